//! What a workspace changed against the tree it was made from (an uploaded session's upload):
//! each path of the tree whose file is gone or differs (content, executable bit, a link's
//! target), and each file added that the workspace's ignore files do not leave out. Never `.git`.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use forkd_core::isolation::ChangeKind;
use forkd_core::upload::{EntryKind, Manifest, blob_hash};

use super::IsolationError;

/// The paths of `ws` that differ from `tree`, in path order, with how.
pub fn changed_paths(
    ws: &Path,
    tree: &Manifest,
) -> Result<Vec<(String, ChangeKind)>, IsolationError> {
    let mut changed = Vec::new();
    let mut named = BTreeSet::new();
    for entry in &tree.entries {
        named.insert(entry.path.as_str());
        let path = ws.join(&entry.path);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            changed.push((entry.path.clone(), ChangeKind::Deleted));
            continue;
        };
        let same = match &entry.kind {
            EntryKind::Symlink { target } => {
                meta.file_type().is_symlink()
                    && std::fs::read_link(&path)
                        .is_ok_and(|t| t.as_os_str().as_bytes() == target.as_bytes())
            }
            EntryKind::File {
                sha256,
                size,
                executable,
            } => {
                meta.is_file()
                    && meta.len() == *size
                    && (meta.mode() & 0o111 != 0) == *executable
                    && std::fs::read(&path).is_ok_and(|c| blob_hash(&c) == *sha256)
            }
        };
        if !same {
            changed.push((entry.path.clone(), ChangeKind::Modified));
        }
    }
    let walk = ignore::WalkBuilder::new(ws)
        .hidden(false)
        .require_git(false)
        .parents(false)
        .filter_entry(|e| e.file_name() != ".git")
        .build();
    for entry in walk {
        let entry = entry.map_err(|e| {
            IsolationError::io(
                format!("cannot list {}", ws.display()),
                std::io::Error::other(e.to_string()),
            )
        })?;
        if entry.file_type().is_some_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(relative) = entry.path().strip_prefix(ws) else {
            continue;
        };
        let relative = relative.to_string_lossy().into_owned();
        if !named.contains(relative.as_str()) {
            changed.push((relative, ChangeKind::Added));
        }
    }
    changed.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(changed)
}
