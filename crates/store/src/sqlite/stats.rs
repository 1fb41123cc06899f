//! The snapshot the metrics endpoint reports: agents by kind and state, and recent batches.

use sqlx::SqlitePool;

use crate::Stats;
use crate::error::Result;
use crate::rows::stats::{BatchStatsRow, agent_count};

pub(super) async fn stats(pool: &SqlitePool, batches_since_ms: i64) -> Result<Stats> {
    // One read transaction: the counts and the batches are one snapshot.
    let mut tx = pool.begin().await?;
    let counts: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT kind, state, COUNT(*) FROM agents GROUP BY kind, state")
            .fetch_all(&mut *tx)
            .await?;
    let rows: Vec<BatchStatsRow> = sqlx::query_as(
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
    Ok(Stats {
        agents: counts.into_iter().map(agent_count).collect::<Result<_>>()?,
        batches: rows
            .into_iter()
            .map(BatchStatsRow::into_stats)
            .collect::<Result<_>>()?,
    })
}
