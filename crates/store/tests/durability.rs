//! What survives a restart, and what many concurrent writers do to the database.

mod support;

use std::sync::Arc;

use forkd_core::{AgentState, Block, Message, NotificationStatus};
use forkd_store::{AgentFilter, Durability, NotificationFilter, SqliteStore, Store};
use sqlx::Connection;
use support::{TestResult, db_path, ended, seeded, temp_store};

/// Everything a daemon needs after a restart: sessions, transcripts, batches, agents, their
/// transcripts and the notification log.
#[tokio::test]
async fn a_reopened_database_keeps_everything() -> TestResult {
    for durability in [Durability::Normal, Durability::Full] {
        let dir = tempfile::tempdir()?;
        let path = db_path(&dir);
        let store = SqliteStore::open(&path, durability).await?;
        let (session, fx) = seeded(&store, 3).await?;
        let child = &fx.children[0].agent;
        store
            .set_agent_state(child.id, AgentState::Running, None)
            .await?;
        store
            .append_agent_message(
                child.id,
                &Message::assistant(vec![Block::text("working — ✓")]),
            )
            .await?;
        let n = store
            .finish_agent(
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
        let next = store
            .finish_agent(
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
/// shared transcript's seqs come out as exactly 0..50: writes queue, none fails with SQLITE_BUSY.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn many_concurrent_writers_never_see_busy() -> TestResult {
    const TASKS: usize = 50;
    let (_dir, store) = temp_store().await?;
    // One more child than tasks: the last one's transcript is the one they all append to.
    let (session, fx) = seeded(&store, TASKS + 1).await?;
    let shared = fx.children[TASKS].agent.id;
    let store = Arc::new(store);

    let mut handles = Vec::new();
    for (i, child) in fx.children[..TASKS].iter().enumerate() {
        let store = Arc::clone(&store);
        let own = child.agent.id;
        handles.push(tokio::spawn(async move {
            let text = format!("message {i}");
            let seq = store
                .append_agent_message(shared, &Message::user(vec![Block::text(&text)]))
                .await?;
            store
                .append_agent_message(own, &Message::assistant(vec![Block::text(&text)]))
                .await?;
            store
                .set_agent_state(own, AgentState::Running, None)
                .await?;
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
    assert_eq!(running, TASKS);
    store.integrity_check().await?;
    Ok(())
}

/// Two stores on one file (two daemons, or the daemon and a CLI) write at the same time: the
/// second writer waits on the busy timeout instead of failing, thanks to `BEGIN IMMEDIATE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_share_the_write_lock() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    let one = SqliteStore::open(&path, Durability::Normal).await?;
    let two = SqliteStore::open(&path, Durability::Normal).await?;
    let (_, fx) = seeded(&one, 2).await?;
    let (a, b) = (fx.children[0].agent.id, fx.children[1].agent.id);

    let write = |store: SqliteStore, id| {
        tokio::spawn(async move {
            for i in 0..100 {
                let m = Message::user(vec![Block::text(&format!("{i}"))]);
                store.append_agent_message(id, &m).await?;
                // Read-then-write inside one transaction: the case that fails with
                // SQLITE_BUSY_SNAPSHOT under a deferred BEGIN.
                store.set_agent_state(id, AgentState::Running, None).await?;
            }
            Ok::<_, forkd_store::StoreError>(())
        })
    };
    let (r1, r2, r3) = tokio::join!(
        write(one.clone(), a),
        write(two.clone(), b),
        write(two.clone(), a)
    );
    r1??;
    r2??;
    r3??;
    assert_eq!(one.agent_messages(a).await?.len(), 200);
    assert_eq!(two.agent_messages(b).await?.len(), 100);
    one.integrity_check().await?;
    Ok(())
}
