//! Compaction boundaries of sessions' transcripts (see `forkd_core::compaction`).

use forkd_core::compaction::Compaction;
use forkd_core::{Message, Role, SessionId};
use sqlx::{PgConnection, PgPool};

use super::{agents, sessions};
use crate::error::Result;
use crate::rows::convert::{corrupt, from_i64, to_i64};
use crate::{DbError, Lease, StoreError};

#[derive(sqlx::FromRow)]
struct CompactionRow {
    to_seq: i64,
    from_seq: i64,
    summary_json: String,
    created_at_ms: i64,
}

/// Runs inside the caller's write transaction: the main loop's lease (its row locked), then the
/// session's row, so two compactions of one session are decided one after the other.
pub(super) async fn append(
    conn: &mut PgConnection,
    lease: &Lease,
    session: SessionId,
    c: &Compaction,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    let session_id = session.to_string();
    if !sessions::lock(conn, &session_id).await? {
        return Err(DbError::Store(StoreError::NotFound {
            kind: "session",
            id: session_id,
        }));
    }
    let to_seq = to_i64(c.to_seq, "to_seq")?;
    let role: Option<String> =
        sqlx::query_scalar("SELECT role FROM session_messages WHERE session_id = $1 AND seq = $2")
            .bind(&session_id)
            .bind(to_seq)
            .fetch_optional(&mut *conn)
            .await?;
    if role.as_deref() != Some(Role::Assistant.as_str()) {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "a compaction boundary of session {session_id} must come before an assistant \
             message; message {to_seq} is {role:?}"
        ))));
    }
    let last: Option<i64> =
        sqlx::query_scalar("SELECT MAX(to_seq) FROM compactions WHERE session_id = $1")
            .bind(&session_id)
            .fetch_one(&mut *conn)
            .await?;
    if let Some(last) = last.filter(|last| *last >= to_seq) {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "session {session_id} is compacted up to message {last} already"
        ))));
    }
    sqlx::query(
        "INSERT INTO compactions (session_id, to_seq, from_seq, summary_json, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&session_id)
    .bind(to_seq)
    .bind(to_i64(c.from_seq, "from_seq")?)
    .bind(c.summary.content_json())
    .bind(c.created_at_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(super) async fn list(pool: &PgPool, session: SessionId) -> Result<Vec<Compaction>> {
    let rows: Vec<CompactionRow> = sqlx::query_as(
        "SELECT to_seq, from_seq, summary_json, created_at_ms FROM compactions \
         WHERE session_id = $1 ORDER BY to_seq",
    )
    .bind(session.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(Compaction {
                from_seq: from_i64(row.from_seq, "from_seq")?,
                to_seq: from_i64(row.to_seq, "to_seq")?,
                summary: Message::from_stored(Role::User, &row.summary_json)
                    .map_err(|e| corrupt("compaction summary", e))?,
                created_at_ms: row.created_at_ms,
            })
        })
        .collect()
}
