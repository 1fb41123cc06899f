//! Branches through the engine and the sim: a branch's first request carries its origin's bytes
//! up to the branch point and reads what the origin's requests cached; on both sides of a
//! compaction boundary; a branch of a branch; invalid points refused with the nearest valid
//! ones; idempotency keys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Recorder, Sent, new_session};
use forkd_core::branch::At;
use forkd_core::session::Session;
use forkd_engine::{Engine, EngineConfig, EngineError, NewBranch, ParentEvent};
use futures::StreamExt;

/// The padding words of each turn's message: ten turns make a ~100k-token session.
const WORDS: usize = 9_000;

async fn engine(dir: &Path, recorder: Arc<Recorder>) -> Engine {
    Engine::new(common::store(dir).await, recorder, EngineConfig::default())
}

/// An engine on the instant sim behind a recorder, and a session to branch.
struct Fixture {
    _dir: tempfile::TempDir,
    recorder: Arc<Recorder>,
    engine: Engine,
    origin: Session,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::with_speed(0.0));
    let engine = engine(dir.path(), recorder.clone()).await;
    let origin = engine
        .create_session(new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    Fixture {
        _dir: dir,
        recorder,
        engine,
        origin,
    }
}

/// Turn `k`'s message: padding, then the sim's script for a long answer (~1,500 tokens: a
/// branch that wrote the last reply again would read well under 99% of the ideal).
fn message(k: usize) -> String {
    format!(
        "Turn {k}. {}\n@sim say answer {k}: {}",
        "word ".repeat(WORDS),
        "reply ".repeat(1_500)
    )
}

/// Runs one turn; what it sent comes back.
async fn turn(engine: &Engine, recorder: &Recorder, session: &Session, text: &str) -> Vec<Sent> {
    let before = recorder.sent().len();
    let stream = engine
        .send_message(session.id, text.to_owned())
        .await
        .unwrap();
    let events: Vec<_> = tokio::time::timeout(Duration::from_secs(60), stream.collect::<Vec<_>>())
        .await
        .expect("the turn ends");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Ok(ParentEvent::TurnEnded { .. }))),
        "{events:?}"
    );
    recorder.sent()[before..].to_vec()
}

/// Turns 1..=`n` of `session`, each a one-line message and a one-line reply.
async fn short_turns(engine: &Engine, recorder: &Recorder, session: &Session, n: usize) {
    for k in 1..=n {
        turn(
            engine,
            recorder,
            session,
            &format!("Turn {k}.\n@sim say {k}"),
        )
        .await;
    }
}

fn branch(origin: &Session, at: At) -> NewBranch {
    NewBranch {
        origin: origin.id,
        at,
        workspace: None,
        idempotency_key: None,
    }
}

/// A body without its last message: what a request carries before its new message.
fn before_last_message(body: &str) -> String {
    let mut json: serde_json::Value = serde_json::from_str(body).unwrap();
    json["messages"].as_array_mut().unwrap().pop();
    json.to_string()
}

/// `a` and `b` agree byte for byte up to where their last message begins.
fn same_up_to_last_message(a: &str, b: &str) {
    let start = |body: &str| body.rfind(r#"{"role":"user""#).expect("a user message");
    let (ea, eb) = (start(a), start(b));
    assert_eq!(ea, eb, "the histories differ in length");
    assert!(a[..ea] == b[..eb], "the histories differ");
    // And the part compared is all of what comes before the last message.
    let tail: serde_json::Value = serde_json::from_str(&a[ea..a.rfind(']').unwrap()]).unwrap();
    assert_eq!(tail["role"], "user");
}

/// The share of the ideal read (everything before the new message) that `sent` read.
fn read_share(sent: &Sent) -> f64 {
    let ideal = forkd_provider::tokens::request_input_tokens(&before_last_message(&sent.body))
        .unwrap() as f64;
    sent.usage().cache_read_input_tokens as f64 / ideal
}

/// Ten turns of a ~100k-token session; each turn's request, in order.
async fn ten_turns(engine: &Engine, recorder: &Recorder, origin: &Session) -> Vec<Sent> {
    let mut turns = Vec::new();
    for k in 1..=10 {
        let sent = turn(engine, recorder, origin, &message(k)).await;
        assert_eq!(sent.len(), 1, "turn {k} is one request");
        turns.extend(sent);
    }
    turns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_sends_its_origins_bytes_to_the_point_and_reads_their_cache() {
    let Fixture {
        _dir,
        recorder,
        engine,
        origin,
    } = fixture().await;
    let turns = ten_turns(&engine, &recorder, &origin).await;
    let total = turns[9].usage().total_input();
    assert!(total > 90_000, "a ~100k-token session: {total}");

    // At turn 3: its first request is the origin's turn 4 up to turn 4's message.
    let at_three = engine
        .branch_session(origin.clone(), branch(&origin, At::AfterTurn(3)))
        .await
        .unwrap();
    let first = turn(&engine, &recorder, &at_three, "Instead.\n@sim say other").await;
    same_up_to_last_message(&turns[3].body, &first[0].body);
    let share = read_share(&first[0]);
    assert!(share >= 0.99, "read {share:.4} of the ideal");
    eprintln!("at turn 3: read {share:.4} of the ideal");

    // Before turn 5's message: the origin's turn 5 up to its message.
    let turn_seqs = engine.session_turns(origin.id).await.unwrap().starts;
    assert_eq!(turn_seqs.len(), 10);
    let before_five = engine
        .branch_session(origin.clone(), branch(&origin, At::Before(turn_seqs[4])))
        .await
        .unwrap();
    assert_eq!(before_five.branch.unwrap().point, turn_seqs[4]);
    let first = turn(
        &engine,
        &recorder,
        &before_five,
        "Turn 5, again.\n@sim say again",
    )
    .await;
    same_up_to_last_message(&turns[4].body, &first[0].body);
    let share = read_share(&first[0]);
    assert!(share >= 0.99, "read {share:.4} of the ideal");

    // The branch's turns number on from the origin's, and the origin is untouched.
    let seen = engine.session_turns(before_five.id).await.unwrap();
    assert_eq!(seen.starts.len(), 5);
    assert_eq!(seen.starts[..4], turn_seqs[..4]);
    assert_eq!(
        engine.session_turns(origin.id).await.unwrap().starts,
        turn_seqs
    );

    // A branch of the branch, after the branch's own turn.
    let second = turn(&engine, &recorder, &before_five, "More.\n@sim say more").await;
    let grandchild = engine
        .branch_session(before_five.clone(), branch(&before_five, At::AfterTurn(5)))
        .await
        .unwrap();
    let first = turn(
        &engine,
        &recorder,
        &grandchild,
        "Elsewhere.\n@sim say elsewhere",
    )
    .await;
    same_up_to_last_message(&second[0].body, &first[0].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_on_both_sides_of_a_compaction_see_what_the_origin_saw() {
    let Fixture {
        _dir,
        recorder,
        engine,
        origin,
    } = fixture().await;
    let mut turns = Vec::new();
    for k in 1..=4 {
        turns.extend(turn(&engine, &recorder, &origin, &message(k)).await);
    }
    let boundary = engine.compact_session(origin.id, None).await.unwrap();
    for k in 5..=6 {
        turns.extend(turn(&engine, &recorder, &origin, &message(k)).await);
    }
    // Before the boundary: the whole history, as turn 3 of the origin sent it.
    let early = engine
        .branch_session(origin.clone(), branch(&origin, At::AfterTurn(2)))
        .await
        .unwrap();
    assert_eq!(early.branch.unwrap().compacted_to, None);
    let first = turn(&engine, &recorder, &early, "Early.\n@sim say early").await;
    same_up_to_last_message(&turns[2].body, &first[0].body);
    assert!(!first[0].body.contains("compaction-summary"));
    // After it: the summary and the messages kept, as turn 6 of the origin sent them.
    let late = engine
        .branch_session(origin.clone(), branch(&origin, At::AfterTurn(5)))
        .await
        .unwrap();
    assert_eq!(late.branch.unwrap().compacted_to, Some(boundary.to_seq));
    let first = turn(&engine, &recorder, &late, "Late.\n@sim say late").await;
    same_up_to_last_message(&turns[5].body, &first[0].body);
    assert!(first[0].body.contains("compaction-summary"));
    assert!(read_share(&first[0]) >= 0.99);

    // The origin compacts again: the branches' bytes do not move.
    engine.compact_session(origin.id, None).await.unwrap();
    let again = turn(&engine, &recorder, &early, "Once more.\n@sim say once").await;
    assert!(!again[0].body.contains("compaction-summary"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_points_are_refused_with_the_nearest_valid_ones() {
    let Fixture {
        _dir,
        recorder,
        engine,
        origin,
    } = fixture().await;
    for k in 1..=2 {
        turn(&engine, &recorder, &origin, &format!("{k}\n@sim say {k}")).await;
    }
    let starts = engine.session_turns(origin.id).await.unwrap().starts;
    let refused = |at| {
        let engine = &engine;
        let origin = origin.clone();
        async move {
            match engine
                .branch_session(origin.clone(), branch(&origin, at))
                .await
            {
                Err(EngineError::InvalidRequest(why)) => why,
                other => panic!("{at:?}: {other:?}"),
            }
        }
    };
    let why = refused(At::AfterTurn(3)).await;
    assert!(why.contains("has 2 turns"), "{why}");
    // Turn 1's reply: inside turn 1, between its message and turn 2's.
    let why = refused(At::Before(starts[0] + 1)).await;
    assert!(
        why.contains(&format!("--at-turn 0 (= --before {})", starts[0]))
            && why.contains(&format!("--at-turn 1 (= --before {})", starts[1])),
        "{why}"
    );
    // Nothing was created.
    assert!(engine.branches_of(origin.id).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_names_one_branch() {
    let Fixture {
        _dir,
        recorder,
        engine,
        origin,
    } = fixture().await;
    turn(&engine, &recorder, &origin, "1\n@sim say 1").await;
    let keyed = |at| NewBranch {
        idempotency_key: Some("branch-key".into()),
        ..branch(&origin, at)
    };
    let first = engine
        .branch_session(origin.clone(), keyed(At::Latest))
        .await
        .unwrap();
    let again = engine
        .branch_session(origin.clone(), keyed(At::Latest))
        .await
        .unwrap();
    assert_eq!(first.id, again.id);
    let other = engine
        .branch_session(origin.clone(), keyed(At::AfterTurn(0)))
        .await;
    assert!(
        matches!(other, Err(EngineError::KeyReused { .. })),
        "{other:?}"
    );
    assert_eq!(engine.branches_of(origin.id).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_forks_after_an_earlier_turn_and_reports_at_the_end() {
    let Fixture {
        _dir,
        recorder,
        engine,
        origin,
    } = fixture().await;
    let mut turns = Vec::new();
    for k in 1..=4 {
        turns.extend(turn(&engine, &recorder, &origin, &message(k)).await);
    }
    let len = engine.session_turns(origin.id).await.unwrap().len;
    let directives = ["first variant", "second variant"].map(|p| forkd_core::Directive {
        description: p.into(),
        prompt: format!("{p}\n@sim say {p} done"),
    });
    let before = recorder.sent().len();
    let batch = engine
        .fork_batch(
            origin.id,
            directives.to_vec(),
            forkd_engine::BatchOptions {
                at_turn: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    for agent in &batch.agent_ids {
        common::ended(&engine, *agent).await;
    }
    // Each child's history is the origin's turn 3 request up to turn 3's message.
    let children: Vec<Sent> = recorder.sent()[before..].to_vec();
    assert_eq!(children.len(), 2);
    for child in &children {
        same_up_to_last_message(&turns[2].body, &child.body);
        assert!(!child.body.contains("answer 3"));
    }
    let first = children
        .iter()
        .find(|c| c.body.contains("first variant"))
        .unwrap();
    let share = read_share(first);
    assert!(share >= 0.99, "read {share:.4} of the ideal");
    // The launch note and the digest went to the end of the transcript.
    common::eventually(Duration::from_secs(10), "the digest", || async {
        engine
            .store()
            .session_message_count(origin.id)
            .await
            .unwrap()
            == len + 2
    })
    .await;
    let messages = engine
        .store()
        .session_messages(origin.id, None)
        .await
        .unwrap();
    assert!(
        messages[len as usize]
            .message
            .text()
            .contains("<batch-launched>")
    );
    assert!(
        messages[len as usize + 1]
            .message
            .text()
            .contains("<batch-notification>")
    );

    // A turn that has not ended, or one before a branch's point, is refused.
    let refused = engine
        .fork_batch(
            origin.id,
            directives.to_vec(),
            forkd_engine::BatchOptions {
                at_turn: Some(5),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(refused, Err(EngineError::InvalidRequest(_))),
        "{refused:?}"
    );
    let branch = engine
        .branch_session(origin.clone(), branch(&origin, At::AfterTurn(3)))
        .await
        .unwrap();
    let refused = engine
        .fork_batch(
            branch.id,
            directives.to_vec(),
            forkd_engine::BatchOptions {
                at_turn: Some(2),
                ..Default::default()
            },
        )
        .await;
    match refused {
        Err(EngineError::InvalidRequest(why)) => {
            assert!(
                why.contains(&format!("fork {} at turn 2", origin.id)),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_brings_the_branch_back_as_one_note() {
    let Fixture {
        _dir,
        recorder,
        engine,
        origin,
    } = fixture().await;
    short_turns(&engine, &recorder, &origin, 2).await;
    let branch_at_one = engine
        .branch_session(origin.clone(), branch(&origin, At::AfterTurn(1)))
        .await
        .unwrap();
    // Nothing to merge yet; and a session that is no branch cannot be merged.
    let early = engine
        .merge_branch(branch_at_one.clone(), false, None)
        .await;
    assert!(
        matches!(early, Err(EngineError::WrongState(_))),
        "{early:?}"
    );
    let not_a_branch = engine.merge_branch(origin.clone(), false, None).await;
    assert!(matches!(not_a_branch, Err(EngineError::InvalidRequest(_))));

    turn(
        &engine,
        &recorder,
        &branch_at_one,
        "Try the other parser.\n@sim say the other parser is 2x faster",
    )
    .await;
    let merged = engine
        .merge_branch(branch_at_one.clone(), false, None)
        .await
        .unwrap();
    assert_eq!(merged.origin, origin.id);
    let note = &merged.note;
    assert!(note.contains(&format!("<branch-id>{}</branch-id>", branch_at_one.id)));
    assert!(note.contains("after turn 1 of this conversation"), "{note}");
    assert!(note.contains("1. Try the other parser."), "{note}");
    assert!(note.contains("<last-reply>\n"), "{note}");
    assert!(
        note.contains("Result: the other parser is 2x faster"),
        "{note}"
    );
    let stored = engine
        .store()
        .session_messages_from(origin.id, merged.seq, None)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].message.text(), merged.note);
    assert!(!stored[0].starts_turn);
    // The origin's next request reads it, after its own history.
    let next = turn(&engine, &recorder, &origin, "Go on.\n@sim say going on").await;
    assert!(next[0].body.contains("<branch-report>"));

    // With a summary: the branch's model writes it, reading the branch's cache.
    let summed = engine
        .merge_branch(branch_at_one.clone(), true, None)
        .await
        .unwrap();
    let summary_request = recorder.sent().last().cloned().unwrap();
    assert!(
        summary_request
            .body
            .contains("branched from another one at message")
    );
    let usage = summary_request.usage();
    assert!(
        usage.cache_read_input_tokens as f64 >= 0.9 * usage.total_input() as f64,
        "{usage:?}"
    );
    assert!(summed.note.contains("<summary>\n"), "{}", summed.note);
    assert!(!summed.note.contains("<last-reply>"));

    // With a key, a retry appends nothing and asks for no second summary.
    let keyed = || engine.merge_branch(branch_at_one.clone(), true, Some("merge-once".to_owned()));
    let first = keyed().await.unwrap();
    let (sent, len) = (
        recorder.sent().len(),
        engine
            .store()
            .session_message_count(origin.id)
            .await
            .unwrap(),
    );
    let again = keyed().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(recorder.sent().len(), sent);
    assert_eq!(
        engine
            .store()
            .session_message_count(origin.id)
            .await
            .unwrap(),
        len
    );
    let other = engine
        .merge_branch(branch_at_one.clone(), false, Some("merge-once".to_owned()))
        .await;
    assert!(
        matches!(other, Err(EngineError::KeyReused { .. })),
        "{other:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_while_the_origin_runs_a_turn_joins_its_next_request() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::with_speed(0.0));
    let engine = Arc::new(engine(dir.path(), recorder.clone()).await);
    let origin = engine
        .create_session(new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    turn(&engine, &recorder, &origin, "One.\n@sim say one").await;
    let side = engine
        .branch_session(origin.clone(), branch(&origin, At::Latest))
        .await
        .unwrap();
    turn(&engine, &recorder, &side, "Side.\n@sim say side done").await;
    // The origin's turn takes two seconds: the merge lands while it runs.
    let running = {
        let (engine, origin) = (engine.clone(), origin.clone());
        tokio::spawn(async move {
            let stream = engine
                .send_message(origin.id, "Two.\n@sim sleep 2s\n@sim say two done".into())
                .await
                .unwrap();
            stream.collect::<Vec<_>>().await
        })
    };
    common::eventually(
        Duration::from_secs(10),
        "the origin's turn to start",
        || async {
            engine
                .session_turns(origin.id)
                .await
                .unwrap()
                .in_flight
                .is_some()
        },
    )
    .await;
    let merged = engine
        .merge_branch(side.clone(), false, None)
        .await
        .unwrap();
    let events = running.await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Ok(ParentEvent::TurnEnded { .. }))),
        "{events:?}"
    );
    // The note went in while the turn ran (after its message), and the next turn reads it.
    let turns = engine.session_turns(origin.id).await.unwrap();
    assert_eq!(turns.in_flight, None);
    assert_eq!(merged.seq, turns.starts[1] + 1);
    let next = turn(&engine, &recorder, &origin, "Three.\n@sim say three").await;
    assert!(next[0].body.contains("<branch-report>"));
    let messages = engine
        .store()
        .session_messages(origin.id, None)
        .await
        .unwrap();
    assert!(
        messages[merged.seq as usize + 1]
            .message
            .text()
            .contains("two done")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_compacts_its_own_messages_only() {
    let Fixture {
        _dir,
        recorder,
        engine,
        origin,
    } = fixture().await;
    short_turns(&engine, &recorder, &origin, 2).await;
    let fresh = engine
        .branch_session(origin.clone(), branch(&origin, At::Latest))
        .await
        .unwrap();
    // Its last reply is its origin's: nothing of its own to compact yet.
    match engine.compact_session(fresh.id, None).await {
        Err(EngineError::WrongState(why)) => assert!(why.contains("of its own"), "{why}"),
        other => panic!("{other:?}"),
    }
    turn(&engine, &recorder, &fresh, "Three.\n@sim say three").await;
    let boundary = engine.compact_session(fresh.id, None).await.unwrap();
    assert!(
        boundary.to_seq >= fresh.branch.unwrap().point,
        "{boundary:?}"
    );
    let next = turn(&engine, &recorder, &fresh, "Four.\n@sim say four").await;
    assert!(next[0].body.contains("compaction-summary"));
    assert!(
        engine
            .store()
            .compactions(origin.id)
            .await
            .unwrap()
            .is_empty()
    );
}
