//! Hooks never change the bytes siblings share (docs/contracts.md, "Hooks"): with operator
//! PreToolUse/PostToolUse hooks whose `additionalContext` differs on every call and a session's
//! own UserPromptSubmit hook (its context in the session's history), two batches of children
//! that run Bash and Write calls complete, each child reads its own hooks' contexts after its
//! directive, and every request of every sibling, on every turn, carries the same bytes before
//! its directive: one prefix fingerprint per batch, no divergence, identical shared transcripts
//! free of any tool hook's context, children 2..N reading the whole prefix from the cache, and
//! each child's last request rebuilt from the store with its first sibling's prefix.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_proto::v1::session_event::Event;
use forkd_test_support::{
    create_session, fork, run_turn, session_request, spawn_daemon_with, turn_text, wait_for_batch,
};
use serde_json::json;

type Client = pb::forkd_client::ForkdClient<tonic::transport::Channel>;

/// Children per batch.
const N: usize = 4;

/// Allows a Bash call, with context naming the agent, the command and a fresh random number.
const PRE: &str = r#"python3 -c 'import json, random, sys; e = json.load(sys.stdin); print(json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow", "additionalContext": "pre-hook ctx agent=%s cmd=%s n=%d" % (e["agent_id"], e["tool_input"]["command"], random.getrandbits(48))}}))'"#;

/// Context after a Bash or Write call, naming the agent, the tool and a fresh random number.
const POST: &str = r#"python3 -c 'import json, random, sys; e = json.load(sys.stdin); print(json.dumps({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "post-hook ctx agent=%s tool=%s n=%d" % (e["agent_id"], e["tool_name"], random.getrandbits(48))}}))'"#;

/// A UserPromptSubmit hook's plain stdout, different on every message.
const PROMPT: &str = r#"cat >/dev/null; python3 -c 'import random; print("prompt-hook ctx n=%d" % random.getrandbits(48))'"#;

fn hooks(matcher: &str, command: &str) -> serde_json::Value {
    json!([{ "matcher": matcher, "hooks": [{ "type": "command", "command": command }] }])
}

/// Child `i` of batch `b`: a Bash call, then a Bash and a Write call in one turn, then its answer.
fn script(b: usize, i: usize) -> String {
    format!(
        "Batch {b}, part {i}: look around.\n\
         @sim tool Bash {{\"command\":\"echo b{b}-child{i} first\"}}\n\
         @sim think and now the rest\n\
         @sim tool Bash {{\"command\":\"echo b{b}-child{i} second && ls\"}}\n\
         @sim tool Write {{\"file_path\":\"out-{b}-{i}.txt\",\"content\":\"child {i}\"}}\n\
         @sim say b{b} child {i} done"
    )
}

/// A child's transcript: its shared messages and the text of its own.
async fn transcript(client: &mut Client, agent: &str) -> (Vec<(String, String)>, String) {
    let messages = client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: agent.to_owned(),
            include_shared_prefix: true,
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    let (shared, own): (Vec<_>, Vec<_>) = messages.into_iter().partition(|m| m.shared);
    let own = own.into_iter().map(|m| m.content_json).collect::<Vec<_>>();
    let shared = shared.into_iter().map(|m| (m.role, m.content_json));
    (shared.collect(), own.join("\n"))
}

/// What every child of a checked batch agrees on.
struct Checked {
    /// The shared messages (role, content) and their text.
    shared: Vec<(String, String)>,
    text: String,
    fingerprint: String,
    /// The batch's first request (its first child's, turn 0).
    first: String,
}

/// Checks batch `b` (children `agents`, directive `i` for `agents[i]`).
async fn check_batch(
    client: &mut Client,
    ws: &Path,
    b: usize,
    batch: &str,
    agents: &[String],
) -> Checked {
    // Every child completed with its own answer.
    let done = wait_for_batch(client, batch, N, Duration::from_secs(120))
        .await
        .unwrap();
    for (i, id) in agents.iter().enumerate() {
        let n = done.iter().find(|n| &n.agent_id == id).unwrap();
        assert_eq!(n.status, pb::NotificationStatus::Completed as i32, "{n:?}");
        let report = n.report.as_ref().unwrap();
        assert_eq!(report.result, format!("b{b} child {i} done"), "{n:?}");
        assert!(ws.join(format!("out-{b}-{i}.txt")).exists(), "{i}");
    }

    // The hooks ran: each child read its own hooks' contexts, after its directive, and no
    // sibling's; the shared messages are the same for all and hold no tool hook's context.
    let mut shared_prefixes = Vec::new();
    for (i, id) in agents.iter().enumerate() {
        let (shared, own) = transcript(client, id).await;
        let mine = format!("pre-hook ctx agent={id} cmd=echo b{b}-child{i} first n=");
        assert!(own.contains(&mine), "{own}");
        let mine = format!("pre-hook ctx agent={id} cmd=echo b{b}-child{i} second && ls n=");
        assert!(own.contains(&mine), "{own}");
        assert_eq!(own.matches("pre-hook ctx agent=").count(), 2, "{own}");
        let post = |tool: &str| format!("post-hook ctx agent={id} tool={tool} n=");
        assert_eq!(own.matches(&post("Bash")).count(), 2, "{own}");
        assert_eq!(own.matches(&post("Write")).count(), 1, "{own}");
        assert_eq!(own.matches("post-hook ctx agent=").count(), 3, "{own}");
        assert!(!own.contains("Permission denied"), "{own}");
        shared_prefixes.push(shared);
    }
    assert!(
        shared_prefixes.iter().all(|s| *s == shared_prefixes[0]),
        "siblings' shared messages differ: {shared_prefixes:#?}"
    );
    let text: String = shared_prefixes[0].iter().map(|(_, c)| c.as_str()).collect();
    assert!(!text.contains("pre-hook ctx"), "{text}");
    assert!(!text.contains("post-hook ctx"), "{text}");
    assert!(text.contains("<user-prompt-submit-hook>"), "{text}");

    // Every request of every child, on every turn, carried the same bytes before its directive.
    let requests = client
        .list_requests(pb::ListRequestsRequest {
            scope: Some(pb::list_requests_request::Scope::BatchId(batch.to_owned())),
        })
        .await
        .unwrap()
        .into_inner()
        .requests;
    // Three each (turns 0, 1 and 2: `request` below finds each child's).
    assert_eq!(requests.len(), 3 * N, "{requests:#?}");
    let fingerprints: BTreeSet<&str> = requests
        .iter()
        .map(|r| r.prefix_fingerprint.as_str())
        .collect();
    assert_eq!(fingerprints.len(), 1, "{requests:#?}");
    assert!(!requests[0].prefix_fingerprint.is_empty());

    // Children 2..N read the whole shared prefix from the cache on their first request.
    let stats = client
        .get_cache_stats(pb::GetCacheStatsRequest {
            scope: Some(pb::get_cache_stats_request::Scope::BatchId(
                batch.to_owned(),
            )),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stats.shared_prefix_tokens > 1024, "{stats:?}");
    let request = |agent: &str, turn: u32| {
        requests
            .iter()
            .find(|r| r.agent_id == agent && r.turn == turn)
            .unwrap()
    };
    for id in &agents[1..] {
        let usage = request(id, 0).usage.unwrap();
        assert_eq!(
            usage.cache_read_input_tokens, stats.shared_prefix_tokens,
            "{usage:?}"
        );
    }

    // Rebuilt from the store, each child's last request has its first sibling's first prefix.
    let first = request(&agents[0], 0).request_id.clone();
    for id in agents {
        let why = client
            .explain_cache(pb::ExplainCacheRequest {
                request_id: request(id, 2).request_id.clone(),
                other_request_id: first.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(why.same_prefix && why.exact, "{why:?}");
    }
    let fingerprint = requests[0].prefix_fingerprint.clone();
    let shared = shared_prefixes.swap_remove(0);
    Checked {
        shared,
        text,
        fingerprint,
        first,
    }
}

#[tokio::test]
async fn hooks_whose_context_differs_per_call_never_change_the_siblings_shared_bytes() {
    let operator = json!({ "hooks": {
        "PreToolUse": hooks("Bash", PRE),
        "PostToolUse": hooks("Bash|Write", POST),
    }});
    let daemon = spawn_daemon_with(|c| {
        std::fs::write(c.home.join("hooks.json"), operator.to_string()).unwrap();
    })
    .await
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    // `dontAsk`: Bash runs only because the PreToolUse hook allows it.
    let own = json!({ "hooks": { "UserPromptSubmit": hooks("", PROMPT) } });
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: "dontAsk".into(),
            allow_rules: vec!["Write".into(), "Agent".into()],
            hooks_json: own.to_string(),
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let sid = session.session_id.clone();
    let message = |text: String| pb::SendMessageRequest {
        session_id: sid.clone(),
        text,
        ..Default::default()
    };

    // A parent turn first: the hook's context joins the session's history.
    let events = run_turn(&mut client, message("Get ready.\n@sim say ready".into()))
        .await
        .unwrap();
    assert!(
        turn_text(&events).unwrap().contains("Result: ready"),
        "{events:?}"
    );

    // The first batch, from the client.
    let scripts: Vec<String> = (0..N).map(|i| script(1, i)).collect();
    let refs: Vec<&str> = scripts.iter().map(String::as_str).collect();
    let first = fork(&mut client, &sid, &refs, None).await.unwrap();
    let one = check_batch(&mut client, ws.path(), 1, &first.batch_id, &first.agent_ids).await;
    let contexts = one.text.matches("prompt-hook ctx n=").count();
    assert_eq!(contexts, 1, "{}", one.text);

    // The second, from the parent model, after a second message (its hook's context another):
    // the history now holds the first batch's launch note and digest.
    let calls: Vec<String> = (0..N)
        .map(|i| {
            let call = json!({ "description": format!("part {i}"), "prompt": script(2, i) });
            format!("@sim agent {call}")
        })
        .collect();
    let text = format!("Split it again.\n{}\n@sim say forked", calls.join("\n"));
    let events = run_turn(&mut client, message(text)).await.unwrap();
    let launched = events
        .iter()
        .find_map(|e| match e {
            Event::ForkLaunched(l) => Some(l.clone()),
            _ => None,
        })
        .expect("the reply forked");
    assert_eq!(launched.agent_ids.len(), N);
    let two = check_batch(
        &mut client,
        ws.path(),
        2,
        &launched.batch_id,
        &launched.agent_ids,
    )
    .await;
    let later = &two.text;
    let contexts: BTreeSet<&str> = later
        .match_indices("prompt-hook ctx n=")
        .map(|(at, _)| later[at..].split(['\\', '<']).next().unwrap())
        .collect();
    assert_eq!(contexts.len(), 2, "two messages, two contexts: {later}");
    assert!(later.contains(&first.agent_ids[0]), "{later}");
    // The history only grew: the first batch's shared messages begin the second's, and the
    // second's requests part from the first's in the history, never in head, tools or system.
    assert!(two.shared.starts_with(&one.shared), "{:#?}", two.shared);
    assert_ne!(one.fingerprint, two.fingerprint);
    let why = client
        .explain_cache(pb::ExplainCacheRequest {
            request_id: two.first.clone(),
            other_request_id: one.first.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!why.same_prefix && why.exact, "{why:?}");
    assert_eq!(why.kind, "message", "{why:?}");

    let engine = &daemon.daemon().unwrap().engine;
    assert_eq!(engine.prefix_divergences(), 0);
}
