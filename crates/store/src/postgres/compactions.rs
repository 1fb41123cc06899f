//! Compaction boundaries of sessions' transcripts and of agents' own (see
//! `forkd_core::compaction`).

use forkd_core::compaction::Compaction;
use forkd_core::{AgentId, SessionId};
use sqlx::{PgConnection, PgPool};

use super::{agents, sessions};
use crate::error::Result;
use crate::rows::compactions::{
    CompactionRow, INSERT_AGENT_COMPACTION, INSERT_COMPACTION, compaction_columns, refusal,
};
use crate::rows::convert::to_i64;
use crate::{DbError, Lease, StoreError};

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
    let last: Option<i64> =
        sqlx::query_scalar("SELECT MAX(to_seq) FROM compactions WHERE session_id = $1")
            .bind(&session_id)
            .fetch_one(&mut *conn)
            .await?;
    let owner = format!("session {session_id}");
    if let Some(why) = refusal(&owner, to_seq, role.as_deref(), last) {
        return Err(DbError::Store(StoreError::Conflict(why)));
    }
    sqlx::query(INSERT_COMPACTION)
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
    let rows: Vec<CompactionRow> = sqlx::query_as(concat!(
        "SELECT ",
        compaction_columns!(),
        " FROM compactions WHERE session_id = $1 ORDER BY to_seq"
    ))
    .bind(session.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Compaction::try_from).collect()
}

/// Stores a boundary of the leased agent's own transcript.
pub(super) async fn append_agent(
    conn: &mut PgConnection,
    lease: &Lease,
    c: &Compaction,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    // The lease check locks the agent's row: its own transcript and boundaries are read under it.
    let agent_id = lease.agent_id.to_string();
    let to_seq = to_i64(c.to_seq, "to_seq")?;
    let role: Option<String> =
        sqlx::query_scalar("SELECT role FROM agent_messages WHERE agent_id = $1 AND seq = $2")
            .bind(&agent_id)
            .bind(to_seq)
            .fetch_optional(&mut *conn)
            .await?;
    let last: Option<i64> =
        sqlx::query_scalar("SELECT MAX(to_seq) FROM agent_compactions WHERE agent_id = $1")
            .bind(&agent_id)
            .fetch_one(&mut *conn)
            .await?;
    let owner = format!("agent {agent_id}");
    if let Some(why) = refusal(&owner, to_seq, role.as_deref(), last) {
        return Err(DbError::Store(StoreError::Conflict(why)));
    }
    sqlx::query(INSERT_AGENT_COMPACTION)
        .bind(&agent_id)
        .bind(to_seq)
        .bind(to_i64(c.from_seq, "from_seq")?)
        .bind(c.summary.content_json())
        .bind(c.created_at_ms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(super) async fn list_agent(pool: &PgPool, agent: AgentId) -> Result<Vec<Compaction>> {
    let rows: Vec<CompactionRow> = sqlx::query_as(concat!(
        "SELECT ",
        compaction_columns!(),
        " FROM agent_compactions WHERE agent_id = $1 ORDER BY to_seq"
    ))
    .bind(agent.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Compaction::try_from).collect()
}
