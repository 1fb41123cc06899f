//! What a workspace changed against the tree it was made from (an uploaded session's upload):
//! each path of the tree whose file is gone or differs (content, executable bit, a link's
//! target), and each file added that the workspace's ignore files do not leave out. Never `.git`.

use std::collections::BTreeSet;
use std::path::Path;

use forkd_core::isolation::ChangeKind;
use forkd_core::upload::{EntryKind, Manifest, blob_hash};

use super::IsolationError;
use super::changes::Side;

/// The paths of `ws` that differ from `tree`, in path order, with how.
pub fn changed_paths(
    ws: &Path,
    tree: &Manifest,
) -> Result<Vec<(String, ChangeKind)>, IsolationError> {
    let mut changed = Vec::new();
    let mut named = BTreeSet::new();
    for entry in &tree.entries {
        named.insert(entry.path.as_str());
        // The agents may have put links anywhere: nothing is read through one.
        let now = match Side::read_beneath(ws, &entry.path) {
            Ok(None) => {
                changed.push((entry.path.clone(), ChangeKind::Deleted));
                continue;
            }
            Ok(Some(side)) => Some(side),
            Err(_) => None,
        };
        let same = match (&entry.kind, now) {
            (_, None) => false,
            (EntryKind::Symlink { target }, Some(now)) => {
                now.mode == 0o120_000 && now.content == target.as_bytes()
            }
            (
                EntryKind::File {
                    sha256, executable, ..
                },
                Some(now),
            ) => {
                now.mode != 0o120_000
                    && (now.mode == 0o100_755) == *executable
                    && blob_hash(&now.content) == *sha256
            }
        };
        if !same {
            changed.push((entry.path.clone(), ChangeKind::Modified));
        }
    }
    // With a trailing slash: a root reached through a link (a session's layer, at
    // `/proc/PID/fd/N`) is walked as the directory it leads to.
    let walk = ignore::WalkBuilder::new(ws.join(""))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use forkd_core::upload::Entry;

    fn file(path: &str, content: &[u8]) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File {
                sha256: blob_hash(content),
                size: content.len() as u64,
                executable: false,
            },
        }
    }

    #[test]
    fn changes_are_found_and_nothing_is_read_through_a_link() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("a.txt"), "SECRET").unwrap();
        std::fs::create_dir(ws.path().join("src")).unwrap();
        std::fs::write(ws.path().join("src/a.txt"), "one\n").unwrap();
        std::fs::write(ws.path().join("b.txt"), "two\n").unwrap();
        let tree = Manifest {
            entries: vec![file("b.txt", b"two\n"), file("src/a.txt", b"one\n")],
            git_commit: None,
        };
        assert!(changed_paths(ws.path(), &tree).unwrap().is_empty());

        // An agent swaps the directory for a link to the daemon's files, and edits and adds.
        std::fs::remove_dir_all(ws.path().join("src")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("src")).unwrap();
        std::fs::write(ws.path().join("b.txt"), "2\n").unwrap();
        std::fs::write(ws.path().join("c.txt"), "new\n").unwrap();
        let changed = changed_paths(ws.path(), &tree).unwrap();
        assert_eq!(
            changed,
            vec![
                ("b.txt".to_owned(), ChangeKind::Modified),
                ("c.txt".to_owned(), ChangeKind::Added),
                ("src".to_owned(), ChangeKind::Added),
                ("src/a.txt".to_owned(), ChangeKind::Modified),
            ]
        );
        let through = Side::read_beneath(ws.path(), "src/a.txt");
        assert!(
            through.is_err(),
            "read through a link: {:?}",
            through.map(|s| s.map(|s| s.content))
        );
        // The link itself is read as a link: its target's name, never what it points at.
        let link = Side::read_beneath(ws.path(), "src").unwrap().unwrap();
        assert_eq!(link.mode, 0o120_000);
        assert_eq!(link.content, outside.path().as_os_str().as_encoded_bytes());
    }
}
