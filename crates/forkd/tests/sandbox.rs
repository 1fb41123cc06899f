//! The sandbox end to end, through the real daemon: the escape a fork child tried when the issue
//! was filed (list the daemon's home, read its database, write beside the workspace) is refused
//! in a default session and allowed in a `full-access` one; and `full-access` is refused to a
//! remote tenant unless the configuration allows that tenant.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_server::TokenStore;
use forkd_test_support::{
    connect, create_session, fork, spawn_daemon, spawn_daemon_with, transcript_text,
    trusted_session_request, wait_for_batch,
};
use tonic::{Code, Request};

type Client = pb::forkd_client::ForkdClient<tonic::transport::Channel>;

/// Runs the escape in a child of a new session of `sandbox` (empty: the daemon's default) and
/// returns what the child saw. `other` is another session's workspace.
async fn escape(c: &mut Client, home: &Path, ws: &Path, other: &Path, sandbox: &str) -> String {
    let session = create_session(
        c,
        pb::CreateSessionRequest {
            sandbox: sandbox.into(),
            ..trusted_session_request(ws)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        session.sandbox,
        if sandbox.is_empty() {
            "workspace-write"
        } else {
            sandbox
        }
    );
    let home = home.display();
    let command = format!(
        "ls -la {home}; head -c 15 {home}/forkd.db; echo; cat {}/notes.md; \
         echo pwned > {}/../outside.txt",
        other.display(),
        ws.display()
    );
    let input = serde_json::json!({ "command": command });
    let script = format!("Look around.\n@sim tool Bash {input}\n@sim say done");
    let batch = fork(c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    wait_for_batch(c, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    transcript_text(c, &batch.agent_ids[0]).await.unwrap()
}

#[tokio::test]
async fn the_issues_escape_is_refused_in_the_default_sandbox_and_open_in_full_access() {
    let daemon = spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let base = tempfile::tempdir().unwrap();
    let ws = base.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let outside = base.path().join("outside.txt");
    // Another session's workspace, with something of its own.
    let other = base.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.md"), "their-private-notes").unwrap();
    create_session(&mut c, trusted_session_request(&other))
        .await
        .unwrap();

    let confined = escape(&mut c, daemon.home_path(), &ws, &other, "").await;
    assert!(!confined.contains("SQLite format"), "{confined}");
    assert!(!confined.contains("their-private-notes"), "{confined}");
    assert!(!confined.contains("forkd.sock"), "{confined}");
    assert!(
        !outside.exists(),
        "the write beside the workspace was refused"
    );

    let open = escape(&mut c, daemon.home_path(), &ws, &other, "full-access").await;
    assert!(open.contains("SQLite format"), "{open}");
    assert!(open.contains("their-private-notes"), "{open}");
    assert!(open.contains("forkd.sock"), "{open}");
    assert!(outside.exists());
}

#[tokio::test]
async fn full_access_is_refused_to_a_remote_tenant_the_config_does_not_allow() {
    const LOOPBACK: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
    let mut secrets = Vec::new();
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("web").unwrap());
        secrets.push(tokens.create("ci").unwrap());
        c.engine.sandbox.full_access_tenants.insert("ci".into());
    })
    .await
    .unwrap();
    let addr = format!("http://127.0.0.1:{}", daemon.tcp_addr().unwrap().port());
    let ws = tempfile::tempdir().unwrap();
    let ci_ws = daemon.tenant_workspace("ci");
    let ask = |secret: &str| {
        let mut request = Request::new(pb::CreateSessionRequest {
            sandbox: "full-access".into(),
            ..trusted_session_request(&ci_ws)
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {secret}").parse().unwrap());
        request
    };
    let mut c = connect(&addr).await.unwrap();
    let refused = c
        .create_session(ask(secrets[0].expose()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("allow_full_access"),
        "{refused:?}"
    );
    let allowed = c.create_session(ask(secrets[1].expose())).await.unwrap();
    let session = allowed.into_inner().session.unwrap();
    assert_eq!(session.sandbox, "full-access");
    // A mode nobody knows is the client's error.
    let mut bad = ask(secrets[1].expose());
    bad.get_mut().sandbox = "none".into();
    let status = c.create_session(bad).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // The `unix_sockets` grant is given as full-access is: refused to a tenant the
    // configuration does not name, granted to the local user.
    let unix = |secret: &str| {
        let mut request = ask(secret);
        request.get_mut().sandbox = String::new();
        request.get_mut().unix_sockets = true;
        request
    };
    let refused = c
        .create_session(unix(secrets[1].expose()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("allow_unix_sockets"),
        "{refused:?}"
    );
    let mut local = daemon.client().await.unwrap();
    let granted = create_session(
        &mut local,
        pb::CreateSessionRequest {
            unix_sockets: true,
            ..trusted_session_request(ws.path())
        },
    )
    .await
    .unwrap();
    assert!(granted.unix_sockets);
    assert!(
        granted.sandbox_layers.contains("Unix sockets granted"),
        "{}",
        granted.sandbox_layers
    );
    // Every session says which layers its commands get.
    assert!(session.sandbox_layers.contains("none (full-access)"));
    let plain = create_session(&mut local, trusted_session_request(ws.path()))
        .await
        .unwrap();
    for layer in [
        "landlock",
        "namespaces (user, mount, pid, net)",
        "seccomp",
        "rlimits",
    ] {
        assert!(
            plain.sandbox_layers.contains(layer),
            "{layer}: {}",
            plain.sandbox_layers
        );
    }
}

/// The second wall through the real daemon, as the issue's hostile tenant tried it: with `HOME`
/// holding credential files, a child's `Bash` call cannot kill a process outside its sandbox
/// (the daemon is one), read the credentials, or connect to a Unix-socket listener; a fork bomb
/// under the process cap ends in a tool error while the daemon keeps answering.
#[tokio::test]
async fn a_hostile_command_cannot_kill_read_credentials_or_reach_a_unix_socket() {
    let base = tempfile::tempdir().unwrap();
    let user = base.path().join("user");
    for file in [".git-credentials", ".pgpass", ".npmrc"] {
        std::fs::create_dir_all(&user).unwrap();
        std::fs::write(user.join(file), "a-credential").unwrap();
    }
    let daemon = spawn_daemon_with(|c| {
        c.engine.sandbox.home = Some(forkd_tools::sandbox::HomeView {
            dir: user.clone(),
            allow: Vec::new(),
        });
        c.engine.sandbox.limits.processes = Some(64);
        c.engine.sandbox.limits.session_processes = Some(64);
    })
    .await
    .unwrap();
    let mut c = daemon.client().await.unwrap();
    let ws = base.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let socket = base.path().join("listener.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut victim = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let session = create_session(&mut c, trusted_session_request(&ws))
        .await
        .unwrap();
    let command = format!(
        "kill -TERM {pid} {daemon}; echo kill=$?; cat {user}/.git-credentials {user}/.pgpass \
         {user}/.npmrc; python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); \
         s.connect('{socket}')\" 2>&1 | tail -1",
        pid = victim.id(),
        daemon = std::process::id(),
        user = user.display(),
        socket = socket.display(),
    );
    let input = serde_json::json!({ "command": command });
    let script = format!("Probe.\n@sim tool Bash {input}\n@sim say done");
    let batch = fork(&mut c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    wait_for_batch(&mut c, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    let seen = transcript_text(&mut c, &batch.agent_ids[0]).await.unwrap();
    assert!(seen.contains("kill=1"), "{seen}");
    assert_eq!(victim.try_wait().unwrap(), None, "the process outside died");
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(!seen.contains("a-credential"), "{seen}");
    assert!(seen.contains("PermissionError"), "{seen}");

    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if root && let Err(why) = forkd_tools::sandbox::cgroup::hierarchy() {
        // The kernel exempts uid 0 from RLIMIT_NPROC: a root daemon's commands are capped by
        // their session's pids cgroup, and here there is none.
        eprintln!("skipping the fork bomb: a root daemon with no cgroup to cap it ({why})");
        return;
    }
    let bomb = serde_json::json!({ "command": ":(){ :|:& };:; sleep 5", "timeout": 3 });
    let script = format!("Bomb.\n@sim tool Bash {bomb}\n@sim say done");
    let batch = fork(&mut c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    // The daemon answers while the bomb runs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = c
        .get_session(pb::GetSessionRequest {
            session_id: session.session_id.clone(),
        })
        .await;
    assert!(got.is_ok(), "{got:?}");
    wait_for_batch(&mut c, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    let seen = transcript_text(&mut c, &batch.agent_ids[0]).await.unwrap();
    assert!(
        seen.contains("timed out") || seen.contains("exit code"),
        "{seen}"
    );
    // The cap bound: forks failed.
    assert!(seen.contains("Resource temporarily unavailable"), "{seen}");
}

/// A sandboxed command with the network allowed reaches the daemon's loopback listeners, and
/// they do not take it for the local user: the gRPC listener answers `UNAUTHENTICATED`, the web
/// view's API 401 (a command could otherwise list every session, answer its own permission
/// prompts, or create a `full-access` session).
#[tokio::test]
async fn a_command_with_the_network_is_not_the_local_user_on_the_loopback_listeners() {
    const LOOPBACK: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        c.ui_listen = Some(LOOPBACK);
    })
    .await
    .unwrap();
    let grpc = daemon.tcp_addr().unwrap().port();
    let ui = daemon.daemon().unwrap().ui_addr.unwrap().port();
    let mut c = daemon.client().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let session = create_session(
        &mut c,
        pb::CreateSessionRequest {
            allow_network: true,
            ..trusted_session_request(ws.path())
        },
    )
    .await
    .unwrap();
    assert!(session.allow_network);
    let command = format!(
        "curl -s -o /dev/null -w 'ui=%{{http_code}}\\n' http://127.0.0.1:{ui}/api/sessions; \
         curl -s --http2-prior-knowledge -X POST -H 'content-type: application/grpc' \
         -H 'te: trailers' --data-binary '' -D - -o /dev/null \
         http://127.0.0.1:{grpc}/forkd.v1.Forkd/ListSessions | tr -d '\\r' | grep -i grpc-status"
    );
    let input = serde_json::json!({ "command": command });
    let script = format!("Knock.\n@sim tool Bash {input}\n@sim say done");
    let batch = fork(&mut c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    wait_for_batch(&mut c, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    let seen = transcript_text(&mut c, &batch.agent_ids[0]).await.unwrap();
    // Reached (a refused connection would be `ui=000`), and refused.
    assert!(seen.contains("ui=401"), "{seen}");
    // 16: UNAUTHENTICATED.
    assert!(seen.contains("grpc-status: 16"), "{seen}");
}

/// The sandbox's temporary root is trusted only when it is the daemon user's alone: one made
/// first as a symlink (by another user, on a shared machine) refuses sandboxed sessions with the
/// reason, and nothing is written where it leads.
#[tokio::test]
async fn a_temporary_root_that_is_not_the_daemons_alone_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let elsewhere = base.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let link = base.path().join("sandbox-tmp");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let daemon = spawn_daemon_with(|c| c.engine.sandbox.tmp_root = link.clone())
        .await
        .unwrap();
    let mut c = daemon.client().await.unwrap();
    let ws = daemon.workspace_path();
    let refused = create_session(&mut c, trusted_session_request(&ws))
        .await
        .expect_err("a sandboxed session is refused")
        .downcast::<tonic::Status>()
        .expect("a gRPC status");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("is a symbolic link"),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing was written through the link"
    );
}

/// A daemon raises its soft limit on open files to the hard one at start: sandbox views, clients
/// and commands each hold descriptors, and 1024 is a common soft default.
#[tokio::test]
async fn the_daemon_raises_its_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // As a shell or a service manager often starts it.
    setrlimit(Resource::RLIMIT_NOFILE, hard.min(1024), hard).unwrap();
    let _daemon = spawn_daemon().await.unwrap();
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert_eq!(soft, hard);
}
