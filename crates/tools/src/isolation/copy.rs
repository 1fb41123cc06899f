//! The snapshot's copy of a workspace, made through descriptors. The session's commands may run
//! while it is made, and may swap a directory for a link (to `FORKD_HOME`, to another tenant's
//! files) while the copy is under way: a copy that goes by path (`cp -a` builds `ws/./sub/NAME`
//! for each entry, following `sub`) would then read outside the workspace into the snapshot,
//! which the children read. Here each directory is opened from its parent's descriptor, never
//! through a link, and its entries are read beneath that descriptor: a directory swapped after
//! it was opened is copied as it was, one swapped before is a link, copied as a link.
//!
//! What is copied: directories, regular files (reflinked where the file system can, else
//! copied in the kernel), symbolic links as links, FIFOs as FIFOs, each with its permission bits
//! and modification time. Sockets and device nodes are left out (no patch carries them); hard
//! links become separate files.

use std::ffi::CStr;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timestamps};
use rustix::io::Errno;

use super::IsolationError;

fn fail(what: &str, at: &Path, e: Errno) -> IsolationError {
    IsolationError::io(format!("{what} {}", at.display()), e.into())
}

/// Copies the tree at `workspace` (opened as itself, or through the daemon's own descriptor for
/// a layer's `/proc/PID/fd/N`) into `dir`, which must not exist yet.
pub(super) fn tree(workspace: &Path, dir: &Path) -> Result<(), IsolationError> {
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    if workspace.starts_with("/proc") {
        flags.remove(OFlags::NOFOLLOW);
    }
    let source = rustix::fs::open(workspace, flags, Mode::empty())
        .map_err(|e| fail("cannot open", workspace, e))?;
    rustix::fs::mkdir(dir, Mode::from_raw_mode(0o700))
        .map_err(|e| fail("cannot create", dir, e))?;
    let target = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| fail("cannot open", dir, e))?;
    copy_dir(&source, &target, Path::new(""))?;
    let stat = rustix::fs::fstat(&source).map_err(|e| fail("cannot stat", workspace, e))?;
    finish(&target, &stat).map_err(|e| fail("cannot set the mode of", dir, e))
}

/// Copies the entries of the directory `source` into the directory `target` (`at`: where, for
/// messages).
fn copy_dir(source: &OwnedFd, target: &OwnedFd, at: &Path) -> Result<(), IsolationError> {
    let mut entries = rustix::fs::Dir::read_from(source).map_err(|e| fail("cannot read", at, e))?;
    while let Some(entry) = entries.read() {
        let entry = entry.map_err(|e| fail("cannot read", at, e))?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let path = at.join(os(name));
        copy_entry(source, target, name, &path)?;
    }
    Ok(())
}

fn os(name: &CStr) -> &std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(name.to_bytes())
}

fn copy_entry(
    source: &OwnedFd,
    target: &OwnedFd,
    name: &CStr,
    path: &Path,
) -> Result<(), IsolationError> {
    let stat = match rustix::fs::statat(source, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        // Gone since it was listed: not there to copy.
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(fail("cannot stat", path, e)),
    };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
            let from = match rustix::fs::openat(source, name, flags, Mode::empty()) {
                Ok(fd) => fd,
                // Swapped for a link or a file since the stat: what is there now is not copied
                // through.
                Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => return Ok(()),
                Err(e) => return Err(fail("cannot open", path, e)),
            };
            rustix::fs::mkdirat(target, name, Mode::from_raw_mode(0o700))
                .map_err(|e| fail("cannot create", path, e))?;
            let to = rustix::fs::openat(target, name, flags, Mode::empty())
                .map_err(|e| fail("cannot open", path, e))?;
            copy_dir(&from, &to, path)?;
            let stat = rustix::fs::fstat(&from).map_err(|e| fail("cannot stat", path, e))?;
            finish(&to, &stat).map_err(|e| fail("cannot set the mode of", path, e))
        }
        FileType::RegularFile => copy_file(source, target, name, path),
        FileType::Symlink => {
            let to = match rustix::fs::readlinkat(source, name, Vec::new()) {
                Ok(to) => to,
                Err(Errno::NOENT | Errno::INVAL) => return Ok(()),
                Err(e) => return Err(fail("cannot read the link", path, e)),
            };
            rustix::fs::symlinkat(to.as_c_str(), target, name)
                .map_err(|e| fail("cannot create the link", path, e))?;
            let _ = rustix::fs::utimensat(target, name, &times(&stat), AtFlags::SYMLINK_NOFOLLOW);
            Ok(())
        }
        FileType::Fifo => {
            let mode = Mode::from_raw_mode(stat.st_mode & 0o777);
            rustix::fs::mknodat(target, name, FileType::Fifo, mode, 0)
                .map_err(|e| fail("cannot create the FIFO", path, e))
        }
        // Sockets and devices: nothing a child's change could carry.
        _ => Ok(()),
    }
}

fn copy_file(
    source: &OwnedFd,
    target: &OwnedFd,
    name: &CStr,
    path: &Path,
) -> Result<(), IsolationError> {
    // Not through a link, not waiting on a FIFO swapped in since the stat.
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    let from = match rustix::fs::openat(source, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::LOOP) => return Ok(()),
        Err(e) => return Err(fail("cannot open", path, e)),
    };
    let stat = rustix::fs::fstat(&from).map_err(|e| fail("cannot stat", path, e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Ok(());
    }
    let create =
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let to = rustix::fs::openat(target, name, create, Mode::from_raw_mode(0o600))
        .map_err(|e| fail("cannot create", path, e))?;
    if rustix::fs::ioctl_ficlone(&to, &from).is_err() {
        // No reflink here: copied in the kernel (`copy_file_range` where it can).
        let mut reader = std::fs::File::from(from);
        let mut writer = std::fs::File::from(to);
        std::io::copy(&mut reader, &mut writer)
            .map_err(|e| IsolationError::io(format!("cannot copy {}", path.display()), e))?;
        return finish(&writer, &stat).map_err(|e| fail("cannot set the mode of", path, e));
    }
    finish(&to, &stat).map_err(|e| fail("cannot set the mode of", path, e))
}

/// Gives a copy its original's permission bits (never set-id) and times.
fn finish(fd: impl std::os::fd::AsFd, stat: &rustix::fs::Stat) -> Result<(), Errno> {
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(stat.st_mode & 0o777))?;
    rustix::fs::futimens(&fd, &times(stat))
}

// The fields' types differ across architectures (`c_long` here, `i64` there).
#[allow(clippy::unnecessary_cast, clippy::cast_possible_wrap)]
fn times(stat: &rustix::fs::Stat) -> Timestamps {
    let at = |sec: i64, nsec: u64| rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    };
    Timestamps {
        last_access: at(stat.st_atime as i64, stat.st_atime_nsec as u64),
        last_modification: at(stat.st_mtime as i64, stat.st_mtime_nsec as u64),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn a_tree_is_copied_with_its_links_as_links_its_fifos_modes_and_times() {
        let base = tempfile::tempdir().unwrap();
        let (ws, outside, copy) = (
            base.path().join("ws"),
            base.path().join("outside"),
            base.path().join("copy"),
        );
        std::fs::create_dir_all(ws.join("sub/deep")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.key"), "the daemon's key").unwrap();
        std::fs::write(ws.join("sub/deep/run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            ws.join("sub/deep/run.sh"),
            std::fs::Permissions::from_mode(0o4751),
        )
        .unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
        std::os::unix::fs::symlink("sub/deep", ws.join("in")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            ws.join("pipe"),
            FileType::Fifo,
            Mode::from_raw_mode(0o640),
            0,
        )
        .unwrap();
        tree(&ws, &copy).unwrap();
        let script = std::fs::metadata(copy.join("sub/deep/run.sh")).unwrap();
        assert_eq!(script.permissions().mode() & 0o7777, 0o751, "never set-id");
        assert_eq!(
            script.mtime(),
            std::fs::metadata(ws.join("sub/deep/run.sh"))
                .unwrap()
                .mtime()
        );
        assert_eq!(
            std::fs::read_link(copy.join("out")).unwrap(),
            outside,
            "a link is copied as a link"
        );
        assert!(!copy.join("secret.key").exists());
        assert_eq!(
            std::fs::read_link(copy.join("in")).unwrap(),
            Path::new("sub/deep")
        );
        assert!(
            std::fs::symlink_metadata(copy.join("pipe"))
                .unwrap()
                .file_type()
                .is_fifo()
        );
    }

    #[test]
    fn a_directory_swapped_for_a_link_once_opened_is_copied_as_it_was() {
        let base = tempfile::tempdir().unwrap();
        let (ws, outside, copy) = (
            base.path().join("ws"),
            base.path().join("outside"),
            base.path().join("copy"),
        );
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("sub/mine.txt"), "mine").unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.key"), "the daemon's key").unwrap();
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let opened = rustix::fs::open(ws.join("sub"), flags, Mode::empty()).unwrap();
        // The session's command swaps it once the copy holds it.
        std::fs::rename(ws.join("sub"), base.path().join("away")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("sub")).unwrap();
        std::fs::create_dir(&copy).unwrap();
        let into = rustix::fs::open(&copy, flags, Mode::empty()).unwrap();
        copy_dir(&opened, &into, Path::new("sub")).unwrap();
        assert_eq!(
            std::fs::read_to_string(copy.join("mine.txt")).unwrap(),
            "mine"
        );
        assert!(!copy.join("secret.key").exists());
    }
}
