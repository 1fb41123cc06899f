//! A batch's snapshot of its session's workspace: what every isolated child of the batch starts
//! from, and the base its changes are merged from.
//!
//! The files are copied once per batch (`cp -a --reflink=auto`: a reflink where the file system
//! offers one, a copy elsewhere), ignored files (`target/`, `node_modules/`) included so that
//! builds work. A git workspace also gets a commit of its working tree, made through a temporary
//! index and kept by `refs/forkd/snapshots/<batch>`: `HEAD`, the index and the stash are never
//! touched, and `git diff refs/forkd/snapshots/<batch>` shows what changed since.
//!
//! What the session's sandbox hides inside its workspace (a local user's workspace may hold
//! `FORKD_HOME`, `~/.ssh` or another session's workspace) is left out of the copy, before the
//! commit: the children's view of the copy is mounted over those covers, so the copy must not
//! hold what they covered.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::IsolationError;
use super::git::Repo;
use super::git::{Git, own_repository};

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

/// Whether `workspace` is the top of a git working tree: a `.git` directory of its own with a
/// `HEAD`. A `.git` file (a linked worktree's `gitdir:` line) or a symlink is not trusted: an
/// agent could point it at a repository it built.
pub fn is_git(workspace: &Path) -> bool {
    let git = workspace.join(".git");
    std::fs::symlink_metadata(&git).is_ok_and(|m| m.is_dir())
        && std::fs::symlink_metadata(git.join("HEAD")).is_ok_and(|m| m.is_file())
}

/// Snapshots `repo`'s workspace into `dir` (which must not exist yet), naming the git ref after
/// `name`, leaving out `hidden` (paths relative to the workspace: what the session's view hides
/// in it).
///
/// The copy is made by the daemon through descriptors ([`super::copy`]), never following a link
/// beneath its source (it copies the link), not even one swapped in while it runs, so it reads
/// only the workspace's own files; it lands in the batch's directory, which every view hides,
/// and what the session's view hides in the workspace is removed from it before anything else
/// reads it. (In the view, the copy would meet those covers themselves: a `/dev/null` it cannot
/// recreate, a directory it cannot read.) git runs in the repository's view ([`Repo::view`]),
/// whose temporary directory must hold `dir`.
pub fn take(
    repo: Repo<'_>,
    dir: &Path,
    name: &str,
    hidden: &[PathBuf],
) -> Result<Snapshot, IsolationError> {
    take_as(repo.workspace, Some((repo, name)), dir, hidden)
}

/// Snapshots the files at `workspace` into `dir` as [`take`] does, without a git commit even
/// where the tree holds a repository: for a workspace forkd's git cannot reach in a view of its
/// own (a session's layer, reached through its descriptor).
pub fn take_files(
    workspace: &Path,
    dir: &Path,
    hidden: &[PathBuf],
) -> Result<Snapshot, IsolationError> {
    take_as(workspace, None, dir, hidden)
}

fn take_as(
    workspace: &Path,
    repo: Option<(Repo<'_>, &str)>,
    dir: &Path,
    hidden: &[PathBuf],
) -> Result<Snapshot, IsolationError> {
    let started = Instant::now();
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| IsolationError::io(format!("cannot create {}", parent.display()), e))?;
    }
    if let Err(e) = super::copy::tree(workspace, dir) {
        let _ = std::fs::remove_dir_all(dir);
        return Err(e);
    }
    for rel in hidden {
        if let Err(e) = leave_out(dir, rel) {
            let _ = std::fs::remove_dir_all(dir);
            return Err(e);
        }
    }
    // The commit records the copy, so that it and the merge base are one state.
    let git = match repo.filter(|_| is_git(workspace)) {
        Some((repo, name)) => match commit(repo, dir, name) {
            Ok(git) => Some(git),
            Err(e) => {
                let _ = std::fs::remove_dir_all(dir);
                return Err(e);
            }
        },
        None => None,
    };
    let (files, bytes) = size(dir);
    Ok(Snapshot {
        dir: dir.to_path_buf(),
        git,
        files,
        bytes,
        took: started.elapsed(),
    })
}

/// Removes `rel` from the copy at `dir`. Its parent is opened beneath `dir` without following a
/// symlink (the copy keeps the workspace's symlinks, which may lead anywhere), and what is there
/// is removed through that descriptor, so nothing outside the copy can be reached. A parent that
/// is a symlink or not there means the path was not copied as a path beneath the workspace:
/// nothing to remove.
fn leave_out(dir: &Path, rel: &Path) -> Result<(), IsolationError> {
    use nix::errno::Errno;
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    use std::os::fd::AsRawFd;
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Ok(());
    };
    let root = std::fs::File::open(dir)
        .map_err(|e| IsolationError::io(format!("cannot open {}", dir.display()), e))?;
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let held = match openat2(&root, parent, how) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => return Ok(()),
        Err(errno) => {
            return Err(IsolationError::io(
                format!("cannot open {} in the snapshot", parent.display()),
                std::io::Error::from(errno),
            ));
        }
    };
    let path = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd())).join(name);
    let removed = match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
        Ok(_) => std::fs::remove_file(&path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.map_err(|e| {
        IsolationError::io(
            format!("cannot leave {} out of the snapshot", rel.display()),
            e,
        )
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

/// Commits the copy at `dir` (as the workspace's working tree) through a temporary index beside
/// it, and keeps the commit by a ref in the workspace's repository.
fn commit(repo: Repo<'_>, dir: &Path, name: &str) -> Result<GitSnapshot, IsolationError> {
    own_repository(repo.workspace)?;
    let index = dir.with_extension("index");
    let result = (|| {
        let git = Git::new(repo, &index);
        let head = git.run(&["rev-parse", "--verify", "--quiet", "HEAD"]).ok();
        // Starting from HEAD's tree: a tracked file stays in the commit even where a .gitignore
        // matches it (a force-added one), as in the user's own index.
        if let Some(head) = &head {
            git.run(&["read-tree", head])?;
        }
        let add = Git::new(repo, &index).work_tree(dir).without_filters();
        add.run(&["add", "--all", "--", "."])?;
        let tree = git.run(&["write-tree"])?;
        let message = format!("forkd: snapshot of the working tree for batch {name}");
        let mut args = vec!["commit-tree", tree.as_str(), "-m", message.as_str()];
        if let Some(head) = &head {
            args.extend(["-p", head.as_str()]);
        }
        let commit = git.run(&args)?;
        let reference = format!("refs/forkd/snapshots/{name}");
        git.run(&["update-ref", &reference, &commit])?;
        Ok(GitSnapshot { reference, commit })
    })();
    let _ = std::fs::remove_file(&index);
    result
}

/// Deletes a snapshot's ref (once its batch's copies are gone); a ref already gone is fine.
pub fn drop_ref(repo: Repo<'_>, reference: &str) -> Result<(), IsolationError> {
    if !is_git(repo.workspace) {
        return Ok(());
    }
    own_repository(repo.workspace)?;
    let index = repo.workspace.join(".git/index");
    Git::new(repo, &index)
        .run(&["update-ref", "-d", reference])
        .map(drop)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn what_the_view_hides_is_left_out_and_no_symlink_leads_the_removal_out() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(ws.join(".forkd")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(ws.join(".forkd/secret.key"), "key").unwrap();
        std::fs::write(ws.join("netrc"), "password").unwrap();
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        std::fs::write(outside.join("victim"), "keep me").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        let hidden = [".forkd", "netrc", "link/victim"].map(PathBuf::from);
        let snap = take(
            super::Repo::unconfined(&ws),
            &dir.path().join("snaps/b0"),
            "b0",
            &hidden,
        )
        .unwrap();
        assert!(!snap.dir.join(".forkd").exists());
        assert!(!snap.dir.join("netrc").exists());
        assert!(snap.dir.join("a.txt").exists());
        // The copy's `link` leads outside: nothing is removed through it.
        assert_eq!(
            std::fs::read_to_string(outside.join("victim")).unwrap(),
            "keep me"
        );
        // The workspace itself is untouched.
        assert!(ws.join(".forkd/secret.key").exists());
    }

    #[test]
    fn a_repository_that_borrows_objects_or_refs_from_elsewhere_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir_all(other.join("objects")).unwrap();
        for (i, plant) in ["alternates", "commondir", "objects-link", "refs-link"]
            .into_iter()
            .enumerate()
        {
            let ws = dir.path().join(format!("ws{i}"));
            std::fs::create_dir_all(&ws).unwrap();
            let init = Command::new("git")
                .args(["init", "-q"])
                .current_dir(&ws)
                .status();
            assert!(init.unwrap().success());
            let git = ws.join(".git");
            match plant {
                "alternates" => {
                    std::fs::write(
                        git.join("objects/info/alternates"),
                        other.join("objects").display().to_string(),
                    )
                    .unwrap();
                }
                "commondir" => {
                    std::fs::write(git.join("commondir"), other.display().to_string()).unwrap()
                }
                "objects-link" => {
                    std::fs::remove_dir_all(git.join("objects")).unwrap();
                    std::os::unix::fs::symlink(other.join("objects"), git.join("objects")).unwrap();
                }
                _ => {
                    std::fs::create_dir_all(git.join("refs")).unwrap();
                    std::os::unix::fs::symlink(&other, git.join("refs/forkd")).unwrap();
                }
            }
            let snaps = dir.path().join(format!("snaps/b{i}"));
            let err = take(super::Repo::unconfined(&ws), &snaps, "b", &[])
                .unwrap_err()
                .to_string();
            assert!(err.contains("another"), "{plant}: {err}");
            assert!(!snaps.exists(), "{plant}: no snapshot is left");
        }
    }

    #[test]
    fn a_plain_workspace_is_copied_whole_with_its_ignored_files() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("target/debug")).unwrap();
        std::fs::write(ws.join(".gitignore"), "target/\n").unwrap();
        std::fs::write(ws.join("target/debug/app"), "binary").unwrap();
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        let snap = take(
            super::Repo::unconfined(&ws),
            &dir.path().join("snaps/b1"),
            "b1",
            &[],
        )
        .unwrap();
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
        let snap = take(
            super::Repo::unconfined(&ws),
            &dir.path().join("snaps/b2"),
            "b2",
            &[],
        )
        .unwrap();
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

    #[test]
    fn nothing_in_the_repository_makes_the_daemons_git_run_a_program() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let marker = dir.path().join("ran");
        std::fs::create_dir_all(ws.join("hooks")).unwrap();
        let git = |args: &[&str]| {
            let out = Command::new("git")
                .arg("-C")
                .arg(&ws)
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
        };
        git(&["init", "-q"]);
        // What an agent with write access to the workspace could plant.
        let run = format!("touch {}; cat", marker.display());
        git(&["config", "filter.evil.clean", &run]);
        git(&["config", "filter.evil.process", &run]);
        git(&["config", "core.hooksPath", "hooks"]);
        git(&["config", "core.fsmonitor", &run]);
        git(&["config", "commit.gpgSign", "true"]);
        git(&["config", "gpg.program", &run]);
        let hook = ws.join("hooks/reference-transaction");
        std::fs::write(&hook, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::write(ws.join(".gitattributes"), "* filter=evil\n").unwrap();
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        let snap = take(
            super::Repo::unconfined(&ws),
            &dir.path().join("snaps/b3"),
            "b3",
            &[],
        )
        .unwrap();
        assert!(snap.git.is_some());
        drop_ref(super::Repo::unconfined(&ws), "refs/forkd/snapshots/b3").unwrap();
        assert!(
            !marker.exists(),
            "the repository's configuration ran a program"
        );
    }

    #[test]
    fn a_git_file_pointing_elsewhere_is_not_a_repository_of_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join(".git"), "gitdir: /somewhere/else\n").unwrap();
        assert!(!is_git(&ws));
        let snap = take(
            super::Repo::unconfined(&ws),
            &dir.path().join("snaps/b4"),
            "b4",
            &[],
        )
        .unwrap();
        assert_eq!(snap.git, None);
    }
}
