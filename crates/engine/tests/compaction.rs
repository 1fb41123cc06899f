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
