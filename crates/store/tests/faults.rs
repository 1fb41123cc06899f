//! A full disk, injected with SQLite's `max_page_count` ([`forkd_store::PageLimit`]): every write
//! path runs into it and fails with `DiskFull`, stores nothing of itself, and succeeds on the same
//! store (no reopen) once the space is given back. The connection a failed write used must not
//! stay inside its transaction: before the fix, every later write failed ("attempted to call
//! begin_with at non-zero transaction depth") until the daemon restarted.

mod support;

use forkd_core::{Block, Message, NotificationStatus};
use forkd_store::{SqliteStore, Store, StoreError, ToolCall};
use support::{TestResult, client_fork, ended, history, main_loop, seeded, session, temp_store};

/// Text big enough to need new pages (64 of SQLite's 4 KiB pages).
fn bulky(what: &str) -> String {
    format!("{what}: {}", "x".repeat(256 * 1024))
}

/// Caps the database at its size now: the next write that needs a new page fails.
async fn fill(store: &SqliteStore) -> TestResult {
    let pages = store.page_count().await?;
    store.page_limit().set(pages);
    Ok(())
}

/// `outcome` is the disk-full error, saying how much space is left and where.
fn assert_disk_full<T: std::fmt::Debug>(what: &str, outcome: Result<T, StoreError>) {
    match outcome {
        Err(e @ StoreError::DiskFull { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("forkd's database is out of disk space (")
                    && msg.contains("free on the filesystem holding")
                    && msg.contains("forkd.db"),
                "{what}: {msg}"
            );
        }
        other => panic!("{what}: expected DiskFull, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_path_fails_cleanly_on_a_full_disk_and_works_once_space_returns() -> TestResult
{
    let (_dir, store) = temp_store().await?;
    let (session, fx) = seeded(&store, 2).await?;
    let parent = main_loop(&session);
    store.insert_agent(&parent, None, None).await?;
    let parent_lease = store.claim_agent(parent.id).await?;
    let child = &fx.children[0].agent;
    let child_lease = store.claim_agent(child.id).await?;
    let transcript = store.session_messages(session.id, None).await?;
    let call = ToolCall {
        agent_id: child.id,
        tool_use_id: "toolu_big".into(),
        name: "Read".into(),
        input_json: r#"{"file_path":"big.txt"}"#.into(),
        read_only: true,
        result: None,
        full_output: None,
        started_at_ms: 15,
        finished_at_ms: None,
        process: None,
    };
    store.begin_tool_call(&child_lease, &call).await?;

    // Each write path, once into the full disk and once after the space came back.
    fill(&store).await?;
    let big_session = {
        let mut s = support::session()?;
        s.id = forkd_core::SessionId::new();
        s
    };
    let big_history = vec![Message::user(vec![Block::text(&bulky("a new session"))])];
    assert_disk_full(
        "create session",
        store.create_session(&big_session, &big_history, None).await,
    );
    let turn = [Message::user(vec![Block::text(&bulky("a message"))])];
    assert_disk_full(
        "send message",
        store
            .append_turn(&parent_lease, session.id, &turn, &[], None, 10)
            .await,
    );
    let mut batch = client_fork(&session, u64::try_from(transcript.len())?, 3)?;
    batch.children[0].directive_block = Block::text(&bulky("a directive"));
    let extras = forkd_store::BatchExtras::default();
    assert_disk_full(
        "fork batch",
        store
            .create_fork_batch(
                &batch.batch,
                std::slice::from_ref(&batch.parent_results),
                &batch.children,
                &extras,
            )
            .await,
    );
    let result = Block::tool_result("toolu_big", &bulky("a tool's result"), false);
    assert_disk_full(
        "tool call",
        store
            .finish_tool_call(&child_lease, "toolu_big", &result, None, 16)
            .await,
    );
    let reply = Message::assistant(vec![Block::text(&bulky("an agent's reply"))]);
    assert_disk_full(
        "append",
        store.append_agent_message(&child_lease, &reply).await,
    );
    let mut notification = ended(child, NotificationStatus::Completed, 20);
    notification.report.result = bulky("a report");
    assert_disk_full(
        "notification",
        store.finish_agent(&child_lease, &notification, None).await,
    );
    assert_disk_full("probe", store.probe_write().await);
    assert!(
        store
            .fault()
            .is_some_and(|f| f.contains("out of disk space")),
        "the store holds the fault until a probe succeeds"
    );

    // Nothing of the failed writes was stored, and reads still work.
    assert_eq!(store.get_session(big_session.id).await?, None);
    assert_eq!(store.session_messages(session.id, None).await?, transcript);
    assert_eq!(store.get_batch(batch.batch.id).await?, None);
    assert!(store.agent_messages(child.id).await?.is_empty());
    assert!(
        store
            .notifications(0, &Default::default(), 0)
            .await?
            .is_empty()
    );

    // The leases are still this store's: renewing them, and claiming an agent again, rewrite
    // rows in place, which a full SQLite file allows (a full filesystem refuses them too, at the
    // WAL, and they fail as the others do).
    store.renew_leases().await?;
    let child_lease = store.claim_agent(child.id).await?;
    assert!(
        store.fault().is_some(),
        "a write that grew nothing clears no fault"
    );

    // Space returns: the same writes succeed on the same store.
    store.page_limit().lift();
    store.probe_write().await?;
    assert_eq!(store.fault(), None);
    store
        .finish_tool_call(&child_lease, "toolu_big", &result, None, 16)
        .await?;
    store
        .create_session(&big_session, &big_history, None)
        .await?;
    store
        .append_turn(&parent_lease, session.id, &turn, &[], None, 10)
        .await?;
    store
        .create_fork_batch(
            &batch.batch,
            std::slice::from_ref(&batch.parent_results),
            &batch.children,
            &extras,
        )
        .await?;
    store.append_agent_message(&child_lease, &reply).await?;
    let n = store
        .finish_agent(&child_lease, &notification, None)
        .await?;
    assert_eq!(n.seq, 1);
    let now = store.session_messages(session.id, None).await?;
    assert_eq!(now[..transcript.len()], transcript[..]);
    assert_eq!(now[transcript.len()].message, turn[0]);
    store.integrity_check().await?;
    Ok(())
}

/// Many writes into a full disk, then one after: no failure leaves the writer unusable, whether
/// SQLite rolled the transaction back by itself or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_never_poison_the_writer() -> TestResult {
    let (_dir, store) = temp_store().await?;
    store.create_session(&session()?, &history()?, None).await?;
    fill(&store).await?;
    for i in 0..20 {
        let mut s = session()?;
        s.id = forkd_core::SessionId::new();
        let first = vec![Message::user(vec![Block::text(&bulky(&format!("{i}")))])];
        assert_disk_full(
            "create session",
            store.create_session(&s, &first, None).await,
        );
    }
    store.page_limit().lift();
    let s = session()?;
    let s = forkd_core::session::Session {
        id: forkd_core::SessionId::new(),
        ..s
    };
    store.create_session(&s, &history()?, None).await?;
    assert!(store.get_session(s.id).await?.is_some());
    Ok(())
}
