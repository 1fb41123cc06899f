//! Uploaded workspaces in the store, on both backends: blobs per tenant, an upload stored only
//! once its blobs are, the bytes a tenant holds, and the sweep of expired uploads and of blobs no
//! upload names.

mod support;

use forkd_core::UploadId;
use forkd_core::upload::{Entry, EntryKind, Manifest, Upload, blob_hash};
use forkd_store::StoreError;
use support::{TestResult, TestStore, conformance};

conformance!(
    an_upload_is_stored_only_once_its_blobs_are_its_tenant_s,
    expired_uploads_and_orphaned_blobs_are_swept,
);

fn upload(tenant: &str, contents: &[&[u8]], created_at_ms: i64) -> Upload {
    let entries = contents
        .iter()
        .enumerate()
        .map(|(i, c)| Entry {
            path: format!("f{i}"),
            kind: EntryKind::File {
                sha256: blob_hash(c),
                size: c.len() as u64,
                executable: false,
            },
        })
        .collect();
    Upload {
        id: UploadId::new(),
        tenant: tenant.to_owned(),
        manifest: Manifest {
            entries,
            git_commit: None,
        },
        files: contents.len() as u64,
        bytes: contents.iter().map(|c| c.len() as u64).sum(),
        created_at_ms,
    }
}

async fn an_upload_is_stored_only_once_its_blobs_are_its_tenant_s(store: TestStore) -> TestResult {
    let (a, b): (&[u8], &[u8]) = (b"first", b"second!");
    let tree = upload("alice", &[a, b], 1);
    store.put_blob("alice", &blob_hash(a), a).await?;
    // Another tenant's blob is not alice's.
    store.put_blob("mallory", &blob_hash(b), b).await?;
    let refused = store.create_upload(&tree).await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    assert_eq!(store.get_upload("alice", tree.id).await?, None);
    assert_eq!(
        store
            .missing_blobs("alice", &[blob_hash(a), blob_hash(b)])
            .await?,
        vec![blob_hash(b)]
    );
    store.put_blob("alice", &blob_hash(b), b).await?;
    // Twice is no change.
    store.put_blob("alice", &blob_hash(b), b).await?;
    store.create_upload(&tree).await?;
    assert_eq!(
        store.get_upload("alice", tree.id).await?,
        Some(tree.clone())
    );
    assert_eq!(store.get_upload("mallory", tree.id).await?, None);
    assert_eq!(store.blob("alice", &blob_hash(b)).await?, Some(b.to_vec()));
    assert_eq!(store.blob_bytes("alice").await?, 12);
    assert_eq!(store.blob_bytes("mallory").await?, 7);
    Ok(())
}

async fn expired_uploads_and_orphaned_blobs_are_swept(store: TestStore) -> TestResult {
    let (kept, orphan): (&[u8], &[u8]) = (b"named by an upload", b"named by none");
    store.put_blob("alice", &blob_hash(kept), kept).await?;
    store.put_blob("alice", &blob_hash(orphan), orphan).await?;
    let tree = upload("alice", &[kept], 1_000);
    store.create_upload(&tree).await?;
    let later = i64::MAX / 2;
    // Uploads made before 1000 (none) and orphans that arrived before now: the orphan goes.
    assert_eq!(store.expire_uploads(1_000, later).await?, (0, 1));
    assert_eq!(
        store
            .missing_blobs("alice", &[blob_hash(kept), blob_hash(orphan)])
            .await?,
        vec![blob_hash(orphan)]
    );
    assert!(store.get_upload("alice", tree.id).await?.is_some());
    // The upload past its retention goes, and with it the blob only it named.
    assert_eq!(store.expire_uploads(later, later).await?, (1, 1));
    assert_eq!(store.get_upload("alice", tree.id).await?, None);
    assert_eq!(store.blob_bytes("alice").await?, 0);
    Ok(())
}
