//! An isolated child's view of its workspace: a copy-on-write layer (overlayfs) over its batch's
//! snapshot, mounted at the workspace's own path (docs/contracts.md, "Isolation").
//!
//! The layer is mounted by a holder process in the child's view ([`super::held`]), so every
//! `Bash` command of the child enters a mount namespace where the workspace path shows the
//! snapshot and the child's own edits, never the live workspace nor a sibling's. The file tools
//! run in the daemon, which cannot see that mount by path; it opens the mounted directory through
//! the holder's `/proc/PID/root` while the holder still lives and keeps that descriptor. Paths
//! beneath `/proc/self/fd/N` then reach the layer, and [`crate::Workspace`] resolves them with
//! `openat2(RESOLVE_BENEATH)` so that nothing leads out of it. One mount (one overlay
//! superblock) serves both, so a file `Edit` wrote is what `cat` reads, and the reverse.
//!
//! The workspace's `.git/`, if it has one, is bound read-only over the layer.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    Sandbox, SandboxError, SandboxMode, SandboxPaths, Setup, c_path, c_str, check, held,
    remount_read_only,
};

/// The directories of one child's layer, all on one file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerDirs {
    /// The batch's snapshot: read-only to the child.
    pub lower: PathBuf,
    /// What the child wrote: whole files, whiteouts for what it removed.
    pub upper: PathBuf,
    /// overlayfs's own scratch directory.
    pub work: PathBuf,
}

impl LayerDirs {
    /// Makes the upper and work directories if they are missing (a resumed child finds its own).
    pub fn create(&self) -> io::Result<()> {
        std::fs::create_dir_all(&self.upper)?;
        std::fs::create_dir_all(&self.work)
    }
}

/// The layer's mount, prepared in the daemon and made in the holder.
pub(crate) struct Mount {
    overlay: CString,
    target: CString,
    options: CString,
    /// The workspace's `.git/`, bound read-only over the layer.
    git: Option<CString>,
}

impl Mount {
    fn new(dirs: &LayerDirs, workspace: &Path) -> Result<Mount, SandboxError> {
        // No inode index: a second mount of the same upper directory (a leftover command of a
        // crashed daemon still holding the last one) is refused by the index where it is on.
        let mut options = String::from("userxattr,index=off");
        for (key, dir) in [
            ("lowerdir", &dirs.lower),
            ("upperdir", &dirs.upper),
            ("workdir", &dirs.work),
        ] {
            let text = dir.to_str().ok_or_else(|| {
                SandboxError::Prepare(format!("{} is not valid UTF-8", dir.display()))
            })?;
            // overlayfs splits its options at commas and its lower directories at colons.
            if text.contains([',', ':', '\\']) {
                return Err(SandboxError::Prepare(format!(
                    "the layer's directory {text} holds a comma, colon or backslash, which \
                     overlayfs cannot take; give the daemon a home whose path has none"
                )));
            }
            options.push_str(&format!(",{key}={text}"));
        }
        let git = workspace.join(".git");
        let git = if dirs.lower.join(".git").is_dir() {
            Some(c_path(&git)?)
        } else {
            None
        };
        Ok(Mount {
            overlay: c_str("overlay")?,
            target: c_path(workspace)?,
            options: c_str(&options)?,
            git,
        })
    }

    /// Mounts the layer over the workspace, then `.git/` read-only over it.
    ///
    /// # Safety
    /// In the holder, forked from the daemon, in its own mount namespace: system calls only.
    pub(crate) unsafe fn mount(&self) -> io::Result<()> {
        // SAFETY: plain system calls on NUL-terminated strings this value owns.
        unsafe {
            check(libc::mount(
                self.overlay.as_ptr(),
                self.target.as_ptr(),
                self.overlay.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.options.as_ptr().cast(),
            ))?;
            if let Some(git) = &self.git {
                check(libc::mount(
                    git.as_ptr(),
                    git.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                remount_read_only(git)?;
            }
        }
        Ok(())
    }
}

/// A child's view with its layer mounted: the namespaces its commands enter and a descriptor of
/// the layer's root that the file tools reach it through.
#[derive(Debug)]
pub struct LayerView {
    pub(crate) held: Arc<held::Held>,
    root: OwnedFd,
    /// `/proc/self/fd/N` for `root`: a path that leads into the layer from the daemon.
    through: PathBuf,
    /// The workspace's path, where the layer is mounted in the view.
    workspace: PathBuf,
    /// The layer's upper directory: what the child wrote.
    upper: PathBuf,
}

impl LayerView {
    /// Makes the view of a child working in `workspace` (canonical) over `dirs`, hiding what
    /// `paths` hides. Isolation needs the namespaces of a sandboxed mode: `full-access` is
    /// refused.
    pub fn open(
        sandbox: Sandbox,
        paths: &SandboxPaths,
        workspace: &Path,
        dirs: &LayerDirs,
    ) -> Result<LayerView, SandboxError> {
        if sandbox.mode == SandboxMode::FullAccess {
            return Err(SandboxError::Prepare(
                "isolation needs a sandboxed session (read-only or workspace-write): a \
                 full-access session's commands run in the daemon's own view of the files"
                    .into(),
            ));
        }
        dirs.create().map_err(|e| {
            SandboxError::Prepare(format!("cannot create {}: {e}", dirs.upper.display()))
        })?;
        super::make_private(&paths.tmp)?;
        let workspace = super::canonical(workspace)?;
        let tmp = super::canonical(&paths.tmp)?;
        // The child's temporary directory is one of its own inside its session's, which the
        // view keeps readable whole: hiding each sibling's one by one would cost a mount per
        // sibling in every child's view. Landlock still lets it write in its own alone.
        let session_tmp = tmp.parent().unwrap_or(&tmp).to_path_buf();
        let mut setup = Setup::new(sandbox, paths, &workspace, &session_tmp)?;
        setup.overlay = Some(Mount::new(dirs, &workspace)?);
        let (held, root) = held::hold(setup, Some(&workspace))?;
        let root = root
            .ok_or_else(|| SandboxError::Prepare("the layer's root was not opened".to_owned()))?;
        let through = PathBuf::from(format!("/proc/self/fd/{}", root.as_raw_fd()));
        Ok(LayerView {
            held: Arc::new(held),
            root,
            through,
            workspace,
            upper: dirs.upper.clone(),
        })
    }

    /// A path that leads into the layer's root from the daemon (`/proc/self/fd/N`).
    pub fn through(&self) -> &Path {
        &self.through
    }

    /// The layer's root, for `openat2`.
    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The workspace's path, where commands see the layer.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The layer's upper directory, which holds what the child wrote.
    pub fn upper(&self) -> &Path {
        &self.upper
    }
}
