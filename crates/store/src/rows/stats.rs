//! The rows of the metrics snapshot.

use forkd_core::AgentKind;

use super::agents::parse_state;
use super::convert::{UsageRow, corrupt, from_i64, parse_id};
use crate::error::Result;
use crate::{AgentCount, BatchStats};

/// One (kind, state) pair and how many agents are in it.
pub(crate) fn agent_count((kind, state, count): (String, String, i64)) -> Result<AgentCount> {
    Ok(AgentCount {
        kind: AgentKind::parse(&kind)
            .ok_or_else(|| corrupt("agent kind", format!("unknown {kind:?}")))?,
        state: parse_state(&state)?,
        count: from_i64(count, "agent count")?,
    })
}

/// One batch's children, summed.
#[derive(sqlx::FromRow)]
pub(crate) struct BatchStatsRow {
    batch_id: String,
    session_id: String,
    tenant: String,
    children: i64,
    ended: i64,
    #[sqlx(flatten)]
    usage: UsageRow,
    cost_usd: f64,
}

impl BatchStatsRow {
    pub fn into_stats(self) -> Result<BatchStats> {
        Ok(BatchStats {
            batch_id: parse_id(&self.batch_id, "batch id")?,
            session_id: parse_id(&self.session_id, "batch session id")?,
            tenant: self.tenant,
            children: from_i64(self.children, "batch children")?,
            ended: from_i64(self.ended, "batch ended children")?,
            usage: self.usage.into_usage()?,
            cost_usd: self.cost_usd,
        })
    }
}
