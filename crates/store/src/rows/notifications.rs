//! Notification rows.

use forkd_core::{Notification, NotificationKind, NotificationStatus};

use super::agents::parse_kind;

use super::convert::{UsageRow, corrupt, from_i64, opt_id, parse_id};
use crate::StoreError;
use crate::error::Result;
use crate::{DbError, Lease, NewNotification};

#[derive(sqlx::FromRow)]
pub(crate) struct NotificationRow {
    seq: i64,
    tenant_seq: i64,
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
    schedule: Option<String>,
}

impl TryFrom<NotificationRow> for Notification {
    type Error = DbError;

    fn try_from(row: NotificationRow) -> Result<Self> {
        Ok(Notification {
            seq: from_i64(row.seq, "notification seq")?,
            tenant_seq: from_i64(row.tenant_seq, "notification tenant seq")?,
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
            schedule: row.schedule,
        })
    }
}

/// Who an ending agent is: what its notification must name, and where its report goes.
#[derive(sqlx::FromRow)]
pub(crate) struct Owner {
    pub session_id: String,
    pub batch_id: Option<String>,
    pub kind: String,
    pub report_to: String,
}

/// The columns [`NotificationRow`] reads.
macro_rules! notification_columns {
    () => {
        "seq, tenant_seq, session_id, batch_id, agent_id, kind, status, summary, report_json, input_tokens, \
         cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd, \
         created_at_ms, schedule"
    };
}
pub(crate) use notification_columns;

/// The columns a new notification's [`NotificationValues`] fill, in [`bind_notification!`]'s
/// order (its seq is each database's own business).
macro_rules! new_notification_columns {
    () => {
        "session_id, batch_id, agent_id, kind, status, \
     summary, report_json, input_tokens, cache_creation_input_tokens, cache_read_input_tokens, \
     output_tokens, cost_usd, created_at_ms"
    };
}
pub(crate) use new_notification_columns;

/// A new notification as its row stores it.
pub(crate) struct NotificationValues<'a> {
    pub session_id: String,
    pub batch_id: Option<String>,
    pub agent_id: String,
    pub kind: &'static str,
    pub status: &'static str,
    pub summary: &'a str,
    pub report_json: String,
    pub usage: UsageRow,
    pub cost_usd: f64,
    pub created_at_ms: i64,
}

impl<'a> NotificationValues<'a> {
    pub fn new(n: &'a NewNotification, kind: NotificationKind) -> Result<Self> {
        let report_json = serde_json::to_string(&n.report).map_err(|e| {
            DbError::Database(sqlx::Error::Encode(
                format!("notification report: {e}").into(),
            ))
        })?;
        Ok(Self {
            session_id: n.session_id.to_string(),
            batch_id: opt_id(n.batch_id),
            agent_id: n.agent_id.to_string(),
            kind: kind.as_str(),
            status: n.status.as_str(),
            summary: &n.summary,
            report_json,
            usage: UsageRow::from_usage(&n.usage)?,
            cost_usd: n.cost_usd,
            created_at_ms: n.created_at_ms,
        })
    }

    /// What a duplicate's `Conflict` says.
    pub fn duplicate(&self) -> String {
        format!("agent {} already notified", self.agent_id)
    }
}

/// Binds [`NotificationValues`] in [`new_notification_columns!`]'s order, on either driver.
macro_rules! bind_notification {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::notifications::NotificationValues<'_> = $values;
        $query
            .bind(&v.session_id)
            .bind(&v.batch_id)
            .bind(&v.agent_id)
            .bind(v.kind)
            .bind(v.status)
            .bind(v.summary)
            .bind(&v.report_json)
            .bind(v.usage.input_tokens)
            .bind(v.usage.cache_creation_input_tokens)
            .bind(v.usage.cache_read_input_tokens)
            .bind(v.usage.output_tokens)
            .bind(v.cost_usd)
            .bind(v.created_at_ms)
    }};
}
pub(crate) use bind_notification;

/// The notification as stored with `seq` and `tenant_seq`.
pub(crate) fn stored(
    n: &NewNotification,
    kind: NotificationKind,
    (seq, tenant_seq): (i64, i64),
    schedule: Option<String>,
) -> Result<Notification> {
    Ok(Notification {
        seq: from_i64(seq, "notification seq")?,
        tenant_seq: from_i64(tenant_seq, "notification tenant seq")?,
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
        schedule,
    })
}

/// The kind of notification the agent `owner` sends; `Conflict` when it is a main loop (which
/// never ends) or when `n` names another session or batch than the agent's.
pub(crate) fn check_owner(owner: &Owner, n: &NewNotification) -> Result<NotificationKind> {
    let agent_id = n.agent_id;
    let kind = NotificationKind::of(parse_kind(&owner.kind)?);
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
    Ok(kind)
}

/// `Conflict` unless the leased agent (of stored kind `kind`) is a session's main loop.
pub(crate) fn check_main_loop(kind: Option<&str>, lease: &Lease) -> Result<()> {
    if kind == Some(forkd_core::AgentKind::Parent.as_str()) {
        return Ok(());
    }
    Err(DbError::Store(StoreError::Conflict(format!(
        "agent {} is not a session's main loop; only those have turns",
        lease.agent_id
    ))))
}

/// `Conflict` unless a turn's notification is the leased agent's.
pub(crate) fn check_turn_notification(n: &NewNotification, lease: &Lease) -> Result<()> {
    if n.agent_id == lease.agent_id {
        return Ok(());
    }
    Err(DbError::Store(StoreError::Conflict(format!(
        "a turn notification for agent {} under a lease on agent {}",
        n.agent_id, lease.agent_id
    ))))
}
