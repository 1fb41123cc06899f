//! Compaction through the real daemon: `CompactSession` summarizes the transcript up to the
//! model's last reply, `GetTranscript` shows the boundary where it sits, and asking again before
//! the model has replied once more is `FAILED_PRECONDITION`. A fork child killed with SIGKILL
//! in the middle of its own compaction leaves its transcript whole and no half boundary, and
//! the next daemon compacts it and carries on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use binary::{Client, Daemon, client, is_terminal};
use forkd_proto::v1 as pb;
use forkd_store::{Durability, RequestFilter, SqliteStore, Store};
use forkd_test_support::get_agent;
use forkd_test_support::{
    create_session, eventually, fork, run_turn, session_request, session_transcript, spawn_daemon,
    turn_text,
};

mod binary;

#[tokio::test]
async fn compact_session_marks_the_boundary_and_the_next_turn_goes_on() {
    let daemon = spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let session = create_session(&mut c, session_request(ws.path()))
        .await
        .unwrap();
    let send = |text: &str| pb::SendMessageRequest {
        session_id: session.session_id.clone(),
        text: text.into(),
        ..Default::default()
    };
    let first = run_turn(&mut c, send("Plan the release.\n@sim say planned"))
        .await
        .unwrap();
    assert!(turn_text(&first).unwrap().contains("planned"));

    let compact = |instructions: &str| pb::CompactSessionRequest {
        session_id: session.session_id.clone(),
        instructions: instructions.into(),
    };
    let done = c
        .compact_session(compact("Keep the release plan."))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.from_seq, 0);
    assert!(done.summary_json.contains("compaction-summary"), "{done:?}");
    let again = c.compact_session(compact("")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");

    // The boundary sits right before the reply the requests go on from; nothing was deleted.
    let transcript = session_transcript(&mut c, &session.session_id)
        .await
        .unwrap();
    let at = transcript.iter().position(|m| m.compaction).unwrap();
    assert_eq!(at as u64, done.to_seq, "{transcript:#?}");
    assert_eq!(transcript[at + 1].role, "assistant");
    assert!(transcript[at + 1].content_json.contains("planned"));
    assert_eq!(transcript.iter().filter(|m| !m.compaction).count(), 3);

    let next = run_turn(&mut c, send("Ship it.\n@sim say shipped"))
        .await
        .unwrap();
    assert!(turn_text(&next).unwrap().contains("shipped"));
    let later = c.compact_session(compact("")).await.unwrap().into_inner();
    assert_eq!(later.from_seq, done.to_seq);
}

const WINDOW: u64 = 32_000;
const MAX_TOKENS: u32 = 2_048;
const READS: usize = 10;

/// A child's script: `READS` reads of a file of about 3,000 tokens — a 32k window holds about
/// seven — and prose that its compaction summary repeats (the sim's summary carries the script
/// in progress verbatim), so that summary streams for seconds at the sim's realistic pace while
/// a turn takes well under one.
fn long_script() -> String {
    let mut script = String::from("Read the big file again and again, then report.\n");
    for i in 0..30 {
        script.push_str(&format!(
            "Note {i}: keep what each read of big.txt showed in mind, line for line, until the end.\n"
        ));
    }
    for i in 0..READS {
        script.push_str(&format!(
            "@sim think read {i}\n@sim tool Read {{\"file_path\":\"big.txt\"}}\n"
        ));
    }
    script.push_str("@sim say read it all, across the kill");
    script
}

/// The child's own transcript: its messages and its boundaries, as `GetTranscript` shows them.
async fn own_transcript(c: &mut Client, agent: &str) -> Vec<pb::TranscriptMessage> {
    c.get_transcript(pb::GetTranscriptRequest {
        agent_id: agent.to_owned(),
        include_shared_prefix: false,
    })
    .await
    .unwrap()
    .into_inner()
    .messages
}

/// What the store holds of the agent: every tool call answered (nothing half-written), and each
/// boundary complete — a summary, before one of its assistant messages, past the one before.
/// Returns the boundaries and the number of its own messages.
async fn check_stored(home: &std::path::Path, agent: &str) -> (usize, usize) {
    let store = SqliteStore::open(&home.join("forkd.db"), Durability::Normal)
        .await
        .unwrap();
    store.integrity_check().await.unwrap();
    let id = agent.parse().unwrap();
    let own = store.agent_messages(id).await.unwrap();
    for (i, m) in own.iter().enumerate() {
        assert_eq!(m.seq as usize, i, "no gap in the transcript");
        let expected = if i % 2 == 0 { "assistant" } else { "user" };
        assert_eq!(m.message.role.as_str(), expected, "message {i}");
    }
    let boundaries = store.agent_compactions(id).await.unwrap();
    let mut after = 0;
    for b in &boundaries {
        assert_eq!(b.from_seq, after);
        assert!(b.to_seq > after);
        assert_eq!(own[b.to_seq as usize].message.role.as_str(), "assistant");
        assert!(
            b.summary.text().contains("compaction-summary") && b.summary.text().len() > 100,
            "{:?}",
            b.summary
        );
        after = b.to_seq;
    }
    store.close().await;
    (boundaries.len(), own.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_childs_compaction_leaves_no_half_boundary() {
    let home = tempfile::Builder::new()
        .prefix("forkd-compaction-")
        .tempdir()
        .unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        format!("[models.claude-sonnet-4-5]\ncontext_window = {WINDOW}\n"),
    )
    .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let line = "forkd keeps long sessions alive by compacting them at the threshold\n";
    std::fs::write(ws.join("big.txt"), line.repeat(300)).unwrap();

    // The sim at its realistic pace: a summary of a few hundred tokens takes seconds.
    let daemon = Daemon::start(home.path(), "1");
    let mut c = client(home.path()).await;
    let session = create_session(
        &mut c,
        pb::CreateSessionRequest {
            max_tokens: MAX_TOKENS,
            ..session_request(&ws)
        },
    )
    .await
    .unwrap();
    let script = long_script();
    let batch = fork(&mut c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    let child = batch.agent_ids[0].clone();

    // The summary request is in flight when the child, past a few reads, has a tool result
    // last and nothing new for two seconds (a turn takes a fraction of one).
    let last = std::sync::Mutex::new((0, Instant::now()));
    let at_kill = eventually(
        Duration::from_secs(90),
        "the child's compaction to be in flight",
        || {
            let mut c = c.clone();
            let child = child.clone();
            let last = &last;
            async move {
                let t = own_transcript(&mut c, &child).await;
                let own: Vec<_> = t.iter().filter(|m| !m.compaction).collect();
                assert!(
                    !is_terminal(get_agent(&mut c, &child).await.state),
                    "the child ended before it compacted: {t:#?}"
                );
                let mut seen = last.lock().unwrap();
                if own.len() != seen.0 {
                    *seen = (own.len(), Instant::now());
                    return None;
                }
                let waiting = own.len() >= 4
                    && own.last().is_some_and(|m| m.role == "user")
                    && t.iter().all(|m| !m.compaction)
                    && seen.1.elapsed() >= Duration::from_secs(2);
                waiting.then_some(own.len())
            }
        },
    )
    .await;
    daemon.kill9();

    // Either no boundary or a whole one; the transcript whole.
    let (boundaries, messages) = check_stored(home.path(), &child).await;
    // (`GetTranscript` shows the fork message first, then the child's own messages.)
    assert_eq!(messages + 1, at_kill, "the transcript is as it was");
    assert_eq!(boundaries, 0, "the summary was cut off: no boundary");

    // The next daemon resumes the child: it compacts, and finishes its script.
    let daemon = Daemon::start(home.path(), "1");
    let mut c = client(home.path()).await;
    let done = eventually(Duration::from_secs(120), "the child to end", || {
        let mut c = c.clone();
        let child = child.clone();
        async move {
            let a = get_agent(&mut c, &child).await;
            is_terminal(a.state).then_some(a)
        }
    })
    .await;
    assert_eq!(done.state, pb::AgentState::Completed as i32, "{done:?}");
    let t = own_transcript(&mut c, &child).await;
    let marked: Vec<usize> = t
        .iter()
        .enumerate()
        .filter(|(_, m)| m.compaction)
        .map(|(i, _)| i)
        .collect();
    assert!(
        !marked.is_empty(),
        "GetTranscript marks the child's boundary"
    );
    // Each boundary sits before a reply; the first replaces what the killed daemon had.
    for &i in &marked {
        assert_eq!(t[i + 1].role, "assistant");
    }
    let reads = t
        .iter()
        .filter(|m| !m.compaction && m.role == "assistant")
        .filter(|m| m.content_json.contains("\"name\":\"Read\""))
        .count();
    assert_eq!(reads, READS, "every read once, none redone");
    assert!(t.last().unwrap().content_json.contains("across the kill"));

    // The session goes on: its next turn answers.
    let next = run_turn(
        &mut c,
        pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: "Thanks.\n@sim say noted".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(turn_text(&next).unwrap().contains("noted"));
    daemon.kill9();

    let (boundaries, _) = check_stored(home.path(), &child).await;
    assert_eq!(boundaries, marked.len());
    // No request of the child passed the window.
    let store = SqliteStore::open(&home.path().join("forkd.db"), Durability::Normal)
        .await
        .unwrap();
    let requests = store
        .list_requests(&RequestFilter {
            agent_id: Some(child.parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(requests.len() > READS);
    for r in &requests {
        assert!(
            r.usage.total_input() + u64::from(MAX_TOKENS) <= WINDOW,
            "{r:?}"
        );
    }
    store.close().await;
}
