//! forkctl against the real daemon: the end-to-end scenario, command by command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

use forkd_test_support::{TestDaemon, spawn_daemon};
use serde_json::Value;

async fn forkctl(daemon: &TestDaemon, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"))
        .arg("--addr")
        .arg(daemon.addr())
        .args(args)
        .output()
        .await
        .unwrap()
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[tokio::test]
async fn create_fork_wait_watch_and_stats_agree() {
    let daemon = spawn_daemon().await.unwrap();
    let system = daemon.home_path().join("system.md");
    std::fs::write(&system, "You are a reviewer.").unwrap();
    let context = daemon.home_path().join("context.md");
    std::fs::write(&context, "forkd forks agents. ".repeat(300)).unwrap();
    let workspace = daemon.home_path().display().to_string();

    let out = forkctl(
        &daemon,
        &[
            "--json",
            "session",
            "create",
            "--system-file",
            system.to_str().unwrap(),
            "--context-file",
            context.to_str().unwrap(),
            "--workspace",
            &workspace,
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sid = json_lines(&out)[0]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut args = vec!["--json", "fork", sid.as_str(), "--wait"];
    for d in ["one", "two", "three", "four", "five"] {
        args.extend(["-d", d]);
    }
    let out = forkctl(&daemon, &args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&out);
    let batch_id = lines[0]["batch_id"].as_str().unwrap().to_owned();
    assert_eq!(lines[0]["agent_ids"].as_array().unwrap().len(), 5);
    let notifications = &lines[1..];
    assert_eq!(notifications.len(), 5);
    for n in notifications {
        assert_eq!(n["status"], "completed");
        assert!(n["report"]["result"].as_str().unwrap().starts_with("Done:"));
        for key in [
            "seq",
            "session_id",
            "batch_id",
            "agent_id",
            "summary",
            "usage",
            "cost_usd",
        ] {
            assert!(n.get(key).is_some(), "missing {key}");
        }
    }

    let out = forkctl(&daemon, &["--json", "watch", "--since", "0", "--no-follow"]).await;
    assert!(out.status.success());
    let mut replayed = json_lines(&out);
    let mut waited = notifications.to_vec();
    let seq = |v: &Value| v["seq"].as_u64().unwrap();
    replayed.sort_by_key(seq);
    waited.sort_by_key(seq);
    assert_eq!(replayed, waited);

    let out = forkctl(&daemon, &["--json", "stats", "--batch", &batch_id]).await;
    assert!(out.status.success());
    let stats = &json_lines(&out)[0];
    for key in [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    ] {
        let sum: u64 = waited
            .iter()
            .map(|n| n["usage"][key].as_u64().unwrap())
            .sum();
        assert_eq!(stats[key].as_u64().unwrap(), sum, "{key}");
    }
    let cost: f64 = waited.iter().map(|n| n["cost_usd"].as_f64().unwrap()).sum();
    assert!((stats["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-9);
    assert_eq!(stats["children"], 5);

    let out = forkctl(&daemon, &["--json", "ps", "-a", "--session", &sid]).await;
    assert_eq!(json_lines(&out).len(), 5);
}

#[tokio::test]
async fn a_failed_child_fails_the_wait_and_unknown_ids_exit_3() {
    let daemon = spawn_daemon().await.unwrap();
    let system = daemon.home_path().join("system.md");
    std::fs::write(&system, "Sys.").unwrap();
    let workspace = daemon.home_path().display().to_string();
    let out = forkctl(
        &daemon,
        &[
            "session",
            "create",
            "--system-file",
            system.to_str().unwrap(),
            "--workspace",
            &workspace,
        ],
    )
    .await;
    let sid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let out = forkctl(
        &daemon,
        &["fork", &sid, "-d", "fine", "-d", "@sim fail 400", "--wait"],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = forkctl(&daemon, &["logs", "01a22937-0000-7000-8000-000000000000"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));

    let out = forkctl(&daemon, &["fork", &sid]).await;
    assert_ne!(out.status.code(), Some(0));
}

#[tokio::test]
async fn session_send_streams_a_parent_turn_that_forks() {
    let daemon = spawn_daemon().await.unwrap();
    let system = daemon.home_path().join("system.md");
    std::fs::write(&system, "Sys.").unwrap();
    let workspace = daemon.home_path().display().to_string();
    let out = forkctl(
        &daemon,
        &[
            "session",
            "create",
            "--system-file",
            system.to_str().unwrap(),
            "--workspace",
            &workspace,
        ],
    )
    .await;
    let sid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let script = "Split it.\n@sim agent {\"description\":\"a\",\"prompt\":\"do a\"}\n@sim agent {\"description\":\"b\",\"prompt\":\"do b\"}";
    let out = forkctl(&daemon, &["--json", "session", "send", &sid, script]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = json_lines(&out);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"fork_launched"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "tool_call").count(), 2);
    assert_eq!(kinds.last(), Some(&"turn_ended"));
    let launched = events
        .iter()
        .find(|e| e["event"] == "fork_launched")
        .unwrap();
    assert_eq!(launched["agent_ids"].as_array().unwrap().len(), 2);

    let batch = launched["batch_id"].as_str().unwrap();
    let out = forkctl(&daemon, &["--json", "ps", "-a", "--batch", batch]).await;
    assert_eq!(json_lines(&out).len(), 2);
}
