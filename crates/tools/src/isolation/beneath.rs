//! Reading and writing a live workspace through descriptors opened beneath it, for applying a
//! child's changes. The session's own commands may run while the daemon applies, and may swap a
//! directory on the way for a link (to `FORKD_HOME`, to another tenant's files) between a check
//! and a write: so nothing here goes by path. Every directory is opened from the workspace's
//! own descriptor with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, each file is staged beside its
//! target under a fresh name (`O_EXCL | O_NOFOLLOW`) and renamed over it within that directory,
//! and a removal unlinks within it. A directory renamed away meanwhile takes the write with it,
//! to wherever the session's commands could move it: their own files.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The live file at a path, as read beneath the workspace.
pub(super) struct Live {
    /// A regular file's content, or a link's target.
    pub content: Vec<u8>,
    pub link: bool,
    /// Its permission bits (`st_mode & 0o7777`).
    pub permissions: u32,
}

/// The workspace's directory, opened once.
pub(super) struct Root(OwnedFd);

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS);

fn said(e: Errno) -> String {
    match e {
        Errno::LOOP | Errno::XDEV => "a symbolic link along the path; not followed".into(),
        Errno::NOTDIR => "something other than a directory along the path".into(),
        e => e.to_string(),
    }
}

impl Root {
    /// Opens the workspace (canonical): as itself, never through a link at its end; a layer's,
    /// reached through the daemon's own descriptor (`/proc/PID/fd/N`, a link by nature),
    /// through that.
    pub(super) fn open(workspace: &Path) -> Result<Root, String> {
        let mut flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        if workspace.starts_with("/proc") {
            flags.remove(OFlags::NOFOLLOW);
        }
        rustix::fs::open(workspace, flags, Mode::empty())
            .map(Root)
            .map_err(|e| format!("cannot open the workspace {}: {e}", workspace.display()))
    }

    /// The directory `rel` (plain components), made where it is missing if `create`; `None`
    /// when it is missing and not made.
    pub(super) fn dir(&self, rel: &Path, create: bool) -> Result<Option<OwnedFd>, String> {
        // No `O_NOFOLLOW` here: `RESOLVE_NO_SYMLINKS` refuses a link anywhere (`ELOOP`), the
        // last component included, where `O_NOFOLLOW` would open the link itself.
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut at = rustix::io::dup(&self.0).map_err(|e| e.to_string())?;
        for part in rel.components() {
            let Component::Normal(name) = part else {
                return Err("not a plain relative path".into());
            };
            let next = match rustix::fs::openat2(&at, name, flags, Mode::empty(), RESOLVE) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&at, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(format!("cannot make a directory: {e}")),
                    }
                    rustix::fs::openat2(&at, name, flags, Mode::empty(), RESOLVE)
                }
                other => other,
            };
            at = match next {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(None),
                // A file where a directory would be: nothing there to read.
                Err(Errno::NOTDIR) if !create => return Ok(None),
                Err(e) => return Err(said(e)),
            };
        }
        Ok(Some(at))
    }

    /// The live file at `rel`: `None` when nothing (or no directory above it) is there. A link
    /// at the end is read as itself; anything but a file or a link is an error.
    pub(super) fn read(&self, rel: &Path) -> Result<Option<Live>, String> {
        use std::io::Read as _;
        let name = rel.file_name().ok_or("a path without a name")?;
        let Some(dir) = self.dir(rel.parent().unwrap_or(Path::new("")), false)? else {
            return Ok(None);
        };
        let stat = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let permissions = stat.st_mode & 0o7777;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => Ok(Some(Live {
                content: rustix::fs::readlinkat(&dir, name, Vec::new())
                    .map_err(|e| e.to_string())?
                    .into_bytes(),
                link: true,
                permissions,
            })),
            FileType::RegularFile => {
                // Not waiting on a FIFO swapped in since the stat.
                let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
                let fd =
                    rustix::fs::openat2(&dir, name, flags, Mode::empty(), RESOLVE).map_err(said)?;
                let file = std::fs::File::from(fd);
                if !file.metadata().is_ok_and(|m| m.is_file()) {
                    return Err("something other than a file at this path".into());
                }
                let mut content = Vec::new();
                (&file)
                    .read_to_end(&mut content)
                    .map_err(|e| e.to_string())?;
                Ok(Some(Live {
                    content,
                    link: false,
                    permissions,
                }))
            }
            _ => Err("something other than a file at this path".into()),
        }
    }
}

/// A file or link staged beside its target in `dir`, removed when dropped unless it was moved
/// into place.
pub(super) struct Staged {
    dir: OwnedFd,
    name: OsString,
    temp: Option<OsString>,
}

/// A name no one else uses for a staged file: the process, a counter and the time. Made with
/// `O_EXCL`, so a name someone planted is only skipped.
fn temp_name(attempt: u32) -> OsString {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        ".forkd-apply-{}-{n}-{nanos:x}-{attempt}",
        std::process::id()
    )
    .into()
}

impl Staged {
    /// Stages a file of `bytes` with permissions `mode` to become `name` in `dir`.
    pub(super) fn file(
        dir: OwnedFd,
        name: &OsStr,
        bytes: &[u8],
        mode: u32,
    ) -> Result<Self, String> {
        use std::io::Write as _;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for attempt in 0..16 {
            let temp = temp_name(attempt);
            let fd = match rustix::fs::openat(&dir, &temp, flags, Mode::from_raw_mode(0o600)) {
                Err(Errno::EXIST) => continue,
                other => other.map_err(|e| format!("cannot stage a file: {e}"))?,
            };
            let staged = Staged {
                dir,
                name: name.to_owned(),
                temp: Some(temp),
            };
            let mut file = std::fs::File::from(fd);
            let fail = |e: std::io::Error| format!("cannot stage a file: {e}");
            file.write_all(bytes).map_err(fail)?;
            // Never set-id: the child's modes are permissions only.
            rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o777))
                .map_err(|e| format!("cannot stage a file: {e}"))?;
            file.sync_all().map_err(fail)?;
            return Ok(staged);
        }
        Err("cannot stage a file: every fresh name was taken".into())
    }

    /// Stages a link to `to` to become `name` in `dir`.
    pub(super) fn link(dir: OwnedFd, name: &OsStr, to: &Path) -> Result<Self, String> {
        for attempt in 0..16 {
            let temp = temp_name(attempt);
            match rustix::fs::symlinkat(to, &dir, &temp) {
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(format!("cannot stage a link: {e}")),
                Ok(()) => {
                    return Ok(Staged {
                        dir,
                        name: name.to_owned(),
                        temp: Some(temp),
                    });
                }
            }
        }
        Err("cannot stage a link: every fresh name was taken".into())
    }

    /// A removal of `name` in `dir`, done when moved into place.
    pub(super) fn removal(dir: OwnedFd, name: &OsStr) -> Self {
        Staged {
            dir,
            name: name.to_owned(),
            temp: None,
        }
    }

    /// Moves the staged file over its target (or removes the target).
    pub(super) fn commit(mut self) -> Result<(), String> {
        match self.temp.take() {
            Some(temp) => {
                rustix::fs::renameat(&self.dir, &temp, &self.dir, &self.name).map_err(|e| {
                    // Not moved: removed as it drops.
                    self.temp = Some(temp);
                    e.to_string()
                })
            }
            None => match rustix::fs::unlinkat(&self.dir, &self.name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(e.to_string()),
            },
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = rustix::fs::unlinkat(&self.dir, &temp, AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_directory_swapped_for_a_link_after_it_was_opened_takes_the_write_not_the_link() {
        let base = tempfile::tempdir().unwrap();
        let ws = base.path().join("ws");
        let outside = base.path().join("outside");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), "outside\n").unwrap();
        let root = Root::open(&ws).unwrap();
        let dir = root.dir(Path::new("sub"), false).unwrap().unwrap();
        let staged = Staged::file(dir, OsStr::new("keep.txt"), b"child\n", 0o4755).unwrap();
        let removal = Staged::removal(
            root.dir(Path::new("sub"), false).unwrap().unwrap(),
            OsStr::new("gone.txt"),
        );
        // The session's command swaps the directory for a link out of the workspace.
        std::fs::rename(ws.join("sub"), ws.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("sub")).unwrap();
        std::fs::write(outside.join("gone.txt"), "outside\n").unwrap();
        staged.commit().unwrap();
        removal.commit().unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.join("keep.txt")).unwrap(),
            "outside\n"
        );
        assert!(outside.join("gone.txt").exists());
        assert_eq!(
            std::fs::read_to_string(ws.join("moved/keep.txt")).unwrap(),
            "child\n"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(ws.join("moved/keep.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "never set-id");
        // Through the link now in its place: refused, for reading and for writing.
        assert!(root.dir(Path::new("sub"), true).is_err());
        assert!(root.read(Path::new("sub/keep.txt")).is_err());
        assert!(root.read(Path::new("moved/none.txt")).unwrap().is_none());
        let live = root.read(Path::new("moved/keep.txt")).unwrap().unwrap();
        assert_eq!(live.content, b"child\n");
        assert!(!live.link);
        // Nothing staged is left behind.
        let left: Vec<_> = std::fs::read_dir(ws.join("moved"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".forkd-apply-"))
            .collect();
        assert!(left.is_empty());
    }

    #[test]
    fn a_staged_file_not_committed_is_removed() {
        let ws = tempfile::tempdir().unwrap();
        let root = Root::open(ws.path()).unwrap();
        let dir = root.dir(Path::new("a/b"), true).unwrap().unwrap();
        drop(Staged::file(dir, OsStr::new("f"), b"x", 0o644).unwrap());
        assert_eq!(std::fs::read_dir(ws.path().join("a/b")).unwrap().count(), 0);
    }
}
