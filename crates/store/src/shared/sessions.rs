//! Sessions and their transcripts.

use forkd_core::session::Session;
use forkd_core::{Message, SessionId};

use super::dialect::{Conn, FOR_UPDATE, Pool};
use crate::StoredMessage;
use crate::error::Result;
use crate::rows::convert::{
    INSERT_SESSION_MESSAGE, MessageRow, bound, conflict_if_duplicate, from_i64, stored_messages,
};
use crate::rows::sessions::{
    INSERT_SESSION, SessionRow, SessionValues, bind_session, not_found, select_sessions,
};
use crate::{DbError, StoreError};

pub(crate) async fn create(
    conn: &mut Conn,
    session: &Session,
    first_messages: &[Message],
) -> Result<()> {
    let values = SessionValues::new(session)?;
    bind_session!(sqlx::query(INSERT_SESSION), &values)
        .execute(&mut *conn)
        .await
        .map_err(|e| {
            conflict_if_duplicate(e, || format!("session {} already exists", values.id))
        })?;
    for (seq, message) in (0_i64..).zip(first_messages) {
        insert_message(conn, &values.id, seq, message, session.created_at_ms).await?;
    }
    Ok(())
}

pub(crate) async fn get(pool: &Pool, id: SessionId) -> Result<Option<Session>> {
    let row: Option<SessionRow> = sqlx::query_as(concat!(select_sessions!(), " WHERE s.id = $1"))
        .bind(id.to_string())
        .fetch_optional(pool)
        .await?;
    row.map(Session::try_from).transpose()
}

pub(crate) async fn list(
    pool: &Pool,
    tenant: Option<&str>,
    after: Option<SessionId>,
    limit: u32,
) -> Result<Vec<Session>> {
    // Every id sorts after "", so one statement serves both the first page and the next ones.
    let rows: Vec<SessionRow> = sqlx::query_as(concat!(
        select_sessions!(),
        " WHERE (CAST($1 AS TEXT) IS NULL OR s.tenant = $1) AND s.id > $2 ORDER BY s.id LIMIT $3"
    ))
    .bind(tenant)
    .bind(after.map(|a| a.to_string()).unwrap_or_default())
    .bind(super::limit_param(limit))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Session::try_from).collect()
}

pub(crate) async fn workspaces(pool: &Pool) -> Result<Vec<(String, std::path::PathBuf)>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT tenant, workspace FROM sessions ORDER BY workspace, tenant",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(tenant, workspace)| (tenant, std::path::PathBuf::from(workspace)))
        .collect())
}

pub(crate) async fn exists(conn: &mut Conn, id: &str) -> Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $1)")
            .bind(id)
            .fetch_one(conn)
            .await?,
    )
}

/// Locks a session's row until the transaction ends, before its transcript is read and appended
/// to (see the module docs of `postgres.rs`); `false` when there is no such session.
pub(crate) async fn lock(conn: &mut Conn, id: &str) -> Result<bool> {
    let found: Option<bool> = sqlx::query_scalar(super::sql(format!(
        "SELECT TRUE FROM sessions WHERE id = $1{FOR_UPDATE}"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(found.is_some())
}

/// The length of a session's transcript: the seq its next message gets. The caller holds the
/// session's lock.
pub(crate) async fn len(conn: &mut Conn, session_id: &str) -> Result<i64> {
    // A session's own seqs are contiguous from 0 (from its point, for a branch), so MAX + 1 is
    // the length; unlike COUNT it is one index seek.
    let len: i64 = sqlx::query_scalar(
        "SELECT COALESCE((SELECT MAX(seq) + 1 FROM session_messages WHERE session_id = $1), \
         (SELECT branch_point FROM sessions WHERE id = $1), 0)",
    )
    .bind(session_id)
    .fetch_one(conn)
    .await?;
    Ok(len)
}

/// Appends `message` to a session's transcript at `seq`.
pub(crate) async fn insert_message(
    conn: &mut Conn,
    session_id: &str,
    seq: i64,
    message: &Message,
    created_at_ms: i64,
) -> Result<()> {
    insert(conn, session_id, seq, message, created_at_ms, Kind::Plain).await
}

/// Appends a note of forkd's for the session's model (a task notification, a batch's launch
/// note or digest, a branch's report) at `seq`: marked as forkd's, so views never judge it by
/// its text.
pub(crate) async fn insert_note(
    conn: &mut Conn,
    session_id: &str,
    seq: i64,
    message: &Message,
    created_at_ms: i64,
) -> Result<()> {
    insert(conn, session_id, seq, message, created_at_ms, Kind::Note).await
}

/// Appends the user's message of a turn at `seq`: turns are counted by these.
pub(crate) async fn insert_user_message(
    conn: &mut Conn,
    session_id: &str,
    seq: i64,
    message: &Message,
    created_at_ms: i64,
) -> Result<()> {
    insert(conn, session_id, seq, message, created_at_ms, Kind::Turn).await
}

/// What a session's message is besides its content.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A turn's user message: turns are counted by these.
    Turn,
    /// A note of forkd's.
    Note,
    /// Anything else: the first message, replies, tool results.
    Plain,
}

async fn insert(
    conn: &mut Conn,
    session_id: &str,
    seq: i64,
    message: &Message,
    created_at_ms: i64,
    kind: Kind,
) -> Result<()> {
    sqlx::query(INSERT_SESSION_MESSAGE)
        .bind(session_id)
        .bind(seq)
        .bind(message.role.as_str())
        .bind(message.content_json())
        .bind(created_at_ms)
        .bind(kind == Kind::Turn)
        .bind(kind == Kind::Note)
        .execute(conn)
        .await?;
    Ok(())
}

/// `chain (id, origin, lo, hi, compacted_to, depth)`: the session `$1` (depth 0) and, for a
/// branch, its origins up to the first session, each with the range of seqs `lo..hi` the
/// transcript takes from it: an origin's ends where the first point below it does (a branch of a
/// branch may start before its own origin's point, which then gives it nothing).
macro_rules! chain {
    () => {
        "WITH RECURSIVE chain (id, origin, lo, hi, compacted_to, depth) AS (\
           SELECT id, branch_of, COALESCE(branch_point, 0), CAST(9223372036854775807 AS BIGINT), \
                  branch_compacted_to, 0 FROM sessions WHERE id = $1 \
           UNION ALL \
           SELECT s.id, s.branch_of, COALESCE(s.branch_point, 0), \
                  CASE WHEN c.lo < c.hi THEN c.lo ELSE c.hi END, s.branch_compacted_to, \
                  c.depth + 1 \
           FROM sessions s JOIN chain c ON s.id = c.origin) "
    };
}

/// One session of a transcript's chain (see `chain!`).
#[derive(sqlx::FromRow)]
pub(crate) struct Link {
    pub id: String,
    /// The seqs the transcript takes from this session: `lo..hi`.
    pub lo: i64,
    pub hi: i64,
    /// The boundary in force at the branch point, for the session after it in the chain.
    pub compacted_to: Option<i64>,
}

/// The sessions whose messages make up `id`'s transcript: `id` first, then its origins.
pub(crate) async fn chain(pool: &Pool, id: &str) -> Result<Vec<Link>> {
    chain_on(&mut *pool.acquire().await?, id).await
}

async fn chain_on(conn: &mut Conn, id: &str) -> Result<Vec<Link>> {
    Ok(sqlx::query_as(concat!(
        chain!(),
        "SELECT id, lo, hi, compacted_to FROM chain ORDER BY depth"
    ))
    .bind(id)
    .fetch_all(conn)
    .await?)
}

/// Stores a branch (see `Store::create_branch`). Runs inside the caller's write transaction.
pub(crate) async fn create_branch(conn: &mut Conn, branch: &Session) -> Result<()> {
    let Some(point) = branch.branch else {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "session {} is not a branch",
            branch.id
        ))));
    };
    let origin = point.origin.to_string();
    // The origin's transcript may grow, never shrink: its lock makes the check exact anyway.
    if !lock(conn, &origin).await? {
        return Err(not_found(origin));
    }
    let origin_len = len(conn, &origin).await?;
    if i64::try_from(point.point).map_or(true, |p| p > origin_len || p == 0) {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "session {origin} has {origin_len} messages; a branch cannot start at {}",
            point.point
        ))));
    }
    let (holder, system, tools): (String, String, String) = sqlx::query_as(
        "SELECT COALESCE(s.params_of, s.id), COALESCE(p.system_prompt, s.system_prompt), \
         COALESCE(p.tools_json, s.tools_json) \
         FROM sessions s LEFT JOIN sessions p ON p.id = s.params_of WHERE s.id = $1",
    )
    .bind(&origin)
    .fetch_one(&mut *conn)
    .await?;
    let mut values = SessionValues::new(branch)?;
    if system == branch.params.system.as_str() && tools == branch.params.tools.raw().as_str() {
        values.share_params(holder);
    }
    bind_session!(sqlx::query(INSERT_SESSION), &values)
        .execute(&mut *conn)
        .await
        .map_err(|e| {
            conflict_if_duplicate(e, || format!("session {} already exists", values.id))
        })?;
    // "Allow always" answers hold in the branch too.
    sqlx::query(
        "INSERT INTO session_allowed_tools (session_id, tool, allowed_at_ms) \
         SELECT $1, tool, allowed_at_ms FROM session_allowed_tools WHERE session_id = $2",
    )
    .bind(&values.id)
    .bind(&origin)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The branches made from `origin`, in creation order.
pub(crate) async fn branches(pool: &Pool, origin: SessionId) -> Result<Vec<Session>> {
    let rows: Vec<SessionRow> = sqlx::query_as(concat!(
        select_sessions!(),
        " WHERE s.branch_of = $1 ORDER BY s.id"
    ))
    .bind(origin.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Session::try_from).collect()
}

/// The seqs of the messages that began the session's turns, its origins' included.
/// Keeps the trace context of the session's latest turn.
pub(crate) async fn set_turn_trace(
    conn: &mut Conn,
    id: SessionId,
    trace_parent: &str,
) -> Result<()> {
    let id = id.to_string();
    let updated = sqlx::query("UPDATE sessions SET trace_parent = $2 WHERE id = $1")
        .bind(&id)
        .bind(trace_parent)
        .execute(conn)
        .await?;
    if updated.rows_affected() == 0 {
        return Err(not_found(id));
    }
    Ok(())
}

/// The trace context of the session's latest turn.
pub(crate) async fn turn_trace(pool: &Pool, id: SessionId) -> Result<Option<String>> {
    let id = id.to_string();
    let row: Option<Option<String>> =
        sqlx::query_scalar("SELECT trace_parent FROM sessions WHERE id = $1")
            .bind(&id)
            .fetch_optional(pool)
            .await?;
    row.ok_or_else(|| not_found(id))
}

pub(crate) async fn turns(pool: &Pool, id: SessionId) -> Result<Vec<u64>> {
    let id = id.to_string();
    let seqs: Vec<i64> = sqlx::query_scalar(concat!(
        chain!(),
        "SELECT m.seq FROM chain c JOIN session_messages m \
         ON m.session_id = c.id AND m.seq >= c.lo AND m.seq < c.hi \
         WHERE m.starts_turn ORDER BY m.seq"
    ))
    .bind(&id)
    .fetch_all(pool)
    .await?;
    if seqs.is_empty() && !exists(&mut *pool.acquire().await?, &id).await? {
        return Err(not_found(id));
    }
    seqs.into_iter()
        .map(|s| from_i64(s, "message seq"))
        .collect()
}

pub(crate) async fn message_count(pool: &Pool, id: SessionId) -> Result<u64> {
    let id = id.to_string();
    let mut conn = pool.acquire().await?;
    let len = len(&mut conn, &id).await?;
    if len == 0 && !exists(&mut conn, &id).await? {
        return Err(not_found(id));
    }
    from_i64(len, "transcript length")
}

pub(crate) async fn messages(
    pool: &Pool,
    id: SessionId,
    from: u64,
    before: Option<u64>,
) -> Result<Vec<StoredMessage>> {
    let id = id.to_string();
    let before = before.map_or(i64::MAX, bound);
    let mut conn = pool.acquire().await?;
    // A branch's transcript is its origins' up to its point, then its own: each session's part
    // read as one range in its index's order (no join, no sort: a batch's children load their
    // prefix from here), the first session's first.
    let chain = chain_on(&mut conn, &id).await?;
    let mut rows: Vec<MessageRow> = Vec::new();
    for link in chain.iter().rev() {
        let (lo, hi) = (link.lo.max(bound(from)), link.hi.min(before));
        if lo >= hi {
            continue;
        }
        let part: Vec<MessageRow> = sqlx::query_as(
            "SELECT seq, role, content_json, created_at_ms, starts_turn, note FROM session_messages \
             WHERE session_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq",
        )
        .bind(&link.id)
        .bind(lo)
        .bind(hi)
        .fetch_all(&mut *conn)
        .await?;
        rows.extend(part);
    }
    // Rows are never deleted, so checking existence after the read cannot race.
    if rows.is_empty() && !exists(&mut conn, &id).await? {
        return Err(not_found(id));
    }
    stored_messages(rows)
}
