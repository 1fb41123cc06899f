//! The recursion guard end to end: a fork child that tries to fork gets the refusal as a tool
//! error and carries on — with its query source, and with the query source deliberately absent
//! (the scan for the boilerplate tag alone must catch it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use forkd_core::agent::FORK_QUERY_SOURCE;
use forkd_core::fork::{self, ForkBatch};
use forkd_core::session::PermissionMode;
use forkd_core::{
    Agent, AgentId, AgentKind, AgentState, BatchId, Directive, NotificationStatus, Usage,
};
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
        id: AgentId::new(),
        session_id: session.id,
        batch_id: Some(batch_id),
        kind: AgentKind::Fork,
        index: 0,
        state: AgentState::Pending,
        directive: Some(directive.clone()),
        query_source: query_source.map(str::to_owned),
        report_to: forkd_core::ReportTo::Transcript,
        usage: Usage::default(),
        cost_usd: 0.0,
        error: None,
        created_at_ms: 0,
        updated_at_ms: 0,
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
    engine.start_agent(agent.id);
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
