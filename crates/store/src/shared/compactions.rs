//! Compaction boundaries of sessions' transcripts and of agents' own (see
//! `forkd_core::compaction`).

use forkd_core::compaction::Compaction;
use forkd_core::{AgentId, SessionId};

use super::dialect::{Conn, Pool};
use super::{agents, sessions};
use crate::error::Result;
use crate::rows::compactions::{CompactionRow, Transcript, refusal};
use crate::rows::convert::to_i64;
use crate::rows::sessions::not_found;
use crate::{DbError, Lease, StoreError};

pub(crate) async fn append(
    conn: &mut Conn,
    lease: &Lease,
    session: SessionId,
    c: &Compaction,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    let session_id = session.to_string();
    if !sessions::lock(conn, &session_id).await? {
        return Err(not_found(session_id));
    }
    cut(conn, Transcript::Session(session), c).await
}

/// Stores a boundary of the leased agent's own transcript.
pub(crate) async fn append_agent(conn: &mut Conn, lease: &Lease, c: &Compaction) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    // The lease check locks the agent's row: its own transcript and boundaries are read under it.
    cut(conn, Transcript::Agent(lease.agent_id), c).await
}

/// Stores `c` in `transcript` unless it may not go there (`Conflict`): before an assistant
/// message of the owner's, past its last boundary.
async fn cut(conn: &mut Conn, transcript: Transcript, c: &Compaction) -> Result<()> {
    let key = transcript.key();
    let to_seq = to_i64(c.to_seq, "to_seq")?;
    let role: Option<String> = sqlx::query_scalar(transcript.role_at())
        .bind(&key)
        .bind(to_seq)
        .fetch_optional(&mut *conn)
        .await?;
    let last: Option<i64> = sqlx::query_scalar(transcript.last())
        .bind(&key)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(why) = refusal(&transcript.owner(), to_seq, role.as_deref(), last) {
        return Err(DbError::Store(StoreError::Conflict(why)));
    }
    sqlx::query(transcript.insert())
        .bind(&key)
        .bind(to_seq)
        .bind(to_i64(c.from_seq, "from_seq")?)
        .bind(c.summary.content_json())
        .bind(c.created_at_ms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A session's boundaries; a branch's begin with those it inherited: its origin's (and so on up
/// the chain) in force at its point when it was made, never one the origin stored later.
pub(crate) async fn list(pool: &Pool, session: SessionId) -> Result<Vec<Compaction>> {
    let chain = sessions::chain(pool, &session.to_string()).await?;
    let mut out: Vec<Compaction> = Vec::new();
    // From the first session down: each keeps what its origin's had at its point, then its own.
    for (i, link) in chain.iter().enumerate().rev() {
        let is_branch = i + 1 < chain.len();
        if is_branch {
            let bound = link.compacted_to.and_then(|c| u64::try_from(c).ok());
            out.retain(|c| bound.is_some_and(|b| c.to_seq <= b));
        }
        let id = link.id.parse().map_err(|e| {
            DbError::Store(StoreError::Corrupt(format!(
                "session id {:?}: {e}",
                link.id
            )))
        })?;
        out.extend(list_of(pool, Transcript::Session(id)).await?);
    }
    Ok(out)
}

pub(crate) async fn list_agent(pool: &Pool, agent: AgentId) -> Result<Vec<Compaction>> {
    list_of(pool, Transcript::Agent(agent)).await
}

async fn list_of(pool: &Pool, transcript: Transcript) -> Result<Vec<Compaction>> {
    let rows: Vec<CompactionRow> = sqlx::query_as(transcript.list())
        .bind(transcript.key())
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(Compaction::try_from).collect()
}
