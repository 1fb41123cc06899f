//! Many writers at once, on both backends: what SQLite gets from running one writer at a time,
//! PostgreSQL must get from its row locks and unique keys. Each test races tasks that read and
//! then write (a transcript's length, a batch's live children, a lease, a key) and checks that
//! the outcome is one that running them one at a time could give.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use forkd_core::{AgentState, Block, Message, NotificationStatus};
use forkd_store::{BatchExtras, IdempotencyRecord, IdempotentCall, NotificationFilter, StoreError};
use support::{
    TestResult, TestStore, client_fork, conformance, ended, finish, fork, history, main_loop,
    seeded, session,
};

conformance!(
    appends_from_many_tasks_keep_a_transcript_contiguous,
    the_last_children_of_a_client_batch_append_one_digest,
    notifications_are_never_seen_out_of_seq_order,
    one_idempotency_key_creates_one_session,
    concurrent_claims_each_get_their_own_generation,
    forks_racing_at_one_point_store_one_batch,
    a_claim_fences_the_older_runs_writes_in_flight,
);

type Handles<T> = Vec<tokio::task::JoinHandle<Result<T, StoreError>>>;

async fn join_all<T>(handles: Handles<T>) -> TestResult<Vec<Result<T, StoreError>>> {
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await?);
    }
    Ok(out)
}

/// A turn's messages, children's `<task-notification>`s and handed-back reports all append to one
/// transcript at once: every append succeeds and the seqs stay 0..len without a gap.
async fn appends_from_many_tasks_keep_a_transcript_contiguous(store: TestStore) -> TestResult {
    const CHILDREN: usize = 24;
    const TURNS: usize = 24;
    let (session, fx) = seeded(&*store, CHILDREN).await?;
    let parent = main_loop(&session);
    store.insert_agent(&parent, None, None).await?;
    let lease = store.claim_agent(parent.id).await?;
    let before = store.session_message_count(session.id).await?;

    let mut handles: Handles<()> = Vec::new();
    for child in &fx.children {
        let (store, child) = (store.shared(), child.agent.clone());
        handles.push(tokio::spawn(async move {
            let n = ended(&child, NotificationStatus::Completed, 10);
            finish(&*store, &n, None).await.map(|_| ())
        }));
    }
    let turns = {
        let store = store.shared();
        tokio::spawn(async move {
            for i in 0..TURNS {
                let m = Message::assistant(vec![Block::text(&format!("turn {i}"))]);
                store
                    .append_turn(&lease, session.id, &[m], &[], None, 20)
                    .await?;
            }
            Ok(())
        })
    };
    handles.push(turns);
    for outcome in join_all(handles).await? {
        outcome?;
    }

    let transcript = store.session_messages(session.id, None).await?;
    let seqs: Vec<u64> = transcript.iter().map(|m| m.seq).collect();
    let expected = before + u64::try_from(CHILDREN + TURNS)?;
    assert_eq!(seqs, (0..expected).collect::<Vec<_>>());
    // The turn's own messages kept their order.
    let turn_texts: Vec<String> = transcript
        .iter()
        .map(|m| m.message.text())
        .filter(|t| t.starts_with("turn "))
        .collect();
    assert_eq!(
        turn_texts,
        (0..TURNS).map(|i| format!("turn {i}")).collect::<Vec<_>>()
    );
    store.check_integrity().await?;
    Ok(())
}

/// Every child of a client's batch ends at once: whichever is last (and two may count their live
/// siblings at the same moment), exactly one digest reaches the transcript, naming all of them.
async fn the_last_children_of_a_client_batch_append_one_digest(store: TestStore) -> TestResult {
    const CHILDREN: usize = 12;
    const ROUNDS: usize = 4;
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    for _ in 0..ROUNDS {
        let len = store.session_message_count(session.id).await?;
        let fx = client_fork(&session, len, CHILDREN)?;
        store
            .create_fork_batch(
                &fx.batch,
                std::slice::from_ref(&fx.parent_results),
                &fx.children,
                &BatchExtras::default(),
            )
            .await?;
        let mut handles: Handles<()> = Vec::new();
        for child in &fx.children {
            let (store, child) = (store.shared(), child.agent.clone());
            handles.push(tokio::spawn(async move {
                let n = ended(&child, NotificationStatus::Completed, 10);
                finish(&*store, &n, None).await.map(|_| ())
            }));
        }
        for outcome in join_all(handles).await? {
            outcome?;
        }
        let added = store.session_messages_from(session.id, len, None).await?;
        assert_eq!(added.len(), 2, "the launch note and one digest");
        let digest = added[1].message.text();
        assert!(
            digest.contains(&format!("{CHILDREN} children: {CHILDREN} completed")),
            "{digest}"
        );
    }
    Ok(())
}

/// Agents of different sessions (so that nothing but the notification log is shared) end at once
/// while a reader follows the log: every read continues exactly where the last one stopped (a
/// reader that has seen seq n has seen every seq below it), and the seqs come out as 1..=N.
async fn notifications_are_never_seen_out_of_seq_order(store: TestStore) -> TestResult {
    const CHILDREN: usize = 64;
    // The reader and half the writers on stores of their own: three daemons' worth of
    // connections, so that writers overlap and the reader never waits for them. Each writer
    // ends the children it created (a daemon runs those it holds).
    let (reading, writing) = (store.reopen().await?, store.reopen().await?);
    let mut children = Vec::new();
    for i in 0..CHILDREN {
        let creator = if i % 2 == 0 { &*store } else { &*writing };
        let (_, fx) = seeded(creator, 1).await?;
        children.extend(fx.children.into_iter().map(|c| c.agent));
    }
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, done) = (reading, Arc::clone(&done));
        tokio::spawn(async move {
            let mut seen: Vec<u64> = Vec::new();
            loop {
                let finished = done.load(Ordering::SeqCst);
                let since = seen.last().copied().unwrap_or(0);
                let batch = store
                    .notifications(since, &NotificationFilter::default(), 0)
                    .await?;
                for (n, expected) in batch.iter().zip(since + 1..) {
                    if n.seq != expected {
                        return Err(format!(
                            "after seq {since} the log showed {:?}",
                            batch.iter().map(|n| n.seq).collect::<Vec<_>>()
                        )
                        .into());
                    }
                    seen.push(n.seq);
                }
                if finished {
                    return Ok::<_, Box<dyn std::error::Error + Send + Sync>>(seen);
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut handles: Handles<()> = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let store = if i % 2 == 0 {
            store.shared()
        } else {
            Arc::clone(&writing)
        };
        handles.push(tokio::spawn(async move {
            let n = ended(&child, NotificationStatus::Completed, 10);
            finish(&*store, &n, None).await.map(|_| ())
        }));
    }
    for outcome in join_all(handles).await? {
        outcome?;
    }
    done.store(true, Ordering::SeqCst);
    let seen = reader.await??;
    let all = u64::try_from(CHILDREN)?;
    assert_eq!(seen, (1..=all).collect::<Vec<_>>());
    assert_eq!(store.last_notification_seq().await?, all);
    Ok(())
}

/// Retries of one call race with one idempotency key: one creates its session, every other gets
/// `Conflict`, and the key names the one that was created.
async fn one_idempotency_key_creates_one_session(store: TestStore) -> TestResult {
    const RETRIES: usize = 16;
    let mut handles: Handles<forkd_core::SessionId> = Vec::new();
    for _ in 0..RETRIES {
        let store = store.shared();
        let session = session()?;
        handles.push(tokio::spawn(async move {
            let record = IdempotencyRecord {
                tenant: "local".into(),
                key: "the-key".into(),
                kind: IdempotentCall::CreateSession,
                request_sha256: "same".into(),
                resource_id: session.id.to_string(),
                created_at_ms: 1,
            };
            store.create_session(&session, &[], Some(&record)).await?;
            Ok(session.id)
        }));
    }
    let outcomes = join_all(handles).await?;
    let created: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
    assert_eq!(created.len(), 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(_) | Err(StoreError::Conflict(_)))),
        "{outcomes:?}"
    );
    let key = store
        .idempotency_key("local", "the-key")
        .await?
        .ok_or("key missing")?;
    assert_eq!(key.resource_id, created[0].to_string());
    let sessions = store.list_sessions(None, None, 0).await?;
    assert_eq!(
        sessions.iter().map(|s| s.id).collect::<Vec<_>>(),
        [*created[0]]
    );
    Ok(())
}

/// Runs claim one agent at once: each gets a generation of its own, and only the newest lease
/// may write.
async fn concurrent_claims_each_get_their_own_generation(store: TestStore) -> TestResult {
    const CLAIMS: usize = 16;
    let (_, fx) = seeded(&*store, 1).await?;
    let id = fx.children[0].agent.id;
    let mut handles: Handles<forkd_store::Lease> = Vec::new();
    for _ in 0..CLAIMS {
        let store = store.shared();
        handles.push(tokio::spawn(async move { store.claim_agent(id).await }));
    }
    let mut leases = Vec::new();
    for outcome in join_all(handles).await? {
        leases.push(outcome?);
    }
    let generations: BTreeSet<u64> = leases.iter().map(|l| l.generation).collect();
    assert_eq!(generations, (1..=u64::try_from(CLAIMS)?).collect());
    leases.sort_by_key(|l| l.generation);
    let m = Message::user(vec![Block::text("mine")]);
    for old in &leases[..CLAIMS - 1] {
        let refused = store.append_agent_message(old, &m).await;
        assert!(
            matches!(refused, Err(StoreError::Superseded { .. })),
            "{refused:?}"
        );
    }
    let newest = leases.last().ok_or("no lease")?;
    assert_eq!(store.append_agent_message(newest, &m).await?, 0);
    Ok(())
}

/// Model forks race at one fork point: the first stores its batch, every other finds the
/// transcript moved on (`Conflict`) and stores nothing.
async fn forks_racing_at_one_point_store_one_batch(store: TestStore) -> TestResult {
    const FORKS: usize = 8;
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let mut handles: Handles<forkd_core::BatchId> = Vec::new();
    for _ in 0..FORKS {
        let store = store.shared();
        let fx = fork(&session, 4, 2)?;
        handles.push(tokio::spawn(async move {
            store
                .create_fork_batch(
                    &fx.batch,
                    std::slice::from_ref(&fx.parent_results),
                    &fx.children,
                    &BatchExtras::default(),
                )
                .await?;
            Ok(fx.batch.id)
        }));
    }
    let outcomes = join_all(handles).await?;
    let stored: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
    assert_eq!(stored.len(), 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(_) | Err(StoreError::Conflict(_)))),
        "{outcomes:?}"
    );
    assert_eq!(store.session_message_count(session.id).await?, 6);
    let agents = store
        .list_agents(&forkd_store::AgentFilter {
            include_ended: true,
            ..forkd_store::AgentFilter::default()
        })
        .await?;
    assert_eq!(agents.len(), 2);
    assert!(agents.iter().all(|a| a.batch_id == Some(*stored[0])));
    Ok(())
}

/// A run keeps writing while a newer run claims its agent: once the claim returns, the older run
/// has written its last message. The newer run reads the transcript right after its claim, and
/// no write of the older run lands after that read.
async fn a_claim_fences_the_older_runs_writes_in_flight(store: TestStore) -> TestResult {
    const ROUNDS: usize = 6;
    let (_, fx) = seeded(&*store, ROUNDS).await?;
    for child in &fx.children {
        let id = child.agent.id;
        let old = store.claim_agent(id).await?;
        let writer = {
            let store = store.shared();
            tokio::spawn(async move {
                let mut written = 0_usize;
                loop {
                    let m = Message::assistant(vec![Block::text(&format!("old {written}"))]);
                    match store.append_agent_message(&old, &m).await {
                        Ok(_) => written += 1,
                        Err(StoreError::Superseded { .. }) => return Ok(written),
                        Err(e) => return Err(e),
                    }
                }
            })
        };
        // Let the older run get going, then claim in the middle of its writes.
        while store.agent_messages(id).await?.len() < 3 {
            tokio::task::yield_now().await;
        }
        let newer = store.claim_agent(id).await?;
        let seen_at_claim = store.agent_messages(id).await?.len();
        let written = writer.await??;
        assert_eq!(
            written, seen_at_claim,
            "a write of the older run landed after the newer run's claim"
        );
        store.release_agent(&newer, AgentState::Running).await?;
    }
    Ok(())
}
