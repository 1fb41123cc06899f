//! What survives a restart, and what many concurrent writers, and two stores on one database, do
//! to it.

mod support;

use forkd_core::{AgentState, Block, Message, NotificationStatus};
use forkd_store::{AgentFilter, Durability, NotificationFilter, SqliteStore, Store, StoreError};
use sqlx::Connection;
use support::{TestResult, TestStore, conformance, db_path, ended, finish, seeded};

conformance!(
    a_reopened_store_keeps_everything,
    many_concurrent_writers_never_see_busy,
    two_stores_on_one_database_write_at_once,
    a_newer_claim_fences_the_older_run_across_stores,
);

/// Everything a daemon needs after a restart — sessions, transcripts, batches, agents, their
/// transcripts and the notification log — read by another store on the same database, and the
/// notification seq going on from where it stood.
async fn a_reopened_store_keeps_everything(store: TestStore) -> TestResult {
    let (session, fx) = seeded(&*store, 3).await?;
    let child = &fx.children[0].agent;
    let lease = store.claim_agent(child.id).await?;
    store
        .append_agent_message(
            &lease,
            &Message::assistant(vec![Block::text("working — ✓")]),
        )
        .await?;
    let n = finish(
        &*store,
        &ended(&fx.children[1].agent, NotificationStatus::Completed, 9),
        None,
    )
    .await?;
    let everything = AgentFilter {
        include_ended: true,
        ..AgentFilter::default()
    };
    let agents = store.list_agents(&everything).await?;

    // The same daemon, connected again (a daemon that starts anew is another daemon: it takes
    // the agents over once their leases expire, see `leases.rs`).
    let reopened = store.reopen_as(store.holder()).await?;
    assert_eq!(
        reopened.get_session(session.id).await?,
        Some(session.clone())
    );
    assert_eq!(
        reopened.session_messages(session.id, None).await?,
        store.session_messages(session.id, None).await?
    );
    assert_eq!(
        reopened.get_batch(fx.batch.id).await?,
        Some(fx.batch.clone())
    );
    assert_eq!(reopened.list_agents(&everything).await?, agents);
    assert_eq!(
        reopened.agent_messages(child.id).await?,
        store.agent_messages(child.id).await?
    );
    assert_eq!(
        reopened
            .notifications(0, &NotificationFilter::default(), 0)
            .await?,
        vec![n.clone()]
    );
    assert_eq!(reopened.last_notification_seq().await?, n.seq);
    let next = finish(
        &*reopened,
        &ended(&fx.children[2].agent, NotificationStatus::Killed, 10),
        None,
    )
    .await?;
    assert_eq!(next.seq, n.seq + 1);
    Ok(())
}

/// SQLite only: what survives a restart under each durability, the daemon killed (no close, no
/// checkpoint) or closed in order, and the file sound and in WAL mode afterwards.
#[tokio::test]
async fn a_reopened_database_keeps_everything() -> TestResult {
    for durability in [Durability::Normal, Durability::Full] {
        let dir = tempfile::tempdir()?;
        let path = db_path(&dir);
        let store = SqliteStore::open(&path, durability).await?;
        let (session, fx) = seeded(&store, 3).await?;
        let child = &fx.children[0].agent;
        let lease = store.claim_agent(child.id).await?;
        store
            .append_agent_message(
                &lease,
                &Message::assistant(vec![Block::text("working — ✓")]),
            )
            .await?;
        let n = finish(
            &store,
            &ended(&fx.children[1].agent, NotificationStatus::Completed, 9),
            None,
        )
        .await?;
        let transcript = store.session_messages(session.id, None).await?;
        let agents = store
            .list_agents(&AgentFilter {
                include_ended: true,
                ..AgentFilter::default()
            })
            .await?;
        let child_transcript = store.agent_messages(child.id).await?;
        // A plain drop, as when the daemon is killed: no close, no checkpoint.
        drop(store);

        let store = SqliteStore::open(&path, durability).await?;
        assert_eq!(store.get_session(session.id).await?, Some(session.clone()));
        assert_eq!(store.session_messages(session.id, None).await?, transcript);
        assert_eq!(store.get_batch(fx.batch.id).await?, Some(fx.batch.clone()));
        let reopened = store
            .list_agents(&AgentFilter {
                include_ended: true,
                ..AgentFilter::default()
            })
            .await?;
        assert_eq!(reopened, agents);
        assert_eq!(reopened[0].state, AgentState::Running);
        assert_eq!(store.agent_messages(child.id).await?, child_transcript);
        assert_eq!(
            store
                .notifications(0, &NotificationFilter::default(), 0)
                .await?,
            vec![n.clone()]
        );
        assert_eq!(store.last_notification_seq().await?, n.seq);
        store.integrity_check().await?;

        // An orderly close, then a third open: the seq after a restart still goes up.
        store.close().await;
        let store = SqliteStore::open(&path, durability).await?;
        let next = finish(
            &store,
            &ended(&fx.children[2].agent, NotificationStatus::Killed, 10),
            None,
        )
        .await?;
        assert!(next.seq > n.seq);
        store.close().await;

        // An independent connection agrees that the file is sound and in WAL mode.
        let url = format!("sqlite://{}", path.display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await?;
        let check: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut conn)
            .await?;
        assert_eq!(check, "ok");
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut conn)
            .await?;
        assert_eq!(mode, "wal");
        conn.close().await?;
    }
    Ok(())
}

/// 50 tasks appending at once (each to its own agent and to a shared one) all succeed, and the
/// shared transcript's seqs come out as exactly 0..50: writes queue, none fails (with
/// SQLITE_BUSY, or on PostgreSQL with a duplicate seq or a deadlock).
async fn many_concurrent_writers_never_see_busy(store: TestStore) -> TestResult {
    const TASKS: usize = 50;
    // One more child than tasks: the last one's transcript is the one they all append to.
    let (session, fx) = seeded(&*store, TASKS + 1).await?;
    let shared = fx.children[TASKS].agent.id;
    let shared_lease = store.claim_agent(shared).await?;

    let mut handles = Vec::new();
    for (i, child) in fx.children[..TASKS].iter().enumerate() {
        let store = store.shared();
        let own = child.agent.id;
        handles.push(tokio::spawn(async move {
            let text = format!("message {i}");
            let seq = store
                .append_agent_message(&shared_lease, &Message::user(vec![Block::text(&text)]))
                .await?;
            let own_lease = store.claim_agent(own).await?;
            store
                .append_agent_message(&own_lease, &Message::assistant(vec![Block::text(&text)]))
                .await?;
            store.release_agent(&own_lease, AgentState::Running).await?;
            // Reads interleave with the writes and never block on them.
            store.session_messages(session.id, None).await?;
            Ok::<u64, forkd_store::StoreError>(seq)
        }));
    }
    let mut seqs = Vec::new();
    for handle in handles {
        seqs.push(handle.await??);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (0..50).collect::<Vec<u64>>());
    assert_eq!(store.agent_messages(shared).await?.len(), TASKS);
    let live = store.list_agents(&AgentFilter::default()).await?;
    let running = live
        .iter()
        .filter(|a| a.state == AgentState::Running)
        .count();
    // Every task's own agent, and the shared one they all appended to.
    assert_eq!(running, TASKS + 1);
    store.check_integrity().await?;
    Ok(())
}

/// Two stores on one database (two daemons, or the daemon and a CLI) write at the same time: on
/// SQLite the second writer waits on the busy timeout instead of failing, thanks to
/// `BEGIN IMMEDIATE`; on PostgreSQL each waits for the row locks it needs.
async fn two_stores_on_one_database_write_at_once(store: TestStore) -> TestResult {
    let one = store.shared();
    let two = store.reopen().await?;
    // Each daemon runs the children it created (see `leases.rs`).
    let (_, fx) = seeded(&*one, 2).await?;
    let (_, theirs) = seeded(&*two, 1).await?;
    let [a, c] = [0, 1].map(|i| fx.children[i].agent.id);
    let b = theirs.children[0].agent.id;

    let write = |store: std::sync::Arc<dyn Store>, id| {
        tokio::spawn(async move {
            let lease = store.claim_agent(id).await?;
            for i in 0..100 {
                let m = Message::user(vec![Block::text(&format!("{i}"))]);
                store.append_agent_message(&lease, &m).await?;
                // Read-then-write inside one transaction: the case that fails with
                // SQLITE_BUSY_SNAPSHOT under a deferred BEGIN.
                store.release_agent(&lease, AgentState::Running).await?;
            }
            Ok::<_, forkd_store::StoreError>(())
        })
    };
    let (r1, r2, r3) = tokio::join!(
        write(one.clone(), a),
        write(two.clone(), b),
        write(one.clone(), c)
    );
    r1??;
    r2??;
    r3??;
    for id in [a, b, c] {
        assert_eq!(two.agent_messages(id).await?.len(), 100);
    }
    store.check_integrity().await?;
    Ok(())
}

/// Two runs of one agent in two processes (two stores on one database): once the first one's
/// lease has expired (it stopped renewing: hung, or cut off from the database), the second
/// claims the agent, and the newer claim fences the older run, whose writes are all refused from
/// then on, so the transcript is never interleaved.
async fn a_newer_claim_fences_the_older_run_across_stores(store: TestStore) -> TestResult {
    let lease = std::time::Duration::from_millis(100);
    let one = store.daemon_with_lease(lease).await?;
    let (_, fx) = seeded(&*one, 1).await?;
    let child = &fx.children[0].agent;
    let m = |text: &str| Message::assistant(vec![Block::text(text)]);

    let old = one.claim_agent(child.id).await?;
    one.append_agent_message(&old, &m("old run, turn 1"))
        .await?;
    tokio::time::sleep(3 * lease).await;
    let two = store.reopen().await?;
    let new = two.claim_agent(child.id).await?;
    assert!(new.generation > old.generation);

    let superseded = |r: Result<(), StoreError>| {
        matches!(r, Err(StoreError::Superseded { held, current, .. })
            if held == old.generation && current == new.generation)
    };
    assert!(superseded(
        one.append_agent_message(&old, &m("old run, turn 2"))
            .await
            .map(|_| ())
    ));
    let call = forkd_store::ToolCall {
        agent_id: child.id,
        tool_use_id: "t1".into(),
        name: "Bash".into(),
        input_json: "{}".into(),
        read_only: false,
        result: None,
        full_output: None,
        started_at_ms: 1,
        finished_at_ms: None,
        process: None,
    };
    assert!(superseded(one.begin_tool_call(&old, &call).await));
    let group = forkd_store::ProcessGroup {
        pgid: 4242,
        start_ticks: 7,
        boot_id: "boot".into(),
    };
    assert!(superseded(
        one.record_tool_process(&old, "t1", &group).await
    ));
    assert!(superseded(
        one.release_agent(&old, AgentState::Pending).await
    ));
    let n = ended(child, NotificationStatus::Completed, 5);
    assert!(superseded(
        one.finish_agent(&old, &n, None).await.map(|_| ())
    ));

    two.append_agent_message(&new, &m("new run")).await?;
    two.finish_agent(&new, &n, None).await?;
    let texts: Vec<String> = one
        .agent_messages(child.id)
        .await?
        .into_iter()
        .map(|s| s.message.text())
        .collect();
    assert_eq!(texts, ["old run, turn 1", "new run"]);
    // An ended agent cannot be claimed again.
    assert!(matches!(
        one.claim_agent(child.id).await,
        Err(StoreError::Conflict(_))
    ));
    Ok(())
}
