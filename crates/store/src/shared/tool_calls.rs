//! Tool calls: intent before the call runs, result after.

use forkd_core::{AgentId, Block};

use super::agents;
use super::dialect::{self, Conn, Pool};
use crate::error::Result;
use crate::rows::convert::corrupt;
use crate::rows::tool_calls::{
    INSERT_INTENT, IntentValues, ProcessValues, RECORD_PROCESS, RECORD_RESULT, ToolCallRow,
    bind_intent, check_owner, no_open_intent, tool_call_columns,
};
use crate::{Lease, ProcessGroup, ToolCall};

/// Records a call's intent. Recording it again (a read-only call re-run after an interruption)
/// keeps the first intent.
pub(crate) async fn begin(conn: &mut Conn, lease: &Lease, call: &ToolCall) -> Result<()> {
    check_owner(call, lease)?;
    agents::check_lease(conn, lease).await?;
    let values = IntentValues::new(call)?;
    bind_intent!(sqlx::query(INSERT_INTENT), &values)
        .execute(conn)
        .await?;
    Ok(())
}

/// Records the process group of a call that is still running (its intent recorded, no result).
pub(crate) async fn record_process(
    conn: &mut Conn,
    lease: &Lease,
    tool_use_id: &str,
    process: &ProcessGroup,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    let agent = lease.agent_id;
    let p = ProcessValues::new(process)?;
    let update = sqlx::query(RECORD_PROCESS)
        .bind(p.pgid)
        .bind(p.start_ticks)
        .bind(p.boot_id);
    update_open_intent(conn, update, agent, tool_use_id).await
}

/// Records a call's result; the call's intent must have been recorded, and a result is final.
pub(crate) async fn finish(
    conn: &mut Conn,
    lease: &Lease,
    tool_use_id: &str,
    result: &Block,
    full_output: Option<&str>,
    at_ms: i64,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    let update = sqlx::query(RECORD_RESULT)
        .bind(result.raw().as_str())
        .bind(dialect::output_param(full_output))
        .bind(at_ms);
    update_open_intent(conn, update, lease.agent_id, tool_use_id).await
}

/// Runs an update of a call whose intent is recorded and whose result is not, its last two
/// parameters the agent and the tool_use id; no such call is an error.
async fn update_open_intent(
    conn: &mut Conn,
    update: sqlx::query::Query<'_, dialect::Db, <dialect::Db as sqlx::Database>::Arguments>,
    agent: AgentId,
    tool_use_id: &str,
) -> Result<()> {
    let done = update
        .bind(agent.to_string())
        .bind(tool_use_id)
        .execute(conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(no_open_intent(tool_use_id, agent));
    }
    Ok(())
}

/// A call's row and its whole output, read as bytes (SQLite's text reads as its bytes).
#[derive(sqlx::FromRow)]
struct Row {
    #[sqlx(flatten)]
    call: ToolCallRow,
    full_output: Option<Vec<u8>>,
}

/// An agent's calls in the order they started; calls of one millisecond in the order they were
/// stored.
pub(crate) async fn list(pool: &Pool, agent: AgentId) -> Result<Vec<ToolCall>> {
    sqlx::query_as::<_, Row>(super::sql(format!(
        "SELECT {}, full_output FROM tool_calls WHERE agent_id = $1 \
         ORDER BY started_at_ms, {}",
        tool_call_columns!(),
        dialect::INSERTION_ORDER
    )))
    .bind(agent.to_string())
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|row| {
        let full_output = row
            .full_output
            .map(String::from_utf8)
            .transpose()
            .map_err(|e| corrupt("tool call full output", e))?;
        row.call.into_call(full_output)
    })
    .collect()
}
