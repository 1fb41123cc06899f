//! Long sessions: a session driven past its model's window keeps answering, compacting its
//! transcript at the threshold; no request exceeds the window; a client compacts on request,
//! not while a turn runs; the transcript keeps every message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use forkd_core::pricing::{self, ModelSpec, Models};
use forkd_core::store::RequestFilter;
use forkd_engine::{Engine, EngineConfig, EngineError, ParentEvent};
use futures::StreamExt;

const WINDOW: u64 = 32_000;
const MAX_TOKENS: u32 = 2_048;

/// An engine whose default model has a 32k window.
async fn small_window_engine(dir: &std::path::Path) -> Engine {
    let sonnet = pricing::model(pricing::DEFAULT_MODEL).unwrap();
    let config = EngineConfig {
        models: Models::default().with(ModelSpec {
            context_window: WINDOW,
            ..sonnet.clone()
        }),
        ..EngineConfig::default()
    };
    common::engine_with(dir, config).await
}

async fn turn(engine: &Engine, session: forkd_core::SessionId, text: &str) -> Vec<ParentEvent> {
    let stream = engine.send_message(session, text.into()).await.unwrap();
    let events: Vec<Result<ParentEvent, EngineError>> =
        tokio::time::timeout(Duration::from_secs(60), stream.collect())
            .await
            .expect("the turn ends");
    events.into_iter().map(|e| e.unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_turns_of_large_tool_output_keep_answering_through_compactions() {
    let dir = tempfile::tempdir().unwrap();
    let engine = small_window_engine(dir.path()).await;
    // About 3,000 tokens of tool output per turn: 40 turns are ~120k, four windows' worth.
    let line = "forkd keeps long sessions alive by compacting them at the threshold\n";
    std::fs::write(dir.path().join("big.txt"), line.repeat(300)).unwrap();
    let mut new = common::new_session(dir.path(), "Sys.");
    new.max_tokens = Some(MAX_TOKENS);
    let s = engine.create_session(new).await.unwrap();
    for i in 0..40 {
        let script = format!(
            "Turn {i}: read the file.\n@sim tool Read {{\"file_path\":\"big.txt\"}}\n@sim say read part {i}"
        );
        let events = turn(&engine, s.id, &script).await;
        assert!(
            matches!(events.last(), Some(ParentEvent::TurnEnded { text, .. }) if text.contains(&format!("read part {i}"))),
            "turn {i}: {events:?}"
        );
    }
    let store = engine.store();
    let compactions = store.compactions(s.id).await.unwrap();
    assert!(compactions.len() >= 3, "{} compactions", compactions.len());
    for pair in compactions.windows(2) {
        assert_eq!(pair[1].from_seq, pair[0].to_seq);
    }
    let requests = store
        .list_requests(&RequestFilter {
            session_id: Some(s.id),
            ..Default::default()
        })
        .await
        .unwrap();
    for r in &requests {
        let input = r.usage.total_input();
        assert!(
            input + u64::from(MAX_TOKENS) <= WINDOW,
            "a request of {input} input tokens passed the {WINDOW}-token window"
        );
    }
    // The cache carried the session: most input was read, not written.
    let read: u64 = requests
        .iter()
        .map(|r| r.usage.cache_read_input_tokens)
        .sum();
    let total: u64 = requests.iter().map(|r| r.usage.total_input()).sum();
    assert!(
        read as f64 / total as f64 > 0.8,
        "read share {read}/{total}"
    );
    // Nothing was deleted: the transcript holds every turn.
    let transcript = store.session_messages(s.id, None).await.unwrap();
    assert!(transcript.len() >= 40 * 4, "{} messages", transcript.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_compacts_between_turns_not_during_one() {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::engine_on(
        common::store(dir.path()).await,
        forkd_provider::SimConfig { speed: 1.0 },
        EngineConfig::default(),
    );
    let s = engine
        .create_session(common::new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    // Nothing to compact before the model has replied.
    let early = engine.compact_session(s.id, None).await.unwrap_err();
    assert!(matches!(early, EngineError::WrongState(_)), "{early}");

    let mut running = engine
        .send_message(s.id, "Think.\n@sim sleep 2s\n@sim say first".into())
        .await
        .unwrap();
    let busy = engine.compact_session(s.id, None).await.unwrap_err();
    assert!(matches!(busy, EngineError::WrongState(_)), "{busy}");
    while running.next().await.is_some() {}

    let c = engine
        .compact_session(s.id, Some("Keep the word first.".into()))
        .await
        .unwrap();
    assert_eq!(c.from_seq, 0);
    let text = c.summary.text();
    assert!(text.contains("compaction-summary"), "{text}");
    // The next turn starts from the summary and the last reply, and answers.
    let events = turn(&engine, s.id, "Go on.\n@sim say second").await;
    assert!(
        matches!(events.last(), Some(ParentEvent::TurnEnded { text, .. }) if text.contains("second")),
        "{events:?}"
    );
    let last = engine
        .store()
        .list_requests(&RequestFilter {
            session_id: Some(s.id),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .max_by_key(|r| r.created_at_ms)
        .unwrap();
    // Summary, the kept reply, the new message (merged with nothing): three messages.
    assert_eq!(last.message_count, Some(3));
    assert_eq!(
        engine.get_agent(last.agent_id).await.unwrap().state,
        forkd_core::AgentState::Idle
    );
}

/// A batch forked before a compaction inherits the whole transcript up to its fork point, and
/// keeps it after a restart; one forked after it inherits the summary and what followed — the
/// prefix the parent's own requests now carry — identical for every sibling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_forked_before_and_after_a_compaction_inherit_what_the_parent_saw() {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::engine(dir.path()).await;
    let mut new = common::new_session(dir.path(), "Sys.");
    new.context_files[0].content = "background ".repeat(5_000);
    let s = engine.create_session(new).await.unwrap();
    turn(&engine, s.id, "Start.\n@sim say one").await;
    let directives = |tag: &str| {
        (0..2)
            .map(|i| forkd_core::Directive {
                description: format!("{tag} {i}"),
                prompt: format!("Part {i} of {tag}.\n@sim say {tag} {i} done"),
            })
            .collect::<Vec<_>>()
    };
    let before = engine
        .fork_batch(s.id, directives("before"), Default::default())
        .await
        .unwrap();
    for id in &before.agent_ids {
        common::ended(&engine, *id).await;
    }
    let c = engine.compact_session(s.id, None).await.unwrap();
    turn(&engine, s.id, "Go on.\n@sim say two").await;
    let after = engine
        .fork_batch(s.id, directives("after"), Default::default())
        .await
        .unwrap();
    for id in &after.agent_ids {
        common::ended(&engine, *id).await;
    }
    let first = engine.get_batch(before.batch_id).await.unwrap();
    let second = engine.get_batch(after.batch_id).await.unwrap();
    assert_eq!(first.compacted_to, None);
    assert_eq!(second.compacted_to, Some(c.to_seq));

    let first_requests = |batch: forkd_core::BatchId| {
        let engine = engine.clone();
        async move {
            engine
                .store()
                .list_requests(&RequestFilter {
                    batch_id: Some(batch),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_iter()
                .filter(|r| r.turn == 0)
                .collect::<Vec<_>>()
        }
    };
    let old = first_requests(before.batch_id).await;
    let new = first_requests(after.batch_id).await;
    assert_eq!(new.len(), 2);
    assert_eq!(
        new[0].prefix_fingerprint, new[1].prefix_fingerprint,
        "siblings share the prefix"
    );
    // The context (~5k tokens) is behind the boundary: the later children do not carry it.
    assert!(
        new[0].usage.total_input() + 3_000 < old[0].usage.total_input(),
        "{} against {}",
        new[0].usage.total_input(),
        old[0].usage.total_input()
    );
    assert!(
        new[1].usage.cache_read_input_tokens > 0,
        "the second sibling read the first's"
    );

    // After a restart the earlier batch's children still see the whole transcript, unchanged.
    let seen = |engine: Engine, agent| async move {
        engine
            .transcript(agent, true)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.message.content_json())
            .collect::<Vec<_>>()
    };
    let child = before.agent_ids[0];
    let was = seen(engine.clone(), child).await;
    engine.shutdown(Duration::from_millis(100)).await;
    let restarted = common::engine(dir.path()).await;
    let is = seen(restarted.clone(), child).await;
    assert_eq!(was, is);
    assert!(!is.iter().any(|m| m.contains("compaction-summary")));
    let later = seen(restarted, after.agent_ids[0]).await;
    assert!(later[0].contains("compaction-summary"), "{later:?}");
}

/// A daemon that stops in the middle of a compaction leaves the old state — no boundary, the
/// transcript whole — and the next one compacts from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_cut_off_leaves_no_half_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let slow = forkd_provider::SimConfig { speed: 1.0 };
    let first = common::engine_on(
        common::store(dir.path()).await,
        slow,
        EngineConfig::default(),
    );
    let s = first
        .create_session(common::new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    turn(&first, s.id, "Start.\n@sim say one").await;
    let before = first
        .store()
        .session_messages(s.id, None)
        .await
        .unwrap()
        .len();
    let compacting = tokio::spawn({
        let first = first.clone();
        async move { first.compact_session(s.id, None).await }
    });
    // The summary request is in flight (the sim streams at its realistic pace).
    common::eventually(
        Duration::from_secs(20),
        "the summary request to start",
        || async {
            first
                .get_agent(
                    first
                        .store()
                        .list_agents(&forkd_core::store::AgentFilter {
                            session_id: Some(s.id),
                            ..Default::default()
                        })
                        .await
                        .unwrap()[0]
                        .id,
                )
                .await
                .unwrap()
                .state
                == forkd_core::AgentState::Running
        },
    )
    .await;
    first.shutdown(Duration::ZERO).await;
    let _ = compacting.await;

    let second = common::engine(dir.path()).await;
    second.resume_interrupted().await.unwrap();
    assert!(second.store().compactions(s.id).await.unwrap().is_empty());
    assert_eq!(
        second
            .store()
            .session_messages(s.id, None)
            .await
            .unwrap()
            .len(),
        before
    );
    let c = second.compact_session(s.id, None).await.unwrap();
    assert_eq!(c.from_seq, 0);
}
