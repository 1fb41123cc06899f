//! Applying a child's changes to the live workspace: the daemon writing on a sandboxed child's
//! behalf, so it is strict.
//!
//! Each changed file is merged three ways: the snapshot (base), the live file (ours, which the
//! parent or an earlier applied child may have changed) and the child's file (theirs). Hunks
//! that do not overlap merge; a file whose hunks overlap is a conflict. A git workspace merges
//! with git's own `git merge-file`; any other with `diffy`. A child with any conflict or refused
//! path is applied not at all: its conflicts are reported per file and nothing is written.
//! Otherwise every new file is written beside its target first and then renamed over it, so a
//! file is never half-written. The session's commands may run meanwhile: the live workspace is
//! read and written only through descriptors opened beneath it ([`super::beneath`]).
//!
//! Refused: a path beneath `.git/`; a path whose parent directories in the workspace are not
//! plain directories (a symlink there could lead the write out); a symlink that points outside
//! the workspace; a FIFO, socket or device node.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::IsolationError;
use super::beneath::{Live, Root, Staged};
use super::changes::Changes;
use crate::sandbox::layer::LayerDirs;
use forkd_core::isolation::{ChangeKind, Conflict, FileChange, Special};

/// What applying one child did: every file, or none and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyOutcome {
    /// The files written (or removed); empty when there were conflicts.
    pub applied: Vec<String>,
    pub conflicts: Vec<Conflict>,
}

/// What one file becomes in the live workspace.
enum Planned {
    Write(Vec<u8>, Option<u32>),
    Link(PathBuf),
    Remove,
}

/// Applies `changes`, read from `dirs`, to `workspace` (canonical).
pub fn apply(
    workspace: &Path,
    dirs: &LayerDirs,
    changes: &Changes,
) -> Result<ApplyOutcome, IsolationError> {
    let git = super::snapshot::is_git(workspace);
    let root = Root::open(workspace).map_err(IsolationError::Git)?;
    let mut plans = Vec::new();
    let mut conflicts = Vec::new();
    for change in &changes.files {
        match plan(workspace, &root, dirs, change, git) {
            Ok(planned) => plans.push((change.path.clone(), planned)),
            Err(reason) => conflicts.push(Conflict {
                path: change.path.clone(),
                reason,
            }),
        }
    }
    if !conflicts.is_empty() {
        return Ok(ApplyOutcome {
            applied: Vec::new(),
            conflicts,
        });
    }
    // Stage every new file beside its target (each removed again if it is never moved into
    // place), then move them all into place.
    let mut staged: Vec<Staged> = Vec::new();
    for (path, planned) in &plans {
        let rel = Path::new(path);
        let fail = |why: String| IsolationError::Git(format!("cannot write {path}: {why}"));
        let name = rel
            .file_name()
            .ok_or_else(|| fail("a path without a name".into()))?;
        let dir = root
            .dir(rel.parent().unwrap_or(Path::new("")), true)
            .map_err(fail)?
            .ok_or_else(|| fail("its directory vanished".into()))?;
        staged.push(match planned {
            Planned::Remove => Staged::removal(dir, name),
            Planned::Write(bytes, mode) => {
                Staged::file(dir, name, bytes, mode.unwrap_or(0o644)).map_err(fail)?
            }
            Planned::Link(to) => Staged::link(dir, name, to).map_err(fail)?,
        });
    }
    let mut done = Vec::new();
    for (staged, (path, _)) in staged.into_iter().zip(&plans) {
        if let Err(e) = staged.commit() {
            // The staged files not moved yet are removed as they drop; say what was written.
            return Err(IsolationError::Git(format!(
                "cannot write {path}: {e} (written before it: {})",
                if done.is_empty() {
                    "none".to_owned()
                } else {
                    done.join(", ")
                }
            )));
        }
        done.push(path.clone());
    }
    Ok(ApplyOutcome {
        applied: plans.into_iter().map(|(p, _)| p).collect(),
        conflicts: Vec::new(),
    })
}

/// What `change` makes of the live file, or why it cannot be applied.
fn plan(
    workspace: &Path,
    root: &Root,
    dirs: &LayerDirs,
    change: &FileChange,
    git: bool,
) -> Result<Planned, String> {
    let rel = checked_relative(&change.path)?;
    check_parents(workspace, rel)?;
    // Read once, beneath the workspace: what is checked is what is merged.
    let live = root
        .read(rel)
        .map_err(|e| format!("the workspace at this path: {e}"))?;
    // Never through a link the snapshot holds along the path (see `in_snapshot`): then the
    // snapshot has nothing there.
    let base = super::changes::in_snapshot(&dirs.lower, rel);
    let base = base.as_deref();
    let theirs = dirs.upper.join(rel);
    match &change.special {
        Some(Special::Other(what)) => {
            return Err(format!(
                "the child made {what} here; only files and links apply"
            ));
        }
        Some(Special::Symlink(target)) => {
            let target = PathBuf::from(target);
            if !link_stays_inside(workspace, rel, &target) {
                return Err(format!(
                    "a symbolic link to {} leads outside the workspace",
                    target.display()
                ));
            }
            if live.is_some() && !unchanged_since(live.as_ref(), base) {
                return Err("changed in the workspace since the snapshot".into());
            }
            return Ok(Planned::Link(target));
        }
        None => {}
    }
    if live.as_ref().is_some_and(|l| l.link) {
        return Err(
            "the workspace has a symbolic link at this path; not writing through it".into(),
        );
    }
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    match change.kind {
        ChangeKind::Deleted => {
            if live.is_some() && !unchanged_since(live.as_ref(), base) {
                return Err("deleted by the child but changed in the workspace since".into());
            }
            Ok(Planned::Remove)
        }
        ChangeKind::Added => {
            let new = read(&theirs)?;
            if live.as_ref().is_some_and(|l| l.content != new) {
                return Err(
                    "added by the child, and the workspace has a different file here".into(),
                );
            }
            Ok(Planned::Write(new, mode_of(&theirs)))
        }
        ChangeKind::Modified => {
            let new = read(&theirs)?;
            let Some(live) = live else {
                return Err("changed by the child but deleted in the workspace since".into());
            };
            if unchanged_since(Some(&live), base) {
                return Ok(Planned::Write(new, mode_of(&theirs)));
            }
            let base = base.ok_or("changed by the child, but the snapshot has no file here")?;
            let merged = if git {
                merge_with_git(&live.content, base, &theirs)?
            } else {
                merge_text(&read(base)?, &live.content, &new)?
            };
            Ok(Planned::Write(merged, Some(live.permissions)))
        }
    }
}

/// `path` as plain components, never beneath `.git/`.
fn checked_relative(path: &str) -> Result<&Path, String> {
    let rel = Path::new(path);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err("not a plain relative path".into());
    }
    if rel.components().next() == Some(Component::Normal(".git".as_ref())) {
        return Err("beneath .git/, which is never applied".into());
    }
    Ok(rel)
}

/// Every existing parent of `rel` in the workspace must be a plain directory, never a symlink.
fn check_parents(workspace: &Path, rel: &Path) -> Result<(), String> {
    let mut dir = workspace.to_path_buf();
    for part in rel.parent().into_iter().flat_map(Path::components) {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{} is a symbolic link in the workspace; not writing through it",
                    dir.strip_prefix(workspace).unwrap_or(&dir).display()
                ));
            }
            Ok(m) if !m.is_dir() => {
                return Err(format!(
                    "{} is not a directory in the workspace",
                    dir.strip_prefix(workspace).unwrap_or(&dir).display()
                ));
            }
            Ok(_) => {}
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// Whether a link at `rel` to `target` names a place inside the workspace (judged on the names:
/// the place itself may not exist yet).
fn link_stays_inside(workspace: &Path, rel: &Path, target: &Path) -> bool {
    let start = if target.is_absolute() {
        match target.strip_prefix(workspace) {
            Ok(inside) => inside.to_path_buf(),
            Err(_) => return false,
        }
    } else {
        rel.parent().unwrap_or(Path::new("")).join(target)
    };
    let mut depth: usize = 0;
    for part in start.components() {
        match part {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir if depth > 0 => depth -= 1,
            _ => return false,
        }
    }
    true
}

/// Whether the live file still is what the snapshot had (content, or link target).
fn unchanged_since(live: Option<&Live>, base: Option<&Path>) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Some(live), Some(base)) = (live, base) else {
        return false;
    };
    let Ok(meta) = std::fs::symlink_metadata(base) else {
        return false;
    };
    if live.link || meta.file_type().is_symlink() {
        return live.link
            && std::fs::read_link(base).is_ok_and(|t| t.as_os_str().as_bytes() == live.content);
    }
    std::fs::read(base).is_ok_and(|b| b == live.content)
}

fn mode_of(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).ok().map(|m| m.permissions().mode())
}

/// Three-way merge with `diffy`; a conflict names the reason.
fn merge_text(base: &[u8], ours: &[u8], theirs: &[u8]) -> Result<Vec<u8>, String> {
    diffy::merge_bytes(base, ours, theirs).map_err(|_| {
        "changed by the child and in the workspace since the snapshot, in overlapping lines".into()
    })
}

/// Three-way merge with `git merge-file`, which writes nothing but its output. It runs outside
/// any repository (`/`), so no repository's configuration is read, with git's own environment.
fn merge_with_git(ours: &[u8], base: &Path, theirs: &Path) -> Result<Vec<u8>, String> {
    use std::io::Write as _;
    // The live file as read, in a file of the daemon's own (never the live path again).
    let mut copy =
        tempfile::NamedTempFile::new().map_err(|e| format!("cannot copy the live file: {e}"))?;
    copy.write_all(ours)
        .map_err(|e| format!("cannot copy the live file: {e}"))?;
    let ours = copy.path();
    let out = Command::new("git")
        .args(["merge-file", "-p", "--quiet"])
        .arg(ours)
        .arg(base)
        .arg(theirs)
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .env_clear()
        .envs(super::git::environment(std::env::var_os("PATH")))
        .output()
        .map_err(|e| format!("cannot run git merge-file: {e}"))?;
    match out.status.code() {
        Some(0) => Ok(out.stdout),
        Some(n) if n > 0 => Err(
            "changed by the child and in the workspace since the snapshot, in overlapping lines"
                .into(),
        ),
        _ => Err(format!(
            "git merge-file failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn links_are_judged_by_where_they_lead() {
        let ws = Path::new("/w");
        assert!(link_stays_inside(ws, Path::new("a/l"), Path::new("../b")));
        assert!(link_stays_inside(ws, Path::new("l"), Path::new("/w/x")));
        assert!(!link_stays_inside(ws, Path::new("l"), Path::new("/etc")));
        assert!(!link_stays_inside(
            ws,
            Path::new("a/l"),
            Path::new("../../x")
        ));
        assert!(!link_stays_inside(
            ws,
            Path::new("l"),
            Path::new("/w-other/x")
        ));
    }

    #[test]
    fn git_paths_and_odd_paths_are_refused() {
        assert!(checked_relative(".git/hooks/pre-commit").is_err());
        assert!(checked_relative("a/../b").is_err());
        assert!(checked_relative("/etc/passwd").is_err());
        assert!(checked_relative("src/.git-keep").is_ok());
    }

    #[test]
    fn merges_take_hunks_that_do_not_overlap() {
        let base = b"1\n2\n3\n4\n5\n";
        let ours = b"one\n2\n3\n4\n5\n";
        let theirs = b"1\n2\n3\n4\nfive\n";
        assert_eq!(
            merge_text(base, ours, theirs).unwrap(),
            b"one\n2\n3\n4\nfive\n"
        );
        assert!(merge_text(base, b"uno\n2\n3\n4\n5\n", ours).is_err());
    }
}
