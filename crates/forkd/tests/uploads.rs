//! Uploaded workspaces over the real gRPC API: two token tenants, `alice` and `mallory`, on one
//! daemon over TCP. A second upload of a tree sends only what changed; mallory learns nothing of
//! alice's blobs or uploads; hostile and incomplete trees are refused with nothing usable
//! stored; quotas hold. (Sessions working in uploaded trees: `upload_layers.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod uploading;

use std::path::Path;

use forkd_core::upload::blob_hash;
use forkd_proto::v1 as pb;
use forkd_test_support::session_request;
use pb::upload_entry::Kind;
use pb::upload_workspace_request::Part;
use tonic::Code;
use uploading::*;

#[tokio::test]
async fn another_tenant_learns_nothing_of_an_upload() {
    let mut t = two_tenants().await;
    let tree = tree();
    let lacking = missing(&mut t.alice, &tree).await;
    let alice_s = upload(&mut t.alice, &tree, &lacking).await.unwrap();
    // Alice's blobs are not mallory's: all of them are missing for mallory.
    assert_eq!(missing(&mut t.mallory, &tree).await.len(), 4);
    // Her upload id is not found for mallory.
    let refused = session_from(&mut t.mallory, &alice_s.upload_id)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    // Nor can mallory name alice's blobs without sending them.
    let incomplete = upload(&mut t.mallory, &tree, &[]).await.unwrap_err();
    assert_eq!(
        incomplete.code(),
        Code::FailedPrecondition,
        "{incomplete:?}"
    );
    assert!(
        incomplete.message().contains("never received"),
        "{incomplete:?}"
    );
}

#[tokio::test]
async fn hostile_trees_are_refused_naming_the_path_and_nothing_is_stored() {
    let mut t = two_tenants().await;
    let cases = [
        (vec![file("../escape", b"x", false)], "../escape"),
        (vec![file("/etc/passwd", b"x", false)], "/etc/passwd"),
        (vec![file(".git/config", b"x", false)], ".git/config"),
        (vec![link("etc", "/etc")], "etc"),
        (vec![link("up", "../../outside")], "up"),
        (
            vec![file("a", b"x", false), file("a/b", b"y", false)],
            "\"a\"",
        ),
    ];
    for (tree, path) in cases {
        let hashes: Vec<String> = missing(&mut t.alice, &tree).await;
        let refused = upload(&mut t.alice, &tree, &hashes).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{path}: {refused:?}");
        assert!(refused.message().contains(path), "{path}: {refused:?}");
    }
    // A blob whose content is not its name: refused, and not stored.
    let (entry, _) = file("a.txt", b"what the tree says", false);
    let lying = vec![(entry, b"something else, same size".to_vec())];
    let hashes = missing(&mut t.alice, &lying).await;
    let refused = upload(&mut t.alice, &lying, &hashes).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(
        missing(&mut t.alice, &lying).await,
        hashes,
        "nothing stored"
    );
    // Over the limits: named.
    let many: Vec<_> = (0..9)
        .map(|i| file(&format!("f{i}"), format!("{i}").as_bytes(), false))
        .collect();
    let refused = upload(&mut t.alice, &many, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("limit per upload is 8"),
        "{refused:?}"
    );
    let big = vec![file("big", &vec![7u8; 65 << 10], false)];
    let refused = upload(&mut t.alice, &big, &[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // An upload cut short (a blob never sent) stores no tree.
    let tree = tree();
    let lacking = missing(&mut t.alice, &tree).await;
    let cut = upload(&mut t.alice, &tree, &lacking[..2])
        .await
        .unwrap_err();
    assert_eq!(cut.code(), Code::FailedPrecondition, "{cut:?}");
    // A session naming a workspace and an upload at once is refused.
    let done = upload(&mut t.alice, &tree, &lacking).await.unwrap();
    let both = pb::CreateSessionRequest {
        upload_id: done.upload_id,
        ..session_request(Path::new("/tmp"))
    };
    let refused = t
        .alice
        .create_session(both)
        .await
        .unwrap_err()
        .downcast::<tonic::Status>()
        .unwrap();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

/// A retry under one idempotency key that uploads the same tree again gets the first session;
/// the key with another tree is refused.
#[tokio::test]
async fn a_retry_with_the_same_tree_uploaded_again_gets_the_first_session() {
    let mut t = two_tenants().await;
    let tree = tree();
    let lacking = missing(&mut t.alice, &tree).await;
    let first = upload(&mut t.alice, &tree, &lacking).await.unwrap();
    let again = upload(&mut t.alice, &tree, &[]).await.unwrap();
    assert_ne!(first.upload_id, again.upload_id);
    let keyed = |upload_id: &str| pb::CreateSessionRequest {
        workspace: String::new(),
        upload_id: upload_id.into(),
        idempotency_key: "ci-run-42".into(),
        ..session_request(Path::new(""))
    };
    let one = t
        .alice
        .create_session(keyed(&first.upload_id))
        .await
        .unwrap();
    let two = t
        .alice
        .create_session(keyed(&again.upload_id))
        .await
        .unwrap();
    assert_eq!(one.session_id, two.session_id);
    let mut other = tree.clone();
    other[0] = file("README.md", b"# another tree\n", false);
    let lacking = missing(&mut t.alice, &other).await;
    let other = upload(&mut t.alice, &other, &lacking).await.unwrap();
    let refused = t
        .alice
        .create_session(keyed(&other.upload_id))
        .await
        .unwrap_err()
        .downcast::<tonic::Status>()
        .unwrap();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
}

/// A tenant's blobs stay within its `upload_quota`: a tree whose new contents would pass it is
/// refused, naming the quota, with nothing stored; what it already holds does not count again.
#[tokio::test]
async fn a_tree_past_the_tenant_s_quota_is_refused_with_nothing_stored() {
    let mut t = two_tenants().await;
    let small = vec![file("a.txt", &[b'a'; 4_000], false)];
    let lacking = missing(&mut t.mallory, &small).await;
    upload(&mut t.mallory, &small, &lacking).await.unwrap();
    // The same content again adds nothing: within the quota.
    let again = upload(&mut t.mallory, &small, &[]).await.unwrap();
    assert_eq!(again.blobs_received, 0);
    let more = vec![
        file("a.txt", &[b'a'; 4_000], false),
        file("b.txt", &[b'b'; 1_500], false),
    ];
    let lacking = missing(&mut t.mallory, &more).await;
    let refused = upload(&mut t.mallory, &more, &lacking).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("upload_quota"), "{refused:?}");
    assert_eq!(
        missing(&mut t.mallory, &more).await,
        lacking,
        "nothing stored"
    );
    // Alice's quota is the default: the same tree is hers to send.
    let lacking = missing(&mut t.alice, &more).await;
    upload(&mut t.alice, &more, &lacking).await.unwrap();
}

/// Two uploads of one tenant at once are each within its quota alone, not together: both are
/// checked against what the tenant held when they began (nothing), so the quota is counted
/// again when their blobs are stored, under the tenant's lock, and one of them is refused.
#[tokio::test]
async fn two_uploads_at_once_cannot_both_pass_the_quota() {
    let t = two_tenants().await;
    let trees = [
        file("a.txt", &[b'x'; 3_000], false),
        file("b.txt", &[b'y'; 3_000], false),
    ];
    let mut senders = Vec::new();
    let mut calls = Vec::new();
    for (entry, _) in &trees {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.send(pb::UploadWorkspaceRequest {
            part: Some(Part::Manifest(pb::UploadManifest {
                entries: vec![entry.clone()],
                git_commit: String::new(),
            })),
        })
        .await
        .unwrap();
        let request = t
            .mallory
            .req(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut client = t.mallory.client.clone();
        calls.push(tokio::spawn(async move {
            client.upload_workspace(request).await
        }));
        senders.push(tx);
    }
    // Both manifests are checked before either blob arrives.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for ((entry, content), tx) in trees.iter().zip(senders) {
        let Some(Kind::File(f)) = &entry.kind else {
            unreachable!()
        };
        tx.send(pb::UploadWorkspaceRequest {
            part: Some(Part::Blob(pb::BlobChunk {
                sha256: f.sha256.clone(),
                data: content.clone(),
                last: true,
            })),
        })
        .await
        .unwrap();
    }
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.unwrap());
    }
    let refused: Vec<&tonic::Status> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(refused.len(), 1, "{outcomes:?}");
    assert_eq!(refused[0].code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused[0].message().contains("upload_quota"), "{refused:?}");
}

/// A client that cuts its upload mid-blob: the blobs it sent whole are kept (a retry sends only
/// the rest); the one cut in the middle and the tree are not. (Before, a cut stream stored
/// nothing of what had arrived since the last 8 MiB flush.)
#[tokio::test]
async fn an_upload_cut_mid_stream_keeps_the_blobs_sent_whole() {
    let mut t = two_tenants().await;
    let tree = vec![
        file("whole.txt", b"sent whole before the cut\n", false),
        file("half.txt", &[b'h'; 3000], false),
    ];
    let hashes = missing(&mut t.alice, &tree).await;
    assert_eq!(hashes.len(), 2);
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let manifest = pb::UploadManifest {
        entries: tree.iter().map(|(e, _)| e.clone()).collect(),
        git_commit: String::new(),
    };
    let blob = |sha: &str, data: &[u8], last: bool| pb::UploadWorkspaceRequest {
        part: Some(Part::Blob(pb::BlobChunk {
            sha256: sha.to_owned(),
            data: data.to_vec(),
            last,
        })),
    };
    let (whole, half) = (blob_hash(&tree[0].1), blob_hash(&tree[1].1));
    tx.send(pb::UploadWorkspaceRequest {
        part: Some(Part::Manifest(manifest)),
    })
    .await
    .unwrap();
    tx.send(blob(&whole, &tree[0].1, true)).await.unwrap();
    tx.send(blob(&half, &tree[1].1[..1000], false))
        .await
        .unwrap();
    let request = t.alice.req(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut client = t.alice.client.clone();
    let call = tokio::spawn(async move { client.upload_workspace(request).await });
    // What was sent reaches the daemon; then the client goes away mid-blob.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    call.abort();
    drop(tx);
    let mut left = Vec::new();
    for _ in 0..100 {
        left = missing(&mut t.alice, &tree).await;
        if left.len() < 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        left,
        vec![half],
        "the whole blob is kept, the one cut in the middle is not"
    );
}
