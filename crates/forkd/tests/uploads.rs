//! Uploaded workspaces over the real gRPC API: two token tenants, `alice` and `mallory`, on one
//! daemon over TCP. A tree uploaded by alice becomes her session's workspace; a second upload of
//! it sends only what changed; mallory learns nothing of alice's blobs or uploads; hostile and
//! incomplete trees are refused with nothing usable stored.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use forkd_core::upload::blob_hash;
use forkd_proto::v1 as pb;
use forkd_server::TokenStore;
use forkd_test_support::{
    Caller, TestDaemon, session_request, spawn_daemon_with, trusted_session_request,
};
use pb::upload_entry::Kind;
use pb::upload_workspace_request::Part;
use tonic::Code;

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

struct Two {
    daemon: TestDaemon,
    alice: Caller,
    mallory: Caller,
}

/// A daemon on TCP with tokens for alice and mallory; an upload holds at most 64 KiB and 8
/// files, and mallory's blobs at most 5,000 bytes.
async fn two_tenants() -> Two {
    two_tenants_with(true).await
}

/// [`two_tenants`]; `layered`: sessions made from uploads work in layers over kept trees (where
/// `/forkd/workspaces` is here), else each gets a copy.
async fn two_tenants_with(layered: bool) -> Two {
    let mut secrets = Vec::new();
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        c.layered_uploads = layered;
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("alice").unwrap());
        secrets.push(tokens.create("mallory").unwrap());
        c.engine.uploads = forkd_core::upload::UploadLimits {
            max_bytes: 64 << 10,
            max_files: 8,
            quotas: [("mallory".to_owned(), 5_000)].into(),
            ..Default::default()
        };
    })
    .await
    .unwrap();
    let alice = Caller::new(&daemon, secrets[0].expose()).await.unwrap();
    let mallory = Caller::new(&daemon, secrets[1].expose()).await.unwrap();
    Two {
        daemon,
        alice,
        mallory,
    }
}

fn file(path: &str, content: &[u8], executable: bool) -> (pb::UploadEntry, Vec<u8>) {
    let entry = pb::UploadEntry {
        path: path.into(),
        kind: Some(Kind::File(pb::UploadFile {
            sha256: blob_hash(content),
            size: content.len() as u64,
            executable,
        })),
    };
    (entry, content.to_vec())
}

fn link(path: &str, target: &str) -> (pb::UploadEntry, Vec<u8>) {
    let entry = pb::UploadEntry {
        path: path.into(),
        kind: Some(Kind::Symlink(target.into())),
    };
    (entry, Vec::new())
}

async fn missing(caller: &mut Caller, tree: &[(pb::UploadEntry, Vec<u8>)]) -> Vec<String> {
    let hashes = tree
        .iter()
        .filter_map(|(e, _)| match &e.kind {
            Some(Kind::File(f)) => Some(f.sha256.clone()),
            _ => None,
        })
        .collect();
    let request = caller.req(pb::FindMissingBlobsRequest { hashes });
    caller
        .client
        .find_missing_blobs(request)
        .await
        .unwrap()
        .into_inner()
        .missing
}

/// Uploads `tree`'s manifest and the blobs named in `send` (in pieces of 1000 bytes).
async fn upload(
    caller: &mut Caller,
    tree: &[(pb::UploadEntry, Vec<u8>)],
    send: &[String],
) -> Result<pb::UploadWorkspaceResponse, tonic::Status> {
    let mut messages = vec![pb::UploadWorkspaceRequest {
        part: Some(Part::Manifest(pb::UploadManifest {
            entries: tree.iter().map(|(e, _)| e.clone()).collect(),
            git_commit: String::new(),
        })),
    }];
    let mut sent = std::collections::HashSet::new();
    for (entry, content) in tree {
        let Some(Kind::File(f)) = &entry.kind else {
            continue;
        };
        if !send.contains(&f.sha256) || !sent.insert(f.sha256.clone()) {
            continue;
        }
        let pieces: Vec<&[u8]> = if content.is_empty() {
            vec![&[]]
        } else {
            content.chunks(1000).collect()
        };
        for (i, piece) in pieces.iter().enumerate() {
            messages.push(pb::UploadWorkspaceRequest {
                part: Some(Part::Blob(pb::BlobChunk {
                    sha256: f.sha256.clone(),
                    data: piece.to_vec(),
                    last: i + 1 == pieces.len(),
                })),
            });
        }
    }
    let request = caller.req(tokio_stream::iter(messages));
    caller
        .client
        .upload_workspace(request)
        .await
        .map(tonic::Response::into_inner)
}

fn tree() -> Vec<(pb::UploadEntry, Vec<u8>)> {
    vec![
        file("README.md", b"# the project\n", false),
        file("bin/run.sh", b"#!/bin/sh\necho run\n", true),
        file("src/lib.rs", &b"fn x() {}\n".repeat(300), false),
        file("empty", b"", false),
        link("src/readme", "../README.md"),
    ]
}

async fn session_from(caller: &mut Caller, upload_id: &str) -> Result<pb::Session, tonic::Status> {
    let request = pb::CreateSessionRequest {
        workspace: String::new(),
        upload_id: upload_id.into(),
        ..trusted_session_request(Path::new(""))
    };
    caller
        .create_session(request)
        .await
        .map_err(|e| e.downcast::<tonic::Status>().expect("a gRPC status"))
}

/// What an agent of the session sees of its workspace: where it is, a file, the run bit, the
/// link, the empty file, `src/lib.rs`'s size.
async fn seen(c: &mut Caller, session: &pb::Session) -> String {
    c.bash(
        &session.session_id,
        "pwd; cat README.md; stat -c '%A' bin/run.sh; readlink src/readme; wc -c < empty; \
         wc -c < src/lib.rs",
    )
    .await
    .unwrap()
}

/// `seen` of the first tree: at `ws`, with `lib` bytes of `src/lib.rs`.
fn tree_at(ws: &str, lib: usize) -> String {
    format!("{ws}\n# the project\n-rwxr-xr-x\n../README.md\n0\n{lib}\n")
}

/// Uploads the tree, then it again with one file changed; a session from each. Their agents
/// see each tree where their session says its workspace is, and their edits stay their own.
async fn round_trip(layered: bool) {
    let mut t = two_tenants_with(layered).await;
    let tree = tree();
    let lacking = missing(&mut t.alice, &tree).await;
    assert_eq!(lacking.len(), 4, "every file's blob at first");
    let first = upload(&mut t.alice, &tree, &lacking).await.unwrap();
    assert_eq!((first.files, first.blobs_received), (5, 4));
    assert_eq!(
        first.bytes,
        tree.iter().map(|(_, c)| c.len() as u64).sum::<u64>()
    );

    let session = session_from(&mut t.alice, &first.upload_id).await.unwrap();
    let origin = session.upload_origin.clone().expect("the session's origin");
    assert_eq!(
        (origin.upload_id.as_str(), origin.files, origin.bytes),
        (first.upload_id.as_str(), 5, first.bytes)
    );
    let ws = Path::new(&session.workspace);
    let lib = "fn x() {}\n".len() * 300;
    assert_eq!(
        seen(&mut t.alice, &session).await,
        tree_at(&session.workspace, lib)
    );
    let kept = t.daemon.home_path().join("trees").join(&first.upload_id);
    if layered {
        // The same path on every daemon, which only the session's views have; the tree is
        // kept once, read-only, in the daemon's home.
        assert_eq!(ws, Path::new("/forkd/workspaces").join(&session.session_id));
        assert!(!ws.exists(), "the path is the views' alone");
        assert_eq!(
            std::fs::read_to_string(kept.join("README.md")).unwrap(),
            "# the project\n"
        );
    } else {
        // A copy of its own, in workspaces_dir.
        assert!(ws.starts_with(t.daemon.workspaces_dir()), "{ws:?}");
        let run = std::fs::metadata(ws.join("bin/run.sh")).unwrap();
        assert_eq!(run.permissions().mode() & 0o111, 0o111);
        assert!(!kept.exists());
    }

    // The same tree with one file changed: only that blob is missing, and only it is sent.
    let mut changed = tree.clone();
    changed[2] = file("src/lib.rs", b"fn y() {}\n", false);
    let lacking = missing(&mut t.alice, &changed).await;
    assert_eq!(lacking, vec![blob_hash(b"fn y() {}\n")]);
    let second = upload(&mut t.alice, &changed, &lacking).await.unwrap();
    assert_eq!((second.blobs_received, second.bytes_received), (1, 10));
    let again = session_from(&mut t.alice, &second.upload_id).await.unwrap();
    assert_eq!(
        seen(&mut t.alice, &again).await,
        tree_at(&again.workspace, 10)
    );

    // An edit in the first session is its own: neither a later session from the same upload
    // nor the kept tree has it.
    t.alice
        .bash(&session.session_id, "echo edited > README.md && rm empty")
        .await
        .unwrap();
    let third = session_from(&mut t.alice, &first.upload_id).await.unwrap();
    assert_eq!(
        seen(&mut t.alice, &third).await,
        tree_at(&third.workspace, lib)
    );
    let edited = t
        .alice
        .bash(&session.session_id, "cat README.md; ls empty")
        .await
        .unwrap();
    assert!(edited.starts_with("edited\n"), "{edited}");
    assert!(edited.contains("No such file"), "{edited}");
    if layered {
        assert_eq!(
            std::fs::read_to_string(kept.join("README.md")).unwrap(),
            "# the project\n"
        );
        // What the session wrote is in its own directory, not where views see it.
        let upper = t
            .daemon
            .workspaces_dir()
            .join(&session.session_id)
            .join("upper");
        assert_eq!(
            std::fs::read_to_string(upper.join("README.md")).unwrap(),
            "edited\n"
        );
        assert_eq!(
            std::fs::read_dir("/forkd/workspaces").unwrap().count(),
            0,
            "nothing is ever made in /forkd/workspaces here"
        );
    }
}

#[tokio::test]
async fn an_uploaded_tree_is_a_session_s_workspace_and_again_only_changes_are_sent() {
    if !Path::new("/forkd/workspaces").is_dir() && !running_as_root() {
        eprintln!(
            "skipped: /forkd/workspaces is missing and the daemon cannot make it (not root); \
             sessions get copies (covered by the next test)"
        );
        return;
    }
    round_trip(true).await;
}

#[tokio::test]
async fn without_the_view_root_a_session_gets_a_copy_of_the_tree() {
    round_trip(false).await;
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

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

/// Whether this machine has `/forkd/workspaces` (or the daemon, as root, can make it): where it
/// has not, sessions made from uploads get copies, and the layer tests say so and stop.
fn layers_here() -> bool {
    let here = Path::new("/forkd/workspaces").is_dir() || running_as_root();
    if !here {
        eprintln!("skipped: /forkd/workspaces is missing and the daemon cannot make it");
    }
    here
}

/// The local user's session from the tree of [`tree`], uploaded.
async fn local_session(daemon: &TestDaemon) -> (Caller, pb::Session) {
    let mut local = Caller::local(daemon).await.unwrap();
    let tree = tree();
    let lacking = missing(&mut local, &tree).await;
    let uploaded = upload(&mut local, &tree, &lacking).await.unwrap();
    let session = session_from(&mut local, &uploaded.upload_id).await.unwrap();
    (local, session)
}

#[tokio::test]
async fn an_isolated_batch_of_an_uploaded_session_applies_into_its_layer_and_it_survives_a_restart()
{
    if !layers_here() {
        return;
    }
    let mut daemon = spawn_daemon_with(|_| {}).await.unwrap();
    let (mut local, session) = local_session(&daemon).await;
    let sid = session.session_id.clone();
    let child = "Edit.\n@sim tool Bash {\"command\":\"echo child > README.md && echo added > \
                 new.txt && pwd\"}\n@sim say edited";
    let batch = local
        .client
        .fork_batch(pb::ForkBatchRequest {
            session_id: sid.clone(),
            directives: forkd_test_support::directives(&[child]),
            isolation: "copy".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    forkd_test_support::wait_for_batch(
        &mut local.client,
        &batch.batch_id,
        1,
        std::time::Duration::from_secs(60),
    )
    .await
    .unwrap();
    // The child worked in its own copy, at the session's path; the session saw nothing yet.
    let log = forkd_test_support::transcript_text(&mut local.client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains(&session.workspace), "{log}");
    assert_eq!(
        local.bash(&sid, "cat README.md").await.unwrap(),
        "# the project\n"
    );
    let applied = local
        .client
        .apply_changes(pb::ApplyChangesRequest {
            batch_id: batch.batch_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(applied.results[0].conflicts.is_empty(), "{applied:?}");
    assert_eq!(
        local.bash(&sid, "cat README.md new.txt").await.unwrap(),
        "child\nadded\n"
    );

    // After a restart the layer is made again over the same edits.
    daemon.restart(|_| {}).await.unwrap();
    let mut local = Caller::local(&daemon).await.unwrap();
    assert_eq!(
        local
            .bash(&sid, "cat README.md new.txt; pwd")
            .await
            .unwrap(),
        format!("child\nadded\n{}\n", session.workspace)
    );
    // A branch works in its origin's workspace: the same layer, the same files.
    let branch = local
        .client
        .branch_session(pb::BranchSessionRequest {
            session_id: sid.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(branch.workspace, session.workspace);
    assert_eq!(
        local
            .bash(&branch.session_id, "cat new.txt; echo from-branch > b.txt")
            .await
            .unwrap(),
        "added\n"
    );
    assert_eq!(
        local.bash(&sid, "cat b.txt").await.unwrap(),
        "from-branch\n"
    );
    // And the session's diff since its upload reads through it.
    let changes = local
        .client
        .get_session_changes(pb::GetSessionChangesRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut paths: Vec<(String, String)> = changes
        .files
        .iter()
        .map(|f| (f.path.clone(), f.kind.clone()))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            ("README.md".to_owned(), "modified".to_owned()),
            ("b.txt".to_owned(), "added".to_owned()),
            ("new.txt".to_owned(), "added".to_owned())
        ]
    );
}

#[tokio::test]
async fn another_session_sees_nothing_of_an_uploaded_session_s_files() {
    if !layers_here() {
        return;
    }
    let mut t = two_tenants().await;
    let tree = tree();
    let lacking = missing(&mut t.alice, &tree).await;
    let first = upload(&mut t.alice, &tree, &lacking).await.unwrap();
    let alice_s = session_from(&mut t.alice, &first.upload_id).await.unwrap();
    t.alice
        .bash(&alice_s.session_id, "echo secret > mine.txt")
        .await
        .unwrap();
    // Mallory's own uploaded session: beside its workspace, nothing; alice's edits and the kept
    // tree are not reachable by any path.
    let theirs = vec![file("m.txt", b"m\n", false)];
    let lacking = missing(&mut t.mallory, &theirs).await;
    let up = upload(&mut t.mallory, &theirs, &lacking).await.unwrap();
    let mallory_s = session_from(&mut t.mallory, &up.upload_id).await.unwrap();
    let upper = t
        .daemon
        .workspaces_dir()
        .join(&alice_s.session_id)
        .join("upper/mine.txt");
    let kept = t.daemon.home_path().join("trees").join(&first.upload_id);
    let probe = format!(
        "ls -A /forkd/workspaces; cat /forkd/workspaces/{}/mine.txt {} {}/README.md",
        alice_s.session_id,
        upper.display(),
        kept.display()
    );
    let seen = t.mallory.bash(&mallory_s.session_id, &probe).await.unwrap();
    assert!(
        seen.starts_with(&format!("{}\n", mallory_s.session_id)),
        "{seen}"
    );
    assert!(
        !seen.contains("secret") && !seen.contains("# the project"),
        "{seen}"
    );
}
