//! The parts of git's patch format that need more than text: a file's blob id (what an `index`
//! line names, and what `git apply` checks a binary patch's preimage against) and the binary
//! patch itself (`GIT binary patch`: zlib-deflated content in git's base85, one line per 52
//! bytes). With them a child's changes are a patch that `git apply` takes as is, binary files
//! included.

use std::io::Write as _;

use sha1::{Digest as _, Sha1};

/// The id git gives a blob of `content` (its SHA-1 over `blob LEN\0CONTENT`), in hex.
pub(crate) fn blob_id(content: &[u8]) -> String {
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
pub(crate) const NO_BLOB: &str = "0000000000000000000000000000000000000000";

/// `GIT binary patch` taking `old` to `new` (and, as git writes it, the reverse after it), each
/// as a literal: what follows a file's `index` line.
pub(crate) fn binary(old: &[u8], new: &[u8]) -> String {
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

#[cfg(test)]
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
}
