//! The daemon user's home, as a sandboxed command sees it: one empty tmpfs over the whole of it,
//! with a read-only allow list bound back in (toolchains, package caches, `~/.gitconfig`, the
//! `PATH` entries under it) and, writable as before, the command's workspace and temporary
//! directory where they lie inside it. Everything else there — `~/.git-credentials`,
//! `~/.pgpass`, `~/.config/gh`, `~/.npmrc`, whatever a deny list would have missed — is gone.
//!
//! The binds are taken from the real tree before the tmpfs covers it (`open_tree`, the new mount
//! API, which clones a subtree into a descriptor), then moved onto mount points made in the
//! tmpfs, which ends read-only. One tmpfs and a bind per allowed entry keep the cost of a
//! command independent of how much the home holds.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{SandboxError, c_path, c_str, check, remount_read_only};

/// What [`crate::sandbox::SandboxPaths::home`] asks for: the home, and what stays readable in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HomeView {
    /// The daemon user's home directory.
    pub dir: PathBuf,
    /// Absolute paths inside `dir` that stay readable (read-only). Missing ones are skipped;
    /// ones outside `dir` need nothing (they are not covered).
    pub allow: Vec<PathBuf>,
}

/// The allow list used when the daemon's configuration names none: toolchains and package
/// caches, relative to the home; every `PATH` entry under the home is added to it.
pub const DEFAULT_READ_ALLOW: [&str; 12] = [
    ".cargo/bin",
    ".cargo/registry",
    ".cargo/git",
    ".cargo/config.toml",
    ".rustup",
    ".pyenv",
    ".npm",
    ".cache/pip",
    ".local/bin",
    ".local/lib",
    ".gitconfig",
    ".config/git",
];

/// The default allow list of `home`: [`DEFAULT_READ_ALLOW`] and the entries of `path` (a
/// `PATH` value) that lie under it.
pub fn default_read_allow(home: &Path, path: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    let mut allow: Vec<PathBuf> = DEFAULT_READ_ALLOW.iter().map(|p| home.join(p)).collect();
    if let Some(path) = path {
        for entry in std::env::split_paths(path) {
            if entry.is_absolute() && entry.starts_with(home) && !allow.contains(&entry) {
                allow.push(entry);
            }
        }
    }
    allow
}

/// One path bound back into the covered home.
struct Bind {
    /// Where it is in the real tree (symlinks followed when it is opened).
    source: CString,
    /// Its place under the tmpfs.
    target: CString,
    read_only: bool,
    /// Its mount point must be made: a directory, or a file.
    make: Option<bool>,
    /// The cloned subtree, between [`Cover::take`] and [`Cover::mount`].
    fd: libc::c_int,
}

/// The cover of one home, prepared in the daemon and applied in the command's mount namespace.
pub(crate) struct Cover {
    dir: CString,
    tmpfs: CString,
    options: CString,
    empty: CString,
    /// Directories to make in the tmpfs before the binds, parents first.
    parents: Vec<CString>,
    binds: Vec<Bind>,
}

impl Cover {
    /// Plans the cover of a hidden directory `dir` that holds some of `kept`: everything in it
    /// hidden but those, bound back in where they lie. `None` when it does not exist or is kept
    /// whole.
    pub(crate) fn around(dir: &Path, kept: &[&Path]) -> Result<Option<Cover>, SandboxError> {
        let view = HomeView {
            dir: dir.to_path_buf(),
            allow: Vec::new(),
        };
        Cover::new(&view, kept)
    }

    /// Plans the cover of `view`, keeping `writable` (the workspace, the temporary directory)
    /// where they lie inside it. `None` when the home does not exist or is itself kept whole.
    pub(crate) fn new(view: &HomeView, writable: &[&Path]) -> Result<Option<Cover>, SandboxError> {
        let Ok(dir) = std::fs::canonicalize(&view.dir) else {
            return Ok(None);
        };
        if writable.iter().any(|w| dir.starts_with(w)) {
            return Ok(None);
        }
        // (target under the canonical home, source, read-only)
        let mut wanted: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
        for path in &view.allow {
            let Some(rel) = path
                .strip_prefix(&view.dir)
                .ok()
                .or_else(|| path.strip_prefix(&dir).ok())
            else {
                continue;
            };
            if std::fs::metadata(path).is_ok() {
                wanted.push((dir.join(rel), path.clone(), true));
            }
        }
        for path in writable {
            if let Ok(rel) = path.strip_prefix(&dir) {
                wanted.push((dir.join(rel), path.to_path_buf(), false));
            }
        }
        // Parents first; an entry inside another one of the same kind comes with it.
        wanted.sort();
        let mut kept: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
        for entry in wanted {
            let inside_same = kept
                .iter()
                .any(|(t, _, ro)| entry.0.starts_with(t) && *ro == entry.2);
            if !inside_same {
                kept.push(entry);
            }
        }
        let mut parents: Vec<PathBuf> = Vec::new();
        let mut binds = Vec::new();
        for (target, source, read_only) in &kept {
            // A mount point inside an earlier bind exists already (it is that bind's content).
            let inside_bind = kept
                .iter()
                .any(|(t, _, _)| t != target && target.starts_with(t));
            let make = if inside_bind {
                None
            } else {
                for ancestor in target.ancestors().skip(1) {
                    if ancestor == dir {
                        break;
                    }
                    if !parents.iter().any(|p| p == ancestor) {
                        parents.push(ancestor.to_path_buf());
                    }
                }
                Some(std::fs::metadata(source).is_ok_and(|m| m.is_dir()))
            };
            binds.push(Bind {
                source: c_path(source)?,
                target: c_path(target)?,
                read_only: *read_only,
                make,
                fd: -1,
            });
        }
        parents.sort_by_key(|p| p.components().count());
        Ok(Some(Cover {
            dir: c_path(&dir)?,
            tmpfs: c_str("tmpfs")?,
            options: c_str("mode=0755,size=64k")?,
            empty: c_str("")?,
            parents: parents
                .iter()
                .map(|p| c_path(p))
                .collect::<Result<_, _>>()?,
            binds,
        }))
    }

    /// Clones each bind's subtree from the real tree. In the command's mount namespace, before
    /// [`Cover::mount`].
    ///
    /// # Safety
    /// Between fork and exec: system calls only.
    pub(crate) unsafe fn take(&mut self) -> io::Result<()> {
        for bind in &mut self.binds {
            // SAFETY: open_tree and mount_setattr read NUL-terminated strings and a struct
            // that live for the call.
            unsafe {
                let fd = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    bind.source.as_ptr(),
                    (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint
                        | libc::AT_RECURSIVE as libc::c_uint,
                );
                if fd < 0 {
                    let err = io::Error::last_os_error();
                    // Gone since the plan was made: nothing to show.
                    if err.raw_os_error() == Some(libc::ENOENT) {
                        continue;
                    }
                    return Err(err);
                }
                bind.fd = fd as libc::c_int;
                if bind.read_only {
                    let attr = libc::mount_attr {
                        attr_set: libc::MOUNT_ATTR_RDONLY,
                        attr_clr: 0,
                        propagation: 0,
                        userns_fd: 0,
                    };
                    let rc = libc::syscall(
                        libc::SYS_mount_setattr,
                        bind.fd,
                        self.empty.as_ptr(),
                        (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
                        &attr,
                        std::mem::size_of::<libc::mount_attr>(),
                    );
                    if rc != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
        }
        Ok(())
    }

    /// Covers the home and moves the binds in; the tmpfs ends read-only.
    ///
    /// # Safety
    /// Between fork and exec, after [`Cover::take`]: system calls only.
    pub(crate) unsafe fn mount(&self) -> io::Result<()> {
        // SAFETY: plain system calls on NUL-terminated strings this value owns.
        unsafe {
            check(libc::mount(
                self.tmpfs.as_ptr(),
                self.dir.as_ptr(),
                self.tmpfs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.options.as_ptr().cast(),
            ))?;
            for parent in &self.parents {
                check(libc::mkdir(parent.as_ptr(), 0o755))?;
            }
            for bind in &self.binds {
                if bind.fd < 0 {
                    continue;
                }
                match bind.make {
                    Some(true) => check(libc::mkdir(bind.target.as_ptr(), 0o755))?,
                    Some(false) => {
                        let fd = libc::open(
                            bind.target.as_ptr(),
                            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                            0o644,
                        );
                        if fd < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        libc::close(fd);
                    }
                    None => {}
                }
                let rc = libc::syscall(
                    libc::SYS_move_mount,
                    bind.fd,
                    self.empty.as_ptr(),
                    libc::AT_FDCWD,
                    bind.target.as_ptr(),
                    libc::MOVE_MOUNT_F_EMPTY_PATH,
                );
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::close(bind.fd);
            }
            remount_read_only(&self.dir)?;
        }
        Ok(())
    }

    /// Whether `path` (canonical) stays reachable inside the covered home: under a bind.
    pub(crate) fn shows(&self, path: &Path) -> bool {
        self.binds
            .iter()
            .any(|b| path.starts_with(Path::new(std::ffi::OsStr::from_bytes(b.target.as_bytes()))))
    }

    /// Whether `path` (canonical) is inside the covered home.
    pub(crate) fn covers(&self, path: &Path) -> bool {
        path.starts_with(Path::new(std::ffi::OsStr::from_bytes(self.dir.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_default_allow_list_adds_path_entries_under_the_home() {
        let home = Path::new("/home/u");
        let path = std::ffi::OsString::from("/usr/bin:/home/u/.volta/bin:/home/u/.cargo/bin:rel");
        let allow = default_read_allow(home, Some(&path));
        assert!(allow.contains(&home.join(".volta/bin")));
        assert!(allow.contains(&home.join(".rustup")));
        assert_eq!(
            allow.iter().filter(|p| p.ends_with(".cargo/bin")).count(),
            1
        );
        assert!(!allow.iter().any(|p| p.starts_with("/usr")));
    }

    #[test]
    fn binds_nest_and_mount_points_are_planned_parents_first() {
        let dir = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(dir.path()).unwrap();
        for d in [".cargo/bin", ".cargo/registry/cache", "src/ws", ".rustup"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::write(home.join(".gitconfig"), "[user]\n").unwrap();
        let view = HomeView {
            dir: home.clone(),
            allow: vec![
                home.join(".cargo/bin"),
                home.join(".cargo/registry"),
                home.join(".cargo/registry/cache"),
                home.join(".gitconfig"),
                home.join(".missing"),
                PathBuf::from("/usr/bin"),
            ],
        };
        let ws = home.join("src/ws");
        let cover = Cover::new(&view, &[&ws]).unwrap().unwrap();
        let targets: Vec<(PathBuf, bool, Option<bool>)> = cover
            .binds
            .iter()
            .map(|b| {
                (
                    PathBuf::from(std::ffi::OsStr::from_bytes(b.target.as_bytes())),
                    b.read_only,
                    b.make,
                )
            })
            .collect();
        assert_eq!(
            targets,
            [
                (home.join(".cargo/bin"), true, Some(true)),
                (home.join(".cargo/registry"), true, Some(true)),
                (home.join(".gitconfig"), true, Some(false)),
                (ws.clone(), false, Some(true)),
            ]
        );
        let parents: Vec<&[u8]> = cover.parents.iter().map(|p| p.as_bytes()).collect();
        assert_eq!(
            parents,
            [
                home.join(".cargo").as_os_str().as_bytes(),
                home.join("src").as_os_str().as_bytes()
            ]
        );
        assert!(cover.shows(&ws.join("a.rs")));
        assert!(!cover.shows(&home.join(".ssh")));
        assert!(cover.covers(&home.join(".ssh")));
        // A workspace that is the home (or holds it) keeps it whole.
        assert!(Cover::new(&view, &[&home]).unwrap().is_none());
    }
}
