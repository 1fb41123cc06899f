//! `--upload DIR`: a tree on this machine sent to a daemon that may run on another one. The tree
//! is listed (git's view of it when DIR is in a git work tree, else a walk that honours ignore
//! files), each file hashed; the daemon says which contents its tenant lacks (FindMissingBlobs),
//! and one UploadWorkspace stream carries the manifest and only those contents. The session then
//! names the upload instead of a directory.

mod list;

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use anyhow::Context as _;
use forkd_proto::v1::upload_entry::Kind;
use forkd_proto::v1::upload_workspace_request::Part;
use forkd_proto::v1::{
    BlobChunk, FindMissingBlobsRequest, UploadEntry, UploadFile, UploadManifest,
    UploadWorkspaceRequest, UploadWorkspaceResponse,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::Client;
use crate::exit::CliError;
#[cfg(test)]
use list::list;
pub use list::{EntryKind, FileEntry, Tree, list_with};

/// The largest piece of a blob one message carries (the protocol's bound).
const CHUNK_BYTES: usize = 1024 * 1024;

/// The most hashes one FindMissingBlobs call asks about, so that a large tree's question stays a
/// small message.
const FIND_BATCH: usize = 10_000;

/// Messages waiting for the connection: enough to keep it busy while the next piece is read,
/// few enough that memory stays a few MiB whatever the tree's size.
const QUEUED_MESSAGES: usize = 4;

/// `forkctl upload DIR`.
#[derive(Debug, clap::Args)]
pub struct UploadArgs {
    /// The tree to send: git's view of it in a git work tree, else what its ignore files keep.
    pub dir: std::path::PathBuf,

    /// Also send the files the rules leave out that match PATTERN (gitignore syntax; repeat).
    #[arg(long = "include", value_name = "PATTERN")]
    pub include: Vec<String>,
}

/// Uploads the tree and prints its id (`--json`: `{"upload": {…}}`); the summary goes to stderr.
pub async fn run(
    args: UploadArgs,
    client: &mut Client,
    out: &crate::output::Printer,
) -> anyhow::Result<u8> {
    let uploaded = upload(client, &args.dir, &args.include).await?;
    if out.is_json() {
        out.value(&json!({ "upload": uploaded.to_json() }))?;
    } else {
        eprintln!("{}", uploaded.summary(&args.dir));
        out.line(&uploaded.upload_id)?;
    }
    Ok(crate::exit::OK)
}

/// What the daemon made of an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    /// The id a session names (`CreateSessionRequest.upload_id`).
    pub upload_id: String,
    pub files: u64,
    /// The tree's size: its files' bytes.
    pub bytes: u64,
    pub git_commit: String,
    /// The contents this upload carried (the daemon had the others already).
    pub blobs_sent: u64,
    pub bytes_sent: u64,
}

impl From<UploadWorkspaceResponse> for Uploaded {
    fn from(r: UploadWorkspaceResponse) -> Self {
        Self {
            upload_id: r.upload_id,
            files: r.files,
            bytes: r.bytes,
            git_commit: r.git_commit,
            blobs_sent: r.blobs_received,
            bytes_sent: r.bytes_received,
        }
    }
}

impl Uploaded {
    /// `uploaded DIR: 1234 files, 5.6 MiB (3 files, 12.0 KiB sent)`, for stderr.
    pub fn summary(&self, dir: &Path) -> String {
        format!(
            "uploaded {}: {}, {} ({}, {} sent)",
            dir.display(),
            count(self.files, "file"),
            human_bytes(self.bytes),
            count(self.blobs_sent, "file"),
            human_bytes(self.bytes_sent)
        )
    }

    /// The `"upload"` object of a command's JSON output.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "upload_id": self.upload_id,
            "files": self.files,
            "bytes": self.bytes,
            "git_commit": self.git_commit,
            "blobs_sent": self.blobs_sent,
            "bytes_sent": self.bytes_sent,
        })
    }
}

fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `812 B`, `12.0 KiB`, `5.6 MiB`: one decimal, binary units.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

impl Tree {
    /// The manifest: every entry, and the commit.
    fn manifest(&self) -> UploadManifest {
        let entries = self
            .entries
            .iter()
            .map(|entry| UploadEntry {
                path: entry.path.clone(),
                kind: Some(match &entry.kind {
                    EntryKind::File(file) => Kind::File(UploadFile {
                        sha256: file.sha256.clone(),
                        size: file.size,
                        executable: file.executable,
                    }),
                    EntryKind::Symlink { target } => Kind::Symlink(target.clone()),
                }),
            })
            .collect();
        UploadManifest {
            entries,
            git_commit: self.git_commit.clone(),
        }
    }

    /// One file per distinct content, by hash: where to read each blob from.
    fn blobs(&self) -> BTreeMap<&str, &FileEntry> {
        let mut blobs = BTreeMap::new();
        for entry in &self.entries {
            if let EntryKind::File(file) = &entry.kind {
                blobs.entry(file.sha256.as_str()).or_insert(file);
            }
        }
        blobs
    }
}

/// Uploads `dir` (see [`list`] for what is sent): asks the daemon which contents its tenant
/// lacks, then sends the manifest and those contents in one UploadWorkspace stream.
pub async fn upload(
    client: &mut Client,
    dir: &Path,
    include: &[String],
) -> anyhow::Result<Uploaded> {
    let (owned_dir, owned_include) = (dir.to_path_buf(), include.to_vec());
    let hashing = live_bar(
        &format!(
            "{{spinner}} hashing {}: {{pos}}/{{len}} files",
            dir.display()
        ),
        0,
    );
    let counted = hashing.clone();
    // Hashing reads the whole tree: off the runtime's only thread.
    let tree = tokio::task::spawn_blocking(move || list_with(&owned_dir, &owned_include, &counted))
        .await
        .context("listing the tree to upload failed");
    hashing.finish_and_clear();
    let tree = tree??;
    let blobs = tree.blobs();
    let hashes: Vec<&str> = blobs.keys().copied().collect();
    let mut missing = Vec::new();
    for batch in hashes.chunks(FIND_BATCH) {
        let request = FindMissingBlobsRequest {
            hashes: batch.iter().map(|h| (*h).to_owned()).collect(),
        };
        let reply = client
            .find_missing_blobs(request)
            .await
            .context("cannot ask the daemon which contents it lacks")?
            .into_inner();
        for hash in reply.missing {
            let file = blobs.get(hash.as_str()).with_context(|| {
                format!("the daemon says a blob is missing that was not asked about ({hash})")
            })?;
            missing.push((*file).clone());
        }
    }
    let sending = live_bar(
        "{spinner} sending: {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        missing.iter().map(|f| f.size).sum(),
    );
    let sent = send(client, &tree, &missing, &sending).await;
    sending.finish_and_clear();
    sent
}

/// A progress line on stderr, drawn only when stderr is a terminal (indicatif hides it
/// otherwise); `len` is what it counts to.
fn live_bar(template: &str, len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// The UploadWorkspace call. Its messages are made as the connection takes them, by a future
/// polled beside the call rather than a spawned task, so nothing is left reading when either
/// side stops: when reading fails (a file unreadable, or changed), the local error is the one
/// reported, and the stream, cut short, lacks blobs its manifest names, which the daemon
/// refuses, storing no upload; when the daemon answers early (a refusal), reading stops.
async fn send(
    client: &mut Client,
    tree: &Tree,
    missing: &[FileEntry],
    progress: &ProgressBar,
) -> anyhow::Result<Uploaded> {
    let (tx, rx) = mpsc::channel(QUEUED_MESSAGES);
    let mut call = Box::pin(client.upload_workspace(ReceiverStream::new(rx)));
    // The stream ends when `produce` returns, dropping the only sender.
    let mut produce = Box::pin(produce(tx, tree, missing, progress));
    let mut produced = false;
    let reply = loop {
        tokio::select! {
            done = &mut produce, if !produced => match done? {
                Sent::Whole => produced = true,
                // The call's own outcome says why.
                Sent::Cut => break call.await,
            },
            reply = &mut call => break reply,
        }
    };
    let reply = reply.context("the daemon refused the upload")?.into_inner();
    if !produced {
        anyhow::bail!("the daemon answered before the upload was sent whole");
    }
    if reply.upload_id.is_empty() {
        anyhow::bail!("the daemon answered the upload without an id");
    }
    Ok(reply.into())
}

/// How far the messages went.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    Whole,
    /// The call stopped taking them: the daemon answered (a refusal, most likely) or the
    /// connection went; the call's outcome says which.
    Cut,
}

/// Sends the manifest, then each missing content, counting its bytes on `progress` as the
/// connection takes them.
async fn produce(
    tx: mpsc::Sender<UploadWorkspaceRequest>,
    tree: &Tree,
    missing: &[FileEntry],
    progress: &ProgressBar,
) -> anyhow::Result<Sent> {
    let manifest = UploadWorkspaceRequest {
        part: Some(Part::Manifest(tree.manifest())),
    };
    if tx.send(manifest).await.is_err() {
        return Ok(Sent::Cut);
    }
    for file in missing {
        if send_blob(&tx, file, progress).await? == Sent::Cut {
            return Ok(Sent::Cut);
        }
    }
    Ok(Sent::Whole)
}

/// Sends one file's content in pieces of at most [`CHUNK_BYTES`], hashing as it reads: a file
/// whose size or content is no longer what was listed is an error, found before its last piece
/// goes, so the daemon never gets a blob under a hash it does not match.
async fn send_blob(
    tx: &mpsc::Sender<UploadWorkspaceRequest>,
    file: &FileEntry,
    progress: &ProgressBar,
) -> anyhow::Result<Sent> {
    let shown = file.source.display();
    let unreadable = |e: io::Error| CliError::InvalidInput(format!("cannot read {shown}: {e}"));
    let changed = || CliError::InvalidInput(format!("{shown} changed while it was being uploaded"));
    let mut source = tokio::fs::File::open(&file.source)
        .await
        .map_err(unreadable)?;
    let mut hasher = Sha256::new();
    let mut left = file.size;
    loop {
        let len = usize::try_from(left).map_or(CHUNK_BYTES, |left| left.min(CHUNK_BYTES));
        let mut data = vec![0; len];
        match source.read_exact(&mut data).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(changed().into()),
            Err(e) => return Err(unreadable(e).into()),
        }
        hasher.update(&data);
        left -= len as u64;
        let last = left == 0;
        if last {
            // Longer than listed, or other bytes: not the content the manifest names.
            let longer = source.read(&mut [0]).await.map_err(unreadable)? != 0;
            if longer || hex::encode(hasher.finalize_reset()) != file.sha256 {
                return Err(changed().into());
            }
        }
        let piece = BlobChunk {
            sha256: file.sha256.clone(),
            data,
            last,
        };
        let message = UploadWorkspaceRequest {
            part: Some(Part::Blob(piece)),
        };
        if tx.send(message).await.is_err() {
            return Ok(Sent::Cut);
        }
        progress.inc(len as u64);
        if last {
            return Ok(Sent::Whole);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn write(root: &Path, path: &str, content: &str) -> anyhow::Result<()> {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, content)?;
        Ok(())
    }

    /// Every message `produce` sends for `missing`.
    async fn produced(tree: &Tree, missing: &[FileEntry]) -> anyhow::Result<Vec<Part>> {
        let (tx, mut rx) = mpsc::channel::<UploadWorkspaceRequest>(QUEUED_MESSAGES);
        let collect = async {
            let mut parts = Vec::new();
            while let Some(message) = rx.recv().await {
                parts.extend(message.part);
            }
            parts
        };
        let progress = ProgressBar::hidden();
        let (sent, parts) = tokio::join!(produce(tx, tree, missing, &progress), collect);
        assert_eq!(sent?, Sent::Whole);
        let sent: u64 = missing.iter().map(|f| f.size).sum();
        assert_eq!(progress.position(), sent, "every byte sent is counted");
        Ok(parts)
    }

    #[tokio::test]
    async fn the_manifest_goes_first_then_missing_blobs_in_pieces() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        let big: String = (0..CHUNK_BYTES * 5 / 2)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        write(root, "big.txt", &big)?;
        write(root, "empty", "")?;
        write(root, "same-as-empty", "")?;
        symlink("big.txt", root.join("link"))?;
        let tree = list(root, &[])?;
        // Two files, one content.
        assert_eq!(tree.blobs().len(), 2);
        let missing = [tree.file("big.txt").clone(), tree.file("empty").clone()];

        let parts = produced(&tree, &missing).await?;
        let Some(Part::Manifest(manifest)) = parts.first() else {
            panic!(
                "the manifest first, got {:?}",
                parts.first().map(|_| "a blob")
            );
        };
        assert_eq!(manifest.git_commit, "");
        let entries: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(entries, ["big.txt", "empty", "link", "same-as-empty"]);
        assert_eq!(
            manifest.entries[2].kind,
            Some(Kind::Symlink("big.txt".into()))
        );
        let Some(Kind::File(big_file)) = &manifest.entries[0].kind else {
            panic!("big.txt is a file");
        };
        assert_eq!(big_file.size, big.len() as u64);

        let pieces: Vec<(&str, usize, bool)> = parts[1..]
            .iter()
            .map(|part| match part {
                Part::Blob(b) => (b.sha256.as_str(), b.data.len(), b.last),
                Part::Manifest(_) => panic!("one manifest only"),
            })
            .collect();
        let (big_hash, empty_hash) = (missing[0].sha256.as_str(), missing[1].sha256.as_str());
        assert_eq!(
            pieces,
            [
                (big_hash, CHUNK_BYTES, false),
                (big_hash, CHUNK_BYTES, false),
                (big_hash, CHUNK_BYTES / 2, true),
                (empty_hash, 0, true),
            ]
        );
        let data: Vec<u8> = parts[1..4]
            .iter()
            .flat_map(|p| match p {
                Part::Blob(b) => b.data.clone(),
                Part::Manifest(_) => Vec::new(),
            })
            .collect();
        assert_eq!(data, big.as_bytes());
        Ok(())
    }

    #[tokio::test]
    async fn a_file_changed_since_it_was_listed_stops_the_upload() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        write(root, "a.txt", "before")?;
        let tree = list(root, &[])?;
        let missing = [tree.file("a.txt").clone()];
        let changed = format!(
            "{} changed while it was being uploaded",
            root.join("a.txt").display()
        );
        for now in ["after!", "short", "longer than before"] {
            write(root, "a.txt", now)?;
            let result = produced(&tree, &missing).await;
            let msg = result.err().map(|e| e.to_string()).unwrap_or_default();
            assert_eq!(msg, changed, "{now}");
        }
        std::fs::remove_file(root.join("a.txt"))?;
        let msg = produced(&tree, &missing)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.starts_with("cannot read"), "{msg}");
        Ok(())
    }

    #[tokio::test]
    async fn a_call_that_stops_taking_messages_stops_the_reading() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        write(dir.path(), "a.txt", "a")?;
        let tree = list(dir.path(), &[])?;
        let missing = [tree.file("a.txt").clone()];
        let (tx, rx) = mpsc::channel::<UploadWorkspaceRequest>(QUEUED_MESSAGES);
        drop(rx);
        let progress = ProgressBar::hidden();
        assert_eq!(produce(tx, &tree, &missing, &progress).await?, Sent::Cut);
        assert_eq!(progress.position(), 0, "nothing went");
        Ok(())
    }

    #[test]
    fn the_summary_says_how_much_was_sent() {
        let uploaded = Uploaded {
            upload_id: "u1".into(),
            files: 1234,
            bytes: 5_872_026,
            git_commit: String::new(),
            blobs_sent: 1,
            bytes_sent: 12_288,
        };
        assert_eq!(
            uploaded.summary(Path::new("repo")),
            "uploaded repo: 1234 files, 5.6 MiB (1 file, 12.0 KiB sent)"
        );
        assert_eq!(human_bytes(812), "812 B");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(
            uploaded.to_json(),
            json!({"upload_id": "u1", "files": 1234, "bytes": 5_872_026, "git_commit": "",
                   "blobs_sent": 1, "bytes_sent": 12_288})
        );
    }
}
