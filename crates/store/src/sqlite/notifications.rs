//! Task notifications: ending an agent, and reading the notification log.

use forkd_core::{AgentId, BatchId, ReportTo};
use forkd_core::{Block, Message, Notification, NotificationKind};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqlitePool};

use super::{agents, sessions};
use crate::StoreError;
use crate::error::Result;
use crate::rows::convert::{bound, conflict_if_duplicate, from_i64, parse_id};
use crate::rows::notifications::{
    NotificationRow, NotificationValues, Owner, bind_notification, check_main_loop, check_owner,
    check_turn_notification, new_notification_columns, notification_columns, stored,
};
use crate::{DbError, Lease, NewNotification, NotificationFilter};

/// Runs inside the caller's write transaction: the agent's end, its notification and the parent's
/// `<task-notification>` message commit together or not at all.
pub(super) async fn finish_agent(
    conn: &mut SqliteConnection,
    lease: &Lease,
    n: &NewNotification,
    error: Option<&str>,
) -> Result<Notification> {
    let agent_id = n.agent_id.to_string();
    if lease.agent_id != n.agent_id {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "notification for agent {agent_id} under a lease on agent {}",
            lease.agent_id
        ))));
    }
    agents::live_state(conn, &agent_id).await?;
    agents::check_lease(conn, lease).await?;
    let owner: Owner =
        sqlx::query_as("SELECT session_id, batch_id, kind, report_to FROM agents WHERE id = ?")
            .bind(&agent_id)
            .fetch_one(&mut *conn)
            .await?;
    let kind = check_owner(&owner, n)?;

    agents::update_state(
        conn,
        &agent_id,
        n.status.agent_state(),
        error,
        n.created_at_ms,
    )
    .await?;
    let notification = insert(conn, n, kind).await?;
    // A caller that waits for the report carries it in its own tool result. A client batch's
    // children report to the parent together: one digest, appended when the last of them ends.
    if ReportTo::parse(&owner.report_to) != Some(ReportTo::Caller) {
        match n.batch_id {
            Some(batch) if batch_shape(conn, batch).await? == "client" => {
                append_digest_if_last(conn, batch, &notification).await?;
            }
            _ => append_to_parent(conn, &notification).await?,
        }
    }
    Ok(notification)
}

/// Runs inside the caller's write transaction: the main loop's turn ends — the agent goes idle,
/// its lease checked — and a turn handed to the background stores its notification of kind
/// `turn`. Nothing is appended to the transcript: the turn's reply is in it already.
pub(super) async fn end_turn(
    conn: &mut SqliteConnection,
    lease: &Lease,
    n: Option<&NewNotification>,
) -> Result<Option<Notification>> {
    let agent_id = lease.agent_id.to_string();
    let kind: Option<String> = sqlx::query_scalar("SELECT kind FROM agents WHERE id = ?")
        .bind(&agent_id)
        .fetch_optional(&mut *conn)
        .await?;
    check_main_loop(kind.as_deref(), lease)?;
    agents::release(conn, lease, forkd_core::AgentState::Idle).await?;
    // A cancel asked of the turn (through another daemon) ends with it.
    sqlx::query("UPDATE agents SET kill_requested = 0 WHERE id = ?")
        .bind(&agent_id)
        .execute(&mut *conn)
        .await?;
    let Some(n) = n else {
        return Ok(None);
    };
    check_turn_notification(n, lease)?;
    Ok(Some(insert(conn, n, NotificationKind::Turn).await?))
}

/// Stores a notification with the next sequence number.
async fn insert(
    conn: &mut SqliteConnection,
    n: &NewNotification,
    kind: NotificationKind,
) -> Result<Notification> {
    let values = NotificationValues::new(n, kind)?;
    let seq: i64 = bind_notification!(
        sqlx::query_scalar(concat!(
            "INSERT INTO notifications (",
            new_notification_columns!(),
            ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq"
        )),
        &values
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| conflict_if_duplicate(e, || values.duplicate()))?;
    stored(n, kind, seq)
}

async fn batch_shape(conn: &mut SqliteConnection, batch: BatchId) -> Result<String> {
    Ok(sqlx::query_scalar("SELECT shape FROM batches WHERE id = ?")
        .bind(batch.to_string())
        .fetch_one(&mut *conn)
        .await?)
}

/// Appends a client batch's digest to its parent's transcript once no child of it is live.
async fn append_digest_if_last(
    conn: &mut SqliteConnection,
    batch: BatchId,
    last: &Notification,
) -> Result<()> {
    let batch_id = batch.to_string();
    let live: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM agents WHERE batch_id = ? AND state IN ('pending', 'running')",
    )
    .bind(&batch_id)
    .fetch_one(&mut *conn)
    .await?;
    if live > 0 {
        return Ok(());
    }
    let filter = NotificationFilter {
        batch_id: Some(batch),
        ..NotificationFilter::default()
    };
    let all = list(&mut *conn, 0, &filter, 0).await?;
    let message = forkd_core::digest::batch_digest(batch, &all);
    let session_id = last.session_id.to_string();
    let next = sessions::len(conn, &session_id).await?;
    sessions::insert_message(conn, &session_id, next, &message, last.created_at_ms).await
}

/// Appends a notification's `<task-notification>` text to its session's transcript.
async fn append_to_parent(conn: &mut SqliteConnection, notification: &Notification) -> Result<()> {
    let session_id = notification.session_id.to_string();
    let message = Message::user(vec![Block::text(&notification.to_parent_text())]);
    let next = sessions::len(conn, &session_id).await?;
    sessions::insert_message(
        conn,
        &session_id,
        next,
        &message,
        notification.created_at_ms,
    )
    .await
}

pub(super) async fn caller_reports(pool: &SqlitePool) -> Result<Vec<AgentId>> {
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT id FROM agents WHERE report_to = 'caller' ORDER BY id")
            .fetch_all(pool)
            .await?;
    ids.iter().map(|id| parse_id(id, "agent id")).collect()
}

/// Runs inside the caller's write transaction (see `Store::redirect_reports`).
pub(super) async fn redirect_reports(
    conn: &mut SqliteConnection,
    agents: &[AgentId],
) -> Result<usize> {
    let mut appended = 0;
    for id in agents {
        let key = id.to_string();
        let redirected = sqlx::query(
            "UPDATE agents SET report_to = 'transcript' WHERE id = ? AND report_to = 'caller'",
        )
        .bind(&key)
        .execute(&mut *conn)
        .await?;
        if redirected.rows_affected() == 0 {
            continue;
        }
        let row: Option<NotificationRow> = sqlx::query_as(concat!(
            "SELECT ",
            notification_columns!(),
            " FROM notifications WHERE agent_id = ?"
        ))
        .bind(&key)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(row) = row {
            append_to_parent(conn, &Notification::try_from(row)?).await?;
            appended += 1;
        }
    }
    Ok(appended)
}

pub(super) async fn list<'c>(
    conn: impl sqlx::SqliteExecutor<'c>,
    since_seq: u64,
    filter: &NotificationFilter,
    limit: u32,
) -> Result<Vec<Notification>> {
    let mut q = QueryBuilder::<Sqlite>::new(concat!(
        "SELECT ",
        notification_columns!(),
        " FROM notifications WHERE seq > "
    ));
    q.push_bind(bound(since_seq));
    if let Some(session_id) = filter.session_id {
        q.push(" AND session_id = ")
            .push_bind(session_id.to_string());
    }
    if let Some(tenant) = &filter.tenant {
        q.push(" AND session_id IN (SELECT id FROM sessions WHERE tenant = ")
            .push_bind(tenant.name().to_owned())
            .push(")");
    }
    if let Some(batch_id) = filter.batch_id {
        q.push(" AND batch_id = ").push_bind(batch_id.to_string());
    }
    if let Some(agent_id) = filter.agent_id {
        q.push(" AND agent_id = ").push_bind(agent_id.to_string());
    }
    q.push(" ORDER BY seq LIMIT ")
        .push_bind(super::limit_param(limit));
    let rows: Vec<NotificationRow> = q.build_query_as().fetch_all(conn).await?;
    rows.into_iter().map(Notification::try_from).collect()
}

pub(super) async fn last_seq(pool: &SqlitePool) -> Result<u64> {
    let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM notifications")
        .fetch_one(pool)
        .await?;
    from_i64(seq, "notification seq")
}
