//! The `forkctl` binary end to end against a fake daemon: what reaches the wire, what reaches
//! stdout and stderr, and the exit codes.

mod support;

use forkd_proto::v1::{Agent, AgentState, NotificationStatus};
use serde_json::{Value, json};
use support::{FakeDaemon, Script, TOKEN, forkctl, notification};

fn json_lines(stdout: &str) -> anyhow::Result<Vec<Value>> {
    stdout
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

#[test]
fn session_create_sends_the_files_and_the_token() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    let system = daemon.dir.path().join("system.md");
    std::fs::write(&system, "Be brief.")?;
    let system = system.display().to_string();
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &[
            "session",
            "create",
            "--system-file",
            &system,
            "--json",
            "--workspace",
            ".",
        ],
    )?;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(json_lines(&run.stdout)?, [json!({"session_id": "S1"})]);
    let recorded = daemon.recorded()?;
    assert_eq!(recorded.create.len(), 1);
    assert_eq!(recorded.create[0].system_prompt, "Be brief.");
    assert!(
        recorded.create[0].workspace.starts_with('/'),
        "{:?}",
        recorded.create[0]
    );
    // The fake locks the record on every call: release it before running forkctl again.
    drop(recorded);

    let human = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["session", "create", "--system-file", &system],
    )?;
    assert_eq!((human.code, human.stdout.as_str()), (Some(0), "S1\n"));
    Ok(())
}

#[test]
fn session_branch_sends_its_point_and_prints_the_id_alone() -> anyhow::Result<()> {
    use forkd_proto::v1::branch_session_request::Point;
    let daemon = FakeDaemon::start(Script::default())?;
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &[
            "session",
            "branch",
            "S1",
            "--at-turn",
            "2",
            "--idempotency-key",
            "k",
        ],
    )?;
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (Some(0), "B1\n"),
        "{run:?}"
    );
    assert!(run.stderr.contains("after turn 2"), "{run:?}");
    assert!(run.stderr.contains("files are not rewound"), "{run:?}");
    let json = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["session", "branch", "S1", "--before", "7", "--json"],
    )?;
    assert_eq!(json.code, Some(0), "{json:?}");
    let shown = &json_lines(&json.stdout)?[0];
    assert_eq!(
        shown["branch"],
        json!({"origin": "S1", "point": 5, "turn": 2})
    );
    assert_eq!(shown["turn_seqs"], json!([1, 3]));
    let latest = forkctl(&daemon.addr(), Some(TOKEN), &["session", "branch", "S1"])?;
    assert_eq!(latest.code, Some(0), "{latest:?}");
    let both = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["session", "branch", "S1", "--at-turn", "1", "--before", "3"],
    )?;
    assert_eq!(both.code, Some(2), "{both:?}");

    let recorded = daemon.recorded()?;
    let points: Vec<_> = recorded.branch.iter().map(|r| r.point).collect();
    assert_eq!(
        points,
        [Some(Point::AtTurn(2)), Some(Point::BeforeSeq(7)), None]
    );
    assert_eq!(recorded.branch[0].idempotency_key, "k");
    assert_eq!(recorded.branch[0].session_id, "S1");
    Ok(())
}

#[test]
fn fork_wait_streams_until_every_child_reported_and_fails_on_a_failure() -> anyhow::Result<()> {
    let notifications = vec![
        notification(1, "A1", NotificationStatus::Completed),
        notification(2, "OTHER", NotificationStatus::Completed),
        notification(3, "A2", NotificationStatus::Failed),
    ];
    let daemon = FakeDaemon::start(Script {
        notifications,
        ..Default::default()
    })?;
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &[
            "--json",
            "fork",
            "S1",
            "-d",
            "@sim say one\nmore",
            "-d",
            "two",
            "--wait",
            "--no-gating",
        ],
    )?;
    assert_eq!(run.code, Some(1), "{run:?}");
    let lines = json_lines(&run.stdout)?;
    assert_eq!(
        lines[0],
        json!({"batch_id": "B1", "agent_ids": ["A1", "A2"]})
    );
    let agents: Vec<&Value> = lines[1..].iter().map(|l| &l["agent_id"]).collect();
    assert_eq!(agents, [&json!("A1"), &json!("A2")]);
    assert_eq!(lines[2]["status"], "failed");

    let recorded = daemon.recorded()?;
    let fork = &recorded.fork[0];
    assert_eq!(fork.directives[0].description, "@sim say one");
    assert_eq!(fork.directives[0].prompt, "@sim say one\nmore");
    assert_eq!(fork.warmup_gating, Some(false));
    let subscribe = &recorded.subscribe[0];
    assert_eq!(
        (
            subscribe.since_seq,
            subscribe.batch_id.as_str(),
            subscribe.follow
        ),
        (0, "B1", true)
    );
    Ok(())
}

#[test]
fn fork_wait_succeeds_and_summarises_for_people() -> anyhow::Result<()> {
    let notifications = vec![notification(1, "A1", NotificationStatus::Completed)];
    let daemon = FakeDaemon::start(Script {
        notifications,
        ..Default::default()
    })?;
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["fork", "S1", "-d", "one", "--wait"],
    )?;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], "batch B1");
    assert_eq!(lines[1], "agent A1");
    assert!(lines[2].starts_with("#1 A1 completed A1 done"), "{lines:?}");
    assert!(
        lines[3].starts_with("batch B1: 1 children, 1 completed, 0 failed"),
        "{lines:?}"
    );
    assert!(run.stderr.contains("waiting for 1 children"), "{run:?}");
    assert_eq!(daemon.recorded()?.fork[0].warmup_gating, None);
    Ok(())
}

#[test]
fn fork_sends_its_limits_and_a_timed_out_child_fails_the_wait() -> anyhow::Result<()> {
    let mut timed_out = notification(2, "A2", NotificationStatus::TimedOut);
    timed_out.report = Some(forkd_proto::v1::Report {
        issues: "timed out: its timeout of 2s (wall time since it started) ran out".into(),
        ..Default::default()
    });
    let notifications = vec![
        notification(1, "A1", NotificationStatus::Completed),
        timed_out,
    ];
    let daemon = FakeDaemon::start(Script {
        notifications,
        ..Default::default()
    })?;
    let args = [
        "fork",
        "S1",
        "-d",
        "one",
        "-d",
        "two",
        "--timeout",
        "2s",
        "--max-output-tokens",
        "4000",
        "--timeout-excludes-throttle",
        "--wait",
    ];
    let run = forkctl(&daemon.addr(), Some(TOKEN), &args)?;
    assert_eq!(run.code, Some(1), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines[4].starts_with(
            "#2 A2 timed_out A2 done [timed out: its timeout of 2s (wall time since it started) \
             ran out]"
        ),
        "{lines:?}"
    );
    assert!(
        lines[5].starts_with("batch B1: 2 children, 1 completed, 0 failed, 0 killed, 1 timed_out"),
        "{lines:?}"
    );
    let limits = daemon.recorded()?.fork[0].limits;
    assert_eq!(
        limits,
        Some(forkd_proto::v1::Limits {
            timeout_ms: 2_000,
            max_output_tokens: 4_000,
            timeout_excludes_throttle: Some(true),
            ..Default::default()
        })
    );

    let mut json_args = vec!["--json"];
    json_args.extend(args);
    let run = forkctl(&daemon.addr(), Some(TOKEN), &json_args)?;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(json_lines(&run.stdout)?[2]["status"], "timed_out");

    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["fork", "S1", "-d", "x", "--max-turns", "0"],
    )?;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("must be more than 0"), "{run:?}");
    // Only the first two calls reached the daemon; no limit given, none sent.
    let run = forkctl(&daemon.addr(), Some(TOKEN), &["fork", "S1", "-d", "x"])?;
    assert_eq!(run.code, Some(0), "{run:?}");
    let recorded = daemon.recorded()?;
    assert_eq!(recorded.fork.len(), 3);
    assert_eq!(recorded.fork[2].limits, None);
    Ok(())
}

#[test]
fn a_stream_that_ends_early_is_reported_as_unavailable() -> anyhow::Result<()> {
    let notifications = vec![notification(1, "A1", NotificationStatus::Completed)];
    let script = Script {
        notifications,
        close_stream: true,
        ..Default::default()
    };
    let daemon = FakeDaemon::start(script)?;
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &[
            "fork",
            "S1",
            "-d",
            "1",
            "-d",
            "2",
            "--wait",
            "--reconnect-for",
            "1s",
        ],
    )?;
    // The stream is asked for again, and again ends early, until the window is spent.
    assert_eq!(run.code, Some(5), "{run:?}");
    assert!(run.stderr.contains("forkctl: lost the daemon"), "{run:?}");
    assert!(run.stderr.contains("forkctl watch --batch B1"), "{run:?}");
    Ok(())
}

#[test]
fn ps_pages_through_every_agent() -> anyhow::Result<()> {
    let agent = |id: &str| Agent {
        agent_id: id.into(),
        session_id: "S1".into(),
        kind: "fork".into(),
        state: AgentState::Completed as i32,
        ..Default::default()
    };
    let script = Script {
        agents: vec![agent("A1"), agent("A2"), agent("A3")],
        ..Default::default()
    };
    let daemon = FakeDaemon::start(script)?;
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["ps", "-a", "--session", "S1", "--json"],
    )?;
    assert_eq!(run.code, Some(0), "{run:?}");
    let ids: Vec<Value> = json_lines(&run.stdout)?
        .iter()
        .map(|l| l["agent_id"].clone())
        .collect();
    assert_eq!(ids, [json!("A1"), json!("A2"), json!("A3")]);
    let recorded = daemon.recorded()?;
    assert_eq!(recorded.list_agents.len(), 3);
    assert!(
        recorded
            .list_agents
            .iter()
            .all(|r| r.include_ended && r.session_id == "S1")
    );
    Ok(())
}

#[test]
fn watch_without_follow_ends_after_the_replay() -> anyhow::Result<()> {
    let notifications = vec![notification(4, "A1", NotificationStatus::Killed)];
    let daemon = FakeDaemon::start(Script {
        notifications,
        ..Default::default()
    })?;
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["watch", "--since", "3", "--no-follow", "--json"],
    )?;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(json_lines(&run.stdout)?[0]["status"], "killed");
    let subscribe = &daemon.recorded()?.subscribe[0];
    assert_eq!((subscribe.since_seq, subscribe.follow), (3, false));
    Ok(())
}

#[test]
fn errors_map_to_exit_codes_with_a_message_and_a_hint() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    let addr = daemon.addr();

    let run = forkctl(&addr, Some(TOKEN), &["session", "get", "nope"])?;
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(
        run.stderr
            .starts_with("forkctl: NOT_FOUND: session nope not found\n"),
        "{run:?}"
    );
    assert!(run.stderr.contains("forkctl: hint: "), "{run:?}");
    assert!(run.stdout.is_empty());

    let run = forkctl(
        &addr,
        None,
        &[
            "calc",
            "--prefix",
            "1",
            "--directive",
            "1",
            "--children",
            "2",
        ],
    )?;
    assert_eq!(run.code, Some(6), "{run:?}");
    assert!(run.stderr.contains("UNAUTHENTICATED"), "{run:?}");
    assert!(run.stderr.contains("FORKD_TOKEN"), "{run:?}");

    let run = forkctl(
        &addr,
        Some(TOKEN),
        &["calc", "--prefix", "1", "--directive", "1"],
    )?;
    assert_eq!(run.code, Some(2), "{run:?}");

    let missing = format!("unix:{}", daemon.dir.path().join("absent.sock").display());
    let run = forkctl(&missing, None, &["ps"])?;
    assert_eq!(run.code, Some(5), "{run:?}");
    assert!(
        run.stderr
            .starts_with("forkctl: cannot connect to forkd at unix:"),
        "{run:?}"
    );
    assert!(run.stderr.contains("forkd serve"), "{run:?}");

    let run = forkctl(
        &addr,
        Some(TOKEN),
        &["session", "create", "--system-file", "/nonexistent"],
    )?;
    assert_eq!(run.code, Some(4), "{run:?}");
    Ok(())
}

#[test]
fn calc_prints_null_break_even_when_forking_never_pays() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    let args = [
        "calc",
        "--prefix",
        "10",
        "--directive",
        "10",
        "--children",
        "2",
        "--json",
    ];
    let run = forkctl(&daemon.addr(), Some(TOKEN), &args)?;
    assert_eq!(run.code, Some(0), "{run:?}");
    let line = &json_lines(&run.stdout)?[0];
    assert_eq!(line["break_even_children"], Value::Null);
    assert_eq!(line["fork_cost_usd"], 0.25);
    Ok(())
}

#[test]
fn ui_prints_the_link_and_asks_for_it_over_the_unix_socket_only() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    let run = forkctl(&daemon.addr(), None, &["ui"])?;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout, "http://127.0.0.1:8080/signin?code=c0de\n");
    assert!(run.stderr.contains("tenant `local`"), "{run:?}");
    assert!(run.stderr.contains("works once"), "{run:?}");

    let run = forkctl(&daemon.addr(), None, &["--json", "ui"])?;
    assert_eq!(run.code, Some(0), "{run:?}");
    let line = &json_lines(&run.stdout)?[0];
    assert_eq!(line["url"], "http://127.0.0.1:8080/signin?code=c0de");
    assert!(
        line["expires_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{line}"
    );

    // A token names another tenant: the daemon refuses, and forkctl says so.
    let run = forkctl(&daemon.addr(), Some(TOKEN), &["ui"])?;
    assert_eq!(run.code, Some(6), "{run:?}");
    assert!(run.stderr.contains("PERMISSION_DENIED"), "{run:?}");

    // Over TCP it is refused before connecting (nothing listens there).
    let run = forkctl("http://127.0.0.1:9", None, &["ui"])?;
    assert_eq!(run.code, Some(4), "{run:?}");
    assert!(run.stderr.contains("Unix socket"), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    Ok(())
}

#[test]
fn fork_sends_its_output_schema_checked_and_compact() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    let schema = daemon.dir.path().join("verdict.json");
    std::fs::write(
        &schema,
        "{\n  \"type\": \"object\",\n  \"required\": [\"verdict\"]\n}\n",
    )?;
    let path = schema.display().to_string();
    let run = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["fork", "S1", "-d", "Judge it", "--output-schema", &path],
    )?;
    assert_eq!(run.code, Some(0), "{run:?}");
    std::fs::write(&schema, r#"{"type": "objet"}"#)?;
    let bad = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["fork", "S1", "-d", "Judge it", "--output-schema", &path],
    )?;
    assert_eq!(bad.code, Some(4), "{bad:?}");
    assert!(bad.stderr.contains("verdict.json"), "{bad:?}");
    assert!(bad.stderr.contains("not a valid JSON Schema"), "{bad:?}");
    let recorded = daemon.recorded()?;
    assert_eq!(recorded.fork.len(), 1, "the bad schema never left forkctl");
    assert_eq!(
        recorded.fork[0].output_schema,
        r#"{"type":"object","required":["verdict"]}"#
    );
    Ok(())
}

#[test]
fn webhook_add_prints_the_secret_once_and_test_exits_1_when_not_taken() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    let add = [
        "webhook",
        "add",
        "https://example.com/hook",
        "--kinds",
        "fork,typed",
    ];
    let run = forkctl(&daemon.addr(), Some(TOKEN), &add)?;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .starts_with("W1  https://example.com/hook  kinds: fork,typed\n"),
        "{run:?}"
    );
    assert!(run.stdout.contains("secret: whsec_c2VjcmV0"), "{run:?}");

    let json_add = [&["--json"], &add[..]].concat();
    let run = forkctl(&daemon.addr(), Some(TOKEN), &json_add)?;
    let line = &json_lines(&run.stdout)?[0];
    assert_eq!(line["secret"], "whsec_c2VjcmV0");
    assert_eq!(
        line["webhook"]["kinds"],
        serde_json::json!(["fork", "typed"])
    );
    assert_eq!(line["webhook"]["session_id"], Value::Null);
    assert_eq!(line["webhook"]["disabled"], Value::Null);

    let run = forkctl(&daemon.addr(), Some(TOKEN), &["webhook", "test", "W1"])?;
    assert_eq!(run.code, Some(1), "not taken: {run:?}");
    assert!(
        run.stdout
            .contains("ping  attempt 1  HTTP 503  12 ms  failed: HTTP 503"),
        "{run:?}"
    );

    let run = forkctl(&daemon.addr(), Some(TOKEN), &["webhook", "get", "W9"])?;
    assert_eq!(run.code, Some(3), "NOT_FOUND: {run:?}");
    Ok(())
}
