//! A tenant reaches only its own files: two token tenants, `alice` and `mallory`, share one
//! daemon over TCP, and mallory tries each door the tenant-workspaces issue found open — alice's
//! directory, its parent, `/`, `FORKD_HOME` (its `secret.key` and `tokens.json`), a relative
//! path, a symlink in mallory's own root, a workspace replaced by a symlink after its session was
//! made, an isolated snapshot's git led out through the repository, and the network without the
//! grant. Each test failed before workspaces belonged to their tenant (the snapshot's, before its
//! git ran in the session's view).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_server::TokenStore;
use forkd_test_support::{Caller, TestDaemon, directives, session_request, spawn_daemon_with};
use tonic::Code;

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
const SECRET: &str = "alice-s-secret-9c1e";

struct Two {
    daemon: TestDaemon,
    alice: Caller,
    mallory: Caller,
    /// Alice's workspace: it holds her secret, and a session of hers works in it.
    alice_ws: std::path::PathBuf,
}

/// A daemon on TCP with tokens for alice and mallory (each given its test root), alice allowed
/// the network; alice's workspace holds her secret and one of her sessions.
async fn two_tenants() -> Two {
    let mut secrets = Vec::new();
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("alice").unwrap());
        secrets.push(tokens.create("mallory").unwrap());
        c.engine.sandbox.network_tenants.insert("alice".into());
    })
    .await
    .unwrap();
    let alice_ws = daemon.tenant_workspace("alice");
    std::fs::write(alice_ws.join("secret.txt"), SECRET).unwrap();
    let mut alice = Caller::new(&daemon, secrets[0].expose()).await.unwrap();
    let mallory = Caller::new(&daemon, secrets[1].expose()).await.unwrap();
    alice
        .create_session(in_workspace(&alice_ws.display().to_string()))
        .await
        .unwrap();
    Two {
        daemon,
        alice,
        mallory,
        alice_ws,
    }
}

/// A session request in `workspace` (`""`: none named).
fn in_workspace(workspace: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        workspace: workspace.to_owned(),
        ..session_request(Path::new(workspace))
    }
}

async fn refused(caller: &mut Caller, workspace: &str) -> tonic::Status {
    caller
        .create_session(in_workspace(workspace))
        .await
        .expect_err("the workspace is refused")
        .downcast::<tonic::Status>()
        .expect("a gRPC status")
}

#[tokio::test]
async fn a_tenant_names_only_workspaces_inside_its_roots() {
    let mut t = two_tenants().await;
    let alice_ws = t.alice_ws.clone();
    let home = t.daemon.home_path().to_path_buf();
    let doors = [
        alice_ws.clone(),
        alice_ws.parent().unwrap().to_path_buf(),
        "/".into(),
        home.clone(),
        home.join("isolation"),
        t.daemon.workspaces_dir(),
        t.daemon.workspace_path(),
    ];
    let mut messages = Vec::new();
    for door in &doors {
        let status = refused(&mut t.mallory, &door.display().to_string()).await;
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "{door:?}: {status:?}"
        );
        assert!(
            status.message().contains("workspace_roots"),
            "{}",
            status.message()
        );
        messages.push(status.message().to_owned());
    }
    // The same refusal for what exists and what does not: it says nothing of the machine.
    let missing = refused(&mut t.mallory, "/no/such/place").await;
    assert_eq!(missing.code(), Code::PermissionDenied);
    assert!(messages.iter().all(|m| *m == missing.message()));
    // A relative path would have named the daemon's working directory.
    let relative = refused(&mut t.mallory, "ws").await;
    assert_eq!(relative.code(), Code::InvalidArgument, "{relative:?}");
    // Inside its own root, mallory's workspace is its own.
    let own = t.daemon.tenant_workspace("mallory");
    t.mallory
        .create_session(in_workspace(&own.display().to_string()))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_daemon_s_own_user_may_not_share_a_tenant_s_workspace_nor_use_the_home() {
    let t = two_tenants().await;
    let alice_ws = t.alice_ws.clone();
    let mut local = t.daemon.client().await.unwrap();
    std::fs::create_dir_all(t.daemon.home_path().join("isolation")).unwrap();
    for (dir, what) in [
        (alice_ws.clone(), "another tenant"),
        (
            alice_ws.parent().unwrap().parent().unwrap().to_path_buf(),
            "another tenant",
        ),
        (t.daemon.home_path().to_path_buf(), "FORKD_HOME"),
        (t.daemon.home_path().join("isolation"), "FORKD_HOME"),
        ("/".into(), "root directory"),
    ] {
        let status = local
            .create_session(in_workspace(&dir.display().to_string()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{dir:?}: {status:?}");
        assert!(status.message().contains(what), "{}", status.message());
    }
}

/// A session's SessionStart hooks run before it is stored; a workspace another tenant took
/// meanwhile is found when it is stored, and the slower session is refused.
#[tokio::test]
async fn a_workspace_taken_while_a_session_starts_is_refused_when_it_is_stored() {
    let mut t = two_tenants().await;
    let late = t.alice_ws.parent().unwrap().join("late");
    std::fs::create_dir_all(&late).unwrap();
    let mut local = t.daemon.client().await.unwrap();
    let slow_start = serde_json::json!({ "hooks": { "SessionStart": [{ "hooks": [
        { "type": "command", "command": "sleep 3" }
    ]}]}});
    let alices = t.alice.create_session(pb::CreateSessionRequest {
        hooks_json: slow_start.to_string(),
        ..in_workspace(&late.display().to_string())
    });
    let locals = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        local
            .create_session(in_workspace(&late.display().to_string()))
            .await
    };
    let (alices, locals) = tokio::join!(alices, locals);
    locals.expect("the local session was stored first");
    let status = alices
        .expect_err("alice's session, stored second, is refused")
        .downcast::<tonic::Status>()
        .unwrap();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("another tenant"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn a_tenant_naming_no_workspace_gets_a_fresh_empty_one_of_its_own() {
    let mut t = two_tenants().await;
    let mut made = Vec::new();
    for _ in 0..2 {
        let session = t.mallory.create_session(in_workspace("")).await.unwrap();
        let ws = std::path::PathBuf::from(&session.workspace);
        assert!(
            ws.starts_with(std::fs::canonicalize(t.daemon.workspaces_dir()).unwrap()),
            "{ws:?}"
        );
        assert_eq!(std::fs::read_dir(&ws).unwrap().count(), 0, "empty");
        made.push(ws);
    }
    assert_ne!(made[0], made[1]);
}

#[tokio::test]
async fn a_symlink_in_a_tenant_s_root_does_not_lead_to_another_tenant_s_files() {
    let mut t = two_tenants().await;
    let alice_ws = t.alice_ws.clone();
    let root = t.daemon.tenant_workspace("mallory");
    std::os::unix::fs::symlink(&alice_ws, root.join("to-alice")).unwrap();
    let status = refused(&mut t.mallory, &root.join("to-alice").display().to_string()).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // A workspace made as a directory and replaced by a link to alice's afterwards (as a Bash
    // command of mallory's could) is not followed: it is pinned where it was created.
    let pinned = root.join("pinned");
    std::fs::create_dir(&pinned).unwrap();
    let session = t
        .mallory
        .create_session(in_workspace(&pinned.display().to_string()))
        .await
        .unwrap();
    std::fs::remove_dir(&pinned).unwrap();
    std::os::unix::fs::symlink(&alice_ws, &pinned).unwrap();
    let note = run_one(
        &mut t.mallory,
        &session.session_id,
        "@sim tool Read {\"file_path\":\"secret.txt\"}\n@sim tool Grep {\"pattern\":\"alice\",\"output_mode\":\"content\"}",
    )
    .await;
    let seen = format!("{note:?}");
    assert!(!seen.contains(SECRET), "{seen}");
    let transcript = transcript_of(&mut t.mallory, &note.agent_id).await;
    assert!(!transcript.contains(SECRET), "{transcript}");
    assert!(
        seen.contains("replaced") || transcript.contains("replaced"),
        "the child is told its workspace was replaced: {seen} {transcript}"
    );
    // Nor is it copied from where the link leads, for an isolated batch.
    let isolated = t
        .mallory
        .client
        .fork_batch(t.mallory.req(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: directives(&["@sim tool Read {\"file_path\":\"secret.txt\"}"]),
            isolation: "copy".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(isolated.code(), Code::FailedPrecondition, "{isolated:?}");
    assert!(isolated.message().contains("replaced"), "{isolated:?}");
}

#[tokio::test]
async fn an_isolated_snapshot_s_git_writes_nothing_in_another_tenant_s_files() {
    let mut t = two_tenants().await;
    let root = t.daemon.tenant_workspace("mallory");
    let repo = root.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let init = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    let session = t
        .mallory
        .create_session(in_workspace(&repo.display().to_string()))
        .await
        .unwrap();
    // What mallory's Bash can write in her own repository: every ref update logged, into a
    // `logs/` that leads to alice's workspace.
    let config = repo.join(".git/config");
    let planted =
        std::fs::read_to_string(&config).unwrap() + "[core]\n\tlogAllRefUpdates = always\n";
    std::fs::write(&config, planted).unwrap();
    std::os::unix::fs::symlink(&t.alice_ws, repo.join(".git/logs")).unwrap();
    let before: Vec<_> = std::fs::read_dir(&t.alice_ws)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();

    let refused = t
        .mallory
        .client
        .fork_batch(t.mallory.req(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: directives(&["@sim text done"]),
            isolation: "copy".into(),
            ..Default::default()
        }))
        .await
        .expect_err("the snapshot's git cannot write its reflog through the link");
    assert!(refused.message().contains("update-ref"), "{refused:?}");
    let after: Vec<_> = std::fs::read_dir(&t.alice_ws)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(before, after, "nothing was written in alice's workspace");
}

#[tokio::test]
async fn the_network_is_a_grant() {
    let mut t = two_tenants().await;
    let request = |ws: &Path| pb::CreateSessionRequest {
        allow_network: true,
        ..in_workspace(&ws.display().to_string())
    };
    let denied = t
        .mallory
        .create_session(request(&t.daemon.tenant_workspace("mallory")))
        .await
        .unwrap_err()
        .downcast::<tonic::Status>()
        .unwrap();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(
        denied.message().contains("allow_network"),
        "{}",
        denied.message()
    );
    let granted = t.alice.create_session(request(&t.alice_ws)).await.unwrap();
    assert!(granted.allow_network);
}

/// The status a stream ends with, once it ends (within 20 seconds).
async fn end_of<T>(stream: &mut tonic::Streaming<T>) -> tonic::Status {
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => return status,
            }
        }
    });
    ended
        .await
        .expect("the stream ends once its token is revoked")
}

/// Forks one child of `session` running `script` as `caller` and waits for its notification.
async fn run_one(caller: &mut Caller, session: &str, script: &str) -> pb::Notification {
    let batch = caller
        .client
        .fork_batch(caller.req(pb::ForkBatchRequest {
            session_id: session.to_owned(),
            directives: directives(&[script]),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let mut stream = caller
        .client
        .subscribe_notifications(caller.req(pb::SubscribeNotificationsRequest {
            batch_id: batch.batch_id,
            follow: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(Duration::from_secs(60), stream.message())
        .await
        .expect("the child ends")
        .unwrap()
        .expect("a notification")
}

/// An agent's whole transcript, as text, read as `caller`.
async fn transcript_of(caller: &mut Caller, agent: &str) -> String {
    let reply = caller
        .client
        .get_transcript(caller.req(pb::GetTranscriptRequest {
            agent_id: agent.to_owned(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    format!("{reply:?}")
}

#[tokio::test]
async fn revoking_a_token_ends_its_open_streams() {
    let mut t = two_tenants().await;
    let session = t.mallory.create_session(in_workspace("")).await.unwrap();
    let mut notes = t
        .mallory
        .client
        .subscribe_notifications(t.mallory.req(pb::SubscribeNotificationsRequest {
            follow: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let mut turn = t
        .mallory
        .client
        .send_message(t.mallory.req(pb::SendMessageRequest {
            session_id: session.session_id,
            text: "Wait a while.\n@sim sleep 30s\n@sim say done".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    t.daemon.tokens().revoke("mallory").unwrap();
    for (what, status) in [
        ("notifications", end_of(&mut notes).await),
        ("the turn", end_of(&mut turn).await),
    ] {
        assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
        assert!(status.message().contains("revoked"), "{}", status.message());
    }
    // Alice's token still works.
    t.alice.create_session(in_workspace("")).await.unwrap();
}

#[tokio::test]
async fn each_tenant_s_cursor_counts_its_own_notifications() {
    let mut t = two_tenants().await;
    let a = t.alice.create_session(in_workspace("")).await.unwrap();
    let m = t.mallory.create_session(in_workspace("")).await.unwrap();
    // Interleaved: alice, mallory, alice, mallory.
    for _ in 0..2 {
        run_one(&mut t.alice, &a.session_id, "one").await;
        run_one(&mut t.mallory, &m.session_id, "one").await;
    }
    for caller in [&mut t.alice, &mut t.mallory] {
        let mut replay = caller
            .client
            .subscribe_notifications(caller.req(pb::SubscribeNotificationsRequest::default()))
            .await
            .unwrap()
            .into_inner();
        let mut seqs = Vec::new();
        while let Some(n) = replay.message().await.unwrap() {
            seqs.push(n.seq);
        }
        assert_eq!(
            seqs,
            [1, 2],
            "a tenant's numbers say nothing of the other's"
        );
    }
}
