//! A batch's snapshot of its session's workspace: what every isolated child of the batch starts
//! from, and the base its changes are merged from.
//!
//! The files are copied once per batch (`cp -a --reflink=auto`: a reflink where the file system
//! offers one, a copy elsewhere), ignored files (`target/`, `node_modules/`) included so that
//! builds work. A git workspace also gets a commit of its working tree, made through a temporary
//! index and kept by `refs/forkd/snapshots/<batch>`: `HEAD`, the index and the stash are never
//! touched, and `git diff refs/forkd/snapshots/<batch>` shows what changed since.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::IsolationError;

/// A snapshot as taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The copy of the workspace.
    pub dir: PathBuf,
    /// The commit of a git workspace's working tree.
    pub git: Option<GitSnapshot>,
    /// What the copy holds.
    pub files: u64,
    pub bytes: u64,
    pub took: Duration,
}

/// A git workspace's snapshot commit and the ref that keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitSnapshot {
    pub reference: String,
    pub commit: String,
}

/// Whether `workspace` is the top of a git working tree (a `.git` directory with a `HEAD`, or
/// a `.git` file naming one, as in a linked worktree).
pub fn is_git(workspace: &Path) -> bool {
    let git = workspace.join(".git");
    git.join("HEAD").is_file() || git.is_file()
}

/// Snapshots `workspace` into `dir` (which must not exist yet), naming the git ref after `name`.
pub fn take(workspace: &Path, dir: &Path, name: &str) -> Result<Snapshot, IsolationError> {
    let started = Instant::now();
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| IsolationError::io(format!("cannot create {}", parent.display()), e))?;
    }
    let git = if is_git(workspace) {
        Some(commit(workspace, dir, name)?)
    } else {
        None
    };
    let mut source = workspace.as_os_str().to_owned();
    source.push("/.");
    let out = Command::new("cp")
        .args(["-a", "--reflink=auto", "--"])
        .arg(&source)
        .arg(dir)
        .output()
        .map_err(|e| IsolationError::io("cannot run cp", e))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(dir);
        return Err(IsolationError::io(
            format!("cannot copy {} to {}", workspace.display(), dir.display()),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        ));
    }
    let (files, bytes) = size(dir);
    Ok(Snapshot {
        dir: dir.to_path_buf(),
        git,
        files,
        bytes,
        took: started.elapsed(),
    })
}

/// The number of files and their bytes beneath `dir` (symlinks not followed).
pub fn size(dir: &Path) -> (u64, u64) {
    let mut files = 0;
    let mut bytes = 0;
    let walker = ignore::WalkBuilder::new(dir)
        .standard_filters(false)
        .follow_links(false)
        .build();
    for entry in walker.flatten() {
        if entry.file_type().is_some_and(|t| !t.is_dir()) {
            files += 1;
            bytes += entry.metadata().map_or(0, |m| m.len());
        }
    }
    (files, bytes)
}

/// Commits the working tree through a temporary index beside `dir`, and keeps the commit by a
/// ref.
fn commit(workspace: &Path, dir: &Path, name: &str) -> Result<GitSnapshot, IsolationError> {
    let index = dir.with_extension("index");
    // Starting from the real index lets git reuse what it knows of unchanged files.
    let real = workspace.join(".git/index");
    if real.is_file() {
        std::fs::copy(&real, &index)
            .map_err(|e| IsolationError::io(format!("cannot copy {}", real.display()), e))?;
    }
    let result = (|| {
        git(workspace, &index, &["add", "--all", "--", "."])?;
        let tree = git(workspace, &index, &["write-tree"])?;
        let head = git(
            workspace,
            &index,
            &["rev-parse", "--verify", "--quiet", "HEAD"],
        )
        .ok();
        let message = format!("forkd: snapshot of the working tree for batch {name}");
        let mut args = vec!["commit-tree", tree.as_str(), "-m", message.as_str()];
        if let Some(head) = &head {
            args.extend(["-p", head.as_str()]);
        }
        let commit = git(workspace, &index, &args)?;
        let reference = format!("refs/forkd/snapshots/{name}");
        git(workspace, &index, &["update-ref", &reference, &commit])?;
        Ok(GitSnapshot { reference, commit })
    })();
    let _ = std::fs::remove_file(&index);
    result
}

/// Deletes a snapshot's ref (once its batch's copies are gone); a ref already gone is fine.
pub fn drop_ref(workspace: &Path, reference: &str) -> Result<(), IsolationError> {
    let index = workspace.join(".git/index");
    git(workspace, &index, &["update-ref", "-d", reference]).map(drop)
}

/// Runs git in `workspace` with `index` as its index, and forkd as the committer; its output,
/// trimmed.
pub(crate) fn git(workspace: &Path, index: &Path, args: &[&str]) -> Result<String, IsolationError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(workspace)
        .args(args)
        .env("GIT_INDEX_FILE", index)
        .env("GIT_AUTHOR_NAME", "forkd")
        .env("GIT_AUTHOR_EMAIL", "forkd@localhost")
        .env("GIT_COMMITTER_NAME", "forkd")
        .env("GIT_COMMITTER_EMAIL", "forkd@localhost")
        .output()
        .map_err(|e| IsolationError::io("cannot run git", e))?;
    if !out.status.success() {
        return Err(IsolationError::Git(format!(
            "git {} failed in {}: {}",
            args.join(" "),
            workspace.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_workspace_is_copied_whole_with_its_ignored_files() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("target/debug")).unwrap();
        std::fs::write(ws.join(".gitignore"), "target/\n").unwrap();
        std::fs::write(ws.join("target/debug/app"), "binary").unwrap();
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        let snap = take(&ws, &dir.path().join("snaps/b1"), "b1").unwrap();
        assert_eq!(snap.git, None);
        assert_eq!(snap.files, 3);
        assert_eq!(
            std::fs::read_to_string(snap.dir.join("target/debug/app")).unwrap(),
            "binary"
        );
    }

    #[test]
    fn a_git_workspace_gets_a_commit_and_keeps_its_head_index_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("git")
                .arg("-C")
                .arg(&ws)
                .args(args)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        run(&["init", "-q"]);
        std::fs::write(ws.join("a.txt"), "one\n").unwrap();
        run(&["add", "a.txt"]);
        run(&["commit", "-qm", "first"]);
        std::fs::write(ws.join("a.txt"), "two\n").unwrap();
        std::fs::write(ws.join("new.txt"), "new\n").unwrap();
        let head = run(&["rev-parse", "HEAD"]);
        let status = run(&["status", "--porcelain"]);
        let snap = take(&ws, &dir.path().join("snaps/b2"), "b2").unwrap();
        let git = snap.git.unwrap();
        assert_eq!(git.reference, "refs/forkd/snapshots/b2");
        assert_eq!(run(&["rev-parse", "HEAD"]), head);
        assert_eq!(run(&["status", "--porcelain"]), status);
        assert_eq!(run(&["show", &format!("{}:new.txt", git.commit)]), "new\n");
        assert_eq!(run(&["show", &format!("{}:a.txt", git.commit)]), "two\n");
        assert_eq!(
            run(&["rev-parse", "refs/forkd/snapshots/b2"]).trim(),
            git.commit
        );
        assert!(snap.dir.join(".git/HEAD").is_file());
    }
}
