//! Uploaded workspaces in the store, on both backends: blobs per tenant, an upload stored only
//! once its blobs are, the bytes a tenant holds, and the sweep of expired uploads and of blobs no
//! upload names.

mod support;

use forkd_core::UploadId;
use forkd_core::upload::{BlobsStored, Entry, EntryKind, Manifest, Upload, blob_hash};
use forkd_store::StoreError;
use support::{TestResult, TestStore, conformance};

conformance!(
    an_upload_is_stored_only_once_its_blobs_are_its_tenant_s,
    expired_uploads_and_orphaned_blobs_are_swept,
    an_upload_a_schedule_names_is_kept_past_its_retention,
    blobs_past_a_quota_are_not_stored_even_by_two_writers_at_once,
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

async fn an_upload_a_schedule_names_is_kept_past_its_retention(store: TestStore) -> TestResult {
    let content: &[u8] = b"the tree each firing starts from";
    store
        .put_blob("alice", &blob_hash(content), content)
        .await?;
    let tree = upload("alice", &[content], 1_000);
    store.create_upload(&tree).await?;
    let schedule = forkd_core::schedule::Schedule {
        upload_id: Some(tree.id),
        ..support::nightly(2_000)
    };
    store.create_schedule(&schedule).await?;
    let later = i64::MAX / 2;
    assert_eq!(store.expire_uploads(later, later).await?, (0, 0));
    assert!(store.get_upload("alice", tree.id).await?.is_some());
    assert!(store.delete_schedule("alice", "nightly").await?);
    assert_eq!(store.expire_uploads(later, later).await?, (1, 1));
    assert_eq!(store.get_upload("alice", tree.id).await?, None);
    Ok(())
}

/// `put_blobs` with a quota stores all or nothing, counts only the blobs the tenant lacks, and
/// counts under a lock: of two writers (two daemons) each within the quota alone but not
/// together, one is refused.
async fn blobs_past_a_quota_are_not_stored_even_by_two_writers_at_once(
    store: TestStore,
) -> TestResult {
    let (a, b, c): (&[u8], &[u8], &[u8]) = (&[1; 600], &[2; 300], &[3; 300]);
    let stored = store
        .put_blobs("alice", &[(&blob_hash(a), a)], Some(1_000))
        .await?;
    assert_eq!(stored, BlobsStored::Stored);
    // `a` again adds nothing; `b` and `c` together pass the quota: neither is stored.
    let over = store
        .put_blobs(
            "alice",
            &[(&blob_hash(a), a), (&blob_hash(b), b), (&blob_hash(c), c)],
            Some(1_000),
        )
        .await?;
    assert_eq!(
        over,
        BlobsStored::OverQuota {
            held: 600,
            adds: 600
        }
    );
    assert_eq!(store.blob_bytes("alice").await?, 600);
    // Another tenant's blobs do not count.
    store.put_blob("mallory", &blob_hash(b), b).await?;

    for round in 0..10u8 {
        let tenant = format!("t{round}");
        let (x, y) = ([round; 700], [round.wrapping_add(100); 700]);
        let (one, two) = (store.reopen().await?, store.reopen().await?);
        let (hx, hy) = (blob_hash(&x), blob_hash(&y));
        let bx: [(&str, &[u8]); 1] = [(&hx, &x)];
        let by: [(&str, &[u8]); 1] = [(&hy, &y)];
        let (first, second) = tokio::join!(
            one.put_blobs(&tenant, &bx, Some(1_000)),
            two.put_blobs(&tenant, &by, Some(1_000)),
        );
        let outcomes = [first?, second?];
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| **o == BlobsStored::Stored)
                .count(),
            1,
            "round {round}: {outcomes:?}"
        );
        assert_eq!(store.blob_bytes(&tenant).await?, 700);
    }
    Ok(())
}
