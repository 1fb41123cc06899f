//! Tool calls: intent before the call runs, result after.

use forkd_core::{AgentId, Block};
use sqlx::{SqliteConnection, SqlitePool};

use super::agents;
use super::convert::{corrupt, parse_id};
use crate::StoreError;
use crate::error::Result;
use crate::{DbError, Lease, ToolCall};

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
    sqlx::query(
        "INSERT INTO tool_calls (agent_id, tool_use_id, name, input_json, read_only, \
         started_at_ms) VALUES (?, ?, ?, ?, ?, ?) \
         ON CONFLICT (agent_id, tool_use_id) DO NOTHING",
    )
    .bind(call.agent_id.to_string())
    .bind(&call.tool_use_id)
    .bind(&call.name)
    .bind(&call.input_json)
    .bind(call.read_only)
    .bind(call.started_at_ms)
    .execute(conn)
    .await?;
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
         started_at_ms, finished_at_ms FROM tool_calls WHERE agent_id = ? \
         ORDER BY started_at_ms, rowid",
    )
    .bind(agent.to_string())
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(ToolCall::try_from)
    .collect()
}
