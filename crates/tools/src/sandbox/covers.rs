//! What the view covers besides the home: each hidden path, planned in the daemon (its identity
//! recorded) and mounted over in the view through a descriptor checked against that plan.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::SandboxError;

/// How the view hides `hidden` while `keep` stays reachable. A hidden directory that holds a
/// kept path is *split*: covered whole by a tmpfs into which the kept paths are bound back (see
/// [`home::Cover`]), one mount and one per kept path however many entries it has, so the view
/// depends on its identity alone — a session's temporary directory or a fresh workspace appearing
/// beside the kept one changes nothing (its name is not even shown). Every other hidden path is
/// covered itself, with whether it is a directory. A path inside one covered whole is left out:
/// once its parent is covered it no longer exists to be covered (and a mount on it would fail).
/// Returns the split directories (outer first) and the covers, in order.
pub(crate) fn covers(hidden: &[PathBuf], keep: &[&Path]) -> (Vec<PathBuf>, Vec<(PathBuf, bool)>) {
    let mut split = BTreeSet::new();
    let mut whole = BTreeSet::new();
    for path in hidden {
        if keep.contains(&path.as_path()) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if keep.iter().any(|k| k.starts_with(path)) {
            split.insert(path.clone());
        } else {
            // Symlinks were resolved when the paths were made canonical.
            whole.insert((path.clone(), meta.is_dir()));
        }
    }
    // In order, a covered directory comes right before what it holds.
    let mut covers: Vec<(PathBuf, bool)> = Vec::with_capacity(whole.len());
    for (path, dir) in whole {
        if !covers.iter().any(|(p, d)| *d && path.starts_with(p)) {
            covers.push((path, dir));
        }
    }
    (split.into_iter().collect(), covers)
}

/// One hidden path to cover, as planned in the daemon: what it is, and its identity then.
pub(crate) struct Cover {
    path: CString,
    /// A directory (covered by a tmpfs) or a file (by `/dev/null`).
    pub(crate) dir: bool,
    dev: u64,
    ino: u64,
}

impl Cover {
    /// Plans the cover of the canonical `path`; `None` when it is gone already.
    pub(crate) fn plan(path: &Path, dir: bool) -> Result<Option<Cover>, SandboxError> {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return Ok(None);
        };
        Ok(Some(Cover {
            path: CString::new(path.as_os_str().as_bytes()).map_err(|_| {
                SandboxError::Prepare(format!("{} holds a NUL byte", path.display()))
            })?,
            dir,
            dev: meta.dev(),
            ino: meta.ino(),
        }))
    }

    /// Opens the path to cover, no symlink followed along it, and checks it is what was
    /// planned.
    ///
    /// # Safety
    /// Between fork and exec: system calls only.
    pub(crate) unsafe fn open(&self) -> io::Result<libc::c_int> {
        // SAFETY: openat2 reads a NUL-terminated string and a struct that live for the call;
        // fstat writes a struct this function owns.
        unsafe {
            let mut how: libc::open_how = std::mem::zeroed();
            how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
            how.resolve = libc::RESOLVE_NO_SYMLINKS;
            let fd = libc::syscall(
                libc::SYS_openat2,
                libc::AT_FDCWD,
                self.path.as_ptr(),
                &raw const how,
                std::mem::size_of::<libc::open_how>(),
            );
            if fd < 0 {
                let err = io::Error::last_os_error();
                // A symlink now along the path: it changed since the plan.
                return Err(if err.raw_os_error() == Some(libc::ELOOP) {
                    io::Error::from_raw_os_error(libc::ESTALE)
                } else {
                    err
                });
            }
            let fd = fd as libc::c_int;
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 {
                let err = io::Error::last_os_error();
                libc::close(fd);
                return Err(err);
            }
            if st.st_dev != self.dev || st.st_ino != self.ino {
                libc::close(fd);
                return Err(io::Error::from_raw_os_error(libc::ESTALE));
            }
            Ok(fd)
        }
    }
}

/// Writes `/proc/self/fd/FD` and a NUL into `buf`, with no allocation.
pub(crate) fn fd_path(fd: libc::c_int, buf: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
}
