//! The reply a parent turn is answering, kept until it is stored with its results (see
//! `Store::set_pending_reply`).

use forkd_core::{Message, Role, SessionId};

use super::agents;
use super::dialect::{Conn, Pool};
use crate::Lease;
use crate::error::Result;
use crate::rows::convert::corrupt;

pub(crate) async fn set(
    conn: &mut Conn,
    lease: &Lease,
    session: SessionId,
    reply: &Message,
    at_ms: i64,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    sqlx::query(
        "INSERT INTO pending_replies (session_id, agent_id, reply_json, created_at_ms) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (session_id) DO UPDATE SET \
         agent_id = excluded.agent_id, reply_json = excluded.reply_json, \
         created_at_ms = excluded.created_at_ms",
    )
    .bind(session.to_string())
    .bind(lease.agent_id.to_string())
    .bind(reply.content_json())
    .bind(at_ms)
    .execute(conn)
    .await?;
    Ok(())
}

pub(crate) async fn get(pool: &Pool, session: SessionId) -> Result<Option<Message>> {
    let json: Option<String> =
        sqlx::query_scalar("SELECT reply_json FROM pending_replies WHERE session_id = $1")
            .bind(session.to_string())
            .fetch_optional(pool)
            .await?;
    json.map(|j| Message::from_stored(Role::Assistant, &j).map_err(|e| corrupt("pending reply", e)))
        .transpose()
}

/// Runs inside the caller's write transaction.
pub(crate) async fn clear(conn: &mut Conn, session: &str) -> Result<()> {
    sqlx::query("DELETE FROM pending_replies WHERE session_id = $1")
        .bind(session)
        .execute(conn)
        .await?;
    Ok(())
}
