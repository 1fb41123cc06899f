//! The recursion guard end to end: a fork child that tries to fork gets the refusal as a tool
//! error and carries on — with its query source, and with the query source deliberately absent
//! (the scan for the boilerplate tag alone must catch it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use forkd_core::agent::FORK_QUERY_SOURCE;
use forkd_core::fork::{self, ForkBatch};
use forkd_core::session::PermissionMode;
use forkd_core::{Agent, AgentId, AgentKind, AgentState, BatchId, Directive, NotificationStatus};
use forkd_engine::{EngineConfig, NewSession};
use forkd_provider::SimConfig;
use forkd_store::{NewChild, NotificationFilter, Store};
use futures::StreamExt;

const SCRIPT: &str = "Split this up.\n@sim agent {\"description\":\"x\",\"prompt\":\"grandchild\"}\n@sim say did it myself";

/// Forks one child straight through the store (so the test decides its query source), runs
/// it, and returns its final notification and the tool results it saw.
async fn fork_and_run(query_source: Option<&str>) -> (NotificationStatus, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store(dir.path()).await;
    let engine = common::engine_on(store.clone(), SimConfig::default(), EngineConfig::default());
    let session = engine
        .create_session(NewSession {
            system_prompt: "Sys.".into(),
            workspace: Some(dir.path().to_path_buf()),
            permission_mode: PermissionMode::DontAsk,
            ..NewSession::default()
        })
        .await
        .unwrap();
    let directive = Directive {
        description: "guarded".into(),
        prompt: SCRIPT.into(),
    };
    let batch_id = BatchId::new();
    let fork_point = store.session_message_count(session.id).await.unwrap();
    let batch = ForkBatch::new(
        batch_id,
        session.id,
        fork_point,
        fork::client_fork_message(batch_id, std::slice::from_ref(&directive)),
        0,
    )
    .unwrap();
    let agent = Agent {
        batch_id: Some(batch_id),
        directive: Some(directive.clone()),
        query_source: query_source.map(str::to_owned),
        ..Agent::new(
            AgentId::new(),
            session.id,
            AgentKind::Fork,
            AgentState::Pending,
            0,
        )
    };
    let tool_use = fork::fork_directives(batch.assistant().unwrap())[0]
        .0
        .clone();
    let results = batch.parent_results(&[(tool_use, agent.id)]);
    let child = NewChild {
        agent: agent.clone(),
        directive_block: ForkBatch::directive_block(&directive),
    };
    store
        .create_fork_batch(
            &batch,
            std::slice::from_ref(&results),
            &[child],
            &forkd_store::BatchExtras::default(),
        )
        .await
        .unwrap();

    let mut notes = engine
        .subscribe(0, NotificationFilter::default(), true)
        .await
        .unwrap();
    engine.start_agent(agent.id).await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(20), notes.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let calls = store.tool_calls(agent.id).await.unwrap();
    let refusal = calls[0].result.as_ref().unwrap().raw().as_str().to_owned();
    let children = store
        .list_agents(&forkd_store::AgentFilter {
            include_ended: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(children.len(), 1, "no grandchild was created");
    engine.shutdown(Duration::from_secs(5)).await;
    (note.status, note.report.result, refusal)
}

#[tokio::test]
async fn the_query_source_refuses_a_fork_from_a_child() {
    let (status, result, refusal) = fork_and_run(Some(FORK_QUERY_SOURCE)).await;
    assert_eq!(status, NotificationStatus::Completed);
    assert_eq!(result, "did it myself");
    assert!(refusal.contains("cannot fork"), "{refusal}");
    assert!(refusal.contains(r#""is_error":true"#));
}

#[tokio::test]
async fn the_boilerplate_scan_alone_refuses_it_when_the_query_source_is_lost() {
    let (status, result, refusal) = fork_and_run(None).await;
    assert_eq!(status, NotificationStatus::Completed);
    assert_eq!(result, "did it myself");
    assert!(refusal.contains("cannot fork"), "{refusal}");
}

/// What a fork child's typed-agent call gives: the child's own transcript, as text.
async fn child_calls_a_typed_agent(
    config: EngineConfig,
) -> (tempfile::TempDir, forkd_engine::Engine, AgentId, String) {
    let dir = tempfile::tempdir().unwrap();
    let engine = common::engine_with(dir.path(), config).await;
    let session = engine
        .create_session(common::new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    let script = concat!(
        "Look around.\n",
        r#"@sim agent {"description":"explore","prompt":"Find it.\n@sim say found it in src/lib.rs","subagent_type":"Explore"}"#,
        "\n@sim agent {\"description\":\"x\",\"prompt\":\"grandchild\"}",
        "\n@sim say done",
    );
    let batch = engine
        .fork_batch(
            session.id,
            vec![Directive {
                description: "look".into(),
                prompt: script.into(),
            }],
            Default::default(),
        )
        .await
        .unwrap();
    let child = batch.agent_ids[0];
    let note = common::ended(&engine, child).await;
    assert_eq!(note.status, NotificationStatus::Completed, "{note:?}");
    let seen: String = engine
        .transcript(child, true)
        .await
        .unwrap()
        .iter()
        .map(|e| e.message.content_json())
        .collect();
    (dir, engine, child, seen)
}

/// A fork child may start a typed agent: it waits for it and gets the report as the call's
/// result (and the session's transcript does not get it too); a fork from it is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_child_starts_a_typed_agent_but_cannot_fork() {
    let (_dir, engine, child, seen) = child_calls_a_typed_agent(EngineConfig::default()).await;
    let typed = AgentId::for_call(
        child,
        &engine.store().tool_calls(child).await.unwrap()[0].tool_use_id,
    );
    let agent = engine.get_agent(typed).await.unwrap();
    assert_eq!(agent.kind, AgentKind::Typed);
    assert_eq!(agent.state, AgentState::Completed);
    assert!(seen.contains("found it in src/lib.rs"), "{seen}");
    assert!(
        seen.contains("a fork child cannot fork") || seen.contains("refused"),
        "{seen}"
    );
    assert!(engine.store().caller_reports().await.unwrap().is_empty());
    let parent: String = engine
        .store()
        .session_messages(agent.session_id, None)
        .await
        .unwrap()
        .iter()
        .map(|m| m.message.content_json())
        .collect();
    assert!(
        !parent.contains(&typed.to_string()),
        "the report went to the child only"
    );
}

/// Past `max_agent_depth`, the call is a clear tool error and the child carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_agent_past_the_depth_bound_is_a_tool_error() {
    let config = EngineConfig {
        max_agent_depth: 1,
        ..EngineConfig::default()
    };
    let (_dir, engine, child, seen) = child_calls_a_typed_agent(config).await;
    assert!(seen.contains("2 levels below the session"), "{seen}");
    assert!(seen.contains("max_agent_depth"), "{seen}");
    let typed = AgentId::for_call(
        child,
        &engine.store().tool_calls(child).await.unwrap()[0].tool_use_id,
    );
    assert!(
        engine.get_agent(typed).await.is_err(),
        "no typed agent was started"
    );
}
