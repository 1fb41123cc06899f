//! Schema upgrades keep what was stored: a database written by the schema before migration 0014
//! (which rebuilds `agents` and `notifications`) opens with every row intact, its main loops
//! `idle`, its notifications of the right kind, and its notification sequence going on where it
//! stood (a seq is never reused, even one whose row is gone); after migration 0030, each tenant's
//! own numbers start where a client's cursor from before could stand; migration 0031 marks the
//! notes forkd appended before it, and nothing else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkd_core::store::{Lease, NotificationFilter};
use forkd_core::{AgentId, AgentKind, AgentState, NotificationKind, SessionId};
use forkd_store::{Durability, SqliteStore, Store};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// A database in a new directory with the migrations up to `version` applied, and one
/// connection to it.
async fn migrated_to(version: i64) -> (tempfile::TempDir, sqlx::SqlitePool) {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("forkd.db"))
        .create_if_missing(true)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::migrate!("../../migrations")
        .run_to(version, &pool)
        .await
        .unwrap();
    (dir, pool)
}

#[tokio::test]
async fn the_turn_lifecycle_migration_keeps_agents_and_notifications() {
    let (dir, pool) = migrated_to(13).await;
    let path = dir.path().join("forkd.db");

    let (session, parent, typed, running) = (
        SessionId::new(),
        AgentId::new(),
        AgentId::new(),
        AgentId::new(),
    );
    sqlx::query(
        "INSERT INTO sessions (id, model, system_prompt, tools_json, max_tokens, workspace, \
         coordinator, interactive, permission_mode, created_at_ms) \
         VALUES (?, 'claude-sonnet-4-5', 'Sys.', '[]', 8192, '/tmp', 0, 0, 'default', 1)",
    )
    .bind(session.to_string())
    .execute(&pool)
    .await
    .unwrap();
    for (id, kind, state) in [
        (parent, "parent", "pending"),
        (typed, "typed", "completed"),
        (running, "typed", "running"),
    ] {
        sqlx::query(
            "INSERT INTO agents (id, session_id, kind, idx, state, created_at_ms, updated_at_ms) \
             VALUES (?, ?, ?, 0, ?, 1, 1)",
        )
        .bind(id.to_string())
        .bind(session.to_string())
        .bind(kind)
        .bind(state)
        .execute(&pool)
        .await
        .unwrap();
    }
    // Two notifications; the later one's row is deleted, so the sequence stands past the last row.
    for (seq, agent) in [(1, typed), (2, running)] {
        sqlx::query(
            "INSERT INTO notifications (seq, session_id, agent_id, status, summary, report_json, \
             input_tokens, cache_creation_input_tokens, cache_read_input_tokens, output_tokens, \
             cost_usd, created_at_ms) VALUES (?, ?, ?, 'completed', 's', ?, 1, 2, 3, 4, 0.5, 1)",
        )
        .bind(seq)
        .bind(session.to_string())
        .bind(agent.to_string())
        .bind(serde_json::to_string(&forkd_core::report::Report::default()).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query("DELETE FROM notifications WHERE seq = 2")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let store = SqliteStore::open(&path, Durability::Normal).await.unwrap();
    let idle = store.get_agent(parent).await.unwrap().unwrap();
    assert_eq!(
        (idle.kind, idle.state),
        (AgentKind::Parent, AgentState::Idle)
    );
    assert_eq!(
        store.get_agent(running).await.unwrap().unwrap().state,
        AgentState::Running
    );
    let notes = store
        .notifications(0, &NotificationFilter::default(), 0)
        .await
        .unwrap();
    assert_eq!(notes.len(), 1);
    assert_eq!((notes[0].seq, notes[0].kind), (1, NotificationKind::Typed));
    // Its tenant's own number is the one its clients saw (migration 0030).
    assert_eq!(notes[0].tenant_seq, 1);
    assert_eq!(notes[0].usage.cache_read_input_tokens, 3);

    // The main loop's turns: a turn notification goes on from the sequence, past the deleted 2.
    let lease: Lease = store.claim_agent(parent).await.unwrap();
    let turn = forkd_core::store::NewNotification {
        session_id: session,
        batch_id: None,
        agent_id: parent,
        status: forkd_core::NotificationStatus::Completed,
        summary: "done".into(),
        report: forkd_core::report::Report::default(),
        usage: forkd_core::Usage::default(),
        cost_usd: 0.0,
        created_at_ms: 2,
    };
    let stored = store.end_turn(&lease, Some(&turn)).await.unwrap().unwrap();
    assert_eq!((stored.seq, stored.kind), (3, NotificationKind::Turn));
    // The tenant's numbers go on above every number given out before the upgrade (the deleted 2
    // included), so a cursor a client kept from before skips nothing.
    assert_eq!(stored.tenant_seq, 3);
    let lease = store.claim_agent(parent).await.unwrap();
    let again = store.end_turn(&lease, Some(&turn)).await.unwrap().unwrap();
    assert_eq!(
        again.seq, 4,
        "a main loop has a notification per backgrounded turn"
    );
    assert_eq!(
        store.get_agent(parent).await.unwrap().unwrap().state,
        AgentState::Idle
    );
    // Foreign keys still hold after the rebuild.
    let check = SqlitePoolOptions::new()
        .connect_with(SqliteConnectOptions::new().filename(&path))
        .await
        .unwrap();
    let problems: Vec<(String,)> = sqlx::query_as("SELECT \"table\" FROM pragma_foreign_key_check")
        .fetch_all(&check)
        .await
        .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// Migration 0031 marks the notes forkd appended before it as forkd's: user messages that begin
/// no turn and begin with one of its tags. A turn's own message is never one, whatever its text.
#[tokio::test]
async fn the_notes_migration_marks_forkd_s_notes_and_nothing_else() {
    let (dir, pool) = migrated_to(30).await;
    let path = dir.path().join("forkd.db");
    let session = SessionId::new();
    sqlx::query(
        "INSERT INTO sessions (id, model, system_prompt, tools_json, max_tokens, workspace, \
         coordinator, interactive, permission_mode, created_at_ms) \
         VALUES (?, 'claude-sonnet-4-5', 'Sys.', '[]', 8192, '/tmp', 0, 0, 'default', 1)",
    )
    .bind(session.to_string())
    .execute(&pool)
    .await
    .unwrap();
    let text = |t: &str| serde_json::json!([{"type": "text", "text": t}]).to_string();
    let rows = [
        (
            "user",
            text("<task-notification>\nthe first message"),
            false,
        ),
        ("user", text("<task-notification>\na user's turn"), true),
        ("assistant", text("ok"), false),
        (
            "user",
            text("<task-notification>\n<agent-id>a</agent-id>"),
            false,
        ),
        ("user", text("<batch-launched>\nA client forked"), false),
        (
            "user",
            text("<batch-notification>\n<batch-id>b</batch-id>"),
            false,
        ),
        (
            "user",
            text("<branch-report>\n<branch-id>c</branch-id>"),
            false,
        ),
        ("user", text("a note of no tag"), false),
    ];
    for (seq, (role, content, starts_turn)) in rows.iter().enumerate() {
        sqlx::query(
            "INSERT INTO session_messages (session_id, seq, role, content_json, created_at_ms, \
             starts_turn) VALUES (?, ?, ?, ?, 1, ?)",
        )
        .bind(session.to_string())
        .bind(i64::try_from(seq).unwrap())
        .bind(role)
        .bind(content)
        .bind(starts_turn)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let store = SqliteStore::open(&path, Durability::Normal).await.unwrap();
    let notes: Vec<bool> = store
        .session_messages(session, None)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.note)
        .collect();
    assert_eq!(
        notes,
        vec![false, false, false, true, true, true, true, false]
    );
}
