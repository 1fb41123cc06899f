//! Compaction boundaries on both backends: stored under the main loop's lease, only before an
//! assistant message and past the previous boundary, read back oldest first with the summary's
//! exact bytes; a batch keeps the boundary it was forked after; an agent's own boundaries (a
//! fork child's, a typed agent's) are kept per agent, under its lease, apart from the
//! session's.

mod support;

use forkd_core::branch::Branch;
use forkd_core::compaction::{Compaction, summary_message};
use forkd_core::{Agent, AgentId, AgentKind, AgentState, Block, Message};
use forkd_store::StoreError;
use support::{TestResult, TestStore, conformance, fork, history, session};

conformance!(
    boundaries_are_checked_and_read_back_in_order,
    a_batch_keeps_its_boundary,
    an_agents_boundaries_are_its_own,
    a_branch_inherits_the_boundary_in_force_at_its_point_and_no_later_one,
);

/// A session with the test history (assistant messages at 1 and 3) and its main loop, claimed.
async fn main_loop(
    store: &TestStore,
) -> TestResult<(forkd_core::session::Session, forkd_store::Lease)> {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let parent = Agent::new(
        AgentId::new(),
        session.id,
        AgentKind::Parent,
        AgentState::Idle,
        1,
    );
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

async fn an_agents_boundaries_are_its_own(store: TestStore) -> TestResult {
    let (session, parent) = main_loop(&store).await?;
    let fx = fork(&session, 4, 2)?;
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    let (one, two) = (fx.children[0].agent.id, fx.children[1].agent.id);
    let lease = store.claim_agent(one).await?;
    // The child's own transcript: replies at 0, 2 and 4, tool results between them.
    for i in 0..5 {
        let text = format!("own {i}");
        let message = if i % 2 == 0 {
            Message::assistant(vec![Block::text(&text)])
        } else {
            Message::user(vec![Block::text(&text)])
        };
        store.append_agent_message(&lease, &message).await?;
    }
    let conflict = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Conflict(_)));
    // Before a user message, or a message the agent does not have: refused.
    assert!(conflict(
        store
            .append_agent_compaction(&lease, &boundary(0, 1, "x"))
            .await
    ));
    assert!(conflict(
        store
            .append_agent_compaction(&lease, &boundary(0, 9, "x"))
            .await
    ));
    let first = boundary(0, 2, "the child's «first» 🚀");
    store.append_agent_compaction(&lease, &first).await?;
    assert!(conflict(
        store.append_agent_compaction(&lease, &first).await
    ));
    let second = boundary(2, 4, "the child's second");
    store.append_agent_compaction(&lease, &second).await?;
    assert_eq!(store.agent_compactions(one).await?, vec![first, second]);
    // Its sibling and its session have none of them.
    assert!(store.agent_compactions(two).await?.is_empty());
    assert!(store.compactions(session.id).await?.is_empty());
    // The session's main loop's lease names the main loop: its boundaries go to the session.
    assert!(conflict(
        store
            .append_agent_compaction(&parent, &boundary(0, 2, "not the parent's"))
            .await
    ));
    // A superseded lease writes nothing.
    store.claim_agent(one).await?;
    assert!(matches!(
        store
            .append_agent_compaction(&lease, &boundary(4, 4, "stale"))
            .await,
        Err(StoreError::Superseded { .. })
    ));
    assert_eq!(store.agent_compactions(one).await?.len(), 2);
    Ok(())
}

async fn a_branch_inherits_the_boundary_in_force_at_its_point_and_no_later_one(
    store: TestStore,
) -> TestResult {
    let (origin, lease) = main_loop(&store).await?;
    let first = boundary(0, 1, "before the point");
    store.append_compaction(&lease, origin.id, &first).await?;
    let branch_at = |point, compacted_to| forkd_core::session::Session {
        id: forkd_core::SessionId::new(),
        branch: Some(Branch {
            origin: origin.id,
            point,
            compacted_to,
        }),
        ..origin.clone()
    };
    let compacted = branch_at(4, Some(1));
    store.create_branch(&compacted, None).await?;
    let whole = branch_at(4, None);
    store.create_branch(&whole, None).await?;
    // The origin compacts again (at 3, before the branches' point): not theirs.
    store
        .append_compaction(&lease, origin.id, &boundary(1, 3, "after the branches"))
        .await?;
    assert_eq!(store.compactions(origin.id).await?.len(), 2);
    assert_eq!(store.compactions(compacted.id).await?, vec![first.clone()]);
    assert_eq!(store.compactions(whole.id).await?, vec![]);
    // A branch of the compacted branch keeps what it kept.
    let grandchild = forkd_core::session::Session {
        id: forkd_core::SessionId::new(),
        branch: Some(Branch {
            origin: compacted.id,
            point: 4,
            compacted_to: Some(1),
        }),
        ..origin.clone()
    };
    store.create_branch(&grandchild, None).await?;
    assert_eq!(store.compactions(grandchild.id).await?, vec![first]);
    Ok(())
}
