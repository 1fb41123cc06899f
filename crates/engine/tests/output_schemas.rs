//! Output schemas through the engine and the sim (docs/contracts.md, "Output schemas"): a valid
//! final object completes the child with it as `report.structured`; a mismatch gets one
//! follow-up that reads the child's own cache; a second mismatch fails it with the violations.
//! The schema block keeps the cache: children 2..N read the whole shared part, schema included.
//! A typed agent takes a schema from its `Agent` call; a fork call with one is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{Recorder, Sent, ended, new_session};
use forkd_core::output::{MISMATCH_TAG, OutputSchema, SCHEMA_TAG};
use forkd_core::{Directive, NotificationStatus};
use forkd_engine::{BatchOptions, Engine, EngineConfig, EngineError, TypedOptions};
use serde_json::json;

fn schema() -> OutputSchema {
    OutputSchema::from_value(&json!({
        "type": "object",
        "required": ["verdict", "findings"],
        "properties": {
            "verdict": {"enum": ["pass", "fail"]},
            "findings": {"type": "array", "items": {"type": "string"}}
        }
    }))
    .unwrap()
}

fn directive(prompt: &str) -> Directive {
    Directive {
        description: prompt.lines().next().unwrap_or_default().to_owned(),
        prompt: prompt.to_owned(),
    }
}

async fn engine(dir: &Path, recorder: Arc<Recorder>) -> Engine {
    Engine::new(common::store(dir).await, recorder, EngineConfig::default())
}

/// An engine on the instant sim behind a recorder, and a session to fork.
struct Fixture {
    dir: tempfile::TempDir,
    recorder: Arc<Recorder>,
    engine: Engine,
    session: forkd_core::session::Session,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::with_speed(0.0));
    let engine = engine(dir.path(), recorder.clone()).await;
    let session = engine
        .create_session(new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    Fixture {
        dir,
        recorder,
        engine,
        session,
    }
}

/// The first request a child sent: the one holding its directive and no reply of its own yet.
fn first_request(recorder: &Recorder, marker: &str) -> Sent {
    recorder.sent_with(marker).into_iter().next().expect("sent")
}

#[tokio::test]
async fn valid_fixed_and_wrong_replies_end_as_the_schema_decides() {
    let Fixture {
        dir: _dir,
        recorder,
        engine,
        session,
    } = fixture().await;
    let directives = vec![
        directive("Child valid.\n@sim json {\"verdict\":\"pass\",\"findings\":[\"a\"]}"),
        directive(
            "Child fixes.\n@sim json {\"verdict\":\"maybe\",\"findings\":[]}\n\
             @sim json {\"verdict\":\"fail\",\"findings\":[\"b\"]}",
        ),
        directive(
            "Child stays wrong.\n@sim json {\"verdict\":\"maybe\",\"findings\":\"none\"}\n\
             @sim json {\"findings\":[]}",
        ),
        directive("Child left to the sim."),
    ];
    let batch = engine
        .fork_batch(
            session.id,
            directives,
            BatchOptions {
                output_schema: Some(schema()),
                ..BatchOptions::default()
            },
        )
        .await
        .unwrap();
    let ids = &batch.agent_ids;

    let valid = ended(&engine, ids[0]).await;
    assert_eq!(valid.status, NotificationStatus::Completed);
    assert_eq!(
        valid.report.structured,
        Some(json!({"verdict": "pass", "findings": ["a"]}))
    );
    assert_eq!(
        valid.report.result,
        r#"{"verdict":"pass","findings":["a"]}"#
    );
    assert_eq!(valid.report.scope, "Child valid.");
    assert!(recorder.sent_with("Child valid.").len() == 1);

    let fixed = ended(&engine, ids[1]).await;
    assert_eq!(fixed.status, NotificationStatus::Completed, "{fixed:?}");
    assert_eq!(
        fixed.report.structured,
        Some(json!({"verdict": "fail", "findings": ["b"]}))
    );
    let sent = recorder.sent_with("Child fixes.");
    assert_eq!(sent.len(), 2, "one follow-up");
    let follow_up = sent[1].body.as_ref();
    assert!(follow_up.contains(&format!("<{MISMATCH_TAG}>")));
    assert!(follow_up.contains("at /verdict"), "{follow_up}");
    // The follow-up reads the child's own cache: everything its first request sent.
    let first = sent[0].usage();
    let total_first =
        first.input_tokens + first.cache_read_input_tokens + first.cache_creation_input_tokens;
    assert!(
        sent[1].usage().cache_read_input_tokens >= total_first,
        "follow-up read {} of the first request's {total_first}",
        sent[1].usage().cache_read_input_tokens
    );

    let wrong = ended(&engine, ids[2]).await;
    assert_eq!(wrong.status, NotificationStatus::Failed);
    assert_eq!(wrong.report.structured, None);
    let issues = &wrong.report.issues;
    assert!(
        issues.contains("did not match the output schema after one follow-up"),
        "{issues}"
    );
    assert!(
        issues.contains("at /: \"verdict\" is a required property"),
        "{issues}"
    );
    assert_eq!(recorder.sent_with("Child stays wrong.").len(), 2);

    let minimal = ended(&engine, ids[3]).await;
    assert_eq!(minimal.status, NotificationStatus::Completed, "{minimal:?}");
    assert!(
        schema()
            .check(&minimal.report.structured.unwrap().to_string())
            .is_ok()
    );

    // The cache: children 2..N read everything before their directive, the schema block
    // included; only their directive is new.
    for marker in [
        "Child fixes.",
        "Child stays wrong.",
        "Child left to the sim.",
    ] {
        let sent = first_request(&recorder, marker);
        let usage = sent.usage();
        assert!(sent.body.contains(&format!("<{SCHEMA_TAG}>")));
        assert!(
            usage.input_tokens + usage.cache_creation_input_tokens < 100,
            "{marker}: {usage:?}"
        );
        assert!(usage.cache_read_input_tokens > 1_000, "{marker}: {usage:?}");
    }
}

#[tokio::test]
async fn a_schema_adds_a_block_after_the_boilerplate_and_changes_nothing_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::with_speed(0.0));
    let engine = engine(dir.path(), recorder.clone()).await;
    let mut bodies = Vec::new();
    for (i, output_schema) in [None, Some(schema())].into_iter().enumerate() {
        let session = engine
            .create_session(new_session(dir.path(), "Sys."))
            .await
            .unwrap();
        let marker = format!("Look at part {i}.");
        let batch = engine
            .fork_batch(
                session.id,
                vec![directive(&marker)],
                BatchOptions {
                    output_schema,
                    ..BatchOptions::default()
                },
            )
            .await
            .unwrap();
        ended(&engine, batch.agent_ids[0]).await;
        let body: serde_json::Value = first_request(&recorder, &marker).json();
        bodies.push(body);
    }
    // Sessions differ in nothing but their ids, which no request carries.
    let (plain, shaped) = (&bodies[0], &bodies[1]);
    assert_eq!(plain["system"], shaped["system"]);
    assert_eq!(plain["tools"], shaped["tools"]);
    let blocks = |b: &serde_json::Value| b["messages"][0]["content"].as_array().unwrap().clone();
    let (plain, shaped) = (blocks(plain), blocks(shaped));
    assert_eq!(shaped.len(), plain.len() + 1);
    let boilerplate = plain.len() - 2;
    assert_eq!(plain[..boilerplate], shaped[..boilerplate]);
    // The boilerplate is the same text; its breakpoint moved to the schema block.
    assert_eq!(plain[boilerplate]["text"], shaped[boilerplate]["text"]);
    assert!(plain[boilerplate].get("cache_control").is_some());
    assert!(shaped[boilerplate].get("cache_control").is_none());
    let block = &shaped[boilerplate + 1];
    assert!(
        block["text"]
            .as_str()
            .unwrap()
            .starts_with(&format!("<{SCHEMA_TAG}>"))
    );
    assert!(block.get("cache_control").is_some());
}

#[tokio::test]
async fn a_typed_agent_takes_a_schema_and_a_fork_call_with_one_is_refused() {
    let Fixture {
        dir: _dir,
        recorder,
        engine,
        session,
    } = fixture().await;

    // A client's typed agent.
    let agent = engine
        .spawn_typed(
            session.id,
            "Explore",
            directive("Explore with a schema.\n@sim json {\"verdict\":\"pass\",\"findings\":[]}"),
            &TypedOptions {
                output_schema: Some(schema()),
                ..TypedOptions::default()
            },
        )
        .await
        .unwrap();
    let note = ended(&engine, agent).await;
    assert_eq!(note.status, NotificationStatus::Completed);
    assert_eq!(
        note.report.structured,
        Some(json!({"verdict": "pass", "findings": []}))
    );
    let sent = recorder.sent_with("Explore with a schema.");
    assert!(sent[0].body.contains(&format!("<{SCHEMA_TAG}>")));

    // A model's calls: a typed one with a schema runs; a fork call with one is refused.
    let typed_call = json!({
        "description": "typed", "prompt": "Typed from the model.", "subagent_type": "Explore",
        "output_schema": {"type": "object", "required": ["ok"]}
    });
    let fork_call = json!({
        "description": "fork", "prompt": "Fork from the model.",
        "output_schema": {"type": "object"}
    });
    let text = format!("Delegate.\n@sim agent {typed_call}\n@sim agent {fork_call}");
    let stream = engine.send_message(session.id, text).await.unwrap();
    let _events: Vec<_> = futures::StreamExt::collect(stream).await;
    let results: Vec<String> = recorder
        .sent_with("Delegate.")
        .iter()
        .flat_map(|s| {
            s.json()["messages"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                .filter(|b| b["type"] == "tool_result")
                .map(|b| b["content"].to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        results
            .iter()
            .any(|r| r.contains("output_schema is for typed agents")),
        "{results:?}"
    );
    // The typed agent answered the schema (the sim's minimal object for `required: [ok]`).
    assert!(
        results
            .iter()
            .any(|r| r.contains("completed") && r.contains("\\\"ok\\\"")),
        "{results:?}"
    );
}

#[tokio::test]
async fn bad_schemas_and_points_are_refused_and_a_rerun_forks_where_its_batch_did() {
    let Fixture {
        dir,
        recorder,
        engine,
        session,
    } = fixture().await;
    let first = engine
        .fork_batch(
            session.id,
            vec![directive("Earlier batch.")],
            BatchOptions::default(),
        )
        .await
        .unwrap();
    ended(&engine, first.agent_ids[0]).await;
    let other = engine
        .create_session(new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    let refused = engine
        .fork_batch(
            other.id,
            vec![directive("Wrong session.")],
            BatchOptions {
                fork_point_of: Some(first.batch_id),
                ..BatchOptions::default()
            },
        )
        .await;
    assert!(
        matches!(&refused, Err(EngineError::InvalidRequest(m)) if m.contains("has no batch")),
        "{refused:?}"
    );
    // The parent moved on (the first batch's digest); the rerun still forks where it did.
    assert!(engine.session_message_count(session.id).await.unwrap() > first.fork_point);
    let rerun = engine
        .fork_batch(
            session.id,
            vec![directive("Earlier batch, again.")],
            BatchOptions {
                fork_point_of: Some(first.batch_id),
                ..BatchOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(rerun.fork_point, first.fork_point);
    ended(&engine, rerun.agent_ids[0]).await;
    let again = first_request(&recorder, "Earlier batch, again.").usage();
    assert!(
        again.input_tokens + again.cache_creation_input_tokens < 100,
        "the rerun reads the first batch's prefix: {again:?}"
    );
}
