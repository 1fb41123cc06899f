//! MCP servers end to end: the daemon's operator defines a server in `$FORKD_HOME/mcp.json`, a
//! session enables it by name, fork children call its tools through `@sim tool mcp__…` and get
//! the server's real results. The server is the fixture built on the official Python MCP SDK
//! (`crates/test-support/fixtures/mcp_server.py`); without the SDK these tests skip, in CI they
//! fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_server::TokenStore;
use forkd_store::RequestFilter;
use forkd_test_support::{
    connect, create_session, eventually, fork, mcp_fixture, mcp_python, session_request,
    spawn_daemon, spawn_daemon_with, transcript_text, wait_for_batch,
};
use serde_json::json;
use tonic::{Code, Request};

const DEADLINE: Duration = Duration::from_secs(60);

/// Writes the operator's `mcp.json` with the fixture as server `calc` (and `extra` servers).
fn write_mcp_json(home: &Path, python: &str, calc: serde_json::Value, extra: serde_json::Value) {
    let mut calc_def = json!({
        "command": python,
        "args": [mcp_fixture().display().to_string(), "stdio"],
        "readOnlyTools": ["add", "pid"],
    });
    calc_def
        .as_object_mut()
        .unwrap()
        .extend(calc.as_object().unwrap().clone());
    let mut servers = json!({"calc": calc_def});
    servers
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    std::fs::write(
        home.join("mcp.json"),
        json!({"mcpServers": servers}).to_string(),
    )
    .unwrap();
}

/// A daemon whose operator's `mcp.json` has the fixture as `calc`; its servers live under a
/// temporary root of its own (returned with it, to keep).
async fn calc_daemon(python: &str) -> (tempfile::TempDir, forkd_test_support::TestDaemon) {
    let tmp_root = tempfile::tempdir().unwrap();
    let daemon = spawn_daemon_with(|c| {
        write_mcp_json(&c.home, python, json!({}), json!({}));
        c.engine.sandbox.tmp_root = tmp_root.path().to_path_buf();
    })
    .await
    .unwrap();
    (tmp_root, daemon)
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

#[tokio::test]
async fn fork_children_call_a_servers_tools_and_get_its_real_results() {
    let Some(python) = mcp_python() else { return };
    let (tmp_root, mut daemon) = calc_daemon(&python).await;
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into()],
            allow_rules: vec!["mcp__calc__echo".into(), "mcp__calc__pixel".into()],
            deny_rules: vec!["mcp__calc__write_file".into()],
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    assert_eq!(session.mcp_servers, ["calc"]);
    for tool in [
        "mcp__calc__add",
        "mcp__calc__dotted_name",
        "mcp__calc__echo",
    ] {
        assert!(
            session.tool_names.contains(&tool.to_owned()),
            "{:?}",
            session.tool_names
        );
    }
    // MCP tools come after the built-ins (docs/mcp.md).
    let first_mcp = session
        .tool_names
        .iter()
        .position(|n| n.starts_with("mcp__"))
        .unwrap();
    assert!(
        session.tool_names[first_mcp..]
            .iter()
            .all(|n| n.starts_with("mcp__"))
    );

    let directives = [
        "Add.\n@sim tool mcp__calc__add {\"a\":2,\"b\":40}\n@sim say added",
        "Echo.\n@sim tool mcp__calc__echo {\"text\":\"hello there\"}\n@sim say echoed",
        "Picture.\n@sim tool mcp__calc__pixel {}\n@sim say drew",
        "Write.\n@sim tool mcp__calc__write_file {\"path\":\"x\",\"text\":\"y\"}\n@sim say denied",
        "Fail.\n@sim tool mcp__calc__fail {\"message\":\"no luck here\"}\n@sim say failed",
        "Pid.\n@sim tool mcp__calc__pid {}\n@sim say pid",
    ];
    let batch = fork(&mut client, &session.session_id, &directives, None)
        .await
        .unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, directives.len(), DEADLINE)
        .await
        .unwrap();
    assert!(
        done.iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{done:?}"
    );
    let mut logs = Vec::new();
    for id in &batch.agent_ids {
        logs.push(transcript_text(&mut client, id).await.unwrap());
    }
    // The server's real results, in each child's transcript.
    assert!(logs[0].contains(r#""content":"42""#), "{}", logs[0]);
    assert!(logs[1].contains("echo: hello there"), "{}", logs[1]);
    assert!(
        logs[2].contains(r#""type":"image""#) && logs[2].contains("image/png"),
        "{}",
        logs[2]
    );
    assert!(
        logs[3].contains("denied by the permission rule `mcp__calc__write_file`"),
        "{}",
        logs[3]
    );
    assert!(
        logs[4].contains("no luck here") && logs[4].contains(r#""is_error":true"#),
        "{}",
        logs[4]
    );

    // Siblings' first requests are byte-identical up to their directives.
    let engine = &daemon.daemon().unwrap().engine;
    let requests = engine
        .store()
        .list_requests(&RequestFilter {
            batch_id: Some(batch.batch_id.parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut first: HashMap<String, &str> = HashMap::new();
    for r in requests.iter().filter(|r| r.turn == 0) {
        first.insert(r.agent_id.to_string(), r.prefix_fingerprint.as_str());
    }
    assert_eq!(first.len(), directives.len());
    let fingerprints: std::collections::HashSet<&str> = first.values().copied().collect();
    assert_eq!(fingerprints.len(), 1, "{first:?}");

    // Shutdown stops the server: no process of it is left.
    let pid: i32 = logs[5]
        .split("\"content\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", logs[5]));
    // The server reports its pid in its own PID namespace.
    let pid = forkd_test_support::host_pid(pid, tmp_root.path())
        .unwrap_or_else(|| panic!("no process of pid {pid} in its namespace"));
    assert!(alive(pid));
    daemon.stop().await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the MCP server to stop",
        || async move { (!alive(pid)).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn crashes_timeouts_and_servers_that_never_start_are_clear_errors() {
    let Some(python) = mcp_python() else { return };
    let daemon = spawn_daemon_with(|c| {
        write_mcp_json(
            &c.home,
            &python,
            json!({"timeoutSecs": 1}),
            json!({"broken": {"command": "bash", "args": ["-c", "echo cannot import things >&2; exit 2"]}}),
        );
    })
    .await
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();

    // A server that never starts fails the session's creation, naming it and why.
    let refused = client
        .create_session(pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into(), "broken".into()],
            ..session_request(ws.path())
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("\"broken\"")
            && refused.message().contains("cannot import things"),
        "{refused:?}"
    );
    // So does an unknown name, and tools nothing runs.
    let unknown = client
        .create_session(pb::CreateSessionRequest {
            mcp_servers: vec!["nope".into()],
            ..session_request(ws.path())
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert!(unknown.message().contains("calc"), "{unknown:?}");
    #[allow(deprecated)]
    let external = client
        .create_session(pb::CreateSessionRequest {
            external_tools_json: vec![r#"{"name":"x","input_schema":{}}"#.into()],
            ..session_request(ws.path())
        })
        .await
        .unwrap_err();
    assert_eq!(external.code(), Code::InvalidArgument);
    assert!(external.message().contains("mcp_servers"), "{external:?}");

    // The daemon keeps serving: a crash mid-call and a timeout are tool errors.
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into()],
            permission_mode: "bypassPermissions".into(),
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let directives = [
        "Crash.\n@sim tool mcp__calc__crash {}\n@sim say crashed",
        "Slow.\n@sim tool mcp__calc__sleep {\"seconds\":600}\n@sim say slept",
    ];
    let batch = fork(&mut client, &session.session_id, &directives, None)
        .await
        .unwrap();
    wait_for_batch(&mut client, &batch.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    let crashed = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(crashed.contains("stopped during the call"), "{crashed}");
    let slow = transcript_text(&mut client, &batch.agent_ids[1])
        .await
        .unwrap();
    assert!(
        slow.contains("did not answer the call within 1 s")
            || slow.contains("stopped during the call"),
        "{slow}"
    );
    // And the server comes back for later calls.
    let later = ["Add.\n@sim tool mcp__calc__add {\"a\":1,\"b\":1}\n@sim say added"];
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let batch = fork(&mut client, &session.session_id, &later, None)
            .await
            .unwrap();
        wait_for_batch(&mut client, &batch.batch_id, 1, DEADLINE)
            .await
            .unwrap();
        let log = transcript_text(&mut client, &batch.agent_ids[0])
            .await
            .unwrap();
        if log.contains(r#""content":"2""#) {
            break;
        }
        assert!(log.contains("restarted"), "{log}");
        assert!(
            std::time::Instant::now() < deadline,
            "the server never came back: {log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A one-child batch of `session` whose child calls its own server's `add` on `a` and `b`; the
/// child's transcript.
async fn add_in_a_child(
    client: &mut forkd_proto::v1::forkd_client::ForkdClient<tonic::transport::Channel>,
    session: &str,
    a: i64,
    b: i64,
) -> String {
    let prompt = format!("Add.\n@sim tool mcp__mine__add {{\"a\":{a},\"b\":{b}}}\n@sim say added");
    let batch = fork(client, session, &[prompt.as_str()], None)
        .await
        .unwrap();
    wait_for_batch(client, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    transcript_text(client, &batch.agent_ids[0]).await.unwrap()
}

#[tokio::test]
async fn a_session_s_own_servers_are_for_the_local_user_and_allowed_tenants() {
    let Some(python) = mcp_python() else { return };
    const LOOPBACK: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
    let mut secrets = Vec::new();
    let mut daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("web").unwrap());
        secrets.push(tokens.create("ci").unwrap());
        c.engine.mcp.config_tenants.insert("ci".into());
    })
    .await
    .unwrap();
    let own = json!({"mcpServers": {"mine": {
        "command": python, "args": [mcp_fixture().display().to_string(), "stdio"]
    }}})
    .to_string();
    let request = || pb::CreateSessionRequest {
        mcp_config_json: own.clone(),
        permission_mode: "bypassPermissions".into(),
        // No workspace named: each tenant gets a fresh one of its own.
        ..session_request(std::path::Path::new(""))
    };
    let addr = format!("http://127.0.0.1:{}", daemon.tcp_addr().unwrap().port());
    let mut tcp = connect(&addr).await.unwrap();
    let as_tenant = |secret: &str| {
        let mut r = Request::new(request());
        r.metadata_mut()
            .insert("authorization", format!("Bearer {secret}").parse().unwrap());
        r
    };
    let refused = tcp
        .create_session(as_tenant(secrets[0].expose()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("allow_mcp_config"),
        "{refused:?}"
    );
    let allowed = tcp
        .create_session(as_tenant(secrets[1].expose()))
        .await
        .unwrap();
    assert_eq!(allowed.into_inner().session.unwrap().mcp_servers, ["mine"]);

    // The local user's own server runs its calls (the local user names its workspace).
    let mut client = daemon.client().await.unwrap();
    let local = pb::CreateSessionRequest {
        workspace: daemon.workspace_path().display().to_string(),
        ..request()
    };
    let session = create_session(&mut client, local).await.unwrap();
    let log = add_in_a_child(&mut client, &session.session_id, 3, 4).await;
    assert!(log.contains(r#""content":"7""#), "{log}");

    // A branch has them too, sealed again for its own id: after a restart (nothing kept in
    // memory) its children still reach the server.
    let branch = client
        .branch_session(pb::BranchSessionRequest {
            session_id: session.session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(branch.mcp_servers, ["mine"]);
    daemon.restart(|_| {}).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let log = add_in_a_child(&mut client, &branch.session_id, 5, 6).await;
    assert!(log.contains(r#""content":"11""#), "{log}");
}

#[tokio::test]
async fn a_streamable_http_server_s_tools_run_too() {
    let Some(python) = mcp_python() else { return };
    let mut server = std::process::Command::new(&python)
        .args([mcp_fixture().display().to_string(), "http".into()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = format!("http://127.0.0.1:{}/mcp", line.trim());
    let daemon = spawn_daemon_with(|c| {
        let def = json!({"mcpServers": {"remote": {
            "type": "http", "url": url, "headers": {"X-Forkd-Test": "${FORKD_TEST_UNSET:-yes}"}
        }}});
        std::fs::write(c.home.join("mcp.json"), def.to_string()).unwrap();
    })
    .await
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    // The server binds its port before it serves: creation is retried until it answers.
    let request = pb::CreateSessionRequest {
        mcp_servers: vec!["remote".into()],
        allow_rules: vec!["mcp__remote".into()],
        ..session_request(ws.path())
    };
    let session = forkd_test_support::create_session_when_ready(&client, request, DEADLINE).await;
    let batch = fork(
        &mut client,
        &session.session_id,
        &["Echo.\n@sim tool mcp__remote__echo {\"text\":\"over http\"}\n@sim say echoed"],
        None,
    )
    .await
    .unwrap();
    wait_for_batch(&mut client, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    let log = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains("echo: over http"), "{log}");
    let _ = server.kill();
    let _ = server.wait();
}

/// The notification that ends `agent_id`.
async fn ended(
    client: &mut pb::forkd_client::ForkdClient<tonic::transport::Channel>,
    agent_id: &str,
) -> pb::Notification {
    let mut stream = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            agent_id: agent_id.to_owned(),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn typed_agents_name_mcp_tools_and_a_kill_cancels_a_call() {
    let Some(python) = mcp_python() else { return };
    let daemon = spawn_daemon_with(|c| {
        write_mcp_json(
            &c.home,
            &python,
            json!({"sandbox": "full-access"}),
            json!({}),
        );
    })
    .await
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join(".forkd/agents")).unwrap();
    std::fs::write(
        ws.path().join(".forkd/agents/adder.md"),
        "---\nname: adder\ndescription: Adds\ntools: Read, mcp__calc__*\n\
         disallowedTools: mcp__calc__echo\n---\nYou add numbers.\n",
    )
    .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into()],
            permission_mode: "bypassPermissions".into(),
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let spawn = |prompt: &str| pb::SpawnAgentRequest {
        session_id: session.session_id.clone(),
        subagent_type: "adder".into(),
        description: "add".into(),
        prompt: prompt.to_owned(),
        ..Default::default()
    };
    let adder = client
        .spawn_agent(spawn(
            "Add.\n@sim tool mcp__calc__add {\"a\":5,\"b\":6}\n@sim tool mcp__calc__echo {\"text\":\"x\"}\n@sim say added",
        ))
        .await
        .unwrap()
        .into_inner();
    let note = ended(&mut client, &adder.agent_id).await;
    assert_eq!(note.status, pb::NotificationStatus::Completed as i32);
    let log = transcript_text(&mut client, &adder.agent_id).await.unwrap();
    assert!(log.contains(r#""content":"11""#), "{log}");
    assert!(
        log.contains("Tool mcp__calc__echo is not available to this agent"),
        "{log}"
    );

    // Killing an agent cancels the call it is waiting on.
    let marker = ws.path().join("started.txt");
    let input = json!({"seconds": 600, "marker": marker.display().to_string()});
    let sleeper = client
        .spawn_agent(spawn(&format!(
            "Wait.\n@sim tool mcp__calc__sleep {input}\n@sim say slept"
        )))
        .await
        .unwrap()
        .into_inner();
    eventually(DEADLINE, "the call to start", || async { marker.exists() }).await;
    client
        .kill(pb::KillRequest {
            agent_id: sleeper.agent_id.clone(),
        })
        .await
        .unwrap();
    let note = ended(&mut client, &sleeper.agent_id).await;
    assert_eq!(
        note.status,
        pb::NotificationStatus::Killed as i32,
        "{note:?}"
    );
    // The server is still there for other calls.
    let again = client
        .spawn_agent(spawn(
            "Add.\n@sim tool mcp__calc__add {\"a\":1,\"b\":2}\n@sim say added",
        ))
        .await
        .unwrap()
        .into_inner();
    ended(&mut client, &again.agent_id).await;
    let log = transcript_text(&mut client, &again.agent_id).await.unwrap();
    assert!(log.contains(r#""content":"3""#), "{log}");
}

/// An isolated child that calls an MCP tool not marked read-only may have changed things no
/// diff of its copy shows: its report and its changes say so. A read-only tool's call does not.
#[tokio::test]
async fn an_isolated_childs_writing_mcp_call_is_noted_as_outside_its_copy() {
    let Some(python) = mcp_python() else { return };
    let (_tmp_root, daemon) = calc_daemon(&python).await;
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into()],
            ..forkd_test_support::trusted_session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let batch = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: forkd_test_support::directives(&[
                "Add.\n@sim tool mcp__calc__add {\"a\":2,\"b\":40}\n@sim say added",
                "Echo.\n@sim tool mcp__calc__echo {\"text\":\"hi\"}\n@sim say echoed",
            ]),
            isolation: "copy".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let done = wait_for_batch(&mut client, &batch.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    for (i, outside) in [(0, false), (1, true)] {
        let id = &batch.agent_ids[i];
        let note = done.iter().find(|n| &n.agent_id == id).unwrap();
        let issues = note.report.clone().unwrap().issues;
        assert_eq!(
            issues.contains("changes outside the copy possible"),
            outside,
            "{issues}"
        );
        let changes = client
            .get_changes(pb::GetChangesRequest {
                agent_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(changes.outside_possible, outside);
    }
}

/// A stdio server makes its view again at each start: one started before a session was made,
/// and restarted after it crashed, cannot read that session's workspace (its first view could).
#[tokio::test]
async fn a_restarted_server_hides_the_workspaces_made_since_it_first_started() {
    let Some(python) = mcp_python() else { return };
    const SECRET: &str = "the-later-session-s-secret";
    let (_tmp_root, daemon) = calc_daemon(&python).await;
    let mut client = daemon.client().await.unwrap();
    let first = tempfile::tempdir().unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into()],
            permission_mode: "bypassPermissions".into(),
            ..session_request(first.path())
        },
    )
    .await
    .unwrap();
    // The server started (and listed its tools) with the first session; a second comes after.
    let later = tempfile::tempdir().unwrap();
    let secret = std::fs::canonicalize(later.path())
        .unwrap()
        .join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    create_session(&mut client, session_request(later.path()))
        .await
        .unwrap();
    let crashed = forkd_test_support::run_child(
        &mut client,
        &session.session_id,
        "Crash.\n@sim tool mcp__calc__crash {}\n@sim say crashed",
        DEADLINE,
    )
    .await
    .unwrap();
    assert!(crashed.contains("stopped during the call"), "{crashed}");
    let input = json!({ "path": secret.display().to_string() });
    let read = forkd_test_support::run_child(
        &mut client,
        &session.session_id,
        &format!("Read.\n@sim tool mcp__calc__read_file {input}\n@sim say read"),
        DEADLINE,
    )
    .await
    .unwrap();
    assert!(
        read.contains("cannot read"),
        "the restarted server ran the call: {read}"
    );
    assert!(!read.contains(SECRET), "{read}");
}

/// A session's own HTTP server is a tenant's URL: checked as a webhook's is (loopback, private,
/// metadata addresses refused unless the operator allows private ones; metadata never).
#[tokio::test]
async fn a_session_s_own_http_server_on_an_address_it_must_not_reach_is_refused() {
    let own =
        |url: &str| json!({"mcpServers": {"inside": {"type": "http", "url": url}}}).to_string();
    let strict = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = strict.client().await.unwrap();
    for url in [
        "http://127.0.0.1:9/mcp",
        "http://localhost:9/mcp",
        "http://10.0.0.1/mcp",
    ] {
        let err = client
            .create_session(pb::CreateSessionRequest {
                mcp_config_json: own(url),
                ..session_request(ws.path())
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{url}: {err:?}");
        assert!(
            err.message().contains("refused"),
            "{url}: {}",
            err.message()
        );
    }
    let open = spawn_daemon_with(|c| c.engine.webhooks.allow_private = true)
        .await
        .unwrap();
    let mut client = open.client().await.unwrap();
    let err = client
        .create_session(pb::CreateSessionRequest {
            mcp_config_json: own("http://169.254.169.254/mcp"),
            ..session_request(ws.path())
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("metadata"), "{}", err.message());
}
