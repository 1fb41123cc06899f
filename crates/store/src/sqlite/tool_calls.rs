//! Tool calls: intent before the call runs, result after.

use forkd_core::{AgentId, Block};
use sqlx::{SqliteConnection, SqlitePool};

use super::agents;
use super::convert::{corrupt, from_i64, parse_id, to_i64};
use crate::StoreError;
use crate::error::Result;
use crate::{DbError, Lease, ProcessGroup, ToolCall};

#[derive(sqlx::FromRow)]
struct ToolCallRow {
    agent_id: String,
    tool_use_id: String,
    name: String,
    input_json: String,
    read_only: bool,
    result_json: Option<String>,
    full_output: Option<String>,
    started_at_ms: i64,
    finished_at_ms: Option<i64>,
    process_pgid: Option<i64>,
    process_start_ticks: Option<i64>,
    process_boot_id: Option<String>,
}

/// The three process columns: all set or all NULL.
fn process(
    pgid: Option<i64>,
    start_ticks: Option<i64>,
    boot_id: Option<String>,
) -> Result<Option<ProcessGroup>> {
    match (pgid, start_ticks, boot_id) {
        (None, None, None) => Ok(None),
        (Some(pgid), Some(start_ticks), Some(boot_id)) => Ok(Some(ProcessGroup {
            pgid: from_i64(pgid, "tool call process group id")?,
            start_ticks: from_i64(start_ticks, "tool call process start time")?,
            boot_id,
        })),
        _ => Err(corrupt(
            "tool call process",
            "its group id, start time and boot id are not all set",
        )),
    }
}

impl TryFrom<ToolCallRow> for ToolCall {
    type Error = DbError;

    fn try_from(row: ToolCallRow) -> Result<Self> {
        Ok(ToolCall {
            agent_id: parse_id(&row.agent_id, "tool call agent id")?,
            tool_use_id: row.tool_use_id,
            name: row.name,
            input_json: row.input_json,
            read_only: row.read_only,
            result: row
                .result_json
                .as_deref()
                .map(Block::from_stored)
                .transpose()
                .map_err(|e| corrupt("tool call result", e))?,
            full_output: row.full_output,
            started_at_ms: row.started_at_ms,
            finished_at_ms: row.finished_at_ms,
            process: process(
                row.process_pgid,
                row.process_start_ticks,
                row.process_boot_id,
            )?,
        })
    }
}

/// Records a call's intent. Recording it again (a read-only call re-run after an interruption)
/// keeps the first intent.
pub(super) async fn begin(
    conn: &mut SqliteConnection,
    lease: &Lease,
    call: &ToolCall,
) -> Result<()> {
    if call.agent_id != lease.agent_id {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "tool call {} belongs to agent {}, not to the leased agent {}",
            call.tool_use_id, call.agent_id, lease.agent_id
        ))));
    }
    agents::check_lease(conn, lease).await?;
    let process = call.process.as_ref();
    let start_ticks = process
        .map(|p| to_i64(p.start_ticks, "process start time"))
        .transpose()?;
    sqlx::query(
        "INSERT INTO tool_calls (agent_id, tool_use_id, name, input_json, read_only, \
         started_at_ms, process_pgid, process_start_ticks, process_boot_id) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (agent_id, tool_use_id) DO NOTHING",
    )
    .bind(call.agent_id.to_string())
    .bind(&call.tool_use_id)
    .bind(&call.name)
    .bind(&call.input_json)
    .bind(call.read_only)
    .bind(call.started_at_ms)
    .bind(process.map(|p| p.pgid))
    .bind(start_ticks)
    .bind(process.map(|p| p.boot_id.as_str()))
    .execute(conn)
    .await?;
    Ok(())
}

/// Records the process group of a call that is still running (its intent recorded, no result).
pub(super) async fn record_process(
    conn: &mut SqliteConnection,
    lease: &Lease,
    tool_use_id: &str,
    process: &ProcessGroup,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    let agent = lease.agent_id;
    let done = sqlx::query(
        "UPDATE tool_calls SET process_pgid = ?, process_start_ticks = ?, process_boot_id = ? \
         WHERE agent_id = ? AND tool_use_id = ? AND result_json IS NULL",
    )
    .bind(process.pgid)
    .bind(to_i64(process.start_ticks, "process start time")?)
    .bind(&process.boot_id)
    .bind(agent.to_string())
    .bind(tool_use_id)
    .execute(conn)
    .await?;
    if done.rows_affected() == 0 {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "tool call {tool_use_id} of agent {agent} has no open intent"
        ))));
    }
    Ok(())
}

/// Records a call's result; the call's intent must have been recorded, and a result is final.
pub(super) async fn finish(
    conn: &mut SqliteConnection,
    lease: &Lease,
    tool_use_id: &str,
    result: &Block,
    full_output: Option<&str>,
    at_ms: i64,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    let agent = lease.agent_id;
    let done = sqlx::query(
        "UPDATE tool_calls SET result_json = ?, full_output = ?, finished_at_ms = ? \
         WHERE agent_id = ? AND tool_use_id = ? AND result_json IS NULL",
    )
    .bind(result.raw().as_str())
    .bind(full_output)
    .bind(at_ms)
    .bind(agent.to_string())
    .bind(tool_use_id)
    .execute(conn)
    .await?;
    if done.rows_affected() == 0 {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "tool call {tool_use_id} of agent {agent} has no open intent"
        ))));
    }
    Ok(())
}

pub(super) async fn list(pool: &SqlitePool, agent: AgentId) -> Result<Vec<ToolCall>> {
    sqlx::query_as::<_, ToolCallRow>(
        "SELECT agent_id, tool_use_id, name, input_json, read_only, result_json, full_output, \
         started_at_ms, finished_at_ms, process_pgid, process_start_ticks, process_boot_id \
         FROM tool_calls WHERE agent_id = ? \
         ORDER BY started_at_ms, rowid",
    )
    .bind(agent.to_string())
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(ToolCall::try_from)
    .collect()
}
