//! The pool against a real MCP server built on the official Python SDK (the fixture in
//! `crates/test-support/fixtures/mcp_server.py`), over stdio and streamable HTTP. Without the
//! SDK installed these tests skip with a message; with `CI` set they fail instead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use forkd_mcp::config::{Origin, ServerDef};
use forkd_mcp::{Pool, PoolPaths, ServerSpec};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../test-support/fixtures/mcp_server.py")
        .display()
        .to_string()
}

/// The Python with the MCP SDK, or `None` (skipping) when it is missing outside CI.
fn python() -> Option<String> {
    let python = std::env::var("FORKD_TEST_MCP_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import mcp.server.mcpserver"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{python} lacks the MCP SDK (pip install mcp); .ci/run installs it"
    );
    eprintln!("SKIPPED: {python} lacks the MCP SDK (pip install mcp)");
    None
}

fn stdio_spec(python: &str, extra: serde_json::Value) -> ServerSpec {
    let mut def =
        json!({"command": python, "args": [fixture(), "stdio"], "sandbox": "full-access"});
    if let (Some(def), Some(extra)) = (def.as_object_mut(), extra.as_object()) {
        def.extend(extra.clone());
    }
    let def: ServerDef = serde_json::from_value(def).unwrap();
    def.resolve("test", Origin::Operator, &|_| None).unwrap()
}

fn paths(dir: &tempfile::TempDir) -> PoolPaths {
    PoolPaths {
        root: dir.path().to_path_buf(),
        ..PoolPaths::default()
    }
}

#[tokio::test]
async fn a_stdio_server_lists_and_runs_its_tools() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::default();
    let server = pool.server("t", &stdio_spec(&python, json!({})), &paths(&dir));
    let tools = server.tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert!(
        names.contains(&"add") && names.contains(&"dotted.name"),
        "{names:?}"
    );
    let add = tools.iter().find(|t| t.name == "add").unwrap();
    assert_eq!(add.input_schema["properties"]["a"]["type"], "integer");

    let cancel = CancellationToken::new();
    let out = server.call("add", json!({"a": 2, "b": 3}), &cancel).await;
    assert!(!out.is_error && out.text == "5", "{out:?}");
    let out = server.call("pixel", json!({}), &cancel).await;
    assert_eq!(out.images.len(), 1, "{out:?}");
    assert_eq!(out.images[0].media_type, "image/png");
    let out = server
        .call("fail", json!({"message": "no luck"}), &cancel)
        .await;
    assert!(out.is_error && out.text.contains("no luck"), "{out:?}");
    let out = server.call("gone", json!({}), &cancel).await;
    assert!(
        out.is_error && out.text.contains("no longer has the tool"),
        "{out:?}"
    );
    pool.shutdown().await;
}

#[tokio::test]
async fn an_idle_server_is_stopped_and_its_next_call_starts_it_again() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::default();
    let server = pool.server("t", &stdio_spec(&python, json!({})), &paths(&dir));
    server.tools().await.unwrap();
    assert_eq!(pool.running().await, 1);
    // Used just now: not idle for a minute.
    assert_eq!(pool.stop_idle(Duration::from_secs(60)).await, 0);
    assert_eq!(pool.running().await, 1);

    // A call in flight keeps it up, however long ago it was last used.
    let cancel = CancellationToken::new();
    let marker = dir.path().join("started");
    let slow = {
        let server = server.clone();
        let cancel = cancel.clone();
        let input = json!({"seconds": 2, "marker": marker.display().to_string()});
        tokio::spawn(async move { server.call("sleep", input, &cancel).await })
    };
    // The server is inside the call once it wrote the marker.
    while !marker.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pool.stop_idle(Duration::ZERO).await, 0);
    let out = slow.await.unwrap();
    assert!(!out.is_error, "{out:?}");

    // Idle: stopped; the next call starts it again and runs.
    assert_eq!(pool.stop_idle(Duration::ZERO).await, 1);
    assert_eq!(pool.running().await, 0);
    let out = server.call("add", json!({"a": 1, "b": 2}), &cancel).await;
    assert!(!out.is_error && out.text == "3", "{out:?}");
    assert_eq!(pool.running().await, 1);
    pool.shutdown().await;
}

#[tokio::test]
async fn a_crash_mid_call_is_an_error_and_the_server_comes_back() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::default();
    let server = pool.server("t", &stdio_spec(&python, json!({})), &paths(&dir));
    let cancel = CancellationToken::new();
    let first = server.call("pid", json!({}), &cancel).await.text;
    let out = server.call("crash", json!({}), &cancel).await;
    assert!(
        out.is_error && out.text.contains("stopped during the call"),
        "{out:?}"
    );
    // The next call, at once, finds the server restarting: it waits for the restart (within
    // its timeout) and runs, on a new process.
    let second = server.call("pid", json!({}), &cancel).await;
    assert!(!second.is_error, "{second:?}");
    assert_ne!(first, second.text);
    pool.shutdown().await;
}

#[tokio::test]
async fn a_call_times_out_or_is_cancelled() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::default();
    let spec = stdio_spec(&python, json!({"timeoutSecs": 1}));
    let server = pool.server("t", &spec, &paths(&dir));
    let cancel = CancellationToken::new();
    let out = server.call("sleep", json!({"seconds": 600}), &cancel).await;
    assert!(out.is_error && out.text.contains("within 1 s"), "{out:?}");
    // The server still serves.
    let out = server.call("echo", json!({"text": "hi"}), &cancel).await;
    assert_eq!(out.text, "echo: hi");
    cancel.cancel();
    let out = server.call("sleep", json!({"seconds": 600}), &cancel).await;
    assert!(out.is_error && out.text.contains("cancelled"), "{out:?}");
    pool.shutdown().await;
}

#[tokio::test]
async fn a_server_that_never_starts_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let def: ServerDef = serde_json::from_value(json!({
        "command": "bash", "args": ["-c", "echo 'missing module xyz' >&2; exit 1"],
        "sandbox": "full-access"
    }))
    .unwrap();
    let spec = def.resolve("broken", Origin::Operator, &|_| None).unwrap();
    let pool = Pool::default();
    let err = pool
        .server("t", &spec, &paths(&dir))
        .tools()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("\"broken\"") && text.contains("missing module xyz"),
        "{text}"
    );
}

#[tokio::test]
async fn tenants_get_their_own_process_and_env_is_passed() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::default();
    let spec = stdio_spec(
        &python,
        json!({"env": {"GREETING": "${FORKD_TEST_UNSET_VARIABLE:-hello}"}}),
    );
    let cancel = CancellationToken::new();
    let a = pool.server("a", &spec, &paths(&dir));
    let b = pool.server("b", &spec, &paths(&dir));
    let pa = a.call("pid", json!({}), &cancel).await.text;
    let pb = b.call("pid", json!({}), &cancel).await.text;
    assert_ne!(pa, pb);
    let again = pool.server("a", &spec, &paths(&dir));
    assert_eq!(again.call("pid", json!({}), &cancel).await.text, pa);
    let greeting = a
        .call("env", json!({"name": "GREETING"}), &cancel)
        .await
        .text;
    assert_eq!(greeting, "hello");
    pool.shutdown().await;
    // Shut down: no process of either is left.
    for pid in [pa, pb] {
        let pid: i32 = pid.parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "server {pid} outlived shutdown"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_streamable_http_server_runs_its_tools() {
    let Some(python) = python() else { return };
    let mut child = std::process::Command::new(&python)
        .args([fixture(), "http".into()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    let def: ServerDef = serde_json::from_value(json!({
        "type": "http", "url": format!("http://127.0.0.1:{port}/mcp"),
        "headers": {"X-Test": "yes"}
    }))
    .unwrap();
    let spec = def.resolve("remote", Origin::Operator, &|_| None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::default();
    let server = pool.server("t", &spec, &paths(&dir));
    // The server binds before it serves: retry until it answers.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let tools = loop {
        match server.tools().await {
            Ok(tools) => break tools,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(600)).await;
            }
        }
    };
    assert!(tools.iter().any(|t| t.name == "add"));
    let out = server
        .call("add", json!({"a": 40, "b": 2}), &CancellationToken::new())
        .await;
    assert_eq!(out.text, "42", "{out:?}");
    pool.shutdown().await;
    let _ = child.kill();
    let _ = child.wait();
}
