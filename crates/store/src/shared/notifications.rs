//! Task notifications: ending an agent, and reading the notification log.

use forkd_core::{AgentId, BatchId, ReportTo};
use forkd_core::{Block, Message, Notification, NotificationKind};
use sqlx::QueryBuilder;

use super::dialect::{self, Conn, Db, FOR_UPDATE, Pool};
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
pub(crate) async fn finish_agent(
    conn: &mut Conn,
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
        sqlx::query_as("SELECT session_id, batch_id, kind, report_to FROM agents WHERE id = $1")
            .bind(&agent_id)
            .fetch_one(&mut *conn)
            .await?;
    let kind = check_owner(&owner, n)?;

    // A caller that waits for the report carries it in its own tool result. A client batch's
    // children report to the parent together: one digest, appended when the last of them ends.
    // What the report appends to is locked before it is written, in the store's lock order:
    // the batch (so that of two last children ending at once, the second counts after the first
    // committed), then the session (before its transcript's length is read), then the counter.
    let to_transcript = ReportTo::parse(&owner.report_to) != Some(ReportTo::Caller);
    let digest = match n.batch_id {
        Some(batch) if to_transcript && lock_batch(conn, batch).await? == "client" => Some(batch),
        _ => None,
    };
    let session_id = n.session_id.to_string();
    if to_transcript && digest.is_none() {
        sessions::lock(conn, &session_id).await?;
    }

    agents::update_state(
        conn,
        &agent_id,
        n.status.agent_state(),
        error,
        n.created_at_ms,
    )
    .await?;
    let last = match digest {
        Some(batch) => no_live_children(conn, batch).await?,
        None => false,
    };
    if last {
        sessions::lock(conn, &session_id).await?;
    }
    let notification = insert(conn, n, kind).await?;
    match digest {
        Some(batch) if last => append_digest(conn, batch, &notification).await?,
        Some(_) => {}
        None if to_transcript => append_to_parent(conn, &notification).await?,
        None => {}
    }
    Ok(notification)
}

/// Runs inside the caller's write transaction: the main loop's turn ends — the agent goes idle,
/// its lease checked — and a turn handed to the background stores its notification of kind
/// `turn`. Nothing is appended to the transcript: the turn's reply is in it already.
pub(crate) async fn end_turn(
    conn: &mut Conn,
    lease: &Lease,
    n: Option<&NewNotification>,
) -> Result<Option<Notification>> {
    let agent_id = lease.agent_id.to_string();
    let kind: Option<String> = sqlx::query_scalar("SELECT kind FROM agents WHERE id = $1")
        .bind(&agent_id)
        .fetch_optional(&mut *conn)
        .await?;
    check_main_loop(kind.as_deref(), lease)?;
    agents::release(conn, lease, forkd_core::AgentState::Idle).await?;
    // A cancel asked of the turn (through another daemon) ends with it.
    sqlx::query("UPDATE agents SET kill_requested = FALSE WHERE id = $1")
        .bind(&agent_id)
        .execute(&mut *conn)
        .await?;
    let Some(n) = n else {
        return Ok(None);
    };
    check_turn_notification(n, lease)?;
    Ok(Some(insert(conn, n, NotificationKind::Turn).await?))
}

/// The channel on which every stored notification wakes the daemons that `LISTEN`.
pub(crate) const CHANNEL: &str = "forkd_notifications";

/// Stores a notification with the next sequence number (see `dialect::next_notification_seq`).
async fn insert(
    conn: &mut Conn,
    n: &NewNotification,
    kind: NotificationKind,
) -> Result<Notification> {
    let values = NotificationValues::new(n, kind)?;
    let seq = dialect::next_notification_seq(conn).await?;
    // The tenant's own counter, taken after the daemon's (one lock order: see `postgres.rs`).
    let tenant: String = sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = $1")
        .bind(&values.session_id)
        .fetch_one(&mut *conn)
        .await?;
    let tenant_seq: i64 = sqlx::query_scalar(
        "INSERT INTO tenant_notification_seqs (tenant, last) VALUES ($1, 1) \
         ON CONFLICT (tenant) DO UPDATE SET last = tenant_notification_seqs.last + 1 \
         RETURNING last",
    )
    .bind(&tenant)
    .fetch_one(&mut *conn)
    .await?;
    // The schedule its batch was forked by, copied from the batch ($2 is the batch's id).
    let (seq, schedule): (i64, Option<String>) = bind_notification!(
        sqlx::query_as(concat!(
            "INSERT INTO notifications (",
            new_notification_columns!(),
            ", seq, tenant, tenant_seq, schedule) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
             $10, $11, $12, $13, $14, $15, $16, (SELECT schedule FROM batches WHERE id = $2)) \
             RETURNING seq, schedule"
        )),
        &values
    )
    .bind(seq)
    .bind(&tenant)
    .bind(tenant_seq)
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| conflict_if_duplicate(e, || values.duplicate()))?;
    let notification = stored(n, kind, (seq, tenant_seq), schedule)?;
    // The webhooks' outbox, in the notification's own transaction: both commit or neither.
    super::webhooks::enqueue(conn, &notification, &tenant).await?;
    // A wake-up, not the row.
    dialect::notify(conn, CHANNEL, "").await?;
    Ok(notification)
}

/// Locks a batch's row until the transaction ends and reads its shape.
async fn lock_batch(conn: &mut Conn, batch: BatchId) -> Result<String> {
    Ok(sqlx::query_scalar(super::sql(format!(
        "SELECT shape FROM batches WHERE id = $1{FOR_UPDATE}"
    )))
    .bind(batch.to_string())
    .fetch_one(&mut *conn)
    .await?)
}

/// Whether no child of a client's batch is live any more. The caller holds the batch's lock, so
/// a sibling ending at the same time counts after this transaction commits, and sees it ended.
async fn no_live_children(conn: &mut Conn, batch: BatchId) -> Result<bool> {
    let live: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM agents WHERE batch_id = $1 AND state IN ('pending', 'running')",
    )
    .bind(batch.to_string())
    .fetch_one(&mut *conn)
    .await?;
    Ok(live == 0)
}

/// Appends a client batch's digest to its parent's transcript: its last child has ended. The
/// caller holds the session's lock.
async fn append_digest(conn: &mut Conn, batch: BatchId, last: &Notification) -> Result<()> {
    let filter = NotificationFilter {
        batch_id: Some(batch),
        ..NotificationFilter::default()
    };
    let all = list(&mut *conn, 0, &filter, 0).await?;
    let message = forkd_core::digest::batch_digest(batch, &all);
    let session_id = last.session_id.to_string();
    let next = sessions::len(conn, &session_id).await?;
    sessions::insert_note(conn, &session_id, next, &message, last.created_at_ms).await
}

/// Appends a notification's `<task-notification>` text to its session's transcript. The caller
/// holds the session's lock.
async fn append_to_parent(conn: &mut Conn, notification: &Notification) -> Result<()> {
    let session_id = notification.session_id.to_string();
    let message = Message::user(vec![Block::text(&notification.to_parent_text())]);
    let next = sessions::len(conn, &session_id).await?;
    sessions::insert_note(
        conn,
        &session_id,
        next,
        &message,
        notification.created_at_ms,
    )
    .await
}

pub(crate) async fn caller_reports(pool: &Pool) -> Result<Vec<AgentId>> {
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT id FROM agents WHERE report_to = 'caller' ORDER BY id")
            .fetch_all(pool)
            .await?;
    ids.iter().map(|id| parse_id(id, "agent id")).collect()
}

/// Runs inside the caller's write transaction (see `Store::redirect_reports`). Locks the agents,
/// then their sessions, each in id order, before it changes any of them.
pub(crate) async fn redirect_reports(conn: &mut Conn, agents: &[AgentId]) -> Result<usize> {
    if agents.is_empty() {
        return Ok(0);
    }
    dialect::lock_agents(conn, agents).await?;
    let ids: Vec<String> = agents.iter().map(ToString::to_string).collect();
    dialect::lock_sessions_of(conn, &ids).await?;
    let mut appended = 0;
    for key in &ids {
        let redirected = sqlx::query(
            "UPDATE agents SET report_to = 'transcript' WHERE id = $1 AND report_to = 'caller'",
        )
        .bind(key)
        .execute(&mut *conn)
        .await?;
        if redirected.rows_affected() == 0 {
            continue;
        }
        let row: Option<NotificationRow> = sqlx::query_as(concat!(
            "SELECT ",
            notification_columns!(),
            " FROM notifications WHERE agent_id = $1"
        ))
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(row) = row {
            append_to_parent(conn, &Notification::try_from(row)?).await?;
            appended += 1;
        }
    }
    Ok(appended)
}

pub(crate) async fn list<'c>(
    conn: impl sqlx::Executor<'c, Database = Db>,
    since_seq: u64,
    filter: &NotificationFilter,
    limit: u32,
) -> Result<Vec<Notification>> {
    let mut q = QueryBuilder::<Db>::new(concat!(
        "SELECT ",
        notification_columns!(),
        " FROM notifications WHERE "
    ));
    // A tenant's cursor is its own count; the daemon's feed reads by the daemon's.
    match &filter.tenant {
        Some(tenant) => q
            .push("tenant = ")
            .push_bind(tenant.name().to_owned())
            .push(" AND tenant_seq > "),
        None => q.push("seq > "),
    };
    q.push_bind(bound(since_seq));
    super::push_scope(
        &mut q,
        filter.session_id,
        filter.tenant.as_ref(),
        filter.batch_id,
    );
    if let Some(agent_id) = filter.agent_id {
        q.push(" AND agent_id = ").push_bind(agent_id.to_string());
    }
    q.push(match filter.tenant {
        Some(_) => " ORDER BY tenant_seq LIMIT ",
        None => " ORDER BY seq LIMIT ",
    })
    .push_bind(super::limit_param(limit));
    let rows: Vec<NotificationRow> = q.build_query_as().fetch_all(conn).await?;
    rows.into_iter().map(Notification::try_from).collect()
}

pub(crate) async fn last_seq(pool: &Pool) -> Result<u64> {
    let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM notifications")
        .fetch_one(pool)
        .await?;
    from_i64(seq, "notification seq")
}
