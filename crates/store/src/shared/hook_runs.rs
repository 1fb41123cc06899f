//! Hooks' runs ([`forkd_core::hooks::runs::HookRunStore`]): what each hook command decided and
//! said, kept for `forkctl logs` and the web view.

use async_trait::async_trait;
use forkd_core::AgentId;
use forkd_core::hooks::HookEvent;
use forkd_core::hooks::runs::{HookDecision, HookRunRecord, HookRunStore};

use super::dialect::DriverStore;
use super::tx::{StoreResult, db};
use crate::error::Result;
use crate::rows::convert::{corrupt, parse_id};

/// A run's row.
#[derive(sqlx::FromRow)]
struct Row {
    agent_id: String,
    event: String,
    tool_use_id: Option<String>,
    tool_name: Option<String>,
    program: String,
    exit_code: Option<i32>,
    decision: String,
    output: String,
    started_at_ms: i64,
    finished_at_ms: i64,
}

impl Row {
    fn into_record(self) -> Result<HookRunRecord> {
        Ok(HookRunRecord {
            agent_id: parse_id(&self.agent_id, "hook run's agent")?,
            event: HookEvent::parse(&self.event)
                .ok_or_else(|| corrupt("hook run's event", &self.event))?,
            tool_use_id: self.tool_use_id,
            tool_name: self.tool_name,
            program: self.program,
            exit_code: self.exit_code,
            decision: HookDecision::parse(&self.decision)
                .ok_or_else(|| corrupt("hook run's decision", &self.decision))?,
            output: self.output,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
        })
    }
}

#[async_trait]
impl HookRunStore for DriverStore {
    async fn record_hook_runs(&self, runs: &[HookRunRecord]) -> StoreResult<()> {
        write_tx!(self, |tx| {
            for run in runs {
                sqlx::query(
                    "INSERT INTO hook_runs (agent_id, event, tool_use_id, tool_name, program, \
                     exit_code, decision, output, started_at_ms, finished_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(run.agent_id.to_string())
                .bind(run.event.as_str())
                .bind(&run.tool_use_id)
                .bind(&run.tool_name)
                .bind(&run.program)
                .bind(run.exit_code)
                .bind(run.decision.as_str())
                .bind(&run.output)
                .bind(run.started_at_ms)
                .bind(run.finished_at_ms)
                .execute(&mut *tx)
                .await?;
            }
        })
    }

    async fn hook_runs(&self, agent: AgentId) -> StoreResult<Vec<HookRunRecord>> {
        let rows: Result<Vec<Row>> = sqlx::query_as(
            "SELECT agent_id, event, tool_use_id, tool_name, program, exit_code, decision, \
             output, started_at_ms, finished_at_ms FROM hook_runs WHERE agent_id = $1 ORDER BY id",
        )
        .bind(agent.to_string())
        .fetch_all(self.readers())
        .await
        .map_err(Into::into);
        db(rows.and_then(|rows| rows.into_iter().map(Row::into_record).collect()))
    }
}
