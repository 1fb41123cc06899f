//! Long sessions: a session driven past its model's window keeps answering, compacting its
//! transcript at the threshold; no request exceeds the window; a client compacts on request,
//! not while a turn runs; the transcript keeps every message. Fork children and typed agents
//! compact their own part the same way, keeping their first message (a child's fork message, a
//! typed agent's prompt) whole, and replay the same bytes after a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Recorder, Sent};

use std::sync::Arc;
use std::time::Duration;

use forkd_core::pricing::{self, ModelSpec, Models};
use forkd_core::store::RequestFilter;
use forkd_core::{AgentId, Directive, NotificationStatus};
use forkd_engine::{Engine, EngineConfig, EngineError, ParentEvent};
use futures::StreamExt;
use serde_json::Value;

const WINDOW: u64 = 32_000;
const MAX_TOKENS: u32 = 2_048;

/// The settings of an engine whose default model has a 32k window.
fn small_window() -> EngineConfig {
    let sonnet = pricing::model(pricing::DEFAULT_MODEL).unwrap();
    EngineConfig {
        models: Models::default().with(ModelSpec {
            context_window: WINDOW,
            ..sonnet.clone()
        }),
        ..EngineConfig::default()
    }
}

/// An engine whose default model has a 32k window.
async fn small_window_engine(dir: &std::path::Path) -> Engine {
    common::engine_with(dir, small_window()).await
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
        forkd_provider::SimConfig {
            speed: 1.0,
            ..forkd_provider::SimConfig::default()
        },
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
    let slow = forkd_provider::SimConfig {
        speed: 1.0,
        ..forkd_provider::SimConfig::default()
    };
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

/// An engine on `dir`'s database, the instant sim behind `recorder`, and a 32k window.
async fn recorded_engine(dir: &std::path::Path, recorder: Arc<Recorder>) -> Engine {
    Engine::new(common::store(dir).await, recorder, small_window())
}

/// A block as the model reads it: its JSON without `cache_control` (breakpoints move).
fn plain(block: &Value) -> Value {
    let mut block = block.clone();
    if let Some(o) = block.as_object_mut() {
        o.remove("cache_control");
    }
    block
}

/// A request's messages, each a role and its blocks without breakpoints.
fn messages(body: &Value) -> Vec<(String, Vec<Value>)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let blocks = m["content"].as_array().unwrap().iter().map(plain).collect();
            (m["role"].as_str().unwrap().to_owned(), blocks)
        })
        .collect()
}

fn text_of(block: &Value) -> &str {
    block["text"].as_str().unwrap_or_default()
}

/// Whether a request is a compaction's: its last user block is forkd's instruction.
fn is_compaction(body: &Value) -> bool {
    let m = messages(body);
    m.last()
        .and_then(|(_, blocks)| blocks.last())
        .is_some_and(|b| text_of(b).starts_with("<compaction-request>"))
}

/// A file of about 3,000 tokens for `Read`.
fn big_file(dir: &std::path::Path) {
    let line = "forkd keeps long sessions alive by compacting them at the threshold\n";
    std::fs::write(dir.join("big.txt"), line.repeat(300)).unwrap();
}

/// A script of `reads` steps, each one `Read` of the big file, then the report.
fn reading_script(prose: &str, reads: usize, last: &str) -> String {
    let mut script = format!("{prose}\n");
    for i in 0..reads {
        script.push_str(&format!(
            "@sim think read {i}\n@sim tool Read {{\"file_path\":\"big.txt\"}}\n"
        ));
    }
    script.push_str(last);
    script
}

/// What every request of one agent (`sent`, in order) must show: none passes the window; its
/// first message starts with `first` (the fork message's or the prompt's blocks) and, after a
/// compaction, goes on with the summary only; each compaction request is the request before
/// it, byte for byte (breakpoints aside), with the instruction added, and reads its cache.
/// Returns how many compactions it saw.
fn check_agent_requests(sent: &[Sent], first_at: usize, first: &[Value]) -> usize {
    let mut compactions = 0;
    let mut summarized = false;
    for (i, request) in sent.iter().enumerate() {
        let body = request.json();
        let usage = request.usage();
        assert!(
            usage.total_input() + u64::from(MAX_TOKENS) <= WINDOW,
            "request {i}: {} input tokens passed the {WINDOW}-token window",
            usage.total_input()
        );
        let m = messages(&body);
        let (role, blocks) = &m[first_at];
        assert_eq!(role, "user");
        assert_eq!(
            &blocks[..first.len()],
            first,
            "request {i}: the first message changed"
        );
        let extra = &blocks[first.len()..];
        if is_compaction(&body) {
            compactions += 1;
            let before = &sent[i - 1];
            let mut expected = messages(&before.json());
            let instruction = m.last().unwrap().1.last().unwrap().clone();
            expected.last_mut().unwrap().1.push(instruction);
            assert_eq!(
                m, expected,
                "request {i}: a compaction is the request before it plus the instruction"
            );
            let prior = before.usage();
            assert!(
                usage.cache_read_input_tokens
                    >= prior.cache_read_input_tokens + prior.cache_creation_input_tokens,
                "request {i}: the compaction read {} of the {} cached by the request before it",
                usage.cache_read_input_tokens,
                prior.cache_read_input_tokens + prior.cache_creation_input_tokens
            );
            summarized = true;
        } else if summarized {
            assert_eq!(
                extra.len(),
                1,
                "request {i}: the summary follows the first message"
            );
            assert!(
                text_of(&extra[0]).starts_with("<compaction-summary>"),
                "request {i}"
            );
        } else {
            assert!(
                extra.is_empty(),
                "request {i}: nothing before the first compaction"
            );
        }
    }
    compactions
}

/// One line of figures for an agent's requests: how many, how many compactions, the largest
/// input, and the share of input read from the cache (all requests, and compactions alone).
fn figures(who: &str, sent: &[Sent]) -> String {
    let share = |filter: &dyn Fn(&Sent) -> bool| {
        let (read, total) = sent.iter().filter(|s| filter(s)).fold((0, 0), |(r, t), s| {
            let u = s.usage();
            (r + u.cache_read_input_tokens, t + u.total_input())
        });
        read as f64 / total.max(1) as f64
    };
    let compactions = sent.iter().filter(|s| is_compaction(&s.json())).count();
    let largest = sent
        .iter()
        .map(|s| s.usage().total_input())
        .max()
        .unwrap_or(0);
    format!(
        "{who}: {} requests, {compactions} compactions, largest input {largest} of {WINDOW} \
         (+{MAX_TOKENS} max_tokens), read share {:.3} (compaction requests {:.3})",
        sent.len(),
        share(&|_| true),
        share(&|s| is_compaction(&s.json())),
    )
}

/// The agent's own messages and its boundaries in its transcript: all its reads are there
/// (none was redone after a compaction), each boundary marked where it sits.
async fn check_transcript(engine: &Engine, agent: AgentId, reads: usize) -> usize {
    let entries = engine.transcript(agent, false).await.unwrap();
    let calls = entries
        .iter()
        .filter(|e| !e.compaction)
        .flat_map(|e| e.message.tool_uses())
        .count();
    assert_eq!(calls, reads, "every scripted read, once");
    let marked = entries.iter().filter(|e| e.compaction).count();
    let stored = engine.store().agent_compactions(agent).await.unwrap();
    assert_eq!(marked, stored.len());
    for pair in stored.windows(2) {
        assert_eq!(pair[1].from_seq, pair[0].to_seq);
    }
    // The requests after a boundary go on from the reply at it.
    let at = entries.iter().position(|e| e.compaction).unwrap();
    assert_eq!(entries[at + 1].message.role, forkd_core::Role::Assistant);
    marked
}

/// The agent's recorded requests are all the requests it was sent, compactions included: its
/// usage and cost count them.
async fn check_accounting(engine: &Engine, agent: AgentId, sent: &[Sent]) {
    let records = engine
        .list_requests(&RequestFilter {
            agent_id: Some(agent),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(records.len(), sent.len());
    let read: u64 = sent.iter().map(|s| s.usage().cache_read_input_tokens).sum();
    let a = engine.get_agent(agent).await.unwrap();
    assert_eq!(a.usage.cache_read_input_tokens, read);
    let cost: f64 = records.iter().map(|r| r.cost_usd).sum();
    assert!(
        (a.cost_usd - cost).abs() < 1e-9,
        "{} against {cost}",
        a.cost_usd
    );
}

/// Fork children whose own reads pass their model's window compact their own part: each keeps
/// its fork message (shared blocks, boilerplate, directive) whole in every request, with the
/// summary after it; each compaction request is its previous request plus the instruction and
/// reads its cache; no request passes the window; siblings keep sharing the prefix; every
/// scripted step runs once; the transcript marks the boundaries; the requests are the agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_children_compact_their_own_part_keeping_the_fork_message() {
    const READS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    big_file(dir.path());
    let recorder = Arc::new(Recorder::default());
    let engine = recorded_engine(dir.path(), recorder.clone()).await;
    let mut new = common::new_session(dir.path(), "Sys.");
    new.max_tokens = Some(MAX_TOKENS);
    let s = engine.create_session(new).await.unwrap();
    turn(&engine, s.id, "Start.\n@sim say ready").await;
    let directives: Vec<Directive> = (0..2)
        .map(|i| Directive {
            description: format!("reader {i}"),
            prompt: reading_script(
                &format!("Reader {i}: read the big file again and again."),
                READS,
                &format!("@sim say reader {i} read it all"),
            ),
        })
        .collect();
    let batch = engine
        .fork_batch(s.id, directives.clone(), Default::default())
        .await
        .unwrap();
    let stored = engine.get_batch(batch.batch_id).await.unwrap();
    for (i, id) in batch.agent_ids.iter().enumerate() {
        let n = common::ended(&engine, *id).await;
        assert_eq!(n.status, NotificationStatus::Completed, "{n:?}");
        assert!(
            n.report.result.contains(&format!("reader {i} read it all")),
            "{n:?}"
        );

        let sent = recorder.sent_with(&format!("Reader {i}:"));
        // The fork message: the blocks every sibling shares, then this child's directive.
        let mut first: Vec<Value> = stored
            .shared_user_blocks
            .iter()
            .map(|b| serde_json::from_str(b.raw().as_str()).unwrap())
            .collect();
        let directive = forkd_core::fork::ForkBatch::directive_block(&directives[i]);
        first.push(serde_json::from_str(directive.raw().as_str()).unwrap());
        let first_at = messages(&sent[0].json())
            .iter()
            .position(|(_, blocks)| blocks.starts_with(&first))
            .expect("the fork message");
        assert!(
            first
                .iter()
                .any(|b| text_of(b).starts_with("<forkd-fork-child>")),
            "the boilerplate is in the fork message"
        );
        let compactions = check_agent_requests(&sent, first_at, &first);
        eprintln!("{}", figures(&format!("fork child {i}"), &sent));
        assert!(compactions >= 2, "child {i}: {compactions} compactions");
        assert_eq!(check_transcript(&engine, *id, READS).await, compactions);
        check_accounting(&engine, *id, &sent).await;
    }
    // Siblings share the prefix before their directives in every request, compactions' too.
    let records = engine
        .list_requests(&RequestFilter {
            batch_id: Some(batch.batch_id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(records.len() > 2 * READS);
    assert!(
        records
            .iter()
            .all(|r| r.prefix_fingerprint == records[0].prefix_fingerprint)
    );
    // The session's own transcript has no boundary: the children compacted only their part.
    assert!(engine.store().compactions(s.id).await.unwrap().is_empty());
}

/// A typed agent compacts its own transcript the same way, keeping its prompt whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_agent_compacts_keeping_its_prompt() {
    const READS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    big_file(dir.path());
    let recorder = Arc::new(Recorder::default());
    let engine = recorded_engine(dir.path(), recorder.clone()).await;
    let mut new = common::new_session(dir.path(), "Sys.");
    new.max_tokens = Some(MAX_TOKENS);
    let s = engine.create_session(new).await.unwrap();
    let directive = Directive {
        description: "typed reader".into(),
        prompt: reading_script(
            "Typed reader: read the big file again and again.",
            READS,
            "@sim say the typed reader read it all",
        ),
    };
    let id = engine
        .spawn_typed(s.id, "general-purpose", directive, &Default::default())
        .await
        .unwrap();
    let n = common::ended(&engine, id).await;
    assert_eq!(n.status, NotificationStatus::Completed, "{n:?}");
    assert!(
        n.report.result.contains("the typed reader read it all"),
        "{n:?}"
    );
    let sent = recorder.sent_with("Typed reader:");
    let prompt = messages(&sent[0].json())[0].1.clone();
    assert_eq!(prompt.len(), 1, "the prompt is one block");
    let compactions = check_agent_requests(&sent, 0, &prompt);
    eprintln!("{}", figures("typed agent", &sent));
    assert!(compactions >= 2, "{compactions} compactions");
    assert_eq!(check_transcript(&engine, id, READS).await, compactions);
    check_accounting(&engine, id, &sent).await;
}

/// A child stopped after its compaction, mid-request, sends the same bytes again when the next
/// daemon resumes it — its summary, the messages since its boundary, its fork message whole —
/// and finishes its script without redoing a step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_child_replays_byte_identical_requests_after_a_restart() {
    const READS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    big_file(dir.path());
    let first = Arc::new(Recorder::default());
    let engine = recorded_engine(dir.path(), first.clone()).await;
    let mut new = common::new_session(dir.path(), "Sys.");
    new.max_tokens = Some(MAX_TOKENS);
    let s = engine.create_session(new).await.unwrap();
    turn(&engine, s.id, "Start.\n@sim say ready").await;
    // The final answer streams slowly: the daemon stops while it is in flight.
    let directive = Directive {
        description: "slow finisher".into(),
        prompt: reading_script(
            "Slow finisher: read the big file, then answer slowly.",
            READS,
            "@sim sleep 3s\n@sim say the slow finisher read it all",
        ),
    };
    let batch = engine
        .fork_batch(s.id, vec![directive], Default::default())
        .await
        .unwrap();
    let child = batch.agent_ids[0];
    // Every read answered, and the request for the final answer (the one that carries the
    // last read's result) answering.
    common::eventually(
        Duration::from_secs(60),
        "the final request in flight",
        || async {
            let own = engine.store().agent_messages(child).await.unwrap();
            if own.len() != 2 * READS {
                return false;
            }
            let last_read = own[2 * READS - 2]
                .message
                .tool_uses()
                .next()
                .unwrap()
                .0
                .to_owned();
            first.sent_with("Slow finisher:").last().is_some_and(|s| {
                s.body.contains(&last_read)
                    && !is_compaction(&s.json())
                    && s.usage.lock().unwrap().is_some()
            })
        },
    )
    .await;
    assert!(
        !engine
            .store()
            .agent_compactions(child)
            .await
            .unwrap()
            .is_empty(),
        "the child compacted before its last request"
    );
    let cut_off = first.sent_with("Slow finisher:").last().unwrap().clone();
    engine.shutdown(Duration::ZERO).await;
    assert_eq!(
        engine.get_agent(child).await.unwrap().state,
        forkd_core::AgentState::Running
    );

    let second = Arc::new(Recorder::on(first.sim.clone()));
    let restarted = recorded_engine(dir.path(), second.clone()).await;
    restarted.resume_interrupted().await.unwrap();
    let n = common::ended(&restarted, child).await;
    assert_eq!(n.status, NotificationStatus::Completed, "{n:?}");
    assert!(n.report.result.contains("read it all"), "{n:?}");
    let again = second.sent_with("Slow finisher:");
    assert_eq!(again.len(), 1, "one request: the final answer");
    assert_eq!(
        again[0].body, cut_off.body,
        "the resumed request is byte for byte the one cut off"
    );
    assert!(again[0].usage().cache_read_input_tokens > 0);
    check_transcript(&restarted, child, READS).await;
}

/// A provider that counts more tokens than forkd refuses a child's request as too long (here
/// forkd is told the window is 1M tokens, the sim holds the model to 200k): the child compacts
/// its own part and sends the request once more, and finishes its script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_prompt_too_long_compacts_it_and_retries_once() {
    const READS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    // About 7,000 tokens a read (45 kB with its line numbers: under the size at which outputs
    // are shortened).
    let line = "forkd keeps long sessions alive by compacting them at the threshold\n";
    std::fs::write(dir.path().join("big.txt"), line.repeat(600)).unwrap();
    let sonnet = pricing::model(pricing::DEFAULT_MODEL).unwrap();
    let config = EngineConfig {
        models: Models::default().with(ModelSpec {
            context_window: 1_000_000,
            ..sonnet.clone()
        }),
        ..EngineConfig::default()
    };
    let recorder = Arc::new(Recorder::default());
    let engine = Engine::new(common::store(dir.path()).await, recorder.clone(), config);
    let mut new = common::new_session(dir.path(), "Sys.");
    // ~175k tokens the child inherits and cannot compact: its fifth read passes 200k (less
    // `max_tokens`), where the request before it and its summary request still fit.
    new.context_files[0].content = "design ".repeat(173_900);
    new.max_tokens = Some(1024);
    let s = engine.create_session(new).await.unwrap();
    let directive = Directive {
        description: "big reader".into(),
        prompt: reading_script("Big reader: read the big file.", READS, "@sim say done"),
    };
    let batch = engine
        .fork_batch(s.id, vec![directive], Default::default())
        .await
        .unwrap();
    let child = batch.agent_ids[0];
    let n = common::ended(&engine, child).await;
    assert_eq!(n.status, NotificationStatus::Completed, "{n:?}");
    let sent = recorder.sent_with("Big reader:");
    let refused: Vec<usize> = (0..sent.len())
        .filter(|&i| sent[i].usage.lock().unwrap().is_none())
        .collect();
    let inputs: Vec<Option<u64>> = sent
        .iter()
        .map(|s| s.usage.lock().unwrap().map(|u| u.total_input()))
        .collect();
    assert!(
        !refused.is_empty(),
        "the sim refused a request as too long: {inputs:?} {n:?}"
    );
    for &i in &refused {
        assert!(
            is_compaction(&sent[i + 1].json()),
            "request {i} was refused: the child compacted next"
        );
        assert!(
            sent[i + 2].usage.lock().unwrap().is_some(),
            "and asked once more"
        );
    }
    let stored = engine.store().agent_compactions(child).await.unwrap();
    assert_eq!(stored.len(), refused.len());
    check_transcript(&engine, child, READS).await;
}
