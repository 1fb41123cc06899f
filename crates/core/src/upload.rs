//! Uploaded workspaces: a tree a client sends (its manifest, then the blobs its tenant lacks),
//! checked strictly before anything of it is stored, and kept as its tenant's.
//!
//! A tree is a list of entries, each a file (its content's SHA-256, size and executable bit) or
//! a symbolic link (its target). Directories are implied by the paths beneath them. Refused,
//! each naming the path: an absolute path, a `.`, `..` or empty component, anything under `.git`,
//! a name twice, a name that is both a file and a directory of another, a link whose target is
//! absolute or leads out of the tree, a hash that is not one; and a tree over the limits.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::ids::UploadId;

/// One entry of an uploaded tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative and `/`-separated.
    pub path: String,
    #[serde(flatten)]
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File {
        sha256: String,
        size: u64,
        executable: bool,
    },
    Symlink {
        target: String,
    },
}

/// A tree as its client described it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub entries: Vec<Entry>,
    /// The tree's git commit, when it was a git work tree.
    pub git_commit: Option<String>,
}

/// What one upload may hold, what a tenant's blobs may come to, and how long uploads are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadLimits {
    pub max_bytes: u64,
    pub max_files: u64,
    /// The bytes of blobs a token tenant may hold (`[tenants.NAME] upload_quota` overrides it);
    /// the local user has no quota.
    pub quota: u64,
    /// Token tenants' own quotas, by name.
    pub quotas: BTreeMap<String, u64>,
    /// An upload is removed this long after it was made (sessions made from it keep their
    /// copies); a blob no upload names, this long after it arrived.
    pub retention: std::time::Duration,
    pub orphan_grace: std::time::Duration,
}

impl Default for UploadLimits {
    fn default() -> Self {
        UploadLimits {
            max_bytes: 1 << 30,
            max_files: 100_000,
            quota: 10 << 30,
            quotas: BTreeMap::new(),
            retention: std::time::Duration::from_secs(7 * 24 * 3600),
            orphan_grace: std::time::Duration::from_secs(3600),
        }
    }
}

impl UploadLimits {
    /// `tenant`'s quota; `None` for the local user.
    pub fn quota_of(&self, tenant: &str) -> Option<u64> {
        if tenant == crate::session::LOCAL_TENANT {
            return None;
        }
        Some(self.quotas.get(tenant).copied().unwrap_or(self.quota))
    }
}

/// Why a tree was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// An entry the rules refuse (`INVALID_ARGUMENT`).
    #[error("{path:?}: {reason}")]
    Entry { path: String, reason: String },
    /// Over a limit (`RESOURCE_EXHAUSTED`).
    #[error("{0}")]
    Limit(String),
}

/// A stored upload: its tree and what it comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub id: UploadId,
    pub tenant: String,
    pub manifest: Manifest,
    pub files: u64,
    pub bytes: u64,
    pub created_at_ms: i64,
}

/// What [`crate::store::Store::put_blobs`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobsStored {
    /// Every blob is the tenant's now.
    Stored,
    /// None was stored: the tenant holds `held` bytes, and these blobs would add `adds`, more
    /// than its quota leaves.
    OverQuota { held: u64, adds: u64 },
}

/// Where an uploaded session's files came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub upload_id: UploadId,
    pub files: u64,
    pub bytes: u64,
    pub git_commit: Option<String>,
}

impl Upload {
    /// What a session made from this upload records of it.
    pub fn origin(&self) -> Origin {
        Origin {
            upload_id: self.id,
            files: self.files,
            bytes: self.bytes,
            git_commit: self.manifest.git_commit.clone(),
        }
    }
}

/// A blob's name: its content's SHA-256, lowercase hex.
pub fn blob_hash(content: &[u8]) -> String {
    hex::encode(Sha256::digest(content))
}

impl Manifest {
    /// Checks every entry and the limits; returns the tree's file count and bytes.
    pub fn check(&self, limits: &UploadLimits) -> Result<(u64, u64), ManifestError> {
        let refuse = |path: &str, reason: &str| ManifestError::Entry {
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        let commit_id = |c: &String| {
            (c.len() == 40 || c.len() == 64) && c.bytes().all(|b| b.is_ascii_hexdigit())
        };
        if self.git_commit.as_ref().is_some_and(|c| !commit_id(c)) {
            return Err(refuse("", "the git commit is not a commit id"));
        }
        let files = self.entries.len() as u64;
        if files > limits.max_files {
            return Err(ManifestError::Limit(format!(
                "the tree has {files} entries; the limit per upload is {}",
                limits.max_files
            )));
        }
        let mut names: BTreeSet<&str> = BTreeSet::new();
        let mut bytes: u64 = 0;
        for entry in &self.entries {
            let path = entry.path.as_str();
            check_path(path).map_err(|reason| refuse(path, &reason))?;
            if !names.insert(path) {
                return Err(refuse(path, "named twice"));
            }
            match &entry.kind {
                EntryKind::File { sha256, size, .. } => {
                    if sha256.len() != 64
                        || !sha256
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                    {
                        return Err(refuse(path, "its hash is not a lowercase SHA-256"));
                    }
                    bytes = bytes.saturating_add(*size);
                }
                EntryKind::Symlink { target } => {
                    check_link(path, target).map_err(|reason| refuse(path, &reason))?
                }
            }
        }
        if bytes > limits.max_bytes {
            return Err(ManifestError::Limit(format!(
                "the tree's files come to {bytes} bytes; the limit per upload is {}",
                limits.max_bytes
            )));
        }
        // A name that is also a directory of another: the two would alias one place.
        for name in &names {
            let prefix = format!("{name}/");
            if names
                .range::<str, _>((std::ops::Bound::Excluded(*name), std::ops::Bound::Unbounded))
                .next()
                .is_some_and(|next| next.starts_with(&prefix))
            {
                return Err(refuse(name, "both a file and a directory of the tree"));
            }
        }
        Ok((files, bytes))
    }

    /// Each distinct blob the tree needs, with its size.
    pub fn blobs(&self) -> BTreeMap<&str, u64> {
        self.entries
            .iter()
            .filter_map(|e| match &e.kind {
                EntryKind::File { sha256, size, .. } => Some((sha256.as_str(), *size)),
                EntryKind::Symlink { .. } => None,
            })
            .collect()
    }
}

/// A relative path of plain components, nothing under `.git`.
fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("an empty path".into());
    }
    if path.starts_with('/') {
        return Err("an absolute path".into());
    }
    if path.contains('\0') {
        return Err("a NUL byte in the path".into());
    }
    for part in path.split('/') {
        match part {
            "" => return Err("an empty component (`//` or a trailing `/`)".into()),
            "." | ".." => return Err(format!("a `{part}` component")),
            ".git" => return Err("inside `.git`, which is never uploaded".into()),
            _ => {}
        }
    }
    Ok(())
}

/// A link's target: relative, and, resolved from the link's directory without following
/// anything, inside the tree.
fn check_link(path: &str, target: &str) -> Result<(), String> {
    if target.is_empty() || target.contains('\0') {
        return Err("a symbolic link without a target".into());
    }
    if target.starts_with('/') {
        return Err("a symbolic link to an absolute path".into());
    }
    let mut depth: Vec<&str> = path.split('/').collect();
    depth.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if depth.pop().is_none() {
                    return Err(format!(
                        "a symbolic link to {target:?} leads outside the tree"
                    ));
                }
            }
            ".git" => return Err("a symbolic link into `.git`".into()),
            other => depth.push(other),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File {
                sha256: blob_hash(path.as_bytes()),
                size,
                executable: false,
            },
        }
    }

    fn link(path: &str, target: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::Symlink {
                target: target.into(),
            },
        }
    }

    fn check(entries: Vec<Entry>) -> Result<(u64, u64), ManifestError> {
        Manifest {
            entries,
            git_commit: None,
        }
        .check(&UploadLimits::default())
    }

    #[test]
    fn a_plain_tree_passes_and_counts() {
        let ok = check(vec![
            file("a.txt", 3),
            file("src/lib.rs", 10),
            link("src/up", "../a.txt"),
            link("here", "src/lib.rs"),
        ]);
        assert_eq!(ok, Ok((4, 13)));
    }

    #[test]
    fn hostile_entries_are_refused_naming_the_path() {
        let cases = [
            (vec![file("../x", 1)], "../x"),
            (vec![file("/etc/passwd", 1)], "/etc/passwd"),
            (vec![file("a//b", 1)], "a//b"),
            (vec![file("a/./b", 1)], "a/./b"),
            (vec![file(".git/config", 1)], ".git/config"),
            (vec![file("sub/.git/HEAD", 1)], "sub/.git/HEAD"),
            (vec![link("etc", "/etc")], "etc"),
            (vec![link("a/up", "../../x")], "a/up"),
            (vec![file("a", 1), file("a", 1)], "a"),
            (vec![file("a", 1), file("a/b", 1)], "a"),
        ];
        for (entries, path) in cases {
            match check(entries) {
                Err(ManifestError::Entry { path: named, .. }) => assert_eq!(named, path),
                other => panic!("{path}: {other:?}"),
            }
        }
        let mut bad_hash = file("x", 1);
        bad_hash.kind = EntryKind::File {
            sha256: "ABC".into(),
            size: 1,
            executable: false,
        };
        assert!(check(vec![bad_hash]).is_err());
    }

    #[test]
    fn limits_are_named() {
        let limits = UploadLimits {
            max_bytes: 10,
            max_files: 2,
            ..UploadLimits::default()
        };
        let many = Manifest {
            entries: vec![file("a", 1), file("b", 1), file("c", 1)],
            git_commit: None,
        };
        assert!(matches!(many.check(&limits), Err(ManifestError::Limit(_))));
        let big = Manifest {
            entries: vec![file("a", 11)],
            git_commit: None,
        };
        let err = big.check(&limits).unwrap_err();
        assert!(err.to_string().contains("limit per upload is 10"), "{err}");
    }
}
