//! Uploaded workspaces: trees clients on other machines send, received blob by blob and stored
//! as their tenant's, then written out as a session's fresh workspace.
//!
//! A tree's manifest is checked first ([`forkd_core::upload::Manifest::check`]: strict paths,
//! links inside the tree, the limits); then each blob the tenant lacks arrives in pieces, is
//! checked against its name (its SHA-256 and its size) and stored; the upload itself is stored
//! last, and only if every blob is the tenant's by then. Nothing partial is ever usable: a tree
//! with a blob missing is refused and nothing of it is stored but the blobs that did arrive
//! (content-addressed, they serve the next try).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use forkd_core::UploadId;
use forkd_core::store::{Store, StoreError};
use forkd_core::upload::{
    BlobsStored, EntryKind, Manifest, ManifestError, Upload, UploadLimits, blob_hash,
};

use crate::clock::now_ms;
use crate::error::{EngineError, Result};

/// The most hashes one `missing` call takes.
pub const MAX_HASHES_PER_CALL: usize = 10_000;

/// How often the heartbeat's sweep of expired uploads and orphaned blobs runs at most.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// The uploads service: the store, the limits, and when expired uploads were last swept.
pub(crate) struct Uploads {
    store: Arc<dyn Store>,
    limits: UploadLimits,
    swept: std::sync::Mutex<Option<std::time::Instant>>,
}

/// A stored upload, and what the call that sent it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub upload: Upload,
    pub blobs_received: u64,
    pub bytes_received: u64,
}

impl Uploads {
    pub(crate) fn new(store: Arc<dyn Store>, limits: UploadLimits) -> Uploads {
        Uploads {
            store,
            limits,
            swept: std::sync::Mutex::new(None),
        }
    }

    /// Of `hashes`, those `tenant` lacks.
    pub(crate) async fn missing(&self, tenant: &str, hashes: &[String]) -> Result<Vec<String>> {
        if hashes.len() > MAX_HASHES_PER_CALL {
            return Err(EngineError::InvalidRequest(format!(
                "{} hashes in one call; the most is {MAX_HASHES_PER_CALL}",
                hashes.len()
            )));
        }
        if let Some(bad) = hashes.iter().find(|h| !is_sha256(h)) {
            return Err(EngineError::InvalidRequest(format!(
                "{bad:?} is not a lowercase SHA-256"
            )));
        }
        Ok(self.store.missing_blobs(tenant, hashes).await?)
    }

    /// Removes uploads past their retention and blobs no upload names past their grace (an
    /// interrupted upload's); runs at most every ten minutes. How many of each.
    pub(crate) async fn sweep(&self) -> Result<(u64, u64)> {
        {
            let mut swept = self
                .swept
                .lock()
                .map_err(|_| EngineError::Invariant("the uploads sweep's clock".into()))?;
            if swept.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return Ok((0, 0));
            }
            *swept = Some(std::time::Instant::now());
        }
        let ago =
            |d: std::time::Duration| now_ms() - i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Ok(self
            .store
            .expire_uploads(ago(self.limits.retention), ago(self.limits.orphan_grace))
            .await?)
    }

    /// Starts receiving `tenant`'s tree: its manifest is checked now, and what it would add to
    /// the tenant's blobs against its quota.
    pub(crate) async fn receive(&self, tenant: &str, manifest: Manifest) -> Result<Receiver> {
        let (files, bytes) = manifest.check(&self.limits).map_err(|e| match e {
            ManifestError::Entry { .. } => EngineError::InvalidRequest(format!(
                "the uploaded tree is refused: {e}; nothing was stored"
            )),
            ManifestError::Limit(limit) => EngineError::OverLimit(format!(
                "the uploaded tree is refused: {limit}; nothing was stored"
            )),
        })?;
        let sizes: HashMap<String, u64> = manifest
            .blobs()
            .into_iter()
            .map(|(hash, size)| (hash.to_owned(), size))
            .collect();
        let room = match self.limits.quota_of(tenant) {
            None => u64::MAX,
            Some(quota) => {
                let hashes: Vec<String> = sizes.keys().cloned().collect();
                let missing = self.store.missing_blobs(tenant, &hashes).await?;
                let adds: u64 = missing.iter().filter_map(|h| sizes.get(h)).sum();
                let held = self.store.blob_bytes(tenant).await?;
                if held.saturating_add(adds) > quota {
                    return Err(EngineError::OverLimit(format!(
                        "the uploaded tree is refused: its new contents ({adds} bytes) would take \
                         tenant {tenant}'s blobs ({held} bytes held) past its upload_quota of \
                         {quota} bytes; nothing was stored"
                    )));
                }
                quota - held
            }
        };
        Ok(Receiver {
            room,
            store: Arc::clone(&self.store),
            tenant: tenant.to_owned(),
            manifest,
            files,
            bytes,
            sizes,
            current: None,
            ready: Vec::new(),
            ready_bytes: 0,
            blobs_received: 0,
            bytes_received: 0,
            quota: self.limits.quota_of(tenant),
        })
    }

    /// A digest of `tenant`'s upload `id`'s tree (its manifest): the same tree uploaded twice has
    /// one digest.
    pub(crate) async fn tree_digest(&self, tenant: &str, id: UploadId) -> Result<String> {
        let upload = self.get(tenant, id).await?;
        let manifest = serde_json::to_vec(&upload.manifest)
            .map_err(|e| EngineError::Invariant(format!("an upload's manifest: {e}")))?;
        Ok(blob_hash(&manifest))
    }

    /// `tenant`'s upload `id`; another tenant's is not found.
    pub(crate) async fn get(&self, tenant: &str, id: UploadId) -> Result<Upload> {
        self.store
            .get_upload(tenant, id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "upload",
                id: id.to_string(),
            })
    }

    /// Writes `tenant`'s upload `id` into `dir` (a fresh, empty directory): its files with their
    /// modes, its links, the directories they imply.
    pub(crate) async fn materialize(
        &self,
        tenant: &str,
        id: UploadId,
        dir: &Path,
    ) -> Result<Upload> {
        let upload = self.get(tenant, id).await?;
        let failed = |path: &str, e: std::io::Error| {
            EngineError::Isolation(format!(
                "cannot write the uploaded tree's {path:?} into {}: {e}",
                dir.display()
            ))
        };
        for entry in &upload.manifest.entries {
            // Checked when received: relative, plain components, nothing under `.git`.
            let path = dir.join(&entry.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| failed(&entry.path, e))?;
            }
            match &entry.kind {
                EntryKind::Symlink { target } => {
                    std::os::unix::fs::symlink(target, &path).map_err(|e| failed(&entry.path, e))?
                }
                EntryKind::File {
                    sha256, executable, ..
                } => {
                    let content = self.store.blob(tenant, sha256).await?.ok_or_else(|| {
                        EngineError::Invariant(format!(
                            "upload {id} names blob {sha256}, which its tenant does not have"
                        ))
                    })?;
                    std::fs::write(&path, &content).map_err(|e| failed(&entry.path, e))?;
                    let mode = if *executable { 0o755 } else { 0o644 };
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                        .map_err(|e| failed(&entry.path, e))?;
                }
            }
        }
        Ok(upload)
    }
}

impl Uploads {
    /// What `session`'s workspace (made from an upload of `tenant`'s, its files reached at
    /// `files`) changed since the upload.
    pub(crate) async fn session_changes(
        &self,
        tenant: &str,
        session: &forkd_core::session::Session,
        files: &Path,
    ) -> Result<(UploadId, forkd_tools::isolation::Changes)> {
        use forkd_core::isolation::ChangeKind;
        use forkd_tools::isolation::changes::{Side, content_change};
        let origin = self
            .store
            .session_origin(session.id)
            .await?
            .ok_or_else(|| {
                EngineError::WrongState(format!(
                    "session {} was not made from an upload: there is no tree to compare its \
                     workspace with",
                    session.id
                ))
            })?;
        let upload = self
            .store
            .get_upload(tenant, origin.upload_id)
            .await?
            .ok_or_else(|| {
                EngineError::WrongState(format!(
                    "upload {}, which session {} was made from, has expired: there is no tree \
                     to compare its workspace with",
                    origin.upload_id, session.id
                ))
            })?;
        let (ws, manifest) = (files.to_path_buf(), upload.manifest.clone());
        let changed = tokio::task::spawn_blocking(move || {
            forkd_tools::isolation::tree::changed_paths(&ws, &manifest)
        })
        .await
        .map_err(|e| EngineError::Invariant(format!("comparing a workspace: {e}")))?
        .map_err(|e| EngineError::Isolation(e.to_string()))?;
        let entries: HashMap<&str, &EntryKind> = upload
            .manifest
            .entries
            .iter()
            .map(|e| (e.path.as_str(), &e.kind))
            .collect();
        let mut changes = forkd_tools::isolation::Changes::default();
        for (path, kind) in changed {
            let old = match (kind, entries.get(path.as_str())) {
                (ChangeKind::Added, _) | (_, None) => None,
                (_, Some(EntryKind::Symlink { target })) => Some(Side {
                    content: target.as_bytes().to_vec(),
                    mode: 0o120_000,
                }),
                (
                    _,
                    Some(EntryKind::File {
                        sha256, executable, ..
                    }),
                ) => Some(Side {
                    content: self.store.blob(tenant, sha256).await?.ok_or_else(|| {
                        EngineError::Invariant(format!("upload {} lacks blob {sha256}", upload.id))
                    })?,
                    mode: if *executable { 0o100_755 } else { 0o100_644 },
                }),
            };
            let new = match kind {
                ChangeKind::Deleted => None,
                _ => match Side::read_beneath(files, &path) {
                    Ok(Some(side)) => Some(side),
                    Ok(None) => None,
                    // Neither a file nor a link (a FIFO), or unreadable: said, not diffed.
                    Err(e) => {
                        changes.diff.push_str(&format!(
                            "# {}: {e}, which no patch carries\n",
                            forkd_core::isolation::quote_path(&path)
                        ));
                        continue;
                    }
                },
            };
            let (file, diff) = content_change(&path, kind, old, new);
            changes.files.push(file);
            changes.diff.push_str(&diff);
        }
        Ok((upload.id, changes))
    }
}

fn is_sha256(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// One blob arriving.
struct Partial {
    sha256: String,
    data: Vec<u8>,
}

/// A tree being received: its checked manifest, then its blobs.
pub struct Receiver {
    store: Arc<dyn Store>,
    tenant: String,
    manifest: Manifest,
    files: u64,
    bytes: u64,
    /// Each blob the tree needs and its size; one is taken out once received.
    sizes: HashMap<String, u64>,
    current: Option<Partial>,
    /// Blobs received whole and checked, stored together at the next flush.
    ready: Vec<Partial>,
    ready_bytes: usize,
    blobs_received: u64,
    bytes_received: u64,
    /// What the tenant's quota left for this upload's blobs when it began: a call that would
    /// pass it is stopped early. Each flush counts again, under the tenant's blob lock.
    room: u64,
    quota: Option<u64>,
}

/// How much a receiver keeps before it stores what it has in one transaction.
const FLUSH_BYTES: usize = 8 << 20;
const FLUSH_BLOBS: usize = 512;

impl Receiver {
    /// Takes one piece of blob `sha256`; the last piece checks and stores the blob.
    pub async fn chunk(&mut self, sha256: &str, data: &[u8], last: bool) -> Result<()> {
        let partial = match &mut self.current {
            Some(p) if p.sha256 == sha256 => p,
            Some(p) => {
                return Err(EngineError::InvalidRequest(format!(
                    "blob {sha256} began before blob {} ended",
                    p.sha256
                )));
            }
            None => {
                if !self.sizes.contains_key(sha256) {
                    return Err(EngineError::InvalidRequest(format!(
                        "blob {sha256} is not one the tree names, or was sent twice"
                    )));
                }
                self.current.insert(Partial {
                    sha256: sha256.to_owned(),
                    data: Vec::new(),
                })
            }
        };
        let size = self.sizes.get(sha256).copied().unwrap_or_default();
        if self.bytes_received + (partial.data.len() + data.len()) as u64 > self.room {
            return Err(EngineError::OverLimit(format!(
                "tenant {}'s blobs would pass its upload_quota; nothing more was stored",
                self.tenant
            )));
        }
        if (partial.data.len() + data.len()) as u64 > size {
            return Err(EngineError::InvalidRequest(format!(
                "blob {sha256} is longer than the {size} bytes the tree says"
            )));
        }
        partial.data.extend_from_slice(data);
        if !last {
            return Ok(());
        }
        let Some(done) = self.current.take() else {
            return Ok(());
        };
        if done.data.len() as u64 != size || blob_hash(&done.data) != done.sha256 {
            return Err(EngineError::InvalidRequest(format!(
                "blob {} does not match its name (its SHA-256 and the size the tree says)",
                done.sha256
            )));
        }
        self.sizes.remove(&done.sha256);
        self.blobs_received += 1;
        self.bytes_received += done.data.len() as u64;
        self.ready_bytes += done.data.len();
        self.ready.push(done);
        if self.ready_bytes >= FLUSH_BYTES || self.ready.len() >= FLUSH_BLOBS {
            self.flush().await?;
        }
        Ok(())
    }

    /// Stores the blobs received whole since the last flush, in one transaction, if the
    /// tenant's quota still has room for them (another upload may have taken it meanwhile).
    async fn flush(&mut self) -> Result<()> {
        if self.ready.is_empty() {
            return Ok(());
        }
        let blobs: Vec<(&str, &[u8])> = self
            .ready
            .iter()
            .map(|p| (p.sha256.as_str(), p.data.as_slice()))
            .collect();
        let stored = self
            .store
            .put_blobs(&self.tenant, &blobs, self.quota)
            .await?;
        if let BlobsStored::OverQuota { held, adds } = stored {
            return Err(EngineError::OverLimit(format!(
                "the uploaded tree is refused: its contents ({adds} bytes more) would take \
                 tenant {}'s blobs ({held} bytes held) past its upload_quota of {} bytes; the \
                 upload was not stored",
                self.tenant,
                self.quota.unwrap_or_default()
            )));
        }
        self.ready.clear();
        self.ready_bytes = 0;
        Ok(())
    }

    /// The stream was cut: the blobs received whole and checked are stored (its tenant's, kept
    /// for the orphan grace, so that a retry sends only the rest); the blob cut in the middle and
    /// the tree are not. How many blobs this upload stored in all.
    pub async fn keep(mut self) -> Result<u64> {
        self.current = None;
        self.flush().await?;
        Ok(self.blobs_received)
    }

    /// Stores the upload once every blob is its tenant's; else nothing is stored.
    /// A blob left unfinished (a client cut off mid-blob) keeps the tree out too; the blobs
    /// received whole are kept, as [`Receiver::keep`] keeps them.
    pub async fn finish(mut self) -> Result<Received> {
        if let Some(p) = self.current.take() {
            self.flush().await?;
            return Err(EngineError::InvalidRequest(format!(
                "blob {} never ended (no piece said it was the last); the tree was not stored \
                 (the blobs received whole were: a retry sends only the rest)",
                p.sha256
            )));
        }
        self.flush().await?;
        let upload = Upload {
            id: UploadId::new(),
            tenant: self.tenant,
            manifest: self.manifest,
            files: self.files,
            bytes: self.bytes,
            created_at_ms: now_ms(),
        };
        match self.store.create_upload(&upload).await {
            Ok(()) => Ok(Received {
                upload,
                blobs_received: self.blobs_received,
                bytes_received: self.bytes_received,
            }),
            Err(StoreError::Conflict(why)) => Err(EngineError::WrongState(format!(
                "the uploaded tree is incomplete: {why}; send the blobs FindMissingBlobs names"
            ))),
            Err(e) => Err(e.into()),
        }
    }
}
