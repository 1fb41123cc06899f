//! forkctl against the real daemon: the end-to-end scenario, command by command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

use forkd_test_support::{TestDaemon, spawn_daemon, spawn_daemon_with};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

async fn forkctl(daemon: &TestDaemon, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"))
        .arg("--addr")
        .arg(daemon.addr())
        .args(args)
        .env_remove("FORKD_TOKEN")
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

/// Fails the test with forkctl's stderr unless it exited 0.
fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `session create` in the daemon's test workspace, with a ~1,500-token context file when `context` is
/// set (enough for the children to share a cached prefix); returns the session's id.
async fn create_session(daemon: &TestDaemon, context: bool) -> String {
    let system = daemon.home_path().join("system.md");
    std::fs::write(&system, "You are a reviewer.").unwrap();
    let workspace = daemon.workspace_path().display().to_string();
    let mut args = vec![
        "--json".to_owned(),
        "session".into(),
        "create".into(),
        "--system-file".into(),
        system.display().to_string(),
        "--workspace".into(),
        workspace,
    ];
    if context {
        let file = daemon.home_path().join("context.md");
        std::fs::write(&file, "forkd forks agents. ".repeat(300)).unwrap();
        args.extend(["--context-file".into(), file.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = forkctl(daemon, &args).await;
    assert_ok(&out);
    json_lines(&out)[0]["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `fork --wait --json`: the reply, then one notification per child.
async fn fork_and_wait(daemon: &TestDaemon, sid: &str, directives: &[&str]) -> Vec<Value> {
    let mut args = vec!["--json", "fork", sid, "--wait"];
    for d in directives {
        args.extend(["-d", d]);
    }
    let out = forkctl(daemon, &args).await;
    assert_ok(&out);
    json_lines(&out)
}

/// `total`'s four token counts (in `total`'s `usage` object, or flattened into `total`) and its
/// cost are the sums of `parts`'.
fn assert_adds_up(total: &Value, parts: &[Value]) {
    let usage = total.get("usage").unwrap_or(total);
    for key in [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    ] {
        let sum: u64 = parts
            .iter()
            .map(|p| p["usage"][key].as_u64().unwrap())
            .sum();
        assert_eq!(usage[key].as_u64().unwrap(), sum, "{key}");
    }
    let cost: f64 = parts.iter().map(|p| p["cost_usd"].as_f64().unwrap()).sum();
    assert!((total["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-9);
}

#[tokio::test]
async fn create_fork_wait_watch_and_stats_agree() {
    let daemon = spawn_daemon().await.unwrap();
    let sid = create_session(&daemon, true).await;
    let lines = fork_and_wait(&daemon, &sid, &["one", "two", "three", "four", "five"]).await;
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
    assert_adds_up(stats, &waited);
    assert_eq!(stats["children"], 5);

    let out = forkctl(&daemon, &["--json", "ps", "-a", "--session", &sid]).await;
    assert_eq!(json_lines(&out).len(), 5);
}

#[tokio::test]
async fn a_failed_child_fails_the_wait_and_unknown_ids_exit_3() {
    let daemon = spawn_daemon().await.unwrap();
    let sid = create_session(&daemon, false).await;
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
    let sid = create_session(&daemon, false).await;
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

#[tokio::test]
async fn top_prints_a_snapshot_of_the_tree_off_a_terminal() {
    let daemon = spawn_daemon().await.unwrap();
    let sid = create_session(&daemon, true).await;
    let lines = fork_and_wait(&daemon, &sid, &["one", "two", "three"]).await;
    let batch_id = lines[0]["batch_id"].as_str().unwrap();
    let ps = json_lines(&forkctl(&daemon, &["--json", "ps", "-a", "--session", &sid]).await);
    assert_eq!(ps.len(), 3);

    // Stdout is a pipe here, so even without --json `top` prints one snapshot and exits.
    for args in [&["top", "--session", &sid][..], &["--json", "top"][..]] {
        let out = forkctl(&daemon, args).await;
        assert_ok(&out);
        let rows = json_lines(&out);
        let kinds: Vec<&str> = rows.iter().map(|r| r["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["session", "batch", "fork", "fork", "fork"],
            "{rows:#?}"
        );
        let (session, batch, children) = (&rows[0], &rows[1], &rows[2..]);
        assert_eq!(session["session_id"], sid.as_str());
        assert_eq!(session["state"], "ended");
        assert_eq!(session["agents"]["ended"], 3);
        assert_eq!(batch["batch_id"], batch_id);
        assert_eq!(batch["agent_id"], Value::Null);
        // The children's rows are `ps`'s agents; the groups add them up.
        for child in children {
            let agent = ps.iter().find(|a| a["agent_id"] == child["agent_id"]);
            let agent = agent.unwrap_or_else(|| panic!("{child} is not in ps"));
            assert_eq!(child["state"], "completed");
            assert_eq!(child["batch_id"], batch_id);
            assert_eq!(child["depth"], 2);
            for key in [
                "session_id",
                "usage",
                "cost_usd",
                "cache_read_share",
                "description",
            ] {
                assert_eq!(child[key], agent[key], "{key}");
            }
        }
        assert_adds_up(session, children);
        assert_adds_up(batch, children);
        // Siblings 2 and 3 read the shared prefix that sibling 1 wrote.
        assert!(batch["cache_read_share"].as_f64().unwrap() > 0.5, "{batch}");
    }

    let out = forkctl(
        &daemon,
        &["top", "--session", "01a22937-0000-7000-8000-000000000000"],
    )
    .await;
    assert_eq!(out.status.code(), Some(3));
}

/// A turn handed to the background (here by the auto-background delay) ends with a notification
/// of kind `turn` that `watch` replays, and `ps` shows the session's main loop `idle` after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backgrounded_turn_ends_with_a_turn_notification_and_the_main_loop_idles() {
    let daemon = forkd_test_support::spawn_daemon_with(|c| {
        c.sim_speed = 1.0;
        c.engine.auto_background = Some(std::time::Duration::from_secs(1));
    })
    .await
    .unwrap();
    let sid = create_session(&daemon, false).await;
    let out = forkctl(
        &daemon,
        &[
            "--json",
            "session",
            "send",
            &sid,
            "Think.\n@sim sleep 3s\n@sim say all done",
        ],
    )
    .await;
    assert_ok(&out);
    let events = json_lines(&out);
    let launched = events.last().unwrap();
    assert_eq!(launched["status"], "async_launched", "{events:?}");
    let main_loop = launched["agent_id"].as_str().unwrap().to_owned();

    let note = forkd_test_support::eventually(
        std::time::Duration::from_secs(30),
        "the turn's notification",
        || async {
            let out = forkctl(&daemon, &["--json", "watch", "--since", "0", "--no-follow"]).await;
            assert_ok(&out);
            json_lines(&out).into_iter().find(|n| n["kind"] == "turn")
        },
    )
    .await;
    assert_eq!(note["agent_id"], main_loop.as_str());
    assert_eq!(note["status"], "completed");
    assert!(
        note["report"]["result"]
            .as_str()
            .unwrap()
            .contains("all done"),
        "{note}"
    );

    let out = forkctl(&daemon, &["--json", "ps"]).await;
    assert_ok(&out);
    let agents = json_lines(&out);
    let parent = agents.iter().find(|a| a["agent_id"] == main_loop.as_str());
    let parent = parent.unwrap_or_else(|| panic!("no main loop in {agents:?}"));
    assert_eq!(parent["kind"], "parent");
    assert_eq!(parent["state"], "idle");
}

/// One plain HTTP/1.1 GET of `url` (`http://ADDR/PATH`) with an optional cookie: the response's
/// status line and headers, and its body.
async fn get(url: &str, cookie: Option<&str>) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{cookie}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.to_owned(), body.to_owned())
}

/// The value of `name` among a response's headers (case-insensitive).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

#[tokio::test]
async fn ui_prints_a_link_that_signs_the_browser_in_as_local_once() {
    let daemon = spawn_daemon_with(|c| c.ui_listen = Some("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let sid = create_session(&daemon, false).await;
    let ui = daemon.daemon().unwrap().ui_addr.unwrap();

    let out = forkctl(&daemon, &["ui"]).await;
    assert_ok(&out);
    let url = String::from_utf8(out.stdout).unwrap();
    let url = url.trim_end();
    assert!(
        url.starts_with(&format!("http://{ui}/signin?code=")),
        "{url}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tenant `local`"), "{stderr}");

    let (head, _) = get(url, None).await;
    assert!(head.starts_with("HTTP/1.1 303"), "{head}");
    assert_eq!(header(&head, "location"), Some("/"), "{head}");
    let cookie = header(&head, "set-cookie").expect("a cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let cookie = cookie.split(';').next().unwrap();
    let (head, body) = get(&format!("http://{ui}/api/sessions"), Some(cookie)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains(&sid), "tenant local's session: {body}");
    let (head, body) = get(&format!("http://{ui}/api/me"), Some(cookie)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("\"tenant\":\"local\""), "{body}");

    // The link works once.
    let (head, body) = get(url, None).await;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    assert!(body.contains("forkctl ui"), "{body}");

    // `--json`: the link and when it expires.
    let out = forkctl(&daemon, &["--json", "ui"]).await;
    assert_ok(&out);
    let line = &json_lines(&out)[0];
    assert!(
        line["url"].as_str().unwrap().contains("/signin?code="),
        "{line}"
    );
    assert!(line["expires_at"].is_string(), "{line}");
}

#[tokio::test]
async fn ui_without_a_web_view_says_how_to_start_one() {
    let daemon = spawn_daemon().await.unwrap();
    let out = forkctl(&daemon, &["ui"]).await;
    assert_eq!(out.status.code(), Some(6));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("FAILED_PRECONDITION"), "{stderr}");
    assert!(stderr.contains("--ui-listen"), "{stderr}");
    assert!(out.stdout.is_empty());
}
