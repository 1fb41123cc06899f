//! No child hangs a batch (docs/contracts.md, "Limits"): a child past its wall time, idle for
//! too long, or past its turns or output tokens ends `timed_out` with a partial report naming
//! the limit, while its siblings go on, the batch's wait returns and its running slot is freed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use binary::{Daemon, client};
use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, eventually, spawn_daemon, spawn_daemon_with, trusted_session_request,
    wait_for_batch,
};

mod binary;

fn bash(command: &str) -> String {
    format!(
        "@sim tool Bash {}",
        serde_json::json!({ "command": command })
    )
}

fn directive(description: &str, prompt: String, limits: Option<pb::Limits>) -> pb::Directive {
    pb::Directive {
        description: description.into(),
        prompt,
        limits,
    }
}

fn timed_out(n: &pb::Notification) -> bool {
    n.status == pb::NotificationStatus::TimedOut as i32
}

fn issues(n: &pb::Notification) -> String {
    n.report.clone().unwrap().issues
}

/// Forks `request`'s batch and waits for its children's notifications, returned in directive
/// order, with the batch.
async fn fork_and_wait(
    c: &mut binary::Client,
    request: pb::ForkBatchRequest,
) -> (pb::ForkBatchResponse, Vec<pb::Notification>) {
    let batch = c.fork_batch(request).await.unwrap().into_inner();
    let done = wait_for_batch(
        c,
        &batch.batch_id,
        batch.agent_ids.len(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let ordered = batch
        .agent_ids
        .iter()
        .map(|id| done.iter().find(|n| &n.agent_id == id).unwrap().clone())
        .collect();
    (batch, ordered)
}

/// A script that calls Bash `turns` times, one call a turn, each a short sleep: busy, never idle.
fn looping(turns: usize) -> String {
    let mut script = String::from("Keep checking.\n");
    for _ in 0..turns {
        script.push_str(&bash("sleep 0.2"));
        script.push_str("\n@sim think once more\n");
    }
    script.push_str("@sim say done");
    script
}

#[tokio::test]
async fn a_batch_with_three_hung_children_ends_at_its_timeout() {
    let daemon = spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let ws = daemon.workspace_path();
    let session = create_session(&mut c, trusted_session_request(&ws))
        .await
        .unwrap();
    let mut directives: Vec<pb::Directive> = (0..7)
        .map(|i| {
            directive(
                &format!("quick {i}"),
                format!("Part {i}.\n@sim say ok {i}"),
                None,
            )
        })
        .collect();
    directives.push(directive(
        "sleeper",
        format!("Wait.\n{}\n@sim say woke", bash("sleep 60")),
        None,
    ));
    directives.push(directive(
        "staller",
        "Talk.\n@sim stall\n@sim say never".into(),
        None,
    ));
    directives.push(directive("looper", looping(200), None));
    let request = pb::ForkBatchRequest {
        session_id: session.session_id,
        directives,
        limits: Some(pb::Limits {
            timeout_ms: 3_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    let (batch, done) = fork_and_wait(&mut c, request).await;
    let completed = pb::NotificationStatus::Completed as i32;
    assert!(done[..7].iter().all(|n| n.status == completed), "{done:#?}");
    let by_agent = |i: usize| done[i].clone();
    for i in 7..10 {
        let n = by_agent(i);
        assert!(timed_out(&n), "child {i}: {n:#?}");
        assert!(
            issues(&n).starts_with("timed out: its timeout of 3s (wall time since it started)"),
            "{n:#?}"
        );
        assert!(
            n.summary.starts_with("Timed out: its timeout of 3s"),
            "{n:#?}"
        );
        let agent = forkd_test_support::get_agent(&mut c, &batch.agent_ids[i]).await;
        assert_eq!(agent.state, pb::AgentState::TimedOut as i32);
        assert_eq!(agent.limits.unwrap().timeout_ms, 3_000);
        assert!(agent.started_at.is_some());
    }
    // The sleeper's Bash call was cut off and is named; the staller's reply never came.
    assert!(
        issues(&by_agent(7)).contains(r#"tool calls cut off (killed): Bash ("sleep 60")"#),
        "{:#?}",
        by_agent(7)
    );
    assert!(
        by_agent(8)
            .report
            .unwrap()
            .result
            .ends_with("before any reply."),
        "{:#?}",
        by_agent(8)
    );
    // The looper got through some of its calls before its time ran out.
    assert!(binary::assistant_replies(&mut c, &batch.agent_ids[9]).await > 1);
}

#[tokio::test]
async fn idle_children_end_at_their_idle_timeout_and_free_their_slot() {
    // One slot: the second idle child runs only once the first has given it back.
    let daemon = spawn_daemon_with(|c| c.engine.max_running_agents = Some(1))
        .await
        .unwrap();
    let mut c = daemon.client().await.unwrap();
    let session = create_session(&mut c, trusted_session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let idle = Some(pb::Limits {
        idle_timeout_ms: 1_000,
        ..Default::default()
    });
    let request = pb::ForkBatchRequest {
        session_id: session.session_id,
        directives: vec![
            directive("staller", "Talk.\n@sim stall\n@sim say never".into(), idle),
            directive(
                "sleeper",
                format!("Wait.\n{}\n@sim say woke", bash("sleep 60")),
                idle,
            ),
            // Busy for longer than the idle timeout, never idle that long: it completes.
            directive("worker", looping(8), idle),
            directive("quick", "Go.\n@sim say ok".into(), None),
        ],
        ..Default::default()
    };
    let (_, done) = fork_and_wait(&mut c, request).await;
    let status = |i: usize| done[i].clone();
    for i in [0, 1] {
        let n = status(i);
        assert!(timed_out(&n), "{n:#?}");
        assert!(
            issues(&n).starts_with(
                "timed out: no model output and no tool call started or finished for 1s"
            ),
            "{n:#?}"
        );
    }
    assert_eq!(status(2).status, pb::NotificationStatus::Completed as i32);
    assert_eq!(status(3).status, pb::NotificationStatus::Completed as i32);
}

#[tokio::test]
async fn turns_and_output_tokens_are_limited_between_requests() {
    let daemon = spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let session = create_session(&mut c, trusted_session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let request = pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: vec![
            directive(
                "turns",
                looping(5),
                Some(pb::Limits {
                    max_turns: 2,
                    ..Default::default()
                }),
            ),
            directive(
                "tokens",
                looping(5),
                Some(pb::Limits {
                    max_output_tokens: 1,
                    ..Default::default()
                }),
            ),
        ],
        // The batch's own limit, below each child's.
        limits: Some(pb::Limits {
            max_turns: 100,
            ..Default::default()
        }),
        ..Default::default()
    };
    let (batch, done) = fork_and_wait(&mut c, request).await;
    let of = |i: usize| done[i].clone();
    assert!(timed_out(&of(0)), "{:#?}", of(0));
    assert_eq!(
        issues(&of(0)),
        "timed out: no final answer after 2 model requests (its max_turns)"
    );
    assert_eq!(
        binary::assistant_replies(&mut c, &batch.agent_ids[0]).await,
        2
    );
    assert!(timed_out(&of(1)), "{:#?}", of(1));
    assert_eq!(
        issues(&of(1)),
        "timed out: it wrote 1 output tokens or more (its max_output_tokens)"
    );
    assert_eq!(
        binary::assistant_replies(&mut c, &batch.agent_ids[1]).await,
        1
    );
    let agent = forkd_test_support::get_agent(&mut c, &batch.agent_ids[1]).await;
    let limits = agent.limits.unwrap();
    // Its own over the batch's over the daemon's (max_turns 50).
    assert_eq!((limits.max_output_tokens, limits.max_turns), (1, 100));

    // On the wire 0 is "unset": an option with no limit set is accepted, and limits nothing.
    let accepted = c
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id,
            directives: vec![directive("x", "Go.".into(), None)],
            limits: Some(pb::Limits {
                timeout_excludes_throttle: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;
    assert!(accepted.is_ok(), "{accepted:?}");
}

#[tokio::test]
async fn a_typed_agent_has_limits_of_its_own() {
    let daemon = spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let session = create_session(&mut c, trusted_session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let agent = c
        .spawn_agent(pb::SpawnAgentRequest {
            session_id: session.session_id,
            subagent_type: "general-purpose".into(),
            description: "stall".into(),
            prompt: "Talk.\n@sim stall\n@sim say never".into(),
            limits: Some(pb::Limits {
                idle_timeout_ms: 500,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ended = eventually(Duration::from_secs(30), "the typed agent to end", || {
        let mut c = c.clone();
        let id = agent.agent_id.clone();
        async move {
            let a = forkd_test_support::get_agent(&mut c, &id).await;
            binary::is_terminal(a.state).then_some(a)
        }
    })
    .await;
    assert_eq!(ended.state, pb::AgentState::TimedOut as i32, "{ended:#?}");
    assert!(ended.error.contains("idle_timeout"), "{ended:#?}");
}

/// The clock counts from the stored start: a daemon killed while the child runs, started again
/// after its timeout has passed, ends it at once rather than giving it a new timeout. (Given a
/// new one, the resumed child would answer its interrupted Bash call and complete.)
#[tokio::test]
async fn the_timeout_counts_from_the_stored_start_across_a_restart() {
    let home = tempfile::Builder::new()
        .prefix("forkd-timeouts-")
        .tempdir()
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let session = create_session(&mut c, trusted_session_request(&ws))
        .await
        .unwrap();
    let forked = std::time::Instant::now();
    let batch = c
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id,
            directives: vec![directive(
                "sleeper",
                format!("Wait.\n{}\n@sim say woke", bash("touch started; sleep 60")),
                None,
            )],
            limits: Some(pb::Limits {
                timeout_ms: 3_000,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    forkd_test_support::wait_for_path(&ws.join("started")).await;
    daemon.kill9();
    // Down past the child's timeout.
    tokio::time::sleep(
        Duration::from_secs(3).saturating_sub(forked.elapsed()) + Duration::from_millis(500),
    )
    .await;
    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let done = wait_for_batch(&mut c, &batch.batch_id, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(timed_out(&done[0]), "{done:#?}");
    assert!(issues(&done[0]).contains("its timeout of 3s"), "{done:#?}");
    daemon.kill9();
}

/// The parent model's `Agent` tool takes `timeout` (seconds): a fork child that stalls ends at
/// it, a sibling without one completes, and a bad value is refused as the call's result.
#[tokio::test]
async fn the_agent_tool_s_timeout_limits_the_child_it_forks() {
    let daemon = spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let session = create_session(&mut c, trusted_session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let call = |prompt: &str, timeout: serde_json::Value| {
        let mut input = serde_json::json!({ "description": "part", "prompt": prompt });
        if !timeout.is_null() {
            input["timeout"] = timeout;
        }
        format!("@sim agent {input}")
    };
    let text = [
        "Split it.".to_owned(),
        call("Talk.\n@sim stall", serde_json::json!(1)),
        call("Quick.\n@sim say ok", serde_json::Value::Null),
        call("Never.", serde_json::json!("soon")),
        "@sim say forked".to_owned(),
    ]
    .join("\n");
    let events = forkd_test_support::run_turn(
        &mut c,
        pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let launched = events
        .iter()
        .find_map(|e| match e {
            pb::session_event::Event::ForkLaunched(f) => Some(f.clone()),
            _ => None,
        })
        .expect("the turn forked");
    assert_eq!(
        launched.agent_ids.len(),
        2,
        "the bad timeout's call was refused"
    );
    let done = wait_for_batch(&mut c, &launched.batch_id, 2, Duration::from_secs(60))
        .await
        .unwrap();
    let of = |i: usize| {
        done.iter()
            .find(|n| n.agent_id == launched.agent_ids[i])
            .unwrap()
            .clone()
    };
    assert!(timed_out(&of(0)), "{:#?}", of(0));
    assert!(issues(&of(0)).contains("its timeout of 1s"), "{:#?}", of(0));
    assert_eq!(of(1).status, pb::NotificationStatus::Completed as i32);
    let transcript: String = forkd_test_support::session_transcript(&mut c, &session.session_id)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content_json)
        .collect();
    assert!(
        transcript.contains("timeout must be a whole number of seconds"),
        "{transcript}"
    );
}

/// A parent turn is bounded by its tenant's or the daemon's `timeout`: past it the turn stops,
/// the caller hears `DEADLINE_EXCEEDED` naming the limit, and the session takes its next message.
#[tokio::test]
async fn a_parent_turn_ends_at_the_daemon_s_timeout() {
    let daemon = spawn_daemon_with(|c| c.engine.agent_limits.timeout_ms = Some(1_000))
        .await
        .unwrap();
    let mut c = daemon.client().await.unwrap();
    let session = create_session(&mut c, trusted_session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let send = |text: &str| pb::SendMessageRequest {
        session_id: session.session_id.clone(),
        text: text.into(),
        ..Default::default()
    };
    let slow = forkd_test_support::run_turn(&mut c, send("Think long.\n@sim stall"))
        .await
        .unwrap_err();
    assert_eq!(slow.code(), tonic::Code::DeadlineExceeded, "{slow:?}");
    assert!(
        slow.message()
            .contains("the turn timed out: its timeout of 1s"),
        "{slow:?}"
    );
    let next = forkd_test_support::run_turn(&mut c, send("Quick.\n@sim say done"))
        .await
        .unwrap();
    assert!(forkd_test_support::turn_text(&next).is_some_and(|t| t.contains("done")));
}
