//! The snapshot the metrics endpoint reports: agents by kind and state, and recent batches.

use forkd_core::{AgentKind, AgentState};
use sqlx::SqlitePool;

use super::convert::{UsageRow, corrupt, from_i64, parse_id};
use crate::error::Result;
use crate::{AgentCount, BatchStats, Stats};

#[derive(sqlx::FromRow)]
struct BatchRow {
    batch_id: String,
    session_id: String,
    tenant: String,
    children: i64,
    ended: i64,
    #[sqlx(flatten)]
    usage: UsageRow,
    cost_usd: f64,
}

pub(super) async fn stats(pool: &SqlitePool, batches_since_ms: i64) -> Result<Stats> {
    // One read transaction: the counts and the batches are one snapshot.
    let mut tx = pool.begin().await?;
    let counts: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT kind, state, COUNT(*) FROM agents GROUP BY kind, state")
            .fetch_all(&mut *tx)
            .await?;
    let agents = counts
        .into_iter()
        .map(|(kind, state, count)| {
            Ok(AgentCount {
                kind: AgentKind::parse(&kind)
                    .ok_or_else(|| corrupt("agent kind", format!("unknown {kind:?}")))?,
                state: AgentState::parse(&state)
                    .ok_or_else(|| corrupt("agent state", format!("unknown {state:?}")))?,
                count: from_i64(count, "agent count")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;

    let rows: Vec<BatchRow> = sqlx::query_as(
        "SELECT a.batch_id, a.session_id, s.tenant, COUNT(*) AS children, \
         SUM(a.state IN ('completed', 'failed', 'killed')) AS ended, \
         SUM(a.input_tokens) AS input_tokens, \
         SUM(a.cache_creation_input_tokens) AS cache_creation_input_tokens, \
         SUM(a.cache_read_input_tokens) AS cache_read_input_tokens, \
         SUM(a.output_tokens) AS output_tokens, SUM(a.cost_usd) AS cost_usd \
         FROM agents a JOIN sessions s ON s.id = a.session_id \
         WHERE a.batch_id IN ( \
             SELECT batch_id FROM agents WHERE batch_id IS NOT NULL \
                 AND state IN ('pending', 'running') \
             UNION \
             SELECT batch_id FROM agents WHERE batch_id IS NOT NULL AND updated_at_ms >= ?) \
         GROUP BY a.batch_id, a.session_id, s.tenant ORDER BY a.batch_id",
    )
    .bind(batches_since_ms)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let batches = rows
        .into_iter()
        .map(|row| {
            Ok(BatchStats {
                batch_id: parse_id(&row.batch_id, "batch id")?,
                session_id: parse_id(&row.session_id, "batch session id")?,
                tenant: row.tenant,
                children: from_i64(row.children, "batch children")?,
                ended: from_i64(row.ended, "batch ended children")?,
                usage: row.usage.into_usage()?,
                cost_usd: row.cost_usd,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Stats { agents, batches })
}
