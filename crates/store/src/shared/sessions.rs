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
    INSERT_SESSION, SessionRow, SessionValues, bind_session, not_found, session_columns,
};

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
    let row: Option<SessionRow> = sqlx::query_as(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE id = $1"
    ))
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
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE (CAST($1 AS TEXT) IS NULL OR tenant = $1) AND id > $2 \
         ORDER BY id LIMIT $3"
    ))
    .bind(tenant)
    .bind(after.map(|a| a.to_string()).unwrap_or_default())
    .bind(super::limit_param(limit))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Session::try_from).collect()
}

pub(crate) async fn workspaces(pool: &Pool) -> Result<Vec<std::path::PathBuf>> {
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT workspace FROM sessions ORDER BY workspace")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(std::path::PathBuf::from).collect())
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
    // Seqs are contiguous from 0, so MAX + 1 is the length; unlike COUNT it is one index seek.
    let len: i64 = sqlx::query_scalar(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM session_messages WHERE session_id = $1",
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
    sqlx::query(INSERT_SESSION_MESSAGE)
        .bind(session_id)
        .bind(seq)
        .bind(message.role.as_str())
        .bind(message.content_json())
        .bind(created_at_ms)
        .execute(conn)
        .await?;
    Ok(())
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
    let rows: Vec<MessageRow> = sqlx::query_as(
        "SELECT seq, role, content_json, created_at_ms FROM session_messages \
         WHERE session_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq",
    )
    .bind(&id)
    .bind(bound(from))
    .bind(before)
    .fetch_all(&mut *conn)
    .await?;
    // Rows are never deleted, so checking existence after the read cannot race.
    if rows.is_empty() && !exists(&mut conn, &id).await? {
        return Err(not_found(id));
    }
    stored_messages(rows)
}
