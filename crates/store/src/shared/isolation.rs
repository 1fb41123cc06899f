//! Isolated children's batch snapshots and changes (docs/contracts.md, "Isolation").

use forkd_core::isolation::{AgentChanges, BatchSnapshot, CopyState};
use forkd_core::{AgentId, BatchId};

use super::dialect::{Conn, Pool};
use crate::error::Result;
use crate::rows::convert::{corrupt, from_i64, parse_id, to_i64};

pub(crate) async fn put_snapshot(conn: &mut Conn, snapshot: &BatchSnapshot) -> Result<()> {
    let agents = snapshot
        .agents
        .as_ref()
        .map(|ids| {
            let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
            serde_json::to_string(&ids)
        })
        .transpose()
        .map_err(|e| corrupt("isolated children", e))?;
    sqlx::query(
        "INSERT INTO batch_snapshots (batch_id, dir, agents_json, git_ref, git_commit, files, \
         bytes, took_ms, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(snapshot.batch_id.to_string())
    .bind(&snapshot.dir)
    .bind(agents)
    .bind(snapshot.git_ref.as_deref())
    .bind(snapshot.git_commit.as_deref())
    .bind(to_i64(snapshot.files, "snapshot files")?)
    .bind(to_i64(snapshot.bytes, "snapshot bytes")?)
    .bind(to_i64(snapshot.took_ms, "snapshot time")?)
    .bind(snapshot.created_at_ms)
    .execute(conn)
    .await?;
    Ok(())
}

type SnapshotRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    i64,
    i64,
    i64,
);

pub(crate) async fn snapshot(pool: &Pool, batch: BatchId) -> Result<Option<BatchSnapshot>> {
    let row: Option<SnapshotRow> = sqlx::query_as(
        "SELECT batch_id, dir, agents_json, git_ref, git_commit, files, bytes, took_ms, \
         created_at_ms FROM batch_snapshots WHERE batch_id = $1",
    )
    .bind(batch.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(
        |(id, dir, agents, git_ref, git_commit, files, bytes, took, at)| {
            let agents = agents
                .map(|json| {
                    let ids: Vec<String> =
                        serde_json::from_str(&json).map_err(|e| corrupt("isolated children", e))?;
                    ids.iter()
                        .map(|id| parse_id(id, "isolated child"))
                        .collect::<Result<Vec<AgentId>>>()
                })
                .transpose()?;
            Ok(BatchSnapshot {
                batch_id: parse_id(&id, "batch id")?,
                dir,
                agents,
                git_ref,
                git_commit,
                files: from_i64(files, "snapshot files")?,
                bytes: from_i64(bytes, "snapshot bytes")?,
                took_ms: from_i64(took, "snapshot time")?,
                created_at_ms: at,
            })
        },
    )
    .transpose()
}

pub(crate) async fn put_changes(conn: &mut Conn, changes: &AgentChanges) -> Result<()> {
    let files = serde_json::to_string(&changes.files).map_err(|e| corrupt("changed files", e))?;
    let conflicts =
        serde_json::to_string(&changes.conflicts).map_err(|e| corrupt("conflicts", e))?;
    sqlx::query(
        "INSERT INTO agent_changes (agent_id, batch_id, files_json, diff, outside_possible, \
         state, conflicts_json, updated_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (agent_id) DO UPDATE SET files_json = excluded.files_json, \
         diff = excluded.diff, outside_possible = excluded.outside_possible, \
         state = excluded.state, conflicts_json = excluded.conflicts_json, \
         updated_at_ms = excluded.updated_at_ms",
    )
    .bind(changes.agent_id.to_string())
    .bind(changes.batch_id.to_string())
    .bind(files)
    .bind(&changes.diff)
    .bind(changes.outside_possible)
    .bind(changes.state.as_str())
    .bind(conflicts)
    .bind(changes.updated_at_ms)
    .execute(conn)
    .await?;
    Ok(())
}

type ChangesRow = (String, String, String, String, bool, String, String, i64);

const CHANGES_COLUMNS: &str = "agent_id, batch_id, files_json, diff, outside_possible, state, \
     conflicts_json, updated_at_ms";

fn changes_row(row: ChangesRow) -> Result<AgentChanges> {
    let (agent, batch, files, diff, outside_possible, state, conflicts, at) = row;
    Ok(AgentChanges {
        agent_id: parse_id(&agent, "agent id")?,
        batch_id: parse_id(&batch, "batch id")?,
        files: serde_json::from_str(&files).map_err(|e| corrupt("changed files", e))?,
        diff,
        outside_possible,
        state: state
            .parse::<CopyState>()
            .map_err(|e| corrupt("copy state", e))?,
        conflicts: serde_json::from_str(&conflicts).map_err(|e| corrupt("conflicts", e))?,
        updated_at_ms: at,
    })
}

pub(crate) async fn changes(pool: &Pool, agent: AgentId) -> Result<Option<AgentChanges>> {
    let row: Option<ChangesRow> = sqlx::query_as(super::sql(format!(
        "SELECT {CHANGES_COLUMNS} FROM agent_changes WHERE agent_id = $1"
    )))
    .bind(agent.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(changes_row).transpose()
}

pub(crate) async fn batch_changes(pool: &Pool, batch: BatchId) -> Result<Vec<AgentChanges>> {
    let rows: Vec<ChangesRow> = sqlx::query_as(super::sql(format!(
        "SELECT {CHANGES_COLUMNS} FROM agent_changes WHERE batch_id = $1"
    )))
    .bind(batch.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(changes_row).collect()
}

pub(crate) async fn expired(pool: &Pool, before_ms: i64, limit: u32) -> Result<Vec<AgentId>> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT agent_id FROM agent_changes WHERE state IN ('kept', 'conflicted') \
         AND updated_at_ms < $1 ORDER BY updated_at_ms LIMIT $2",
    )
    .bind(before_ms)
    .bind(super::limit_param(limit))
    .fetch_all(pool)
    .await?;
    ids.iter().map(|id| parse_id(id, "agent id")).collect()
}
