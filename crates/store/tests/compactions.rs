//! Compaction boundaries on both backends: stored under the main loop's lease, only before an
//! assistant message and past the previous boundary, read back oldest first with the summary's
//! exact bytes; a batch keeps the boundary it was forked after.

mod support;

use forkd_core::compaction::{Compaction, summary_message};
use forkd_core::{Agent, AgentId, AgentKind, AgentState, ReportTo, Usage};
use forkd_store::StoreError;
use support::{TestResult, TestStore, conformance, fork, history, session};

conformance!(
    boundaries_are_checked_and_read_back_in_order,
    a_batch_keeps_its_boundary
);

/// A session with the test history (assistant messages at 1 and 3) and its main loop, claimed.
async fn main_loop(
    store: &TestStore,
) -> TestResult<(forkd_core::session::Session, forkd_store::Lease)> {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let parent = Agent {
        id: AgentId::new(),
        session_id: session.id,
        batch_id: None,
        kind: AgentKind::Parent,
        index: 0,
        state: AgentState::Idle,
        directive: None,
        query_source: None,
        report_to: ReportTo::Transcript,
        usage: Usage::default(),
        cost_usd: 0.0,
        error: None,
        created_at_ms: 1,
        updated_at_ms: 1,
        held_by: None,
    };
    store.insert_agent(&parent, None, None).await?;
    let lease = store.claim_agent(parent.id).await?;
    Ok((session, lease))
}

fn boundary(from_seq: u64, to_seq: u64, text: &str) -> Compaction {
    Compaction {
        from_seq,
        to_seq,
        summary: summary_message(text),
        created_at_ms: 5,
    }
}

async fn boundaries_are_checked_and_read_back_in_order(store: TestStore) -> TestResult {
    let (session, lease) = main_loop(&store).await?;
    let conflict = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Conflict(_)));
    // Message 2 is a user message: no boundary before it.
    assert!(conflict(
        store
            .append_compaction(&lease, session.id, &boundary(0, 2, "x"))
            .await
    ));
    let first = boundary(0, 1, "the first «summary» 🚀");
    store.append_compaction(&lease, session.id, &first).await?;
    // Not at or before the last boundary.
    assert!(conflict(
        store.append_compaction(&lease, session.id, &first).await
    ));
    let second = boundary(1, 3, "the second");
    store.append_compaction(&lease, session.id, &second).await?;
    assert_eq!(store.compactions(session.id).await?, vec![first, second]);
    // A superseded lease writes nothing.
    store.claim_agent(lease.agent_id).await?;
    assert!(matches!(
        store
            .append_compaction(&lease, session.id, &boundary(3, 3, "stale"))
            .await,
        Err(StoreError::Superseded { .. })
    ));
    assert_eq!(store.compactions(session.id).await?.len(), 2);
    Ok(())
}

async fn a_batch_keeps_its_boundary(store: TestStore) -> TestResult {
    let (session, lease) = main_loop(&store).await?;
    store
        .append_compaction(&lease, session.id, &boundary(0, 3, "s"))
        .await?;
    let mut fx = fork(&session, 4, 2)?;
    fx.batch.compacted_to = Some(3);
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    let stored = store.get_batch(fx.batch.id).await?.ok_or("no batch")?;
    assert_eq!(stored.compacted_to, Some(3));
    assert_eq!(stored, fx.batch);
    Ok(())
}
