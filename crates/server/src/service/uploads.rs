//! `FindMissingBlobs` and `UploadWorkspace`: a client's tree, received for its tenant (see
//! `forkd_engine`'s uploads). Free functions on the engine, so this file reaches nothing of the
//! service's own.

use forkd_core::upload::{Entry, EntryKind, Manifest};
use forkd_engine::{Engine, Received, Receiver};
use forkd_proto::v1 as pb;
use tonic::Streaming;

use crate::auth::Tenant;
use crate::status::ApiError;

pub(super) async fn find_missing_blobs(
    engine: &Engine,
    tenant: Tenant,
    req: pb::FindMissingBlobsRequest,
) -> Result<pb::FindMissingBlobsResponse, ApiError> {
    let missing = engine.for_tenant(tenant).missing_blobs(&req.hashes).await?;
    Ok(pb::FindMissingBlobsResponse { missing })
}

pub(super) async fn upload_workspace(
    engine: &Engine,
    tenant: Tenant,
    mut stream: Streaming<pb::UploadWorkspaceRequest>,
) -> Result<pb::UploadWorkspaceResponse, ApiError> {
    use pb::upload_workspace_request::Part;
    let first = stream
        .message()
        .await
        .map_err(|e| ApiError::BadRequest(format!("the upload stream failed: {e}")))?;
    let Some(Part::Manifest(manifest)) = first.and_then(|m| m.part) else {
        return Err(ApiError::BadRequest(
            "an upload begins with its manifest".into(),
        ));
    };
    let receiver = engine
        .for_tenant(tenant)
        .receive_upload(manifest_of(manifest)?)
        .await?;
    // Received in a task of its own: a client that cuts the stream drops this call, and the
    // blobs it sent whole must still be kept.
    let received = tokio::spawn(receive(receiver, stream))
        .await
        .map_err(|e| ApiError::Engine(forkd_engine::EngineError::Invariant(e.to_string())))??;
    let upload = received.upload;
    Ok(pb::UploadWorkspaceResponse {
        upload_id: upload.id.to_string(),
        files: upload.files,
        bytes: upload.bytes,
        git_commit: upload.manifest.git_commit.unwrap_or_default(),
        blobs_received: received.blobs_received,
        bytes_received: received.bytes_received,
    })
}

/// Takes the blobs of an upload whose manifest `receiver` holds, then stores the tree. A stream
/// that fails keeps the blobs received whole (a retry sends only the rest), never the tree.
async fn receive(
    mut receiver: Receiver,
    mut stream: Streaming<pb::UploadWorkspaceRequest>,
) -> Result<Received, ApiError> {
    use pb::upload_workspace_request::Part;
    loop {
        let message = match stream.message().await {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(receiver.finish().await?),
            Err(e) => {
                let kept = match receiver.keep().await {
                    Ok(0) | Err(_) => String::new(),
                    Ok(n) => {
                        format!(" (its {n} blobs received whole were: a retry sends only the rest)")
                    }
                };
                return Err(ApiError::BadRequest(format!(
                    "the upload stream failed: {e}; the tree was not stored{kept}"
                )));
            }
        };
        match message.part {
            Some(Part::Blob(chunk)) => {
                receiver
                    .chunk(&chunk.sha256, &chunk.data, chunk.last)
                    .await?;
            }
            Some(Part::Manifest(_)) => {
                return Err(ApiError::BadRequest(
                    "an upload has one manifest, first".into(),
                ));
            }
            None => return Err(ApiError::BadRequest("an empty upload message".into())),
        }
    }
}

pub(super) async fn session_changes(
    engine: &Engine,
    tenant: Tenant,
    req: pb::GetSessionChangesRequest,
) -> Result<pb::GetSessionChangesResponse, ApiError> {
    let id = req
        .session_id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("{:?} is not a session id", req.session_id)))?;
    let (upload, changes) = engine.for_tenant(tenant).session_changes(id).await?;
    Ok(pb::GetSessionChangesResponse {
        session_id: req.session_id,
        upload_id: upload.to_string(),
        files: changes
            .files
            .into_iter()
            .map(crate::convert::file_change)
            .collect(),
        diff: changes.diff,
    })
}

/// The wire's manifest as the engine's; an entry of no kind is refused.
fn manifest_of(m: pb::UploadManifest) -> Result<Manifest, ApiError> {
    use pb::upload_entry::Kind;
    let entries = m
        .entries
        .into_iter()
        .map(|e| {
            let kind = match e.kind {
                Some(Kind::File(f)) => EntryKind::File {
                    sha256: f.sha256,
                    size: f.size,
                    executable: f.executable,
                },
                Some(Kind::Symlink(target)) => EntryKind::Symlink { target },
                None => {
                    return Err(ApiError::BadRequest(format!(
                        "{:?}: an entry that is neither a file nor a symbolic link",
                        e.path
                    )));
                }
            };
            Ok(Entry { path: e.path, kind })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Manifest {
        entries,
        git_commit: Some(m.git_commit).filter(|c| !c.is_empty()),
    })
}
