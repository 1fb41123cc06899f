//! Tool call rows.

use forkd_core::Block;

use super::convert::{corrupt, from_i64, parse_id, to_i64};
use crate::StoreError;
use crate::error::Result;
use crate::{DbError, ProcessGroup, ToolCall};

#[derive(sqlx::FromRow)]
pub(crate) struct ToolCallRow {
    agent_id: String,
    tool_use_id: String,
    name: String,
    input_json: String,
    read_only: bool,
    result_json: Option<String>,
    started_at_ms: i64,
    finished_at_ms: Option<i64>,
    process_pgid: Option<i64>,
    process_start_ticks: Option<i64>,
    process_boot_id: Option<String>,
}

/// The columns [`ToolCallRow`] reads: all but `full_output`, which each database stores its own
/// way (SQLite as text, PostgreSQL as bytes, since a command's output may hold NUL bytes).
macro_rules! tool_call_columns {
    () => {
        "agent_id, tool_use_id, name, input_json, read_only, result_json, started_at_ms, \
         finished_at_ms, process_pgid, process_start_ticks, process_boot_id"
    };
}
pub(crate) use tool_call_columns;

/// Records a call's intent; recording it again keeps the first. Bind [`IntentValues`] with
/// [`bind_intent!`].
pub(crate) const INSERT_INTENT: &str = "INSERT INTO tool_calls (agent_id, tool_use_id, name, \
     input_json, read_only, started_at_ms, process_pgid, process_start_ticks, process_boot_id) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
     ON CONFLICT (agent_id, tool_use_id) DO NOTHING";

/// Records the process group of a call still open: pgid, start ticks, boot id, agent id,
/// tool_use id.
pub(crate) const RECORD_PROCESS: &str = "UPDATE tool_calls SET process_pgid = $1, \
     process_start_ticks = $2, process_boot_id = $3 \
     WHERE agent_id = $4 AND tool_use_id = $5 AND result_json IS NULL";

/// Records an open call's result: result, full output, finish time, agent id, tool_use id.
pub(crate) const RECORD_RESULT: &str = "UPDATE tool_calls SET result_json = $1, \
     full_output = $2, finished_at_ms = $3 \
     WHERE agent_id = $4 AND tool_use_id = $5 AND result_json IS NULL";

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

impl ToolCallRow {
    /// The call, with the `full_output` read beside the row.
    pub fn into_call(self, full_output: Option<String>) -> Result<ToolCall> {
        Ok(ToolCall {
            agent_id: parse_id(&self.agent_id, "tool call agent id")?,
            tool_use_id: self.tool_use_id,
            name: self.name,
            input_json: self.input_json,
            read_only: self.read_only,
            result: self
                .result_json
                .as_deref()
                .map(Block::from_stored)
                .transpose()
                .map_err(|e| corrupt("tool call result", e))?,
            full_output,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            process: process(
                self.process_pgid,
                self.process_start_ticks,
                self.process_boot_id,
            )?,
        })
    }
}

/// A process group as its three columns store it.
pub(crate) struct ProcessValues<'a> {
    pub pgid: i64,
    pub start_ticks: i64,
    pub boot_id: &'a str,
}

impl<'a> ProcessValues<'a> {
    pub fn new(process: &'a ProcessGroup) -> Result<Self> {
        Ok(Self {
            pgid: i64::from(process.pgid),
            start_ticks: to_i64(process.start_ticks, "process start time")?,
            boot_id: &process.boot_id,
        })
    }
}

/// A call's intent as its row stores it.
pub(crate) struct IntentValues<'a> {
    pub agent_id: String,
    pub tool_use_id: &'a str,
    pub name: &'a str,
    pub input_json: &'a str,
    pub read_only: bool,
    pub started_at_ms: i64,
    pub process: Option<ProcessValues<'a>>,
}

impl<'a> IntentValues<'a> {
    pub fn new(call: &'a ToolCall) -> Result<Self> {
        Ok(Self {
            agent_id: call.agent_id.to_string(),
            tool_use_id: &call.tool_use_id,
            name: &call.name,
            input_json: &call.input_json,
            read_only: call.read_only,
            started_at_ms: call.started_at_ms,
            process: call.process.as_ref().map(ProcessValues::new).transpose()?,
        })
    }
}

/// `Conflict` unless the call is the leased agent's.
pub(crate) fn check_owner(call: &ToolCall, lease: &crate::Lease) -> Result<()> {
    if call.agent_id == lease.agent_id {
        return Ok(());
    }
    Err(DbError::Store(StoreError::Conflict(format!(
        "tool call {} belongs to agent {}, not to the leased agent {}",
        call.tool_use_id, call.agent_id, lease.agent_id
    ))))
}

/// What an update of a call with no open intent answers.
pub(crate) fn no_open_intent(tool_use_id: &str, agent: forkd_core::AgentId) -> DbError {
    DbError::Store(StoreError::Conflict(format!(
        "tool call {tool_use_id} of agent {agent} has no open intent"
    )))
}

/// Binds [`IntentValues`] to [`INSERT_INTENT`], on either driver.
macro_rules! bind_intent {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::tool_calls::IntentValues<'_> = $values;
        let p = v.process.as_ref();
        $query
            .bind(&v.agent_id)
            .bind(v.tool_use_id)
            .bind(v.name)
            .bind(v.input_json)
            .bind(v.read_only)
            .bind(v.started_at_ms)
            .bind(p.map(|p| p.pgid))
            .bind(p.map(|p| p.start_ticks))
            .bind(p.map(|p| p.boot_id))
    }};
}
pub(crate) use bind_intent;
