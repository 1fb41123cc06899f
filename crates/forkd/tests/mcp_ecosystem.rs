//! An MCP server nobody here wrote: the reference server `@modelcontextprotocol/server-everything`
//! from npm (pinned by `crates/test-support/mcp-ecosystem/package-lock.json`, installed by
//! `.ci/run`), over stdio and over streamable HTTP. Fork children call its tools and get its real
//! results — text, a structured sum, an image — and siblings' requests stay byte-identical up to
//! their directives. Without node or the package these tests skip; in CI they fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_store::RequestFilter;
use forkd_test_support::{
    create_session, create_session_when_ready, everything_server, fork, run_child, session_request,
    spawn_daemon_with, transcript_text, wait_for_batch,
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

fn write_mcp_json(home: &Path, servers: serde_json::Value) {
    std::fs::write(
        home.join("mcp.json"),
        json!({ "mcpServers": servers }).to_string(),
    )
    .unwrap();
}

#[tokio::test]
async fn the_reference_server_s_tools_run_over_stdio() {
    let Some(script) = everything_server() else {
        return;
    };
    let daemon = spawn_daemon_with(|c| {
        // The operator's default sandbox for a stdio server: workspace-write, network allowed.
        write_mcp_json(
            &c.home,
            json!({"everything": {"command": "node", "args": [script, "stdio"]}}),
        );
    })
    .await
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            mcp_servers: vec!["everything".into()],
            allow_rules: vec!["mcp__everything".into()],
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let batch = fork(
        &mut client,
        &session.session_id,
        &[
            "Echo.\n@sim tool mcp__everything__echo {\"message\":\"from forkd\"}\n@sim say echoed",
            "Sum.\n@sim tool mcp__everything__get-sum {\"a\":20,\"b\":22}\n@sim say summed",
            "Image.\n@sim tool mcp__everything__get-tiny-image {}\n@sim say seen",
        ],
        None,
    )
    .await
    .unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, 3, DEADLINE)
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
    let [echo, sum, image] = &logs[..] else {
        panic!("three transcripts: {logs:?}");
    };
    assert!(echo.contains("Echo: from forkd"), "{echo}");
    assert!(sum.contains("42"), "{sum}");
    assert!(image.contains(r#""type":"image""#), "{image}");
    assert!(image.contains("MCP logo"), "{image}");

    // The server's tools sit in the pool: siblings' requests share everything up to the
    // directive.
    let requests = daemon
        .daemon()
        .unwrap()
        .engine
        .store()
        .list_requests(&RequestFilter {
            batch_id: Some(batch.batch_id.parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    let firsts: Vec<_> = requests.iter().filter(|r| r.turn == 0).collect();
    assert_eq!(firsts.len(), 3);
    assert!(
        firsts
            .windows(2)
            .all(|w| w[0].prefix_fingerprint == w[1].prefix_fingerprint),
        "{firsts:?}"
    );
}

#[tokio::test]
async fn the_reference_server_s_tools_run_over_streamable_http() {
    let Some(script) = everything_server() else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = std::process::Command::new("node")
        .arg(&script)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let daemon = spawn_daemon_with(|c| {
        write_mcp_json(&c.home, json!({"remote": {"type": "http", "url": url}}));
    })
    .await
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let request = pb::CreateSessionRequest {
        mcp_servers: vec!["remote".into()],
        allow_rules: vec!["mcp__remote".into()],
        ..session_request(ws.path())
    };
    // The server binds its port after node starts.
    let session = create_session_when_ready(&client, request, DEADLINE).await;
    let script = "Sum.\n@sim tool mcp__remote__get-sum {\"a\":2,\"b\":40}\n\
                  @sim tool mcp__remote__echo {\"message\":\"over http\"}\n@sim say done";
    let log = run_child(&mut client, &session.session_id, script, DEADLINE)
        .await
        .unwrap();
    assert!(log.contains("42"), "{log}");
    assert!(log.contains("Echo: over http"), "{log}");
    let _ = server.kill();
    let _ = server.wait();
}
