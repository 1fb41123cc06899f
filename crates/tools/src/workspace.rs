//! Workspace confinement: every path a tool touches is resolved here, and nothing outside the
//! session's workspace root comes back.
//!
//! The check runs on *canonical* paths (symlinks and `..` resolved by the kernel) and compares
//! them component by component with `Path::starts_with`, so `/ws-secret` is never "inside" `/ws`.
//! A path that does not exist yet is checked through its deepest existing ancestor; the missing
//! components below it must be plain names (a `..` there cannot be checked, so it is refused).
//!
//! The check and the later open are two system calls, and a process sharing the workspace (a
//! command of the session) may swap a checked directory for a symlink in between. So the tools
//! open what was resolved beneath the root's descriptor with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` ([`Workspace::open_beneath`]; the resolved path has no link on it) and
//! make missing directories one `mkdirat` at a time beneath it
//! ([`Workspace::create_dirs_beneath`]): a swap fails the call instead of leading it out.
//! Grep reads each file its walk lists the same way. Glob only lists names: a swap racing its
//! walk could make it list a directory elsewhere (names, never contents).

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

use crate::error::ToolError;
use crate::sandbox::layer::LayerView;
use crate::wall::Wall;

/// What the caller means to do with a path, which decides whether it must already exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The path must exist.
    Read,
    /// The path may not exist yet, nor may its parent directories.
    Write,
}

/// A canonical workspace root that paths are resolved against and confined to: the live
/// workspace, or an isolated child's layer mounted at its path ([`Workspace::layered`]).
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    layer: Option<Arc<LayerView>>,
    /// What the session's sandbox hides, hidden from the tools too; `None`: nothing beyond the
    /// root's bounds (`full-access`).
    wall: Option<Arc<Wall>>,
}

impl PartialEq for Workspace {
    fn eq(&self, other: &Workspace) -> bool {
        self.root == other.root
            && self.wall == other.wall
            && match (&self.layer, &other.layer) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for Workspace {}

impl Workspace {
    /// Canonicalizes `root` once; every later check compares against this canonical form.
    pub fn new(root: impl AsRef<Path>) -> Result<Workspace, ToolError> {
        let given = root.as_ref();
        let root = fs::canonicalize(given).map_err(|source| ToolError::BadRoot {
            root: given.to_path_buf(),
            source,
        })?;
        if !root.is_dir() {
            return Err(ToolError::BadRoot {
                root,
                source: std::io::Error::other("not a directory"),
            });
        }
        Ok(Workspace {
            root,
            layer: None,
            wall: None,
        })
    }

    /// A session's workspace at the canonical path stored when the session was created,
    /// **pinned**: no component of it may have become a symbolic link since (the kernel opens
    /// it with `RESOLVE_NO_SYMLINKS`), so a link planted later cannot point the session at
    /// another directory. A workspace replaced that way, removed, or no longer a directory fails
    /// with [`ToolError::Replaced`].
    pub fn pinned(root: impl AsRef<Path>) -> Result<Workspace, ToolError> {
        let root = root.as_ref();
        let replaced = |reason: String| ToolError::Replaced {
            root: root.to_path_buf(),
            reason,
        };
        if !root.is_absolute() {
            return Err(replaced("its stored path is not absolute".into()));
        }
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        match openat2(nix::fcntl::AT_FDCWD, root, how) {
            Ok(_) => {}
            Err(Errno::ELOOP) => {
                return Err(replaced(
                    "a component of its path is now a symbolic link, which forkd does not follow"
                        .into(),
                ));
            }
            Err(Errno::ENOENT) => return Err(replaced("it no longer exists".into())),
            Err(Errno::ENOTDIR) => return Err(replaced("it is no longer a directory".into())),
            Err(errno) => return Err(replaced(std::io::Error::from(errno).to_string())),
        }
        Ok(Workspace {
            root: root.to_path_buf(),
            layer: None,
            wall: None,
        })
    }

    /// Opens the directory `rel` beneath the root, the kernel resolving it there
    /// (`RESOLVE_BENEATH`: neither `..` nor a symlink leads out): for what forkd itself reads
    /// from a workspace, such as its agent type files. `Ok(None)` when it does not exist.
    pub fn open_dir(&self, rel: &Path) -> Result<Option<std::os::fd::OwnedFd>, ToolError> {
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let opened = match &self.layer {
            // A layer's root is reached through its descriptor, not by the path views see.
            Some(layer) => openat2(layer.root_fd(), rel, how),
            None => {
                let root = fs::File::open(&self.root).map_err(|source| ToolError::BadRoot {
                    root: self.root.clone(),
                    source,
                })?;
                openat2(&root, rel, how)
            }
        };
        match opened {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::EXDEV) => Err(ToolError::OutsideWorkspace {
                path: rel.display().to_string(),
                resolved: self.root.join(rel),
                root: self.root.clone(),
            }),
            Err(errno) => Err(ToolError::Unresolvable {
                path: rel.display().to_string(),
                source: std::io::Error::from(errno),
            }),
        }
    }

    /// The same workspace behind `wall`: what the session's sandbox hides is hidden from every
    /// path resolved and every directory walked here.
    #[must_use]
    pub fn walled(self, wall: Wall) -> Workspace {
        Workspace {
            wall: Some(Arc::new(wall)),
            ..self
        }
    }

    /// The wall, if the session has one.
    pub fn wall(&self) -> Option<&Wall> {
        self.wall.as_deref()
    }

    /// Where `path` (as the tools reach it: through an isolated child's layer, or directly) is
    /// at the workspace's own path, as the session's commands see it.
    fn seen_at(&self, path: &Path) -> PathBuf {
        match &self.layer {
            Some(layer) => match path.strip_prefix(layer.through()) {
                Ok(rel) => self.root.join(rel),
                Err(_) => path.to_path_buf(),
            },
            None => path.to_path_buf(),
        }
    }

    /// Whether the wall hides `path` (as [`Workspace::resolve`] returns it).
    pub fn hides(&self, path: &Path) -> bool {
        self.wall
            .as_ref()
            .is_some_and(|wall| wall.hides(&self.seen_at(path)))
    }

    /// Whether a walk may go into the directory `dir` (as [`Workspace::resolve`] returns it).
    pub fn enters(&self, dir: &Path) -> bool {
        self.wall
            .as_ref()
            .is_none_or(|wall| wall.enters(&self.seen_at(dir)))
    }

    /// `resolved` if the wall does not hide it.
    fn behind_wall(&self, path: &str, resolved: PathBuf) -> Result<PathBuf, ToolError> {
        if self.hides(&resolved) {
            return Err(ToolError::Hidden {
                path: path.to_owned(),
            });
        }
        Ok(resolved)
    }

    /// An isolated child's workspace: its layer, seen at the workspace's path. Paths resolve to
    /// places beneath the layer's root as the daemon reaches it ([`LayerView::through`]).
    pub fn layered(layer: Arc<LayerView>) -> Workspace {
        Workspace {
            root: layer.workspace().to_path_buf(),
            layer: Some(layer),
            wall: None,
        }
    }

    /// The canonical root: the path the model and commands see.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The child's layer, for an isolated child.
    pub fn layer(&self) -> Option<&Arc<LayerView>> {
        self.layer.as_ref()
    }

    /// Resolves `path` (relative to the root, or absolute) to a canonical path inside the
    /// workspace. With [`Access::Write`] the result may not exist yet: it is then the canonical
    /// deepest existing ancestor joined with the missing plain components.
    pub fn resolve(&self, path: &str, intent: Access) -> Result<PathBuf, ToolError> {
        if path.is_empty() {
            return Err(ToolError::EmptyPath);
        }
        if path.contains('\0') {
            return Err(ToolError::NulByte {
                path: path.to_owned(),
            });
        }
        if let Some(layer) = &self.layer {
            let resolved = self.resolve_in(layer, path, intent)?;
            return self.behind_wall(path, resolved);
        }
        // `join` replaces the root when `path` is absolute, which is what we want.
        let joined = self.root.join(path);
        let (existing, missing) = split_existing(&joined);
        let canonical = fs::canonicalize(existing).map_err(|source| ToolError::Unresolvable {
            path: path.to_owned(),
            source,
        })?;
        if !canonical.starts_with(&self.root) {
            return Err(ToolError::OutsideWorkspace {
                path: path.to_owned(),
                resolved: canonical.join(missing),
                root: self.root.clone(),
            });
        }
        let plain = missing
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !plain {
            return Err(ToolError::UncheckableDotDot {
                path: path.to_owned(),
                root: self.root.clone(),
            });
        }
        if missing.as_os_str().is_empty() {
            // Not `join("")`, which would append a trailing `/` and make a file look like a
            // directory to `open`.
            return self.behind_wall(path, canonical);
        }
        // Hidden or missing tell nothing apart: a hidden place is refused either way.
        let resolved = self.behind_wall(path, canonical.join(missing))?;
        if intent == Access::Read {
            return Err(ToolError::NotFound {
                path: path.to_owned(),
            });
        }
        Ok(resolved)
    }

    /// [`Workspace::resolve`] in a layer: the kernel resolves the path beneath the layer's root
    /// (`openat2` with `RESOLVE_BENEATH`), so neither `..` nor a symlink leads out of it, nor to
    /// the live workspace an absolute symlink would name in the daemon's view. An absolute
    /// symlink is refused even where it names a path inside: it cannot be followed safely from
    /// the daemon. Writes beneath `.git/` are refused: it is read-only in a child.
    fn resolve_in(
        &self,
        layer: &LayerView,
        path: &str,
        intent: Access,
    ) -> Result<PathBuf, ToolError> {
        let joined = self.root.join(path);
        let outside = || ToolError::OutsideWorkspace {
            path: path.to_owned(),
            resolved: joined.clone(),
            root: self.root.clone(),
        };
        let rel = joined.strip_prefix(&self.root).map_err(|_| outside())?;
        let parts: Vec<Component> = rel
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect();
        let open = |prefix: &[Component]| -> nix::Result<std::os::fd::OwnedFd> {
            let sub: PathBuf = prefix.iter().collect();
            let sub = if sub.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                sub
            };
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            openat2(layer.root_fd(), &sub, how)
        };
        let unresolvable = |errno: Errno| match errno {
            Errno::EXDEV => outside(),
            errno => ToolError::Unresolvable {
                path: path.to_owned(),
                source: std::io::Error::from(errno),
            },
        };
        // The deepest prefix that exists (the whole path, for a read).
        let mut existing = parts.len();
        let found = loop {
            match open(&parts[..existing]) {
                Ok(fd) => break fd,
                Err(Errno::ENOENT) if existing > 0 && intent == Access::Write => existing -= 1,
                Err(Errno::ENOENT) => {
                    return Err(ToolError::NotFound {
                        path: path.to_owned(),
                    });
                }
                Err(errno) => return Err(unresolvable(errno)),
            }
        };
        let missing = &parts[existing..];
        if !missing.iter().all(|c| matches!(c, Component::Normal(_))) {
            return Err(ToolError::UncheckableDotDot {
                path: path.to_owned(),
                root: self.root.clone(),
            });
        }
        if let Some(first) = missing.first() {
            // A dangling symlink "exists" to a write, which would follow it anywhere.
            let dir = layer
                .through()
                .join(parts[..existing].iter().collect::<PathBuf>());
            if fs::symlink_metadata(dir.join(first)).is_ok() {
                return Err(ToolError::rejected(format!(
                    "{path} is a symbolic link that leads nowhere inside the workspace; \
                     refusing to write through it"
                )));
            }
        }
        // Where the existing part really is (its `..` and relative symlinks resolved), as the
        // kernel names the descriptor: permission rules match that place, as they match the
        // canonical path outside a layer.
        use std::os::fd::AsRawFd;
        let named = fs::read_link(format!("/proc/self/fd/{}", found.as_raw_fd())).ok();
        let real = named
            .as_deref()
            .and_then(|n| n.strip_prefix(&self.root).ok())
            .map(Path::to_path_buf)
            .ok_or_else(|| ToolError::Unresolvable {
                path: path.to_owned(),
                source: std::io::Error::other("its place in the child's copy cannot be named"),
            })?;
        let rel: PathBuf = real.components().chain(missing.iter().copied()).collect();
        // (A session's own layer has its `.git/` as any workspace does.)
        if intent == Access::Write
            && !layer.is_shared()
            && rel.components().next() == Some(Component::Normal(std::ffi::OsStr::new(".git")))
        {
            return Err(ToolError::rejected(format!(
                "{path} is beneath .git/, which is read-only in an isolated child: commit \
                 nothing there; forkd keeps your changes as a diff"
            )));
        }
        Ok(layer.through().join(rel))
    }

    /// `path` relative to the root for display and for `files_changed` (`.` for the root
    /// itself); a path outside the root is shown whole.
    pub fn relative(&self, path: &Path) -> String {
        let base = match &self.layer {
            Some(layer) if path.starts_with(layer.through()) => layer.through(),
            _ => self.root.as_path(),
        };
        match path.strip_prefix(base) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.to_string_lossy().into_owned(),
            Err(_) => path.to_string_lossy().into_owned(),
        }
    }
}

impl Workspace {
    /// The root as the daemon reaches it: the layer's descriptor, or the root opened now
    /// without following a link anywhere on its path.
    fn root_dir(&self) -> Result<RootDir<'_>, Errno> {
        match &self.layer {
            Some(layer) => Ok(RootDir::Layer(layer.root_fd())),
            None => {
                let how = OpenHow::new()
                    .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                    .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
                openat2(nix::fcntl::AT_FDCWD, &self.root, how).map(RootDir::Opened)
            }
        }
    }

    /// `path` (as [`Workspace::resolve`] returned it) relative to the root as the daemon
    /// reaches it.
    fn beneath<'p>(&self, path: &'p Path) -> Result<&'p Path, Errno> {
        let base = match &self.layer {
            Some(layer) => layer.through(),
            None => self.root.as_path(),
        };
        path.strip_prefix(base).map_err(|_| Errno::EXDEV)
    }

    /// Opens `path` (as [`Workspace::resolve`] returned it: canonical, no link on it) beneath
    /// the root, following no link on the way: a directory swapped for a link since it was
    /// resolved fails the open (`ELOOP`) instead of leading the daemon out of the workspace.
    /// Nor is a FIFO, socket or device swapped in waited on: the open does not block, and what
    /// it opens must be a file or a directory (`ENXIO` otherwise) — a FIFO no one writes would
    /// hold one of the runtime's blocking threads for good.
    pub(crate) fn open_beneath(
        &self,
        path: &Path,
        flags: OFlag,
    ) -> Result<std::os::fd::OwnedFd, Errno> {
        let rel = self.beneath(path)?;
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let mut how =
            OpenHow::new().flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK);
        if flags.contains(OFlag::O_CREAT) {
            // openat2 takes a mode only with O_CREAT.
            how = how.mode(nix::sys::stat::Mode::from_bits_truncate(0o644));
        }
        let how = how.resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        let fd = match self.root_dir()? {
            RootDir::Layer(fd) => openat2(fd, rel, how)?,
            RootDir::Opened(fd) => openat2(&fd, rel, how)?,
        };
        let kind = nix::sys::stat::fstat(&fd)?.st_mode & libc::S_IFMT;
        if kind != libc::S_IFREG && kind != libc::S_IFDIR {
            return Err(Errno::ENXIO);
        }
        // A regular file's reads and writes never block; the flag is dropped all the same.
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = OFlag::from_bits_truncate(flags) - OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        Ok(fd)
    }

    /// Makes the directories of `dir` (as [`Workspace::resolve`] returned it) that are missing,
    /// one at a time beneath the root, following no link: what exists must be a directory.
    pub(crate) fn create_dirs_beneath(&self, dir: &Path) -> Result<(), Errno> {
        use nix::sys::stat::{Mode, mkdirat};
        let rel = self.beneath(dir)?;
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
        let root = self.root_dir()?;
        let mut current = match &root {
            RootDir::Layer(fd) => openat2(*fd, ".", how)?,
            RootDir::Opened(fd) => openat2(fd, ".", how)?,
        };
        for part in rel.components() {
            let Component::Normal(name) = part else {
                return Err(Errno::EINVAL);
            };
            match mkdirat(&current, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
            current = openat2(&current, name, how)?;
        }
        Ok(())
    }
}

/// The root a tool opens beneath.
enum RootDir<'a> {
    Layer(std::os::fd::BorrowedFd<'a>),
    Opened(std::os::fd::OwnedFd),
}

/// Splits `path` into its deepest ancestor that exists (as an entry, possibly a dangling
/// symlink, which canonicalization then refuses) and the components below it.
fn split_existing(path: &Path) -> (&Path, &Path) {
    for ancestor in path.ancestors() {
        // lstat, not stat: a dangling symlink must count as existing, or a write "through" it
        // would be checked against its parent and then follow the link anywhere.
        if fs::symlink_metadata(ancestor).is_ok() {
            let missing = path.strip_prefix(ancestor).unwrap_or(Path::new(""));
            return (ancestor, missing);
        }
    }
    // Unreachable for absolute paths (`/` exists); canonicalization reports anything else.
    (path, Path::new(""))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ws() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        (dir, ws)
    }

    #[test]
    fn relative_and_absolute_paths_inside_resolve_to_the_same_place() {
        let (_dir, ws) = ws();
        fs::write(ws.root().join("a.txt"), "x").unwrap();
        let rel = ws.resolve("a.txt", Access::Read).unwrap();
        let abs = ws
            .resolve(ws.root().join("a.txt").to_str().unwrap(), Access::Read)
            .unwrap();
        assert_eq!(rel, abs);
        assert_eq!(rel.as_os_str(), ws.root().join("a.txt").as_os_str());
        assert_eq!(ws.relative(&rel), "a.txt");
        assert_eq!(ws.relative(ws.root()), ".");
    }

    #[test]
    fn a_fifo_swapped_in_is_refused_at_once_for_reading_and_writing() {
        let (_dir, ws) = ws();
        let pipe = ws.root().join("p");
        nix::unistd::mkfifo(&pipe, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Without O_NONBLOCK each open would wait for a writer (or a reader) forever.
        assert_eq!(
            ws.open_beneath(&pipe, OFlag::O_RDONLY).unwrap_err(),
            Errno::ENXIO
        );
        assert_eq!(
            ws.open_beneath(&pipe, OFlag::O_WRONLY).unwrap_err(),
            Errno::ENXIO
        );
        fs::write(ws.root().join("f"), "x").unwrap();
        let fd = ws
            .open_beneath(&ws.root().join("f"), OFlag::O_RDONLY)
            .unwrap();
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert!(!OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK));
    }

    #[test]
    fn a_write_may_create_missing_directories() {
        let (_dir, ws) = ws();
        let path = ws.resolve("new/deeper/file.rs", Access::Write).unwrap();
        assert_eq!(path, ws.root().join("new/deeper/file.rs"));
        let err = ws.resolve("new/deeper/file.rs", Access::Read).unwrap_err();
        assert!(matches!(err, ToolError::NotFound { .. }), "{err}");
    }

    #[test]
    fn dot_dot_below_a_missing_directory_is_refused() {
        let (_dir, ws) = ws();
        let err = ws.resolve("missing/../x", Access::Write).unwrap_err();
        assert!(matches!(err, ToolError::UncheckableDotDot { .. }), "{err}");
    }

    #[test]
    fn dot_dot_that_stays_inside_is_fine() {
        let (_dir, ws) = ws();
        fs::create_dir(ws.root().join("sub")).unwrap();
        let path = ws.resolve("sub/../top.txt", Access::Write).unwrap();
        assert_eq!(path, ws.root().join("top.txt"));
    }

    #[test]
    fn empty_and_nul_paths_are_refused() {
        let (_dir, ws) = ws();
        assert!(matches!(
            ws.resolve("", Access::Write),
            Err(ToolError::EmptyPath)
        ));
        assert!(matches!(
            ws.resolve("a\0b", Access::Write),
            Err(ToolError::NulByte { .. })
        ));
    }

    #[test]
    fn a_dangling_symlink_is_refused_rather_than_written_through() {
        let (_dir, ws) = ws();
        std::os::unix::fs::symlink("/nonexistent-forkd-target", ws.root().join("dangling"))
            .unwrap();
        let err = ws.resolve("dangling", Access::Write).unwrap_err();
        assert!(matches!(err, ToolError::Unresolvable { .. }), "{err}");
    }

    #[test]
    fn the_root_must_be_a_directory() {
        let (dir, _ws) = ws();
        let file = dir.path().join("f");
        fs::write(&file, "").unwrap();
        assert!(matches!(
            Workspace::new(&file),
            Err(ToolError::BadRoot { .. })
        ));
        assert!(Workspace::new(dir.path().join("missing")).is_err());
    }
}
