//! Parent turns and agent runs across their lifecycle: typed-agent reports delivered once,
//! cancelling a turn, forks that are not always asynchronous, a turn resumed by a new engine,
//! and two engines on one database fencing each other's runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ended, engine, engine_on, engine_with, eventually, new_session};
use forkd_core::session::Session;
use forkd_core::{AgentKind, AgentState, Directive, NotificationKind, NotificationStatus, Role};
use forkd_engine::{Engine, EngineConfig, EngineError, ParentEvent};
use forkd_provider::SimConfig;
use forkd_store::{AgentFilter, NotificationFilter};
use futures::StreamExt;

async fn session(engine: &Engine, dir: &Path) -> Session {
    engine
        .create_session(new_session(dir, "Sys."))
        .await
        .unwrap()
}

/// Every event of a turn, until its stream ends.
async fn turn(
    engine: &Engine,
    session: &Session,
    text: &str,
) -> Vec<Result<ParentEvent, EngineError>> {
    let stream = engine.send_message(session.id, text.into()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), stream.collect())
        .await
        .expect("the turn ends")
}

async fn transcript_texts(engine: &Engine, session: &Session) -> Vec<(Role, String)> {
    engine
        .store()
        .session_messages(session.id, None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.message.role, m.message.content_json()))
        .collect()
}

async fn agents_of(engine: &Engine, session: &Session, kind: AgentKind) -> Vec<forkd_core::Agent> {
    engine
        .list_agents(&AgentFilter {
            session_id: Some(session.id),
            include_ended: true,
            ..AgentFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.kind == kind)
        .collect()
}

/// What only a `<task-notification>` message holds (fork placeholders name the tag too).
const NOTIFICATION: &str = "<agent-id>";

fn mentions(messages: &[(Role, String)], needle: &str) -> usize {
    messages.iter().filter(|(_, m)| m.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_agent_called_in_a_turn_reports_once_in_the_tool_result() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let s = session(&engine, dir.path()).await;
    let script = concat!(
        "Plan it.\n",
        r#"@sim agent {"description":"plan","prompt":"Plan it.\n@sim say step 1, step 2","subagent_type":"Plan"}"#,
        "\n@sim say delegated",
    );
    let events = turn(&engine, &s, script).await;
    assert!(
        events.iter().any(
            |e| matches!(e, Ok(ParentEvent::TurnEnded { text, .. }) if text.contains("delegated"))
        ),
        "{events:?}"
    );
    let typed = agents_of(&engine, &s, AgentKind::Typed).await;
    assert_eq!(typed.len(), 1);
    let id = typed[0].id.to_string();

    let messages = transcript_texts(&engine, &s).await;
    // The report is in the Agent call's tool_result, and nowhere else in the transcript.
    assert_eq!(mentions(&messages, &id), 1, "{messages:#?}");
    assert_eq!(mentions(&messages, NOTIFICATION), 0, "{messages:#?}");
    // The user's script, the Agent call's input and its tool_result.
    assert_eq!(mentions(&messages, "step 1, step 2"), 3);
    // Subscribers still hear of it.
    assert_eq!(
        ended(&engine, typed[0].id).await.status,
        NotificationStatus::Completed
    );
    assert!(engine.store().caller_reports().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_parent_cancels_its_turn_and_the_report_it_waited_for_reaches_the_transcript() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let s = session(&engine, dir.path()).await;
    let script = concat!(
        "Take your time.\n",
        r#"@sim agent {"description":"slow","prompt":"Slowly.\n@sim sleep 2s\n@sim say slow but done","subagent_type":"general-purpose"}"#,
        "\n@sim say never said",
    );
    let mut stream = engine.send_message(s.id, script.into()).await.unwrap();
    // Wait until the turn is waiting on its typed agent.
    let typed = eventually(
        Duration::from_secs(30),
        "the typed agent to start",
        || async { agents_of(&engine, &s, AgentKind::Typed).await.pop() },
    )
    .await;
    let parent = agents_of(&engine, &s, AgentKind::Parent)
        .await
        .pop()
        .unwrap();
    engine.kill(parent.id).await.unwrap();

    let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(5), async {
        let mut rest = Vec::new();
        while let Some(e) = stream.next().await {
            rest.push(e);
        }
        rest
    })
    .await
    .expect("the turn stops at once");
    assert!(
        matches!(rest.last(), Some(Err(EngineError::Cancelled(_)))),
        "{rest:?}"
    );
    let parent = engine.get_agent(parent.id).await.unwrap();
    assert_eq!(parent.state, AgentState::Idle);
    assert!(matches!(
        engine.kill(parent.id).await,
        Err(EngineError::WrongState(_))
    ));

    // The typed agent goes on; its report, which no turn will deliver, reaches the transcript.
    let note = ended(&engine, typed.id).await;
    assert_eq!(note.status, NotificationStatus::Completed);
    let messages = transcript_texts(&engine, &s).await;
    assert_eq!(mentions(&messages, NOTIFICATION), 1, "{messages:#?}");
    // The user's script, and the notification; the cancelled reply was never stored.
    assert_eq!(mentions(&messages, "slow but done"), 2);
    assert_eq!(
        mentions(&messages, "never said"),
        1,
        "only the user's script says it"
    );
    // The session takes its next turn.
    let events = turn(&engine, &s, "Again.\n@sim say back").await;
    assert!(events.iter().all(|e| e.is_ok()), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_forks_waits_for_its_children_when_forks_are_not_always_async() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        fork_always_async: false,
        ..EngineConfig::default()
    };
    let engine = engine_with(dir.path(), config).await;
    let s = session(&engine, dir.path()).await;
    let script = concat!(
        "Split it.\n",
        r#"@sim agent {"description":"a","prompt":"Do a.\n@sim sleep 1s\n@sim say a done"}"#,
        "\n",
        r#"@sim agent {"description":"b","prompt":"Do b.\n@sim sleep 1s\n@sim say b done"}"#,
        "\n@sim say summarized",
    );
    let events = turn(&engine, &s, script).await;
    assert!(events.iter().all(|e| e.is_ok()), "{events:?}");
    let messages = transcript_texts(&engine, &s).await;
    // user, fork message, placeholder results, two notifications, then the reply that read them.
    let roles: Vec<Role> = messages.iter().map(|(r, _)| *r).collect();
    assert_eq!(
        roles[roles.len() - 5..],
        [
            Role::Assistant,
            Role::User,
            Role::User,
            Role::User,
            Role::Assistant
        ],
        "{messages:#?}"
    );
    let n = messages.len();
    for (_, m) in &messages[n - 3..n - 1] {
        assert!(m.contains(NOTIFICATION), "{m}");
    }
    assert!(messages[n - 1].1.contains("summarized"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_engine_resumes_a_parent_turn_cut_off_mid_request() {
    let dir = tempfile::tempdir().unwrap();
    let first = engine(dir.path()).await;
    let s = session(&first, dir.path()).await;
    let mut stream = first
        .send_message(
            s.id,
            "Think slowly.\n@sim sleep 3s\n@sim say resumed fine".into(),
        )
        .await
        .unwrap();
    // The reply has started streaming (over 3 s): the request is in flight.
    let started = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("the reply starts");
    assert!(
        matches!(started, Some(Ok(ParentEvent::TextDelta(_)))),
        "{started:?}"
    );
    // The daemon stops mid-request: nothing of the reply was stored.
    first.shutdown(Duration::ZERO).await;
    drop(stream);
    let parent = agents_of(&first, &s, AgentKind::Parent)
        .await
        .pop()
        .unwrap();
    assert_eq!(parent.state, AgentState::Running);
    let before = transcript_texts(&first, &s).await.len();

    let second = engine(dir.path()).await;
    assert_eq!(second.resume_interrupted().await.unwrap(), 1);
    eventually(
        Duration::from_secs(30),
        "the resumed turn to end",
        || async { second.get_agent(parent.id).await.unwrap().state == AgentState::Idle },
    )
    .await;
    let messages = transcript_texts(&second, &s).await;
    assert_eq!(messages.len(), before + 1, "{messages:#?}");
    let (role, reply) = messages.last().unwrap();
    assert_eq!(*role, Role::Assistant);
    assert!(reply.contains("resumed fine"));
    // No client watched the resumed turn: its end is a notification of kind `turn`.
    let note = ended(&second, parent.id).await;
    assert_eq!(note.kind, NotificationKind::Turn);
    assert_eq!(note.status, NotificationStatus::Completed);
    assert!(note.report.result.contains("resumed fine"), "{note:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_engine_that_claims_an_agent_fences_the_first_run() {
    let dir = tempfile::tempdir().unwrap();
    let first = engine(dir.path()).await;
    let s = session(&first, dir.path()).await;
    let batch = first
        .fork_batch(
            s.id,
            vec![Directive {
                description: "slow".into(),
                prompt: "Slowly.\n@sim sleep 2s\n@sim say done once".into(),
            }],
            Default::default(),
        )
        .await
        .unwrap();
    let child = batch.agent_ids[0];
    eventually(
        Duration::from_secs(30),
        "the first engine to run the child",
        || async { first.get_agent(child).await.unwrap().state == AgentState::Running },
    )
    .await;

    // A second daemon on the same database resumes the child while the first still runs it.
    let second = engine(dir.path()).await;
    assert_eq!(second.resume_interrupted().await.unwrap(), 1);
    let note = ended(&second, child).await;
    assert_eq!(note.status, NotificationStatus::Completed);
    // Shutting the first engine down waits for its run: the response in flight arrives, and the
    // write it makes is refused.
    first.shutdown(Duration::from_secs(30)).await;

    let own = second.store().agent_messages(child).await.unwrap();
    let replies = own
        .iter()
        .filter(|m| m.message.role == Role::Assistant)
        .count();
    assert_eq!(
        replies,
        1,
        "{:#?}",
        own.iter()
            .map(|m| m.message.content_json())
            .collect::<Vec<_>>()
    );
    let notes: Vec<_> = second
        .subscribe(
            0,
            NotificationFilter {
                agent_id: Some(child),
                ..NotificationFilter::default()
            },
            false,
        )
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(notes.len(), 1);
    // The client batch's one digest names the child once.
    let transcript = transcript_texts(&second, &s).await;
    assert_eq!(mentions(&transcript, "<batch-notification>"), 1);
    assert_eq!(mentions(&transcript, &child.to_string()), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_cap_agents_wait_as_pending_and_start_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        max_running_agents: Some(2),
        ..EngineConfig::default()
    };
    let engine = engine_with(dir.path(), config).await;
    let s = session(&engine, dir.path()).await;
    let directives = (0..6)
        .map(|i| Directive {
            description: format!("child {i}"),
            prompt: format!("Child {i}.\n@sim sleep 300ms\n@sim say {i} done"),
        })
        .collect();
    let options = forkd_engine::BatchOptions {
        warmup_gating: Some(false),
        ..Default::default()
    };
    let batch = engine.fork_batch(s.id, directives, options).await.unwrap();
    let filter = NotificationFilter {
        batch_id: Some(batch.batch_id),
        ..NotificationFilter::default()
    };
    let mut notes = engine.subscribe(0, filter, true).await.unwrap();
    let mut most_running = 0;
    let mut ended = Vec::new();
    while ended.len() < 6 {
        tokio::select! {
            note = notes.next() => ended.push(note.unwrap().unwrap().agent_id),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let running = engine
            .list_agents(&AgentFilter {
                batch_id: Some(batch.batch_id),
                ..AgentFilter::default()
            })
            .await
            .unwrap()
            .iter()
            .filter(|a| a.state == AgentState::Running)
            .count();
        most_running = most_running.max(running);
    }
    assert!(most_running <= 2, "{most_running} ran at once");
    assert!(most_running >= 1);
    // Equal work, started in order, two at a time: they end in order too.
    let first_two: std::collections::HashSet<_> = ended[..2].iter().collect();
    assert_eq!(
        first_two,
        batch.agent_ids[..2].iter().collect(),
        "the first two started first"
    );
}

/// Under a cap, tenants take turns at the running slots: a tenant whose small batch comes after
/// another tenant's long one does not wait for all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_cap_tenants_take_turns_at_the_slots() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let mut config = EngineConfig {
        max_running_agents: Some(2),
        ..EngineConfig::default()
    };
    // Each tenant works in a root of its own: tenants never share a workspace.
    for tenant in ["a", "b"] {
        std::fs::create_dir(base.join(tenant)).unwrap();
        config
            .workspaces
            .roots
            .insert(tenant.into(), vec![base.join(tenant)]);
    }
    let engine = engine_with(dir.path(), config).await;
    let session_of = |tenant: &str| {
        let mut new = new_session(&base.join(tenant), "Sys.");
        new.tenant = tenant.into();
        engine.create_session(new)
    };
    let (a, b) = (
        session_of("a").await.unwrap(),
        session_of("b").await.unwrap(),
    );
    let options = || forkd_engine::BatchOptions {
        warmup_gating: Some(false),
        ..Default::default()
    };
    let directives = |n: usize| {
        (0..n)
            .map(|i| Directive {
                description: format!("child {i}"),
                prompt: format!("Child {i}.\n@sim sleep 300ms\n@sim say {i} done"),
            })
            .collect()
    };
    let long = engine
        .fork_batch(a.id, directives(8), options())
        .await
        .unwrap();
    let short = engine
        .fork_batch(b.id, directives(2), options())
        .await
        .unwrap();

    let mut notes = engine
        .subscribe(0, NotificationFilter::default(), true)
        .await
        .unwrap();
    let mut ended = Vec::new();
    while ended.len() < 10 {
        let note = tokio::time::timeout(Duration::from_secs(60), notes.next())
            .await
            .expect("every child ends")
            .unwrap()
            .unwrap();
        assert_eq!(note.status, NotificationStatus::Completed);
        ended.push(if note.batch_id == Some(long.batch_id) {
            'A'
        } else {
            'B'
        });
    }
    let ended: String = ended.into_iter().collect();
    let last_of_b = ended.rfind('B').unwrap();
    // First come, first served, B's two would end 9th and 10th. Taking turns, B's second child
    // starts at the latest with the fourth slot that frees after A's first two: it ends about
    // 6th, a little later where children end at the same moment.
    assert!(
        last_of_b <= 7,
        "B's children waited behind A's whole batch; they ended {ended}"
    );
    assert_eq!(short.agent_ids.len(), 2);
}

/// A kill reaches an agent waiting for a slot at once, wherever it stands in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_ends_an_agent_that_waits_for_a_slot_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        max_running_agents: Some(1),
        ..EngineConfig::default()
    };
    let engine = engine_with(dir.path(), config).await;
    let s = session(&engine, dir.path()).await;
    let directives = (0..3)
        .map(|i| Directive {
            description: format!("child {i}"),
            prompt: format!("Child {i}.\n@sim sleep 30s\n@sim say {i} done"),
        })
        .collect();
    let options = forkd_engine::BatchOptions {
        warmup_gating: Some(false),
        ..Default::default()
    };
    let batch = engine.fork_batch(s.id, directives, options).await.unwrap();
    let last = batch.agent_ids[2];
    engine.kill(last).await.unwrap();
    let note = ended(&engine, last).await;
    assert_eq!(note.status, NotificationStatus::Killed);
    // It did not wait for the two ahead of it: the first still runs, the second still waits.
    let states: Vec<AgentState> =
        futures::future::join_all(batch.agent_ids[..2].iter().map(|id| engine.get_agent(*id)))
            .await
            .into_iter()
            .map(|a| a.unwrap().state)
            .collect();
    assert_eq!(states, [AgentState::Running, AgentState::Pending]);
    engine.shutdown(Duration::from_millis(100)).await;
}

/// A batch interrupted before any child made a request resumes behind warm-up gating: the first
/// child writes the shared prefix and its siblings read it, instead of each writing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_batch_whose_prefix_is_cold_warms_it_once() {
    let dir = tempfile::tempdir().unwrap();
    // No run slot at all: the children stay pending, as a daemon stopped at once leaves them.
    let first = engine_with(
        dir.path(),
        EngineConfig {
            max_running_agents: Some(0),
            ..EngineConfig::default()
        },
    )
    .await;
    let s = session(&first, dir.path()).await;
    let directives = (0..3)
        .map(|i| Directive {
            description: format!("child {i}"),
            prompt: format!("Child {i}."),
        })
        .collect();
    let batch = first
        .fork_batch(s.id, directives, Default::default())
        .await
        .unwrap();
    first.shutdown(Duration::from_secs(1)).await;
    drop(first);

    // A pace at which requests sent together overlap: ungated, each would miss the cache.
    let second = engine_on(
        common::store(dir.path()).await,
        SimConfig {
            speed: 0.01,
            ..SimConfig::default()
        },
        EngineConfig::default(),
    );
    assert_eq!(second.resume_interrupted().await.unwrap(), 3);
    let filter = NotificationFilter {
        batch_id: Some(batch.batch_id),
        ..NotificationFilter::default()
    };
    let mut notes = second.subscribe(0, filter, true).await.unwrap();
    for _ in 0..3 {
        let note = tokio::time::timeout(Duration::from_secs(60), notes.next())
            .await
            .expect("the children end")
            .unwrap()
            .unwrap();
        assert_eq!(note.status, NotificationStatus::Completed);
    }
    let requests = second
        .store()
        .list_requests(&forkd_store::RequestFilter {
            batch_id: Some(batch.batch_id),
            ..Default::default()
        })
        .await
        .unwrap();
    let first_requests: Vec<_> = batch
        .agent_ids
        .iter()
        .map(|id| {
            requests
                .iter()
                .find(|r| r.agent_id == *id && r.turn == 0)
                .expect("a first request")
        })
        .collect();
    assert_eq!(
        first_requests[0].usage.cache_read_input_tokens, 0,
        "the first child finds the cache cold"
    );
    for r in &first_requests[1..] {
        assert!(
            r.usage.cache_read_input_tokens > 1_000,
            "a sibling read the shared prefix: {:?}",
            r.usage
        );
    }
}

/// A client's batch forks at the end of the parent's last finished turn: a turn in flight is not
/// part of what its children inherit. The parent's transcript gets one launch note and, when the
/// last child ends, one digest naming every child — not one notification per child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_batch_forks_before_a_turn_in_flight_and_reports_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::engine_on(
        common::store(dir.path()).await,
        SimConfig {
            speed: 1.0,
            ..SimConfig::default()
        },
        EngineConfig::default(),
    );
    let s = session(&engine, dir.path()).await;
    let before = engine.session_message_count(s.id).await.unwrap();
    // A slow turn is in flight when the batch arrives.
    let in_flight = "A turn still running.\n@sim sleep 3s\n@sim say slow";
    let mut turn_events = engine.send_message(s.id, in_flight.into()).await.unwrap();
    let directives: Vec<Directive> = (0..3)
        .map(|i| Directive {
            description: format!("part {i}"),
            prompt: format!("Look at part {i}.\n@sim say part {i} is fine"),
        })
        .collect();
    let batch = engine
        .fork_batch(s.id, directives, Default::default())
        .await
        .unwrap();
    let stored = engine.get_batch(batch.batch_id).await.unwrap();
    assert_eq!(
        stored.fork_point, before,
        "the batch forks before the turn in flight"
    );
    for id in &batch.agent_ids {
        let note = ended(&engine, *id).await;
        assert_eq!(note.status, NotificationStatus::Completed);
        let seen: String = engine
            .transcript(*id, true)
            .await
            .unwrap()
            .iter()
            .map(|e| e.message.content_json())
            .collect();
        assert!(!seen.contains("A turn still running"), "{seen}");
    }
    while turn_events.next().await.is_some() {}

    let transcript = transcript_texts(&engine, &s).await;
    assert_eq!(
        mentions(&transcript, "<batch-launched>"),
        1,
        "{transcript:#?}"
    );
    assert_eq!(mentions(&transcript, "<batch-notification>"), 1);
    assert_eq!(
        mentions(&transcript, NOTIFICATION),
        0,
        "no per-child notification"
    );
    let digest = transcript
        .iter()
        .find(|(_, m)| m.contains("<batch-notification>"))
        .map(|(_, m)| m.clone())
        .unwrap();
    assert!(digest.contains("3 children: 3 completed"), "{digest}");
    for id in &batch.agent_ids {
        assert!(digest.contains(&id.to_string()), "{digest}");
    }
}

/// A batch whose children would not fit their model's window is refused at submission, naming
/// the tokens and the window, before any model request; so is a parent turn that would not fit.
#[tokio::test]
async fn requests_that_would_not_fit_the_window_are_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let mut new = new_session(dir.path(), "Sys.");
    new.context_files[0].content = "word ".repeat(200_000);
    let s = engine.create_session(new).await.unwrap();
    let directives = vec![Directive {
        description: "too big".into(),
        prompt: "Read it all.".into(),
    }];
    let refused = engine
        .fork_batch(s.id, directives, Default::default())
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(
        matches!(
            refused,
            EngineError::ContextWindow {
                window: 200_000,
                ..
            }
        ),
        "{message}"
    );
    assert!(message.contains("200000-token window"), "{message}");
    assert!(agents_of(&engine, &s, AgentKind::Fork).await.is_empty());

    let events = turn(&engine, &s, "Summarize it.").await;
    assert!(
        matches!(events.last(), Some(Err(EngineError::ContextWindow { .. }))),
        "{events:?}"
    );
    let requests = engine
        .store()
        .list_requests(&forkd_store::RequestFilter {
            session_id: Some(s.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(requests.is_empty(), "no request was sent");
}

/// A parent turn after a 1000-child client batch on a thinking session is a valid request (the
/// sim enforces the Messages API's rules: roles alternate, the thinking rule) that fits the
/// window: the batch adds one launch note and one digest to the parent's context, not a
/// notification per child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_turn_after_a_thousand_child_thinking_batch_is_valid_and_small() {
    const N: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let mut new = new_session(dir.path(), "Sys.");
    new.thinking_budget = Some(2048);
    let s = engine.create_session(new).await.unwrap();
    let first = turn(&engine, &s, "Get ready to review the files.").await;
    assert!(first.iter().all(Result::is_ok), "{first:?}");

    let directives: Vec<Directive> = (0..N)
        .map(|i| Directive {
            description: format!("file {i}"),
            prompt: format!("Review file {i}.\n@sim say file {i} is fine"),
        })
        .collect();
    let batch = engine
        .fork_batch(s.id, directives, Default::default())
        .await
        .unwrap();
    assert_eq!(batch.agent_ids.len(), N);
    eventually(
        Duration::from_secs(300),
        "the batch's digest in the parent's transcript",
        || async { mentions(&transcript_texts(&engine, &s).await, "<batch-notification>") == 1 },
    )
    .await;
    let forks = agents_of(&engine, &s, AgentKind::Fork).await;
    assert_eq!(forks.len(), N);
    assert!(forks.iter().all(|a| a.state == AgentState::Completed));

    let events = turn(&engine, &s, "Summarize the batch.").await;
    assert!(events.iter().all(Result::is_ok), "{:?}", events.last());
    let transcript = transcript_texts(&engine, &s).await;
    assert_eq!(
        mentions(&transcript, NOTIFICATION),
        0,
        "no per-child notification"
    );
    let digest = transcript
        .iter()
        .find(|(_, m)| m.contains("<batch-notification>"))
        .map(|(_, m)| m.clone())
        .unwrap();
    assert!(digest.contains("1000 children: 1000 completed"), "{digest}");
    // What the batch added to the parent's context: the launch note and the digest, a few
    // thousand tokens, where a notification per child would add ~150k.
    let parent_requests: Vec<u64> = engine
        .store()
        .list_requests(&forkd_store::RequestFilter {
            session_id: Some(s.id),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.batch_id.is_none())
        .map(|r| r.usage.total_input())
        .collect();
    let [before, after] = parent_requests[..] else {
        panic!("two parent requests: {parent_requests:?}");
    };
    let added = after - before;
    assert!(
        added < 8_000,
        "the batch added {added} tokens to the parent's context"
    );
}

/// A parent turn that delegates to a `Plan` agent scripted to sleep `sleep`, then says
/// "delegated".
fn delegating(sleep: &str) -> String {
    format!(
        "Plan it.\n@sim agent {{\"description\":\"plan\",\"prompt\":\"Plan slowly.\\n@sim sleep \
         {sleep}\\n@sim say the plan: step 1, step 2\",\"subagent_type\":\"Plan\"}}\n@sim say \
         delegated"
    )
}

/// The session's typed agent, once it runs.
async fn running_typed(engine: &Engine, s: &Session) -> forkd_core::Agent {
    eventually(
        Duration::from_secs(30),
        "the typed agent to run",
        || async {
            agents_of(engine, s, AgentKind::Typed)
                .await
                .into_iter()
                .find(|a| a.state == AgentState::Running)
        },
    )
    .await
}

/// How a parent's wait on a typed agent is handed to the background.
#[derive(Debug, Clone, Copy)]
enum Signal {
    /// `Background` on the session's main-loop agent: frees the client and the model's wait.
    MainLoop,
    /// `Background` on the typed agent the turn waits on.
    WaitedOn,
    /// The auto-background delay, counted from the start of the wait.
    Auto,
}

/// The seed's race for the parent model: a turn waiting on a slow typed agent is handed to the
/// background, the `Agent` call's result becomes `async_launched` and the parent's next reply
/// follows at once, while the typed agent still runs; its report reaches the transcript later,
/// exactly once, as a `<task-notification>`. The turn ends with a `turn` notification (it was in
/// the background) and the main loop is `idle` again.
async fn a_backgrounded_wait_frees_the_parent(signal: Signal) {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        auto_background: match signal {
            Signal::Auto => Some(Duration::from_secs(2)),
            _ => None,
        },
        ..EngineConfig::default()
    };
    let engine = engine_on(
        common::store(dir.path()).await,
        SimConfig {
            speed: 1.0,
            ..SimConfig::default()
        },
        config,
    );
    let s = session(&engine, dir.path()).await;
    let mut stream = engine.send_message(s.id, delegating("8s")).await.unwrap();
    let typed = running_typed(&engine, &s).await;
    let main_loop = agents_of(&engine, &s, AgentKind::Parent).await[0].id;
    match signal {
        Signal::MainLoop => engine.background(main_loop).await.unwrap(),
        Signal::WaitedOn => engine.background(typed.id).await.unwrap(),
        Signal::Auto => {}
    }
    let launched = format!("async_launched: agent {}", typed.id);
    let texts = eventually(
        Duration::from_secs(30),
        "the parent's next reply after the handoff",
        || async {
            let texts = transcript_texts(&engine, &s).await;
            (mentions(&texts, &launched) == 1 && mentions(&texts, "delegated") >= 2)
                .then_some(texts)
        },
    )
    .await;
    assert_eq!(mentions(&texts, NOTIFICATION), 0, "{texts:#?}");
    assert_eq!(
        engine.get_agent(typed.id).await.unwrap().state,
        AgentState::Running,
        "the parent went on while the typed agent still runs"
    );
    if !matches!(signal, Signal::WaitedOn) {
        // The client was handed to the background too.
        let mut events = Vec::new();
        while let Some(event) = stream.next().await {
            events.push(event);
        }
        assert!(
            matches!(events.last(), Some(Ok(ParentEvent::AsyncLaunched(id))) if *id == main_loop),
            "{events:?}"
        );
    }

    // The report arrives later, once, as a notification in the transcript.
    let note = ended(&engine, typed.id).await;
    assert_eq!(note.status, NotificationStatus::Completed);
    let texts = eventually(
        Duration::from_secs(30),
        "the typed agent's report",
        || async {
            let texts = transcript_texts(&engine, &s).await;
            (mentions(&texts, NOTIFICATION) == 1).then_some(texts)
        },
    )
    .await;
    assert_eq!(
        mentions(&texts, "the plan: step 1, step 2"),
        3,
        "{texts:#?}"
    );
    assert!(engine.store().caller_reports().await.unwrap().is_empty());

    let idle = eventually(Duration::from_secs(30), "the main loop to idle", || async {
        let a = engine.get_agent(main_loop).await.unwrap();
        (a.state == AgentState::Idle).then_some(a)
    })
    .await;
    assert_eq!(idle.kind, AgentKind::Parent);
    if !matches!(signal, Signal::WaitedOn) {
        let turns = engine
            .store()
            .notifications(
                0,
                &NotificationFilter {
                    agent_id: Some(main_loop),
                    ..NotificationFilter::default()
                },
                0,
            )
            .await
            .unwrap();
        assert_eq!(turns.len(), 1, "{turns:?}");
        assert_eq!(turns[0].kind, NotificationKind::Turn);
        assert_eq!(turns[0].status, NotificationStatus::Completed);
        // The summary is the reply's first line; the report holds the whole reply.
        let reply = &turns[0].report.result;
        assert!(reply.contains("delegated"), "{reply}");
        assert_eq!(turns[0].summary, reply.lines().next().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_on_the_main_loop_frees_the_parents_wait_on_a_typed_agent() {
    a_backgrounded_wait_frees_the_parent(Signal::MainLoop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_on_the_typed_agent_frees_the_parents_wait() {
    a_backgrounded_wait_frees_the_parent(Signal::WaitedOn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auto_background_delay_frees_the_parents_wait() {
    a_backgrounded_wait_frees_the_parent(Signal::Auto).await;
}

/// A daemon that dies while its parent turn waits on a typed agent: the next one answers the
/// same stored reply (no new model request for it) and finds the typed agent the call started
/// (never a second one); the resumed turn is in the background, so the call's result is
/// `async_launched`, the parent goes on, and the report reaches the transcript exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cut_off_while_waiting_on_a_typed_agent_resumes_without_a_second_one() {
    let dir = tempfile::tempdir().unwrap();
    let sim = || SimConfig {
        speed: 1.0,
        ..SimConfig::default()
    };
    let first = engine_on(
        common::store(dir.path()).await,
        sim(),
        EngineConfig::default(),
    );
    let s = session(&first, dir.path()).await;
    let stream = first.send_message(s.id, delegating("6s")).await.unwrap();
    let typed = running_typed(&first, &s).await;
    first.shutdown(Duration::ZERO).await;
    drop(stream);
    let parent_requests = |engine: Engine| async move {
        engine
            .store()
            .list_requests(&forkd_store::RequestFilter {
                session_id: Some(s.id),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.batch_id.is_none() && r.agent_id != typed.id)
            .count()
    };
    assert_eq!(parent_requests(first.clone()).await, 1);

    let second = engine_on(
        common::store(dir.path()).await,
        sim(),
        EngineConfig::default(),
    );
    second.resume_interrupted().await.unwrap();
    let launched = format!("async_launched: agent {}", typed.id);
    eventually(
        Duration::from_secs(30),
        "the resumed turn's next reply",
        || async {
            let texts = transcript_texts(&second, &s).await;
            mentions(&texts, &launched) == 1 && mentions(&texts, "delegated") >= 2
        },
    )
    .await;
    assert_eq!(
        agents_of(&second, &s, AgentKind::Typed).await.len(),
        1,
        "the call's typed agent was not started twice"
    );
    assert_eq!(
        parent_requests(second.clone()).await,
        2,
        "the stored reply was answered, not asked for again"
    );
    assert_eq!(
        ended(&second, typed.id).await.status,
        NotificationStatus::Completed
    );
    let texts = eventually(
        Duration::from_secs(30),
        "the typed agent's report",
        || async {
            let texts = transcript_texts(&second, &s).await;
            (mentions(&texts, NOTIFICATION) == 1).then_some(texts)
        },
    )
    .await;
    assert_eq!(
        mentions(&texts, "the plan: step 1, step 2"),
        3,
        "{texts:#?}"
    );
}
