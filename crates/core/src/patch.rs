//! git's patch format, as forkd writes a child's changes and as a client reads them back.
//!
//! Written (by the daemon, [`blob_id`] and [`binary`]): what needs more than text, a file's blob
//! id (what an `index` line names, and what `git apply` checks a binary patch's preimage against)
//! and the binary patch itself (`GIT binary patch`: zlib-deflated content in git's base85, one
//! line per 52 bytes). With them a child's changes are a patch that `git apply` takes as is.
//!
//! Read (by `forkctl apply --to`, [`parse`] and [`FilePatch::apply`]): forkd's own patches, file
//! by file, each applied to what a client's checkout holds at that path.

use std::io::Write as _;

use sha1::{Digest as _, Sha1};

/// The id git gives a blob of `content` (its SHA-1 over `blob LEN\0CONTENT`), in hex.
pub fn blob_id(content: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", content.len()).as_bytes());
    hasher.update(content);
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The id of no blob: a side that does not exist.
pub const NO_BLOB: &str = "0000000000000000000000000000000000000000";

/// `GIT binary patch` taking `old` to `new` (and, as git writes it, the reverse after it), each
/// as a literal: what follows a file's `index` line.
pub fn binary(old: &[u8], new: &[u8]) -> String {
    let mut out = String::from("GIT binary patch\n");
    literal(new, &mut out);
    out.push('\n');
    literal(old, &mut out);
    out.push('\n');
    out
}

/// One `literal LEN` hunk: `content` deflated, in lines of at most 52 bytes, each led by its
/// length (`A`–`Z` for 1–26, `a`–`z` for 27–52).
fn literal(content: &[u8], out: &mut String) {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing to a Vec cannot fail.
    let deflated = encoder
        .write_all(content)
        .and_then(|()| encoder.finish())
        .unwrap_or_default();
    out.push_str(&format!("literal {}\n", content.len()));
    for line in deflated.chunks(52) {
        let n = u8::try_from(line.len()).unwrap_or(52);
        out.push(char::from(if n <= 26 {
            b'A' + n - 1
        } else {
            b'a' + n - 27
        }));
        base85(line, out);
        out.push('\n');
    }
}

/// git's base85 alphabet.
const ALPHABET: &[u8; 85] =
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// `bytes` in git's base85: each group of 4 bytes (the last padded with zeros), read big-endian,
/// as 5 digits, most significant first.
fn base85(bytes: &[u8], out: &mut String) {
    for group in bytes.chunks(4) {
        let mut word = [0u8; 4];
        word[..group.len()].copy_from_slice(group);
        let mut acc = u32::from_be_bytes(word);
        let mut digits = [0u8; 5];
        for digit in digits.iter_mut().rev() {
            *digit = ALPHABET[(acc % 85) as usize];
            acc /= 85;
        }
        out.extend(digits.iter().map(|&d| char::from(d)));
    }
}

/// Why a patch could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} of the patch: {reason}")]
pub struct PatchError {
    pub line: usize,
    pub reason: String,
}

/// One side of a file as an `index` line and the mode lines name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// Its blob id ([`blob_id`]).
    pub id: String,
    /// `0o100644`, `0o100755`, or `0o120000` for a symbolic link (whose content is its target).
    pub mode: u32,
}

/// What a file's part says its new content is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// No content change (a file removed, or made empty).
    None,
    /// Text hunks, as `diffy` reads them.
    Text(String),
    /// A binary file's whole new content.
    Binary(Vec<u8>),
    /// `Binary files … differ`: a file too large for a binary patch.
    Unavailable,
}

/// One file's part of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// Its path in the tree, unquoted.
    pub path: String,
    /// The file before (`None`: the child made it).
    pub old: Option<Blob>,
    /// The file after (`None`: the child removed it).
    pub new: Option<Blob>,
    pub body: Body,
}

impl FilePatch {
    /// The file's new content given what is at its path now (`None`: nothing), or why the
    /// change does not apply. `Ok(None)`: the file is to be removed. Where `current` is the file
    /// the patch was made from (its blob id is the `index` line's), the result is the child's
    /// file exactly; where it has changed since, text hunks still apply where their context
    /// matches, and anything else is a conflict.
    pub fn apply(&self, current: Option<&[u8]>) -> Result<Option<Vec<u8>>, String> {
        let unchanged = match (&self.old, current) {
            (None, None) => true,
            (Some(old), Some(now)) => blob_id(now) == old.id,
            _ => false,
        };
        // A file already as the child left it (a patch applied twice) is no conflict.
        if let (Some(new), Some(now)) = (&self.new, current)
            && blob_id(now) == new.id
        {
            return Ok(Some(now.to_vec()));
        }
        let Some(new) = &self.new else {
            return match current {
                None => Ok(None),
                Some(_) if unchanged => Ok(None),
                Some(_) => Err("removed by the child, but changed here since".into()),
            };
        };
        let result = match &self.body {
            Body::Unavailable => {
                return Err("a binary file too large for a patch; apply it on the daemon".into());
            }
            Body::Binary(content) if unchanged => content.clone(),
            Body::Binary(_) => return Err("a binary file that has changed here since".into()),
            Body::None if unchanged => Vec::new(),
            Body::None => return Err("changed here since".into()),
            Body::Text(hunks) => {
                let base = match current {
                    Some(now) if self.old.is_some() => {
                        std::str::from_utf8(now).map_err(|_| "not text here any more".to_owned())?
                    }
                    Some(_) => return Err("made by the child, but it exists here".into()),
                    None if self.old.is_none() => "",
                    None => return Err("changed by the child, but missing here".into()),
                };
                let patch = diffy::Patch::from_str(hunks)
                    .map_err(|e| format!("its hunks do not read: {e}"))?;
                diffy::apply(base, &patch)
                    .map_err(|_| {
                        "changed here since the snapshot, where the child changed it".to_owned()
                    })?
                    .into_bytes()
            }
        };
        // From the file it was made from, a patch must make the child's file exactly.
        if unchanged && blob_id(&result) != new.id {
            return Err("the result is not the child's file".into());
        }
        Ok(Some(result))
    }
}

/// Reads a patch forkd wrote: each file's part, in order. Comment lines (`# …`) between parts,
/// and anything before the first part, are skipped.
pub fn parse(patch: &str) -> Result<Vec<FilePatch>, PatchError> {
    let lines: Vec<&str> = patch.lines().collect();
    let mut files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(names) = lines[i].strip_prefix("diff --git ") else {
            i += 1;
            continue;
        };
        let fail = |line: usize, reason: &str| PatchError {
            line: line + 1,
            reason: reason.to_owned(),
        };
        let path = header_path(names).map_err(|e| fail(i, &e))?;
        i += 1;
        let (mut old, mut new) = (None, None);
        let (mut old_mode, mut new_mode, mut ids) = (None, None, None);
        let mut created = false;
        let mut removed = false;
        while i < lines.len() {
            let line = lines[i];
            let mode = |m: &str| u32::from_str_radix(m, 8).map_err(|_| fail(i, "a bad mode"));
            if let Some(m) = line.strip_prefix("new file mode ") {
                (created, new_mode) = (true, Some(mode(m)?));
            } else if let Some(m) = line.strip_prefix("deleted file mode ") {
                (removed, old_mode) = (true, Some(mode(m)?));
            } else if let Some(m) = line.strip_prefix("old mode ") {
                old_mode = Some(mode(m)?);
            } else if let Some(m) = line.strip_prefix("new mode ") {
                new_mode = Some(mode(m)?);
            } else if let Some(rest) = line.strip_prefix("index ") {
                let (range, both) = match rest.split_once(' ') {
                    Some((range, m)) => (range, Some(mode(m)?)),
                    None => (rest, None),
                };
                let (a, b) = range
                    .split_once("..")
                    .ok_or_else(|| fail(i, "a bad index"))?;
                ids = Some((a.to_owned(), b.to_owned()));
                if let Some(m) = both {
                    (old_mode, new_mode) = (Some(m), Some(m));
                }
            } else {
                break;
            }
            i += 1;
        }
        let (a, b) = ids.ok_or_else(|| fail(i, "a file's part without its index line"))?;
        if !created {
            old = Some(Blob {
                id: a,
                mode: old_mode.unwrap_or(0o100_644),
            });
        }
        if !removed {
            new = Some(Blob {
                id: b,
                mode: new_mode.or(old_mode).unwrap_or(0o100_644),
            });
        }
        let start = i;
        let body = match lines.get(i).copied() {
            Some(l) if l.starts_with("--- ") => {
                i += 2;
                while i < lines.len()
                    && !lines[i].starts_with("diff --git ")
                    && !lines[i].starts_with("# ")
                {
                    i += 1;
                }
                // diffy reads the hunks; the names are forkd's (quoted), so it gets its own.
                let hunks = lines[start + 2..i].join("\n");
                Body::Text(format!("--- a\n+++ b\n{hunks}\n"))
            }
            Some("GIT binary patch") => {
                let size = lines
                    .get(i + 1)
                    .and_then(|l| l.strip_prefix("literal "))
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| fail(i + 1, "a binary patch that is not a literal"))?;
                i += 2;
                let mut deflated = Vec::new();
                while i < lines.len() && !lines[i].is_empty() {
                    decode_line(lines[i], &mut deflated).map_err(|e| fail(i, &e))?;
                    i += 1;
                }
                let content = inflate(&deflated, size).map_err(|e| fail(i, &e))?;
                // The reverse literal, which nothing here needs.
                while i < lines.len()
                    && !lines[i].starts_with("diff --git ")
                    && !lines[i].starts_with("# ")
                {
                    i += 1;
                }
                Body::Binary(content)
            }
            Some(l) if l.starts_with("Binary files ") => {
                i += 1;
                Body::Unavailable
            }
            _ => Body::None,
        };
        files.push(FilePatch {
            path,
            old,
            new,
            body,
        });
    }
    Ok(files)
}

/// The path of a `diff --git A B` line (forkd writes the same path on both sides).
fn header_path(names: &str) -> Result<String, String> {
    let b = if names.starts_with('"') {
        let end = quoted_end(names).ok_or("an unterminated quoted name")?;
        names[end..]
            .strip_prefix(' ')
            .ok_or("no second name")?
            .to_owned()
    } else {
        // `a/X b/X`: both halves have the same length.
        let half = names.len().checked_sub(1).ok_or("no names")? / 2;
        names.get(half + 1..).ok_or("no second name")?.to_owned()
    };
    let b = unquote_path(&b)?;
    b.strip_prefix("b/")
        .map(str::to_owned)
        .ok_or_else(|| format!("{b:?} is not a b/ name"))
}

/// Where a C-quoted string that `s` begins with ends (one past its closing quote).
fn quoted_end(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The name [`crate::isolation::quote_path`] quoted (a name it left alone is returned as is).
pub fn unquote_path(quoted: &str) -> Result<String, String> {
    let Some(inner) = quoted
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return Ok(quoted.to_owned());
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut it = inner.bytes();
    while let Some(b) = it.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        let escaped = it.next().ok_or("a name ending in a lone backslash")?;
        bytes.push(match escaped {
            b'a' => 0x07,
            b'b' => 0x08,
            b't' => b'\t',
            b'n' => b'\n',
            b'v' => 0x0b,
            b'f' => 0x0c,
            b'r' => b'\r',
            b'"' => b'"',
            b'\\' => b'\\',
            d @ b'0'..=b'3' => {
                let mut value = u32::from(d - b'0');
                for _ in 0..2 {
                    let d = it
                        .next()
                        .filter(u8::is_ascii_digit)
                        .ok_or("a bad octal escape")?;
                    value = value * 8 + u32::from(d - b'0');
                }
                u8::try_from(value).map_err(|_| "a bad octal escape")?
            }
            _ => return Err("an unknown escape in a name".into()),
        });
    }
    String::from_utf8(bytes).map_err(|_| "a name that is not UTF-8".into())
}

/// Appends the bytes of one line of a binary literal (its length letter, then base85).
fn decode_line(line: &str, out: &mut Vec<u8>) -> Result<(), String> {
    let bytes = line.as_bytes();
    let n = match bytes.first() {
        Some(c @ b'A'..=b'Z') => usize::from(c - b'A') + 1,
        Some(c @ b'a'..=b'z') => usize::from(c - b'a') + 27,
        _ => return Err("a binary line without its length".into()),
    };
    let digits = &bytes[1..];
    if digits.len() != n.div_ceil(4) * 5 {
        return Err("a binary line of the wrong length".into());
    }
    let mut decoded = Vec::with_capacity(digits.len() / 5 * 4);
    for group in digits.chunks(5) {
        let mut acc: u64 = 0;
        for &d in group {
            let value = ALPHABET
                .iter()
                .position(|&a| a == d)
                .ok_or("a character outside base85")?;
            acc = acc * 85 + value as u64;
        }
        let word = u32::try_from(acc).map_err(|_| "a base85 group out of range")?;
        decoded.extend_from_slice(&word.to_be_bytes());
    }
    out.extend_from_slice(&decoded[..n]);
    Ok(())
}

/// `deflated`, inflated, which must come to `size` bytes.
fn inflate(deflated: &[u8], size: usize) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut content = Vec::with_capacity(size);
    flate2::read::ZlibDecoder::new(deflated)
        .take(size as u64 + 1)
        .read_to_end(&mut content)
        .map_err(|e| format!("a binary literal that does not inflate: {e}"))?;
    if content.len() != size {
        return Err(format!(
            "a binary literal of {} bytes, not the {size} it says",
            content.len()
        ));
    }
    Ok(content)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn blob_ids_are_git_s() {
        // `git hash-object` of an empty file and of "hello\n".
        assert_eq!(blob_id(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
        assert_eq!(
            blob_id(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }

    #[test]
    fn base85_is_git_s() {
        let mut out = String::new();
        base85(&[0, 0, 0, 0], &mut out);
        base85(&[0xff, 0xff, 0xff, 0xff], &mut out);
        assert_eq!(out, "00000|NsC0");
    }

    #[test]
    fn a_patch_reads_back_and_applies() {
        let blob: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        let text_old = "one\ntwo\n";
        let text_new = "one\n2\n";
        let hunks = diffy::create_patch(text_old, text_new).to_string();
        let hunks = hunks.splitn(3, '\n').nth(2).unwrap();
        let patch = format!(
            "# agent x\ndiff --git a/t.txt b/t.txt\nindex {}..{} 100644\n--- a/t.txt\n+++ b/t.txt\n\
             {hunks}diff --git \"a/b\\303\\251\\n.bin\" \"b/b\\303\\251\\n.bin\"\nnew file mode 100755\n\
             index {NO_BLOB}..{}\n{}# gone: a FIFO\ndiff --git a/a b/a b/a b/a\ndeleted file mode \
             100644\nindex {}..{NO_BLOB}\n",
            blob_id(text_old.as_bytes()),
            blob_id(text_new.as_bytes()),
            blob_id(&blob),
            binary(b"", &blob),
            blob_id(b"x"),
        );
        let files = parse(&patch).unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["t.txt", "bé\n.bin", "a b/a"]);
        assert_eq!(
            files[0].apply(Some(text_old.as_bytes())).unwrap().unwrap(),
            text_new.as_bytes()
        );
        assert_eq!(files[1].new.as_ref().unwrap().mode, 0o100_755);
        assert_eq!(files[1].apply(None).unwrap().unwrap(), blob);
        assert!(files[1].apply(Some(b"other")).is_err());
        assert_eq!(files[2].apply(Some(b"x")).unwrap(), None);
        assert!(
            files[2].apply(Some(b"y")).is_err(),
            "changed since: a conflict"
        );
        // Changed here away from the hunk: still applies; at the hunk: a conflict.
        let patch = diffy::create_patch("a\nb\nc\nd\ne\nf\ng\nh\n", "a\nb\nc\nd\ne\nf\ng\nH\n");
        let text = patch.to_string();
        let file = FilePatch {
            path: "x".into(),
            old: Some(Blob {
                id: "0".repeat(40),
                mode: 0o100_644,
            }),
            new: Some(Blob {
                id: blob_id(b"a\nb\nc\nd\ne\nf\ng\nH\n"),
                mode: 0o100_644,
            }),
            body: Body::Text(text),
        };
        assert_eq!(
            file.apply(Some(b"A\nb\nc\nd\ne\nf\ng\nh\n"))
                .unwrap()
                .unwrap(),
            b"A\nb\nc\nd\ne\nf\ng\nH\n"
        );
        assert!(file.apply(Some(b"a\nb\nc\nd\ne\nf\ng\nX\n")).is_err());
    }

    #[test]
    fn quoted_names_read_back() {
        for name in [
            "plain.rs",
            "with space",
            "a\"b\\c",
            "new\nline",
            "é",
            "\u{7}\u{1b}",
        ] {
            let quoted = crate::isolation::quote_path(name);
            assert_eq!(unquote_path(&quoted).unwrap(), name);
        }
    }
}
