//! Clients that outlive their daemon: the real `forkctl` follows batches — `fork --wait`, `run
//! --wait --junit`, `watch` — while the real `forkd serve` is killed with SIGKILL mid-batch and
//! started again on the same home. Each exits 0 with every child's notification once, and the
//! JUnit report is whole; with `--reconnect-for 0` the loss is `UNAVAILABLE` (exit 5), never
//! `UNKNOWN`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod binary;

use std::collections::HashSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use binary::{Daemon, client, forkctl, list_batch};
use forkd_proto::v1 as pb;
use forkd_test_support::{create_session, eventually, session_request};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A child that is still answering when the daemon is killed, and answers again once resumed.
fn prompt(i: usize) -> String {
    format!("Part {i}.\n@sim sleep 2s\n@sim say part {i} done")
}

fn forkctl_on(home: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(forkctl());
    command
        .args(args)
        .env("FORKD_HOME", home)
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// A command's exit code, stdout and stderr, once it ends (within a minute).
async fn finish(child: Child) -> (i32, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("forkctl did not finish within a minute")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The notifications among `--json` lines (objects with a `seq`).
fn notifications(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("seq").is_some())
        .collect()
}

/// Asserts one notification per child, each completed.
fn once_each(what: &str, seen: &[serde_json::Value], children: usize) {
    let agents: HashSet<&str> = seen
        .iter()
        .map(|n| n["agent_id"].as_str().unwrap())
        .collect();
    assert_eq!(seen.len(), children, "{what}: {seen:#?}");
    assert_eq!(agents.len(), children, "{what}: a child twice: {seen:#?}");
    assert!(
        seen.iter().all(|n| n["status"] == "completed"),
        "{what}: {seen:#?}"
    );
}

#[tokio::test]
async fn forkctl_follows_batches_across_a_daemon_restart() {
    let home = tempfile::Builder::new()
        .prefix("forkd-reconnect-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let daemon = Daemon::start(home.path(), "1");
    let mut c = client(home.path()).await;
    let session = create_session(&mut c, session_request(&ws)).await.unwrap();
    let sid = session.session_id.as_str();

    // `watch` from the start, then `fork --wait`, `run --wait --junit`, and one that may not
    // reconnect.
    let watch = forkctl_on(home.path(), &["--json", "watch"])
        .spawn()
        .unwrap();
    let (p0, p1) = (prompt(0), prompt(1));
    let fork_args = ["--json", "fork", sid, "-d", &p0, "-d", &p1, "--wait"];
    let fork = forkctl_on(home.path(), &fork_args).spawn().unwrap();
    let mut once = fork_args.to_vec();
    once.extend(["--reconnect-for", "0"]);
    let gives_up = forkctl_on(home.path(), &once).spawn().unwrap();
    let junit = files.path().join("junit.xml");
    std::fs::write(
        files.path().join("batch.yaml"),
        format!(
            "key: across-a-restart\nsession:\n  system: You review.\n  workspace: ws\n\
             directives:\n  - {:?}\n  - {:?}\n",
            prompt(2),
            prompt(3)
        ),
    )
    .unwrap();
    let run = forkctl_on(
        home.path(),
        &[
            "run",
            files.path().join("batch.yaml").to_str().unwrap(),
            "--wait",
            "--junit",
            junit.to_str().unwrap(),
        ],
    )
    .spawn()
    .unwrap();

    // Once all four batches' children are running, the daemon dies and starts again.
    eventually(Duration::from_secs(30), "every child to run", || {
        let mut c = c.clone();
        async move {
            let agents = c
                .list_agents(pb::ListAgentsRequest::default())
                .await
                .ok()?
                .into_inner()
                .agents;
            let running = agents
                .iter()
                .filter(|a| a.state() == pb::AgentState::Running && !a.batch_id.is_empty())
                .count();
            (running >= 6).then_some(())
        }
    })
    .await;
    daemon.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _daemon = Daemon::start(home.path(), "1");
    c = client(home.path()).await;

    let (code, stdout, stderr) = finish(fork).await;
    assert_eq!(code, 0, "fork --wait: {stderr}");
    once_each("fork --wait", &notifications(&stdout), 2);
    assert!(stderr.contains("forkctl: lost the daemon"), "{stderr}");
    assert!(stderr.contains("forkctl: reconnected"), "{stderr}");

    let (code, _, stderr) = finish(run).await;
    assert_eq!(code, 0, "run --wait --junit: {stderr}");
    let report = std::fs::read_to_string(&junit).unwrap();
    let xml = roxmltree::Document::parse(&report).unwrap();
    let cases = xml.descendants().filter(|n| n.has_tag_name("testcase"));
    assert_eq!(cases.count(), 2, "{report}");
    assert!(!report.contains("<failure"), "{report}");

    // Without reconnecting, the loss is UNAVAILABLE: exit 5, and where to pick up.
    let (code, _, stderr) = finish(gives_up).await;
    assert_eq!(code, 5, "{stderr}");
    assert!(!stderr.contains("UNKNOWN"), "{stderr}");
    assert!(stderr.contains("forkctl watch --batch"), "{stderr}");

    // `watch` saw each of the three batches' children once (its own stream resumed too).
    let mut watch = watch;
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while seen.len() < 6 {
            let line = lines.next_line().await.unwrap().expect("watch ended");
            seen.extend(notifications(&line));
        }
    })
    .await
    .expect("watch did not see every child");
    let seqs: HashSet<u64> = seen.iter().map(|n| n["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs.len(), seen.len(), "a notification twice: {seen:#?}");
    once_each("watch", &seen, 6);
    watch.kill().await.unwrap();

    // The daemon that started again finished the children the first one left.
    for batch in seen.iter().map(|n| n["batch_id"].as_str().unwrap()) {
        assert!(
            list_batch(&mut c, batch)
                .await
                .iter()
                .all(|a| a.state() == pb::AgentState::Completed)
        );
    }
}
