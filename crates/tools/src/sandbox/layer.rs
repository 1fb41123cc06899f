//! An isolated child's view of its workspace: a copy-on-write layer (overlayfs) over its batch's
//! snapshot, mounted at the workspace's own path (docs/contracts.md, "Isolation"). And a
//! session's own workspace over an uploaded tree (docs/contracts.md, "Uploaded workspaces"):
//! the same kind of layer over the tree this daemon keeps read-only, mounted once for the
//! session at its fixed path beneath [`VIEW_ROOT`] in a held namespace that every view of the
//! session enters ([`LayerView::session`]) — one overlay superblock for all its commands and
//! file tools, as two mounts of one upper directory must never be.
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
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::{
    Sandbox, SandboxError, SandboxMode, SandboxPaths, Setup, c_path, c_str, check, held,
    remount_read_only,
};

/// Where sessions made from uploads see their workspaces: `/forkd/workspaces/SESSION_ID`, the
/// same path on every daemon. The directory exists, empty, on the machine; in a session's views
/// a private tmpfs covers it, holding the session's own workspace alone.
pub const VIEW_ROOT: &str = "/forkd/workspaces";

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
    /// Where the mountpoint is made in the view, for a workspace that exists only there
    /// (beneath [`VIEW_ROOT`]): its parent, covered by a private tmpfs (made read-only once the
    /// layer is on), and that tmpfs's options.
    place: Option<(CString, CString)>,
}

/// Whether `workspace` lies beneath [`VIEW_ROOT`]: a path only views have, never looked up
/// here (whatever is at it on this machine, a link planted there included, is covered).
pub(crate) fn in_view_root(workspace: &Path) -> bool {
    workspace.starts_with(VIEW_ROOT)
}

impl Mount {
    /// The layer of `dirs` at `workspace`; `place`: the directory its views cover with a
    /// tmpfs to make the mountpoint in (the workspace's parent), for a workspace that exists
    /// only in views.
    fn new(
        dirs: &LayerDirs,
        workspace: &Path,
        place: Option<&Path>,
    ) -> Result<Mount, SandboxError> {
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
        let place = match place {
            Some(parent) => Some((c_path(parent)?, c_str("mode=0755,size=16k,nr_inodes=16")?)),
            None => None,
        };
        Ok(Mount {
            overlay: c_str("overlay")?,
            target: c_path(workspace)?,
            options: c_str(&options)?,
            git,
            place,
        })
    }

    /// Mounts the layer over the workspace, then `.git/` read-only over it.
    ///
    /// # Safety
    /// In the holder, forked from the daemon, in its own mount namespace: system calls only.
    pub(crate) unsafe fn mount(&self) -> io::Result<()> {
        // SAFETY: plain system calls on NUL-terminated strings this value owns.
        unsafe {
            if let Some((parent, options)) = &self.place {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    parent.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    options.as_ptr().cast(),
                ))?;
                check(libc::mkdir(self.target.as_ptr(), 0o755))?;
            }
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
            if let Some((parent, _)) = &self.place {
                remount_read_only(parent)?;
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
    /// `/proc/PID/fd/N` for `root`: a path that leads into the layer from the daemon and the
    /// processes it starts.
    through: PathBuf,
    /// The workspace's path, where the layer is mounted in the view.
    workspace: PathBuf,
    /// The layer's upper directory: what the child wrote.
    upper: PathBuf,
    /// A session's layer, which each of its views enters ([`LayerView::session`]), rather than
    /// an isolated child's, which is its view.
    shared: bool,
    /// Tells layers apart in the keys of the views made over them.
    id: u64,
}

/// The next layer's [`LayerView::id`].
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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
        let workspace = super::seen_path(workspace)?;
        let tmp = super::canonical(&paths.tmp)?;
        // The child's temporary directory is one of its own in a folder of its session's
        // children's (beside the session's own, out of the reach of its commands), which the
        // view keeps readable whole: hiding each sibling's one by one would cost a mount per
        // sibling in every child's view. Landlock still lets it write in its own alone.
        let session_tmp = tmp.parent().unwrap_or(&tmp).to_path_buf();
        let mut setup = Setup::new(sandbox, paths, &workspace, &session_tmp, None)?;
        // A child of a session made from an upload: its copy at the session's path, which
        // exists only in views.
        let place = in_view_root(&workspace)
            .then(|| workspace.parent())
            .flatten();
        setup.overlay = Some(Mount::new(dirs, &workspace, place)?);
        Self::hold(setup, workspace, dirs, false)
    }

    /// Makes a session's layer over `dirs` (its lower directory: the tree this daemon keeps
    /// read-only) at `workspace`, in a directory that exists here (its parent: [`VIEW_ROOT`],
    /// or a test's) and that the layer's namespaces cover with a private tmpfs holding only the
    /// mountpoint, so nothing at `workspace` here (a link planted there) is ever looked at. The
    /// layer is alone in namespaces of its own, with nothing covered; each view of the session
    /// enters them before it covers what it hides. Dropped with its last view and workspace, the
    /// mount goes with it; a later one mounts it again.
    pub fn session(workspace: &Path, dirs: &LayerDirs) -> Result<LayerView, SandboxError> {
        let plain = workspace.is_absolute()
            && workspace
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        let parent = workspace.parent().filter(|p| plain && p.parent().is_some());
        let Some(parent) = parent else {
            return Err(SandboxError::Prepare(format!(
                "a session's layer needs a plain absolute path in a directory: {}",
                workspace.display()
            )));
        };
        dirs.create().map_err(|e| {
            SandboxError::Prepare(format!("cannot create {}: {e}", dirs.upper.display()))
        })?;
        let mut setup = Setup::layer_only()?;
        setup.overlay = Some(Mount::new(dirs, workspace, Some(parent))?);
        Self::hold(setup, workspace.to_path_buf(), dirs, true)
    }

    fn hold(
        setup: Setup,
        workspace: PathBuf,
        dirs: &LayerDirs,
        shared: bool,
    ) -> Result<LayerView, SandboxError> {
        let (held, root) = held::hold(setup, Some(&workspace))?;
        let root = root
            .ok_or_else(|| SandboxError::Prepare("the layer's root was not opened".to_owned()))?;
        // By the daemon's pid, not `self`: the processes it starts (`cp`, `git merge-file`)
        // reach the layer by the same path.
        let through = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            root.as_raw_fd()
        ));
        Ok(LayerView {
            held: Arc::new(held),
            root,
            through,
            workspace,
            upper: dirs.upper.clone(),
            shared,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether this is a session's layer (its views enter it), not an isolated child's.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// A path that leads into the layer's root from the daemon (`/proc/PID/fd/N`).
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
