//! Cache diagnostics: siblings share their recorded prefix parts; a request whose system prompt
//! differs by one byte is caught (a warning and the counter), and `explain_cache` points at the
//! system part and at that byte.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{engine, eventually, new_session as session};
use forkd_core::{AgentId, AgentKind, Directive, RequestId, SessionId};
use forkd_engine::{Engine, ParentEvent};
use forkd_store::{AgentFilter, RequestFilter, RequestRecord};
use futures::StreamExt;

/// Forks `n` children in a new session with this system prompt and waits for them to end;
/// returns their first requests in agent order.
async fn batch(
    engine: &Engine,
    dir: &std::path::Path,
    system: &str,
    n: usize,
) -> Vec<RequestRecord> {
    let s = engine.create_session(session(dir, system)).await.unwrap();
    let directives = (0..n)
        .map(|i| Directive {
            description: format!("d{i}"),
            prompt: format!("part {i}"),
        })
        .collect();
    let submitted = engine
        .fork_batch(s.id, directives, Default::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(60), "the children to end", || async {
        let filter = AgentFilter {
            batch_id: Some(submitted.batch_id),
            ..AgentFilter::default()
        };
        engine.list_agents(&filter).await.unwrap().is_empty()
    })
    .await;
    let records = engine
        .store()
        .list_requests(&RequestFilter {
            batch_id: Some(submitted.batch_id),
            ..RequestFilter::default()
        })
        .await
        .unwrap();
    let first = |id: AgentId| {
        records
            .iter()
            .find(|r| r.agent_id == id && r.turn == 0)
            .cloned()
            .expect("a first request")
    };
    submitted.agent_ids.iter().map(|id| first(*id)).collect()
}

/// An exact explanation of two prefixes that differ, at a byte inside `record`'s system part.
fn assert_exact_in_system(why: &forkd_engine::CacheExplanation, record: &RequestRecord) {
    assert!(!why.same_prefix);
    assert!(why.exact, "{why:?}");
    assert_eq!(why.part, "system");
    assert_eq!(why.kind, "system");
    let system = record
        .prefix_parts
        .iter()
        .find(|p| p.label == "system")
        .unwrap();
    assert!(why.byte > system.offset, "{why:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_of_system_prompt_is_caught_and_explained() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let same = batch(&engine, dir.path(), "You review code. Be brief.", 2).await;
    let other = batch(&engine, dir.path(), "You review code. Be brief!", 1).await;

    // Siblings record the same parts, and their first requests raised nothing.
    assert_eq!(same[0].prefix_parts, same[1].prefix_parts);
    // Every record carries its time to first token (the sim's response starts a block).
    assert!(
        same.iter()
            .chain(&other)
            .all(|r| r.first_token_ms.is_some())
    );
    // And when it was sent, before its response ended.
    assert!(
        same.iter()
            .chain(&other)
            .all(|r| r.sent_at_ms.is_some_and(|sent| sent <= r.created_at_ms))
    );
    let labels: Vec<&str> = same[0]
        .prefix_parts
        .iter()
        .map(|p| p.label.as_str())
        .collect();
    assert_eq!(&labels[..3], ["head", "tools", "system"]);
    assert!(labels[3].starts_with("message "), "{labels:?}");
    assert_eq!(engine.prefix_divergences(), 0);

    // By default a child is explained against its first sibling: the prefixes agree, and the
    // bodies part only in the child's own directive.
    let sibling = engine.explain_cache(same[1].id, None).await.unwrap();
    assert!(sibling.same_prefix, "{sibling:?}");
    assert_eq!(sibling.other_request_id, same[0].id.to_string());
    assert_eq!(sibling.kind, "message");
    assert!(sibling.exact);

    // A child whose prefix came out with one byte changed in the system prompt: the check a
    // run makes on its first request warns and counts.
    let odd = RequestRecord {
        id: RequestId::new(),
        agent_id: same[1].agent_id,
        batch_id: same[1].batch_id,
        session_id: same[1].session_id,
        ..other[0].clone()
    };
    let divergence = engine.check_prefix(&odd).await.unwrap().expect("caught");
    assert_eq!(divergence.part, "system");
    assert_eq!(divergence.sibling_request_id, same[0].id);
    assert_eq!(engine.prefix_divergences(), 1);

    // Explain points at the system part and at the byte: `.` against `!`.
    let why = engine
        .explain_cache(other[0].id, Some(same[0].id))
        .await
        .unwrap();
    assert_exact_in_system(&why, &same[0]);
    assert!(why.excerpt.contains("Be brief!"), "{why:?}");
    assert!(why.other_excerpt.contains("Be brief."), "{why:?}");
    // The excerpts are cut around the byte: it is the `!` on one side and the `.` on the other.
    let at = why.excerpt.find("Be brief!").unwrap() + "Be brief".len();
    let at_other = why.other_excerpt.find("Be brief.").unwrap() + "Be brief".len();
    assert_eq!(at, at_other);
    assert_eq!(at, 40, "the excerpts show 40 bytes before the byte");
    // The byte is exactly where the two bodies part: everything before it agrees.
    assert_eq!(&why.excerpt[..at], &why.other_excerpt[..at]);

    // No request at all.
    assert!(engine.explain_cache(RequestId::new(), None).await.is_err());
}

/// Runs one parent turn on `text` and returns the session's main-loop requests so far, in order.
async fn main_loop_turn(engine: &Engine, session: SessionId, text: &str) -> Vec<RequestRecord> {
    let events: Vec<_> = tokio::time::timeout(
        Duration::from_secs(60),
        engine
            .send_message(session, text.into())
            .await
            .unwrap()
            .collect(),
    )
    .await
    .expect("the turn ends");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Ok(ParentEvent::TurnEnded { .. }))),
        "{events:?}"
    );
    let parent = engine
        .list_agents(&AgentFilter {
            session_id: Some(session),
            include_ended: true,
            ..AgentFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.kind == AgentKind::Parent)
        .expect("the main-loop agent");
    engine
        .store()
        .list_requests(&RequestFilter {
            agent_id: Some(parent.id),
            ..RequestFilter::default()
        })
        .await
        .unwrap()
}

/// A session's main-loop requests are rebuilt from the first messages of its transcript (as many
/// as each request carried), even after the transcript moved on, so explain finds the byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_loop_requests_are_explained_to_the_byte() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let a = engine
        .create_session(session(dir.path(), "You review code. Be brief."))
        .await
        .unwrap();
    let b = engine
        .create_session(session(dir.path(), "You review code. Be brief!"))
        .await
        .unwrap();
    let first = main_loop_turn(&engine, a.id, "Look.\n@sim say looked").await;
    let other = main_loop_turn(&engine, b.id, "Look.\n@sim say looked").await;
    assert_eq!((first.len(), other.len()), (1, 1));
    // The request carried the transcript up to the user's message; the reply came since.
    let stored = engine.store().session_message_count(a.id).await.unwrap();
    assert_eq!(first[0].message_count.map(u64::from), Some(stored - 1));

    // One byte of system prompt: `.` against `!`, found in the system part, to the byte.
    let why = engine
        .explain_cache(other[0].id, Some(first[0].id))
        .await
        .unwrap();
    assert_exact_in_system(&why, &first[0]);
    assert!(why.excerpt.contains("Be brief!"), "{why:?}");
    assert!(why.other_excerpt.contains("Be brief."), "{why:?}");
    let at = why.excerpt.find("Be brief!").unwrap() + "Be brief".len();
    assert_eq!(at, 40, "the excerpts show 40 bytes before the byte");
    assert_eq!(
        why.other_excerpt.find("Be brief.").unwrap() + "Be brief".len(),
        at
    );
    assert_eq!(&why.excerpt[..at], &why.other_excerpt[..at]);

    // Two turns of one session: the later request carries the whole first exchange, and the
    // bodies agree up to where the first request's breakpoint is spliced into its last block.
    let turns = main_loop_turn(&engine, a.id, "Again.\n@sim say again").await;
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].message_count.map(u64::from), Some(stored + 1));
    let why = engine
        .explain_cache(turns[1].id, Some(turns[0].id))
        .await
        .unwrap();
    assert!(why.exact, "{why:?}");
    let last = first[0].message_count.unwrap() - 1;
    assert_eq!(why.part, format!("message {last}"));
    assert_eq!(why.kind, "message");
    assert!(why.other_excerpt.contains(r#","cache_control""#), "{why:?}");
    assert!(why.note.contains("one session's main loop"), "{why:?}");
    assert!(why.note.contains("cache breakpoint"), "{why:?}");
    assert!(why.excerpt.contains("Look."), "{why:?}");

    // A record made before message counts were kept still gets the recorded part, not the byte.
    let old = RequestRecord {
        id: RequestId::new(),
        message_count: None,
        ..other[0].clone()
    };
    engine.store().record_request(&old).await.unwrap();
    let why = engine
        .explain_cache(old.id, Some(first[0].id))
        .await
        .unwrap();
    assert!(!why.exact, "{why:?}");
    assert_eq!(why.part, "system");
    let system = first[0]
        .prefix_parts
        .iter()
        .find(|p| p.label == "system")
        .unwrap();
    assert_eq!(why.byte, system.offset);
    assert!(why.note.contains("could not be rebuilt"), "{why:?}");
}
