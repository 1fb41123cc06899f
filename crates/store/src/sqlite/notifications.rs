//! Task notifications: ending an agent, and reading the notification log.

use forkd_core::{AgentKind, Block, Message, Notification, NotificationKind, NotificationStatus};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqlitePool};

use super::agents;
use super::convert::{
    UsageRow, conflict_if_duplicate, corrupt, from_i64, insert_session_message, limit_param,
    opt_id, parse_id, session_len,
};
use crate::StoreError;
use crate::error::Result;
use crate::{DbError, Lease, NewNotification, NotificationFilter};
use forkd_core::{AgentId, BatchId, ReportTo};

#[derive(sqlx::FromRow)]
struct NotificationRow {
    seq: i64,
    session_id: String,
    batch_id: Option<String>,
    agent_id: String,
    kind: String,
    status: String,
    summary: String,
    report_json: String,
    #[sqlx(flatten)]
    usage: UsageRow,
    cost_usd: f64,
    created_at_ms: i64,
}

impl TryFrom<NotificationRow> for Notification {
    type Error = DbError;

    fn try_from(row: NotificationRow) -> Result<Self> {
        Ok(Notification {
            seq: from_i64(row.seq, "notification seq")?,
            session_id: parse_id(&row.session_id, "notification session id")?,
            batch_id: row
                .batch_id
                .as_deref()
                .map(|b| parse_id(b, "notification batch id"))
                .transpose()?,
            agent_id: parse_id(&row.agent_id, "notification agent id")?,
            kind: NotificationKind::parse(&row.kind)
                .ok_or_else(|| corrupt("notification kind", format!("unknown {:?}", row.kind)))?,
            status: NotificationStatus::parse(&row.status).ok_or_else(|| {
                corrupt("notification status", format!("unknown {:?}", row.status))
            })?,
            summary: row.summary,
            report: serde_json::from_str(&row.report_json)
                .map_err(|e| corrupt("notification report", e))?,
            usage: row.usage.into_usage()?,
            cost_usd: row.cost_usd,
            created_at_ms: row.created_at_ms,
        })
    }
}

#[derive(sqlx::FromRow)]
struct Owner {
    session_id: String,
    batch_id: Option<String>,
    kind: String,
    report_to: String,
}

macro_rules! notification_columns {
    () => {
        "seq, session_id, batch_id, agent_id, kind, status, summary, report_json, input_tokens, \
         cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd, \
         created_at_ms"
    };
}

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
    let kind = AgentKind::parse(&owner.kind)
        .map(NotificationKind::of)
        .ok_or_else(|| corrupt("agent kind", format!("unknown {:?}", owner.kind)))?;
    if kind == NotificationKind::Turn {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "agent {agent_id} is a session's main loop, which never ends; its turns end with \
             end_turn"
        ))));
    }
    let session_id = n.session_id.to_string();
    let batch_id = opt_id(n.batch_id);
    if owner.session_id != session_id || owner.batch_id != batch_id {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "notification for agent {agent_id} names session {session_id} and batch {batch_id:?}; \
             the agent belongs to session {} and batch {:?}",
            owner.session_id, owner.batch_id
        ))));
    }

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
    if kind.as_deref() != Some(AgentKind::Parent.as_str()) {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "agent {agent_id} is not a session's main loop; only those have turns"
        ))));
    }
    agents::release(conn, lease, forkd_core::AgentState::Idle).await?;
    let Some(n) = n else {
        return Ok(None);
    };
    if n.agent_id != lease.agent_id {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "a turn notification for agent {} under a lease on agent {agent_id}",
            n.agent_id
        ))));
    }
    Ok(Some(insert(conn, n, NotificationKind::Turn).await?))
}

/// Stores a notification with the next sequence number.
async fn insert(
    conn: &mut SqliteConnection,
    n: &NewNotification,
    kind: NotificationKind,
) -> Result<Notification> {
    let agent_id = n.agent_id.to_string();
    let session_id = n.session_id.to_string();
    let batch_id = opt_id(n.batch_id);
    let report_json = serde_json::to_string(&n.report).map_err(|e| {
        DbError::Database(sqlx::Error::Encode(
            format!("notification report: {e}").into(),
        ))
    })?;
    let usage = UsageRow::from_usage(&n.usage)?;
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO notifications (session_id, batch_id, agent_id, kind, status, summary, \
         report_json, input_tokens, cache_creation_input_tokens, cache_read_input_tokens, \
         output_tokens, cost_usd, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         RETURNING seq",
    )
    .bind(&session_id)
    .bind(&batch_id)
    .bind(&agent_id)
    .bind(kind.as_str())
    .bind(n.status.as_str())
    .bind(&n.summary)
    .bind(report_json)
    .bind(usage.input_tokens)
    .bind(usage.cache_creation_input_tokens)
    .bind(usage.cache_read_input_tokens)
    .bind(usage.output_tokens)
    .bind(n.cost_usd)
    .bind(n.created_at_ms)
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| conflict_if_duplicate(e, || format!("agent {agent_id} already notified")))?;

    Ok(Notification {
        seq: from_i64(seq, "notification seq")?,
        session_id: n.session_id,
        batch_id: n.batch_id,
        agent_id: n.agent_id,
        kind,
        status: n.status,
        summary: n.summary.clone(),
        report: n.report.clone(),
        usage: n.usage,
        cost_usd: n.cost_usd,
        created_at_ms: n.created_at_ms,
    })
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
    let next = session_len(conn, &session_id).await?;
    insert_session_message(conn, &session_id, next, &message, last.created_at_ms).await
}

/// Appends a notification's `<task-notification>` text to its session's transcript.
async fn append_to_parent(conn: &mut SqliteConnection, notification: &Notification) -> Result<()> {
    let session_id = notification.session_id.to_string();
    let message = Message::user(vec![Block::text(&notification.to_parent_text())]);
    let next = session_len(conn, &session_id).await?;
    insert_session_message(
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
    // A cursor past i64::MAX is past every seq SQLite can assign.
    q.push_bind(i64::try_from(since_seq).unwrap_or(i64::MAX));
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
    q.push(" ORDER BY seq LIMIT ").push_bind(limit_param(limit));
    let rows: Vec<NotificationRow> = q.build_query_as().fetch_all(conn).await?;
    rows.into_iter().map(Notification::try_from).collect()
}

pub(super) async fn last_seq(pool: &SqlitePool) -> Result<u64> {
    let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM notifications")
        .fetch_one(pool)
        .await?;
    from_i64(seq, "notification seq")
}
