//! A view's namespaces as its holder process makes them ([`super::held`]): planned in the
//! daemon ([`Setup::new`]: the covers over what the view hides, the home's, a layer to mount, a
//! session's layer to enter), made by system calls alone in the forked holder ([`Setup::enter`]).

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::covers::{Cover, covers, fd_path};
use super::error::Layer;
use super::{Sandbox, SandboxError, SandboxPaths, c_str, check, held, home, layer, write_file};

/// A view's namespaces as a holder process makes them ([`held`]): what every command that sees
/// the view shares.
pub(crate) struct Setup {
    unshare: libc::c_int,
    setgroups_path: CString,
    uid_map_path: CString,
    gid_map_path: CString,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    root: CString,
    tmpfs: CString,
    tmpfs_options: CString,
    dev_null: CString,
    home: Option<home::Cover>,
    /// Hidden directories that hold a kept path, each covered whole with it bound back in.
    splits: Vec<home::Cover>,
    /// What to cover, as planned.
    covers: Vec<Cover>,
    /// An isolated child's layer, mounted over the workspace before anything is covered (or
    /// a session's, alone in its own namespaces: [`layer::LayerView::session`]).
    pub(super) overlay: Option<layer::Mount>,
    /// The session's layer whose namespaces the view enters (and copies its mounts from)
    /// instead of making a user namespace of its own.
    pub(super) base: Option<Arc<layer::LayerView>>,
    /// A test's holder that never answers ([`held::testing`]).
    pub(super) hang: bool,
}

impl Setup {
    /// Plans the view of a command working in `workspace` with its temporary directory `tmp`
    /// (both canonical).
    pub(super) fn new(
        sandbox: Sandbox,
        paths: &SandboxPaths,
        workspace: &Path,
        tmp: &Path,
        base: Option<Arc<layer::LayerView>>,
    ) -> Result<Setup, SandboxError> {
        let kept = [workspace, tmp];
        let home = match &paths.home {
            Some(view) => home::Cover::new(view, &kept)?,
            None => None,
        };
        let (split, covers) = covers(&hidden(paths), &kept);
        // Inside a covered directory (the home, a split one) only what is bound back in is
        // there to cover.
        let shown = |path: &Path, covered: &[&home::Cover]| {
            covered.iter().all(|c| !c.covers(path) || c.shows(path))
        };
        let mut splits: Vec<home::Cover> = Vec::new();
        for dir in split {
            let covered: Vec<&home::Cover> = home.iter().chain(&splits).collect();
            if shown(&dir, &covered)
                && let Some(cover) = home::Cover::around(&dir, &kept)?
            {
                splits.push(cover);
            }
        }
        let covered: Vec<&home::Cover> = home.iter().chain(&splits).collect();
        let covers = covers
            .into_iter()
            .filter(|(path, _)| shown(path, &covered))
            .filter_map(|(path, dir)| Cover::plan(&path, dir).transpose())
            .collect::<Result<Vec<_>, SandboxError>>()?;
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        // Entering a session's layer gives its user namespace: only a mount namespace (a copy
        // of the layer's) is made.
        let mut unshare = if base.is_some() {
            libc::CLONE_NEWNS
        } else {
            libc::CLONE_NEWUSER | libc::CLONE_NEWNS
        };
        if !sandbox.allow_network {
            unshare |= libc::CLONE_NEWNET;
        }
        Ok(Setup {
            unshare,
            setgroups_path: c_str("/proc/self/setgroups")?,
            uid_map_path: c_str("/proc/self/uid_map")?,
            gid_map_path: c_str("/proc/self/gid_map")?,
            uid_map: format!("{uid} {uid} 1").into_bytes(),
            gid_map: format!("{gid} {gid} 1").into_bytes(),
            root: c_str("/")?,
            tmpfs: c_str("tmpfs")?,
            tmpfs_options: c_str("mode=000,size=4k,nr_inodes=1")?,
            dev_null: c_str("/dev/null")?,
            home,
            splits,
            covers,
            overlay: None,
            base,
            hang: held::testing::hangs(tmp),
        })
    }

    /// Namespaces with nothing in them but a layer, mounted next ([`layer::LayerView::session`]):
    /// a user namespace mapping the daemon's user to itself, and a mount namespace.
    pub(super) fn layer_only() -> Result<Setup, SandboxError> {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Ok(Setup {
            unshare: libc::CLONE_NEWUSER | libc::CLONE_NEWNS,
            setgroups_path: c_str("/proc/self/setgroups")?,
            uid_map_path: c_str("/proc/self/uid_map")?,
            gid_map_path: c_str("/proc/self/gid_map")?,
            uid_map: format!("{uid} {uid} 1").into_bytes(),
            gid_map: format!("{gid} {gid} 1").into_bytes(),
            root: c_str("/")?,
            tmpfs: c_str("tmpfs")?,
            tmpfs_options: c_str("mode=000,size=4k,nr_inodes=1")?,
            dev_null: c_str("/dev/null")?,
            home: None,
            splits: Vec::new(),
            covers: Vec::new(),
            overlay: None,
            base: None,
            hang: false,
        })
    }

    /// What keys the view [`Setup::new`] would plan: see [`held`].
    pub(super) fn key(
        sandbox: Sandbox,
        paths: &SandboxPaths,
        workspace: &Path,
        tmp: &Path,
        base: Option<&layer::LayerView>,
    ) -> held::Key {
        let mut key = held::Key::new(!sandbox.allow_network);
        if let Some(base) = base {
            key.push_id(base.id());
        }
        key.push_path(workspace);
        key.push_path(tmp);
        // As given, each with the identity of what it leads to now: a symlink pointed elsewhere
        // changes the key, and no path is resolved component by component on every command.
        for path in &paths.hidden {
            key.push_path(path);
        }
        if let Some(view) = &paths.home {
            key.push_path(&view.dir);
            for entry in &view.allow {
                key.push_path(entry);
            }
        }
        key
    }

    /// Whether the view has a network namespace of its own.
    pub(crate) fn has_own_network(&self) -> bool {
        self.unshare & libc::CLONE_NEWNET != 0
    }

    /// Enters the session's layer's user and mount namespaces, for a view made over it: first,
    /// while the holder still has the descriptors that name them.
    ///
    /// # Safety
    /// In a forked child of the daemon (single-threaded), before it exits: system calls only.
    pub(crate) unsafe fn enter_base(&self) -> io::Result<()> {
        let Some(base) = &self.base else {
            return Ok(());
        };
        // SAFETY: setns on descriptors the layer holds open.
        unsafe {
            Layer::Namespaces.tag(check(libc::setns(base.held.user(), libc::CLONE_NEWUSER)))?;
            Layer::Namespaces.tag(check(libc::setns(base.held.mnt(), libc::CLONE_NEWNS)))
        }
    }

    /// Makes the view's namespaces and mounts. Runs in the holder process, forked from the
    /// daemon: system calls only, on what [`Setup::new`] made ready.
    ///
    /// # Safety
    /// In a forked child of the daemon, before it exits: system calls only.
    pub(crate) unsafe fn enter(&mut self) -> io::Result<()> {
        // SAFETY: each call below is a plain system call on pointers to memory this value owns
        // (NUL-terminated strings, byte buffers) that outlives the call.
        unsafe {
            Layer::Namespaces.tag(check(libc::unshare(self.unshare)))?;
            if self.base.is_none() {
                // Writing "deny" is refused where it is not needed (a privileged caller).
                let _ = write_file(&self.setgroups_path, b"deny");
                Layer::Namespaces.tag(write_file(&self.uid_map_path, &self.uid_map))?;
                Layer::Namespaces.tag(write_file(&self.gid_map_path, &self.gid_map))?;
            }
            // Nothing mounted here propagates back to the daemon's namespace.
            Layer::Mounts.tag(check(libc::mount(
                std::ptr::null(),
                self.root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )))?;
            // The layer first: it reads its lower and upper directories where they are (in the
            // daemon's home), before the covers hide them.
            if let Some(overlay) = &self.overlay {
                Layer::Overlay.tag(overlay.mount())?;
            }
            if let Some(home) = &mut self.home {
                Layer::HomeCover.tag(home.take())?;
                Layer::HomeCover.tag(home.mount())?;
            }
            for split in &mut self.splits {
                Layer::Mounts.tag(split.take())?;
                Layer::Mounts.tag(split.mount())?;
            }
            Layer::Mounts.tag(self.mount_covers())
        }
    }

    /// Covers each hidden path: an empty read-only tmpfs over a directory, `/dev/null` over a
    /// file. Each is mounted on a descriptor, never by path: the path is opened without
    /// following a symlink anywhere along it, and what it opens must be what was planned (the
    /// same device and inode). An entry swapped since the plan (a symlink put in its place, the
    /// directory moved and another made) fails the view with `ESTALE`: the command does not
    /// run, rather than run with a cover landed elsewhere or missing.
    ///
    /// # Safety
    /// In the view's mount namespace, in a forked child: system calls only.
    unsafe fn mount_covers(&self) -> io::Result<()> {
        // SAFETY: plain system calls on NUL-terminated strings and buffers this function or
        // this value owns.
        unsafe {
            for cover in &self.covers {
                let fd = cover.open()?;
                // `/proc/self/fd/N`: mount(2) reaches the object the descriptor holds.
                let mut target = [0u8; 32];
                fd_path(fd, &mut target);
                let mounted = if cover.dir {
                    check(libc::mount(
                        self.tmpfs.as_ptr(),
                        target.as_ptr().cast(),
                        self.tmpfs.as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        self.tmpfs_options.as_ptr().cast(),
                    ))
                } else {
                    check(libc::mount(
                        self.dev_null.as_ptr(),
                        target.as_ptr().cast(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ))
                };
                libc::close(fd);
                mounted?;
            }
        }
        Ok(())
    }
}

/// The hidden paths that exist, canonical.
pub(crate) fn hidden(paths: &SandboxPaths) -> Vec<PathBuf> {
    paths
        .hidden
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect()
}
