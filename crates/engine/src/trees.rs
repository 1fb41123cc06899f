//! Uploaded trees this daemon keeps, and the layers of the sessions made from them
//! (docs/contracts.md, "Uploaded workspaces").
//!
//! An upload a session starts from is written out once per daemon, into `FORKD_HOME/trees/ID`
//! (hidden from every view with the home), and kept read-only: nothing writes there again. A
//! session made from it gets an upper and a work directory of its own,
//! `workspaces_dir/SESSION_ID/{upper,work}`, beside a `tree` file naming the upload, and its
//! workspace is `/forkd/workspaces/SESSION_ID` ([`VIEW_ROOT`]): the same path on every daemon,
//! which exists only in the session's views, where the tree and the session's edits are one
//! overlay ([`LayerView::session`]). Making such a session copies nothing.
//!
//! One overlay per session at a time: the layer is made once and shared (a weak map, a lock per
//! session), every view of the session enters it, and the daemon's own readers (the file tools,
//! a snapshot, an apply, the session's diff) reach it through its descriptor
//! ([`SessionFiles`]). It goes when the last of them lets go, and is made again when needed.
//!
//! Where `/forkd/workspaces` is missing (the daemon makes it when it runs as root), or for a
//! `full-access` session (whose commands have no view), a session gets a private copy of the
//! tree in `workspaces_dir/SESSION_ID` instead, as sessions made before layers did.

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use forkd_core::session::{SandboxMode, Session};
use forkd_core::upload::Upload;
use forkd_core::{SessionId, UploadId};
use forkd_tools::sandbox::layer::{LayerDirs, LayerView};

pub use forkd_tools::sandbox::layer::VIEW_ROOT;

use crate::config::EngineConfig;
use crate::error::{EngineError, Result, blocking};
use crate::locks::LockMap;
use crate::uploads::Uploads;
use crate::workspaces::{self, Allowed};

/// The file in a layered session's directory that names the upload its tree is.
const TREE_FILE: &str = "tree";

/// A session's files as the daemon reaches them: `path` leads to the workspace (through the
/// session's layer, which this keeps mounted, for a layered session).
pub(crate) struct SessionFiles {
    pub path: PathBuf,
    pub layer: Option<Arc<LayerView>>,
}

/// A session's workspace made from an upload.
pub(crate) struct Made {
    /// What to remove if the session is not stored.
    pub allowed: Allowed,
    pub upload: Upload,
    /// The workspace's path, as the session stores it and its agents see it.
    pub workspace: PathBuf,
    /// A layered session's layer (mounted once at creation: where none can be, the session
    /// gets a copy).
    pub layer: Option<Arc<LayerView>>,
}

/// Trees kept here and the sessions' layers over them.
pub(crate) struct Trees {
    config: Arc<EngineConfig>,
    uploads: Arc<Uploads>,
    /// Each layered workspace's layer while something holds it, by its path (a branch shares
    /// its origin's).
    layers: Mutex<HashMap<PathBuf, Weak<LayerView>>>,
    /// One layer made at a time per workspace: two overlays of one upper directory must never be.
    making: LockMap<PathBuf>,
    /// One tree written, or swept, at a time.
    writing: LockMap<UploadId>,
    /// When kept trees were last swept.
    swept: Mutex<Option<std::time::Instant>>,
}

/// How often kept trees are swept.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

fn io_error(what: &str, path: &Path, e: std::io::Error) -> EngineError {
    EngineError::Isolation(format!("{what} {}: {e}", path.display()))
}

/// Whether what is at `path` was last changed more than `age` ago.
fn aged(path: &Path, age: std::time::Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|a| a > age))
}

/// Whether `session` works in a layer over a kept tree (its workspace beneath [`VIEW_ROOT`]).
pub(crate) fn is_layered(session: &Session) -> bool {
    session.workspace.starts_with(VIEW_ROOT)
}

impl Trees {
    pub(crate) fn new(config: Arc<EngineConfig>, uploads: Arc<Uploads>) -> Self {
        Self {
            config,
            uploads,
            layers: Mutex::default(),
            making: LockMap::default(),
            writing: LockMap::default(),
            swept: Mutex::default(),
        }
    }

    /// Where kept trees go, and where layered sessions' directories go: `None` where sessions
    /// made from uploads get copies (no `/forkd/workspaces` here).
    fn places(&self) -> Option<(PathBuf, &Path)> {
        let ws = &self.config.workspaces;
        ws.view_root.as_ref()?;
        Some((ws.home.as_ref()?.join("trees"), ws.dir.as_deref()?))
    }

    /// Makes session `id`'s workspace from `tenant`'s upload: a layer over the tree kept here
    /// where it can be, else a copy of its own.
    pub(crate) async fn make(
        &self,
        tenant: &str,
        upload: UploadId,
        id: SessionId,
        sandbox: SandboxMode,
    ) -> Result<Made> {
        if let Some((trees, _)) = self.places().filter(|_| sandbox != SandboxMode::FullAccess) {
            match self.layered(tenant, upload, id, &trees).await? {
                Ok(made) => return Ok(made),
                Err(why) => tracing::warn!(
                    session.id = %id,
                    error = %why,
                    "Cannot mount the session's layer over its uploaded tree; it gets a copy"
                ),
            }
        }
        let allowed = workspaces::fresh(&self.config.workspaces, id)?;
        match self
            .uploads
            .materialize(tenant, upload, &allowed.path)
            .await
        {
            Ok(made) => Ok(Made {
                workspace: allowed.path.clone(),
                allowed,
                upload: made,
                layer: None,
            }),
            Err(e) => {
                allowed.discard();
                Err(e)
            }
        }
    }

    /// [`Trees::make`]'s layer: the tree kept (written now if it is not yet), the session's
    /// directory, and its layer mounted once now, so that a machine where no layer can be
    /// mounted gives copies instead (the inner error) rather than sessions whose tools fail.
    async fn layered(
        &self,
        tenant: &str,
        upload: UploadId,
        id: SessionId,
        trees: &Path,
    ) -> Result<std::result::Result<Made, String>> {
        let lock = self.writing.get(upload);
        let _writing = lock.lock().await;
        let (made, tree) = self.kept_tree(tenant, upload, trees).await?;
        let allowed = workspaces::fresh(&self.config.workspaces, id)?;
        let dir = allowed.path.clone();
        let workspace = Path::new(VIEW_ROOT).join(id.to_string());
        let dirs = LayerDirs {
            lower: tree.clone(),
            upper: dir.join("upper"),
            work: dir.join("work"),
        };
        let tree_file = dir.join(TREE_FILE);
        let written = blocking(move || std::fs::write(&tree_file, upload.to_string())).await?;
        let mounted = match written {
            Ok(()) => self.mounted(&workspace, || Ok(dirs)).await?,
            Err(e) => Err(format!("cannot write in {}: {e}", allowed.path.display())),
        };
        let layer = match mounted {
            Ok(layer) => layer,
            Err(why) => {
                allowed.discard();
                return Ok(Err(why));
            }
        };
        Ok(Ok(Made {
            allowed,
            upload: made,
            workspace,
            layer: Some(layer),
        }))
    }

    /// `tenant`'s upload, and its tree kept in `trees`: written out now if it is not there yet
    /// (into a directory of its own, renamed into place once whole).
    async fn kept_tree(
        &self,
        tenant: &str,
        upload: UploadId,
        trees: &Path,
    ) -> Result<(Upload, PathBuf)> {
        let tree = trees.join(upload.to_string());
        if tree.is_dir() {
            // Another tenant's id is not found here either: the tree is never reached by id.
            let made = self.uploads.get(tenant, upload).await?;
            // Used now: the sweep counts a tree's age from its last use.
            if let Err(e) = std::fs::File::open(&tree)
                .and_then(|dir| dir.set_modified(std::time::SystemTime::now()))
            {
                tracing::debug!(path = %tree.display(), error = %e, "Cannot mark a kept tree used");
            }
            return Ok((made, tree));
        }
        let partial = trees.join(format!(".{upload}.{}", std::process::id()));
        if partial.exists() {
            // Left by this process's earlier try, cut short: the lock is held, so no one writes it.
            let _ = std::fs::remove_dir_all(&partial);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&partial)
            .map_err(|e| io_error("cannot make", &partial, e))?;
        let made = match self.uploads.materialize(tenant, upload, &partial).await {
            Ok(made) => made,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&partial);
                return Err(e);
            }
        };
        std::fs::rename(&partial, &tree).map_err(|e| {
            let _ = std::fs::remove_dir_all(&partial);
            io_error("cannot keep the tree at", &tree, e)
        })?;
        tracing::info!(upload.id = %upload, "Uploaded tree kept for the sessions made from it");
        Ok((made, tree))
    }

    /// The directories of a layered session's layer: the kept tree its `tree` file names, and
    /// its own upper and work directories.
    fn dirs(&self, session: &Session) -> Result<LayerDirs> {
        let (trees, dir) = self.places().ok_or_else(|| {
            EngineError::Isolation(format!(
                "session {} works in a layer over an uploaded tree, which this daemon does not \
                 keep (it has no /forkd/workspaces)",
                session.id
            ))
        })?;
        // The directory of the session that made the workspace: a branch works in its origin's.
        let maker = session.workspace.file_name().ok_or_else(|| {
            EngineError::Invariant(format!(
                "session {}'s workspace {} names no session",
                session.id,
                session.workspace.display()
            ))
        })?;
        let dir = dir.join(maker);
        let upload = std::fs::read_to_string(dir.join(TREE_FILE))
            .map_err(|e| io_error("cannot read the session's tree file in", &dir, e))?;
        let lower = trees.join(upload.trim());
        if !lower.is_dir() {
            return Err(EngineError::Isolation(format!(
                "the uploaded tree session {} works over ({}) is gone from this daemon",
                session.id,
                upload.trim()
            )));
        }
        Ok(LayerDirs {
            lower,
            upper: dir.join("upper"),
            work: dir.join("work"),
        })
    }

    /// A layered session's layer: the one mounted now, or a new one.
    pub(crate) async fn layer(&self, session: &Session) -> Result<Arc<LayerView>> {
        self.mounted(&session.workspace, || self.dirs(session))
            .await?
            .map_err(|e| EngineError::Isolation(format!("the session's workspace: {e}")))
    }

    /// The layer at `workspace`: the one mounted now, or a new one over `dirs`' directories.
    /// The only place a layer is mounted: under the workspace's lock, registered before the lock
    /// is let go, so two overlays of one upper directory are never mounted by this daemon.
    async fn mounted(
        &self,
        workspace: &Path,
        dirs: impl FnOnce() -> Result<LayerDirs>,
    ) -> Result<std::result::Result<Arc<LayerView>, String>> {
        let alive = || {
            self.layers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(workspace)
                .and_then(Weak::upgrade)
        };
        if let Some(layer) = alive() {
            return Ok(Ok(layer));
        }
        let lock = self.making.get(workspace.to_path_buf());
        let _making = lock.lock().await;
        if let Some(layer) = alive() {
            return Ok(Ok(layer));
        }
        let dirs = dirs()?;
        let seen = workspace.to_path_buf();
        let layer = match blocking(move || LayerView::session(&seen, &dirs)).await? {
            Ok(layer) => Arc::new(layer),
            Err(e) => return Ok(Err(e.to_string())),
        };
        let mut layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
        layers.retain(|_, l| l.strong_count() > 0);
        layers.insert(workspace.to_path_buf(), Arc::downgrade(&layer));
        Ok(Ok(layer))
    }

    /// Where the daemon reaches `session`'s files: through its layer for a layered session,
    /// else its workspace's path.
    pub(crate) async fn files(&self, session: &Session) -> Result<SessionFiles> {
        if !is_layered(session) {
            return Ok(SessionFiles {
                path: session.workspace.clone(),
                layer: None,
            });
        }
        let layer = self.layer(session).await?;
        Ok(SessionFiles {
            path: layer.through().to_path_buf(),
            layer: Some(layer),
        })
    }

    /// Whether a session here works over `upload`'s kept tree (its directory's `tree` file names
    /// it).
    async fn names(&self, upload: UploadId) -> Result<bool> {
        let Some((_, dir)) = self.places() else {
            return Ok(false);
        };
        let (dir, name) = (dir.to_path_buf(), upload.to_string());
        blocking(move || {
            std::fs::read_dir(&dir).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| tree_named(&e.path()).is_some_and(|s| s == name))
            })
        })
        .await
    }

    /// Removes kept trees that no session here works over, once older than the uploads'
    /// retention (an upload's sessions keep theirs for as long as they are here).
    pub(crate) async fn sweep(&self) -> Result<u64> {
        let Some((trees, dir)) = self.places() else {
            return Ok(0);
        };
        {
            let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
            if swept.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return Ok(0);
            }
            *swept = Some(std::time::Instant::now());
        }
        let dir = dir.to_path_buf();
        let used = blocking(move || -> std::collections::HashSet<String> {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return Default::default();
            };
            entries
                .flatten()
                .filter_map(|e| tree_named(&e.path()))
                .collect()
        })
        .await?;
        let Ok(entries) = std::fs::read_dir(&trees) else {
            return Ok(0);
        };
        let retention = self.config.uploads.retention;
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let old = aged(&entry.path(), retention);
            // A tree cut short by a crash: named `.ID.UUID`.
            let partial = name.starts_with('.');
            let Ok(upload) = name
                .trim_start_matches('.')
                .split('.')
                .next()
                .unwrap_or("")
                .parse()
            else {
                continue;
            };
            let lock = self.writing.get(upload);
            let _writing = lock.lock().await;
            // Looked at again under the tree's lock: a session made from it meanwhile (while
            // the sweep waited for the lock) names it now, and its use renewed its age.
            let (used_now, old_now) = if partial || !old || used.contains(&name) {
                (used.contains(&name), old)
            } else {
                (self.names(upload).await?, aged(&entry.path(), retention))
            };
            if old_now && (partial || !used_now) {
                let path = entry.path();
                blocking(move || std::fs::remove_dir_all(path)).await?.ok();
                removed += 1;
            }
        }
        Ok(removed)
    }
}
/// The upload `dir`'s `tree` file names, if it holds one. Every session directory here is
/// looked in, and a token tenant's fresh workspace is one such directory, which its commands
/// write: a `tree` there may be a link (to `/dev/zero`), a FIFO no one writes, or anything else.
/// So it is opened without following a link or waiting, read only if it is a regular file, at
/// most a few bytes of it, and taken only if it is an upload's id.
fn tree_named(dir: &Path) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(TREE_FILE))
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(128).read_to_string(&mut text).ok()?;
    let id = text.trim();
    id.parse::<UploadId>().ok().map(|_| id.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_tree_file_is_read_only_if_it_is_a_small_file_naming_an_upload() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(TREE_FILE);
        assert_eq!(tree_named(dir.path()), None);
        let id = UploadId::new().to_string();
        std::fs::write(&file, format!("{id}\n")).unwrap();
        assert_eq!(tree_named(dir.path()), Some(id.clone()));
        std::fs::write(&file, "not an id").unwrap();
        assert_eq!(tree_named(dir.path()), None);
        // A link (to an endless file), and a FIFO no one writes: neither followed nor waited on.
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
        assert_eq!(tree_named(dir.path()), None);
        std::fs::remove_file(&file).unwrap();
        use rustix::fs::{CWD, FileType, Mode, mknodat};
        mknodat(CWD, &file, FileType::Fifo, Mode::RWXU, 0).unwrap();
        assert_eq!(tree_named(dir.path()), None);
    }
}
