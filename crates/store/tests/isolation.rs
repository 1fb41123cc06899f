//! Isolated batches on both backends: the snapshot is stored with its batch, and each child's
//! changes are stored, replaced as its copy is applied or discarded, and listed by batch.

mod support;

use forkd_core::isolation::{
    AgentChanges, BatchSnapshot, ChangeKind, Conflict, CopyState, FileChange,
};
use forkd_store::BatchExtras;
use support::{TestResult, TestStore, conformance, fork, history, session};

conformance!(an_isolated_batch_keeps_its_snapshot_and_its_childrens_changes);

async fn an_isolated_batch_keeps_its_snapshot_and_its_childrens_changes(
    store: TestStore,
) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let fx = fork(&session, 4, 2)?;
    let snapshot = BatchSnapshot {
        batch_id: fx.batch.id,
        dir: "/var/lib/forkd/isolation/b/snapshot".into(),
        agents: Some(vec![fx.children[0].agent.id]),
        git_ref: Some(format!("refs/forkd/snapshots/{}", fx.batch.id)),
        git_commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
        files: 10_000,
        bytes: 100 << 20,
        took_ms: 812,
        created_at_ms: 5_000,
    };
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &BatchExtras {
                snapshot: Some(&snapshot),
                ..BatchExtras::default()
            },
        )
        .await?;
    assert_eq!(store.batch_snapshot(fx.batch.id).await?, Some(snapshot));
    let plain = fork(&session, 6, 1)?;
    store
        .create_fork_batch(
            &plain.batch,
            std::slice::from_ref(&plain.parent_results),
            &plain.children,
            &BatchExtras::default(),
        )
        .await?;
    assert_eq!(store.batch_snapshot(plain.batch.id).await?, None);

    let child = fx.children[0].agent.id;
    assert_eq!(store.agent_changes(child).await?, None);
    let mut changes = AgentChanges {
        agent_id: child,
        batch_id: fx.batch.id,
        files: vec![FileChange {
            path: "src/ünï.rs".into(),
            kind: ChangeKind::Modified,
            added: 3,
            removed: 1,
            binary: false,
            special: None,
        }],
        diff: "diff --git a/src/ünï.rs b/src/ünï.rs\n-a\n+b\n".into(),
        outside_possible: true,
        state: CopyState::Kept,
        conflicts: Vec::new(),
        updated_at_ms: 6_000,
    };
    store.put_changes(&changes).await?;
    assert_eq!(store.agent_changes(child).await?, Some(changes.clone()));
    changes.state = CopyState::Conflicted;
    changes.conflicts = vec![Conflict {
        path: "src/ünï.rs".into(),
        reason: "overlapping lines".into(),
    }];
    changes.updated_at_ms = 7_000;
    store.put_changes(&changes).await?;
    assert_eq!(store.agent_changes(child).await?, Some(changes.clone()));
    assert_eq!(store.expired_copies(7_001, 10).await?, vec![child]);
    assert_eq!(store.expired_copies(7_000, 10).await?, Vec::new());
    let listed = store.batch_changes(fx.batch.id).await?;
    assert_eq!(listed, vec![changes.clone()]);
    assert_eq!(store.batch_changes(plain.batch.id).await?, Vec::new());
    // Applied or discarded copies are past any retention.
    changes.state = CopyState::Discarded;
    store.put_changes(&changes).await?;
    assert_eq!(store.expired_copies(i64::MAX, 10).await?, Vec::new());
    Ok(())
}
