//! The snapshot the metrics endpoint reports: agents by kind and state, and recent batches.

use super::dialect::{self, Pool};
use crate::Stats;
use crate::error::Result;
use crate::rows::stats::{BatchStatsRow, agent_count};

pub(crate) async fn stats(pool: &Pool, batches_since_ms: i64) -> Result<Stats> {
    // One snapshot for both reads.
    let mut tx = dialect::begin_snapshot(pool).await?;
    let counts: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT kind, state, COUNT(*) FROM agents GROUP BY kind, state")
            .fetch_all(&mut *tx)
            .await?;
    // SUM over BIGINT is NUMERIC in PostgreSQL: cast back.
    let rows: Vec<BatchStatsRow> = sqlx::query_as(
        "SELECT a.batch_id, a.session_id, s.tenant, COUNT(*) AS children, \
         COUNT(*) FILTER (WHERE a.state IN ('completed', 'failed', 'killed', 'timed_out')) AS ended, \
         CAST(SUM(a.input_tokens) AS BIGINT) AS input_tokens, \
         CAST(SUM(a.cache_creation_input_tokens) AS BIGINT) AS cache_creation_input_tokens, \
         CAST(SUM(a.cache_read_input_tokens) AS BIGINT) AS cache_read_input_tokens, \
         CAST(SUM(a.output_tokens) AS BIGINT) AS output_tokens, SUM(a.cost_usd) AS cost_usd \
         FROM agents a JOIN sessions s ON s.id = a.session_id \
         WHERE a.batch_id IN ( \
             SELECT batch_id FROM agents WHERE batch_id IS NOT NULL \
                 AND state IN ('pending', 'running') \
             UNION \
             SELECT batch_id FROM agents WHERE batch_id IS NOT NULL AND updated_at_ms >= $1) \
         GROUP BY a.batch_id, a.session_id, s.tenant ORDER BY a.batch_id",
    )
    .bind(batches_since_ms)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Stats {
        agents: counts.into_iter().map(agent_count).collect::<Result<_>>()?,
        batches: rows
            .into_iter()
            .map(BatchStatsRow::into_stats)
            .collect::<Result<_>>()?,
    })
}
