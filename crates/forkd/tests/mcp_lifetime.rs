//! No MCP server outlives the daemon that started it, and a call cut off by the daemon's death is
//! answered as interrupted: the real `forkd serve` binary is killed with SIGKILL while a child's
//! call to a stdio server is in flight; the server dies with it (its group's sentinel sees the
//! daemon's end of its pipe close), the next daemon answers the call as interrupted (the tool is
//! not marked read-only), and the session's server comes back for later calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use binary::{Client, Daemon, client};
use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, eventually, fork, mcp_fixture, mcp_python, session_request, transcript_text,
    wait_for_batch,
};
use serde_json::json;

mod binary;

const DEADLINE: Duration = Duration::from_secs(60);

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
    })
}

/// Forks one child running `script` and returns its transcript once it ended.
async fn run_child(c: &mut Client, session_id: &str, script: &str) -> String {
    forkd_test_support::run_child(c, session_id, script, DEADLINE)
        .await
        .unwrap()
}

/// The server's pid, asked through its `pid` tool.
async fn server_pid(c: &mut Client, session_id: &str) -> i32 {
    let log = run_child(
        c,
        session_id,
        "Pid.\n@sim tool mcp__calc__pid {}\n@sim say pid",
    )
    .await;
    log.split("\"content\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {log}"))
}

fn write_mcp_json(home: &Path, python: &str) {
    let def = json!({"mcpServers": {"calc": {
        "command": python,
        "args": [mcp_fixture().display().to_string(), "stdio"],
        "readOnlyTools": ["add", "pid"],
        // It writes a marker into the test's workspace, which a sandbox would hide.
        "sandbox": "full-access",
    }}});
    std::fs::write(home.join("mcp.json"), def.to_string()).unwrap();
}

#[tokio::test]
async fn a_sigkilled_daemon_takes_its_mcp_servers_with_it() {
    let Some(python) = mcp_python() else { return };
    let home = tempfile::Builder::new()
        .prefix("forkd-mcp-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    write_mcp_json(home.path(), &python);
    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let session = create_session(
        &mut c,
        pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into()],
            permission_mode: "bypassPermissions".into(),
            ..session_request(&ws)
        },
    )
    .await
    .unwrap();
    let pid = server_pid(&mut c, &session.session_id).await;
    assert!(alive(pid));

    // A call in flight when the daemon dies.
    let marker = ws.join("started.txt");
    let input = json!({"seconds": 600, "marker": marker.display().to_string()});
    let script = format!("Wait.\n@sim tool mcp__calc__sleep {input}\n@sim say finished");
    let batch = fork(&mut c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    eventually(DEADLINE, "the call to start", || async { marker.exists() }).await;

    daemon.kill9();
    eventually(
        Duration::from_secs(10),
        "the MCP server to die with its daemon",
        || async { !alive(pid) },
    )
    .await;

    // The next daemon answers the cut-off call as interrupted, and the server comes back.
    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let done = wait_for_batch(&mut c, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        done[0].status,
        pb::NotificationStatus::Completed as i32,
        "{done:?}"
    );
    let log = transcript_text(&mut c, &batch.agent_ids[0]).await.unwrap();
    assert!(log.contains("Interrupted: this call was started"), "{log}");
    let log = run_child(
        &mut c,
        &session.session_id,
        "Add.\n@sim tool mcp__calc__add {\"a\":20,\"b\":22}\n@sim say added",
    )
    .await;
    assert!(log.contains(r#""content":"42""#), "{log}");
    let second = server_pid(&mut c, &session.session_id).await;
    assert_ne!(second, pid);
    daemon.kill9();
    eventually(
        Duration::from_secs(10),
        "the restarted server to die with its daemon",
        || async { !alive(second) },
    )
    .await;
}

/// A read-only MCP call (by the operator's `readOnlyTools`) cut off by the daemon's death runs
/// again after the restart, and its result reaches the model.
#[tokio::test]
async fn a_cut_off_read_only_call_runs_again_after_a_restart() {
    let Some(python) = mcp_python() else { return };
    let home = tempfile::Builder::new()
        .prefix("forkd-mcp-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let def = json!({"mcpServers": {"calc": {
        "command": python,
        "args": [mcp_fixture().display().to_string(), "stdio"],
        "readOnlyTools": ["sleep"],
        "sandbox": "full-access",
    }}});
    std::fs::write(home.path().join("mcp.json"), def.to_string()).unwrap();
    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let session = create_session(
        &mut c,
        pb::CreateSessionRequest {
            mcp_servers: vec!["calc".into()],
            ..session_request(&ws)
        },
    )
    .await
    .unwrap();
    let marker = ws.join("started.txt");
    let input = json!({"seconds": 2, "marker": marker.display().to_string()});
    let script = format!("Wait.\n@sim tool mcp__calc__sleep {input}\n@sim say finished");
    let batch = fork(&mut c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    eventually(DEADLINE, "the call to start", || async { marker.exists() }).await;
    daemon.kill9();
    std::fs::remove_file(&marker).unwrap();

    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    wait_for_batch(&mut c, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    let log = transcript_text(&mut c, &batch.agent_ids[0]).await.unwrap();
    assert!(log.contains(r#""content":"slept""#), "{log}");
    assert!(!log.contains("Interrupted"), "{log}");
    // It ran again: the new server wrote the marker anew.
    assert!(marker.exists());
    daemon.kill9();
}

/// A session's own server definitions (which may hold secrets) come back after a restart: the
/// database holds them only sealed with the daemon's key (`$FORKD_HOME/secret.key`, created on
/// first start, readable by the daemon's user only); a daemon with another key says so.
#[tokio::test]
async fn a_sessions_own_servers_come_back_after_a_restart_sealed() {
    use std::os::unix::fs::PermissionsExt;
    let Some(python) = mcp_python() else { return };
    let home = tempfile::Builder::new()
        .prefix("forkd-mcp-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let secret = format!(
        "tok-{}",
        forkd_core::SessionId::new().to_string().replace('-', "")
    );
    let own = json!({"mcpServers": {"mine": {
        "command": python,
        "args": [mcp_fixture().display().to_string(), "stdio"],
        "env": {"FIXTURE_SECRET": secret, "FIXTURE_VISIBLE": "kept-across-restarts"},
    }}})
    .to_string();
    let daemon = Daemon::start(home.path(), "0");
    let mut c = client(home.path()).await;
    let session = create_session(
        &mut c,
        pb::CreateSessionRequest {
            mcp_config_json: own,
            permission_mode: "bypassPermissions".into(),
            ..session_request(&ws)
        },
    )
    .await
    .unwrap();
    let add = "Add.\n@sim tool mcp__mine__add {\"a\":20,\"b\":22}\n@sim say added";
    let log = run_child(&mut c, &session.session_id, add).await;
    assert!(log.contains(r#""content":"42""#), "{log}");
    let key = home.path().join("secret.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    daemon.kill9();

    // The next daemon starts the server again from the sealed definition, env values and all.
    let daemon = Daemon::start(home.path(), "0");
    let mut c = client(home.path()).await;
    let log = run_child(&mut c, &session.session_id, add).await;
    assert!(log.contains(r#""content":"42""#), "{log}");
    let env = "Env.\n@sim tool mcp__mine__env {\"name\":\"FIXTURE_VISIBLE\"}\n@sim say read";
    let log = run_child(&mut c, &session.session_id, env).await;
    assert!(log.contains("kept-across-restarts"), "{log}");
    daemon.kill9();
    // Nothing of the definition is in the database in the clear.
    for file in ["forkd.db", "forkd.db-wal"] {
        let bytes = std::fs::read(home.path().join(file)).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(&secret), "{file} holds the secret");
        assert!(
            !text.contains("FIXTURE_SECRET"),
            "{file} holds the definition"
        );
    }

    // A daemon holding another key cannot open it, and says why.
    let other = home.path().join("other.key");
    std::fs::write(&other, format!("{}\n", "ab".repeat(32))).unwrap();
    let daemon = Daemon::start_with(
        home.path(),
        "0",
        &[("FORKD_SECRET_KEY_FILE", other.to_str().unwrap())],
    );
    let mut c = client(home.path()).await;
    let log = run_child(&mut c, &session.session_id, add).await;
    assert!(log.contains("another secret key"), "{log}");
    daemon.kill9();
}
