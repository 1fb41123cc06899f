//! The `anthropic` provider end to end: forkd serve against `forkd sim-server` gives the same
//! figures as the in-process sim, and injected 529s and a cut stream still complete every child.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_provider::{SimConfig, SimProvider};
use forkd_sim_server::{SimServerConfig, StreamCuts};
use forkd_test_support::{
    create_session, directives, run_turn, session_request, spawn_daemon_with, turn_text,
    wait_for_batch,
};

const DEADLINE: Duration = Duration::from_secs(60);

async fn sim_server(cuts: StreamCuts) -> String {
    let config = SimServerConfig {
        api_key: Some("test-key".into()),
        cuts,
    };
    forkd_test_support::sim_server(SimProvider::new(SimConfig::default()), config)
        .await
        .unwrap()
}

/// Points the daemon's `anthropic` provider at a `forkd sim-server`.
fn use_sim_server(c: &mut forkd::daemon::DaemonConfig, base_url: String) {
    forkd_test_support::use_anthropic(c, &base_url, "test-key");
}

/// Runs one 5-child batch; returns each child's usage in directive order and its status.
async fn batch(
    anthropic: Option<String>,
    workspace: &std::path::Path,
    prompts: &[&str],
) -> Vec<(i32, pb::Usage)> {
    let daemon = spawn_daemon_with(|c| {
        if let Some(base_url) = anthropic {
            use_sim_server(c, base_url);
        }
    })
    .await
    .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(workspace))
        .await
        .unwrap();
    let submitted = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id,
            directives: directives(prompts),
            warmup_gating: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let done = wait_for_batch(&mut client, &submitted.batch_id, prompts.len(), DEADLINE)
        .await
        .unwrap();
    submitted
        .agent_ids
        .iter()
        .map(|id| {
            let n = done.iter().find(|n| &n.agent_id == id).unwrap();
            (n.status, n.usage.unwrap())
        })
        .collect()
}

#[tokio::test]
async fn the_anthropic_provider_against_sim_server_matches_the_in_process_sim() {
    let workspace = tempfile::tempdir().unwrap();
    let prompts = ["one", "two", "three", "four", "five"];
    let in_process = batch(None, workspace.path(), &prompts).await;
    let url = sim_server(StreamCuts::default()).await;
    let over_http = batch(Some(url), workspace.path(), &prompts).await;
    // Ids (batch, tool_use) are fresh UUIDs in each run and tokenize differently (a UUID is
    // 20 to 30 tokens in o200k), so the figures agree in shape and to within a few tokens per id,
    // not to the token. (Byte-identical requests give identical figures: see forkd-provider's
    // tests/anthropic.rs.) Each child's prefix holds the batch id and every tool_use id twice.
    let ids = 1 + 2 * prompts.len() as u64;
    let slack = 10 * ids;
    let total =
        |u: &pb::Usage| u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
    for ((s1, a), (s2, b)) in in_process.iter().zip(&over_http) {
        assert_eq!(s1, s2);
        assert_eq!(a.output_tokens, b.output_tokens);
        assert_eq!(a.input_tokens, b.input_tokens);
        assert!(total(a).abs_diff(total(b)) <= slack, "{a:?} vs {b:?}");
        assert_eq!(
            a.cache_read_input_tokens == 0,
            b.cache_read_input_tokens == 0
        );
    }
    assert_eq!(in_process[0].1.cache_read_input_tokens, 0);
    for (_, child) in &over_http[1..] {
        assert_eq!(
            child.cache_read_input_tokens,
            over_http[1].1.cache_read_input_tokens
        );
        assert!(child.cache_read_input_tokens > 1024);
    }
}

#[tokio::test]
async fn injected_overloads_and_a_cut_stream_still_complete_every_child() {
    let workspace = tempfile::tempdir().unwrap();
    let cuts = StreamCuts::default();
    // The first streamed response is cut after a few events: the provider reports the break,
    // and the engine requests again (which reads the cache).
    cuts.cut_next(3);
    let url = sim_server(cuts.clone()).await;
    let prompts = [
        "@sim fail 529 x2\n@sim say survived",
        "two",
        "three",
        "@sim fail 529\n@sim say also survived",
        "five",
    ];
    let results = batch(Some(url), workspace.path(), &prompts).await;
    for (status, _) in &results {
        assert_eq!(*status, pb::NotificationStatus::Completed as i32);
    }
    assert_eq!(cuts.pending(), 0, "the cut happened");
}

/// A client's batch on a session with extended thinking completes through the `anthropic`
/// provider against `forkd sim-server`, which enforces the API's thinking rule: the parent's
/// turn and each child's tool round are valid requests.
#[tokio::test]
async fn a_client_batch_on_a_thinking_session_completes_against_sim_server() {
    let base_url = sim_server(StreamCuts::default()).await;
    let workspace = tempfile::tempdir().unwrap();
    let daemon = spawn_daemon_with(|c| use_sim_server(c, base_url))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            thinking_budget_tokens: 2048,
            ..session_request(workspace.path())
        },
    )
    .await
    .unwrap();
    // A parent turn with a tool round first, so the history holds thinking replies.
    let events = run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: "Look around.\n@sim tool Glob {\"pattern\": \"*\"}\n@sim say looked".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(turn_text(&events).is_some(), "the parent's turn ends");
    let prompts = [
        "Part one.\n@sim tool Glob {\"pattern\": \"*\"}\n@sim say one",
        "Part two.\n@sim tool Glob {\"pattern\": \"*\"}\n@sim say two",
        "Part three.\n@sim say three",
    ];
    let submitted = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: directives(&prompts),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let done = wait_for_batch(&mut client, &submitted.batch_id, prompts.len(), DEADLINE)
        .await
        .unwrap();
    for n in &done {
        assert_eq!(
            n.status,
            pb::NotificationStatus::Completed as i32,
            "{:?}",
            n.report
        );
    }
    // The parent's next turn, after the launch note and the batch's digest, with a tool round:
    // a valid request under the thinking rule.
    let events = run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: session.session_id,
            text: "What did they find?\n@sim tool Glob {\"pattern\": \"*\"}\n@sim say all fine"
                .into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(turn_text(&events).is_some_and(|t| t.contains("all fine")));
}

/// A provider that counts more tokens than forkd does refuses a request as "prompt is too long"
/// (here: forkd is told the model's window is 1M tokens, `forkd sim-server` holds it to 200k):
/// the session compacts and the request is sent once more, and the turn answers.
#[tokio::test]
async fn a_prompt_too_long_compacts_the_session_and_retries_once() {
    let base_url = sim_server(StreamCuts::default()).await;
    let workspace = tempfile::tempdir().unwrap();
    let daemon = spawn_daemon_with(|c| {
        use_sim_server(c, base_url);
        let sonnet = forkd_core::pricing::model(forkd_core::pricing::DEFAULT_MODEL).unwrap();
        c.engine.models =
            forkd_core::pricing::Models::default().with(forkd_core::pricing::ModelSpec {
                context_window: 1_000_000,
                ..sonnet.clone()
            });
    })
    .await
    .unwrap();
    let mut client = daemon.client().await.unwrap();
    // ~180k tokens of context: one more long message passes the real window.
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            context_files: vec![pb::ContextFile {
                path: "design.md".into(),
                content: "design ".repeat(180_000),
            }],
            max_tokens: 1024,
            ..session_request(workspace.path())
        },
    )
    .await
    .unwrap();
    let send = |text: String| pb::SendMessageRequest {
        session_id: session.session_id.clone(),
        text,
        ..Default::default()
    };
    let long = "note ".repeat(12_000);
    let first = run_turn(&mut client, send(format!("{long}\n@sim say first")))
        .await
        .unwrap();
    assert!(turn_text(&first).unwrap().contains("first"), "{first:?}");
    // This request is ~205k tokens: sim-server refuses it; forkd compacts and retries.
    let second = run_turn(&mut client, send(format!("{long}\n@sim say second")))
        .await
        .unwrap();
    assert!(
        turn_text(&second).is_some_and(|t| t.contains("second")),
        "{second:?}"
    );
    let transcript = forkd_test_support::session_transcript(&mut client, &session.session_id)
        .await
        .unwrap();
    let compacted = transcript.iter().filter(|m| m.compaction).count();
    assert_eq!(compacted, 1);
}

/// An output schema through the `anthropic` provider and `forkd sim-server`: a valid object
/// completes its child, a mismatch gets one follow-up, a second one fails the child; children
/// 2..N read the shared prefix, schema block included. Bad schemas are INVALID_ARGUMENT, a
/// remote `$ref` among them (nothing is fetched: no resolver is built in).
#[tokio::test]
async fn an_output_schema_shapes_the_reports_against_sim_server() {
    let workspace = tempfile::tempdir().unwrap();
    let url = sim_server(StreamCuts::default()).await;
    let daemon = spawn_daemon_with(|c| use_sim_server(c, url)).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(workspace.path()))
        .await
        .unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "required": ["verdict", "findings"],
        "properties": {
            "verdict": {"enum": ["pass", "fail"]},
            "findings": {"type": "array", "items": {"type": "string"}}
        }
    });
    let prompts = [
        "Valid.\n@sim json {\"verdict\":\"pass\",\"findings\":[]}",
        "Fixed.\n@sim json {\"verdict\":\"maybe\",\"findings\":[]}\n\
         @sim json {\"verdict\":\"fail\",\"findings\":[\"a.rs\"]}",
        "Wrong.\n@sim json {\"findings\":1}\n@sim json {\"findings\":2}",
    ];
    let request = |output_schema: String| pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: directives(&prompts),
        output_schema,
        ..Default::default()
    };
    for (bad, needle) in [
        (r#"{"type": "objet"}"#, "not a valid JSON Schema"),
        (
            r#"{"$ref": "https://example.com/s.json"}"#,
            "not a valid JSON Schema",
        ),
        ("[1]", "must be a JSON object"),
    ] {
        let err = client.fork_batch(request(bad.into())).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}: {err:?}");
        assert!(err.message().contains(needle), "{bad}: {}", err.message());
    }
    let submitted = client
        .fork_batch(request(schema.to_string()))
        .await
        .unwrap()
        .into_inner();
    let done = wait_for_batch(&mut client, &submitted.batch_id, prompts.len(), DEADLINE)
        .await
        .unwrap();
    let note = |i: usize| {
        done.iter()
            .find(|n| n.agent_id == submitted.agent_ids[i])
            .unwrap()
    };
    let structured = |i: usize| -> serde_json::Value {
        serde_json::from_str(&note(i).report.as_ref().unwrap().structured_json).unwrap()
    };
    assert_eq!(note(0).status, pb::NotificationStatus::Completed as i32);
    assert_eq!(
        structured(0),
        serde_json::json!({"verdict": "pass", "findings": []})
    );
    assert_eq!(note(1).status, pb::NotificationStatus::Completed as i32);
    assert_eq!(structured(1)["findings"], serde_json::json!(["a.rs"]));
    assert_eq!(note(2).status, pb::NotificationStatus::Failed as i32);
    let issues = &note(2).report.as_ref().unwrap().issues;
    assert!(issues.contains("after one follow-up"), "{issues}");
    assert!(issues.contains("at /findings"), "{issues}");
    // Children 2..N: only their directive (and, for those asked again, their own turns) is not
    // read from the cache; the first request of each reads the shared part whole.
    for i in 1..prompts.len() {
        let usage = note(i).usage.unwrap();
        assert!(usage.cache_read_input_tokens > 1024, "{usage:?}");
    }
}
