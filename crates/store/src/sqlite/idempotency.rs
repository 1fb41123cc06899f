//! Idempotency keys and spending totals.

use sqlx::{SqliteConnection, SqlitePool};

use crate::error::Result;
use crate::rows::convert::{conflict_if_duplicate, from_i64};
use crate::rows::idempotency::{INSERT_KEY, KeyRow, bind_key, key_columns, taken};
use crate::{IdempotencyRecord, Spend, SpendScope};

pub(super) async fn get(
    pool: &SqlitePool,
    tenant: &str,
    key: &str,
) -> Result<Option<IdempotencyRecord>> {
    let row: Option<KeyRow> = sqlx::query_as(concat!(
        "SELECT ",
        key_columns!(),
        " FROM idempotency_keys WHERE tenant = ? AND key = ?"
    ))
    .bind(tenant)
    .bind(key)
    .fetch_optional(pool)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

/// Runs inside the write transaction that creates the key's resource.
pub(super) async fn insert(conn: &mut SqliteConnection, r: &IdempotencyRecord) -> Result<()> {
    bind_key!(sqlx::query(INSERT_KEY), r)
        .execute(conn)
        .await
        .map_err(|e| conflict_if_duplicate(e, || taken(r)))?;
    Ok(())
}

pub(super) async fn spend(pool: &SqlitePool, scope: SpendScope<'_>) -> Result<Spend> {
    let (usd, tokens): (f64, i64) = match scope {
        SpendScope::Batch(id) => {
            sqlx::query_as(
                "SELECT COALESCE(SUM(cost_usd), 0.0), COALESCE(SUM(input_tokens + \
                 cache_creation_input_tokens + cache_read_input_tokens + output_tokens), 0) \
                 FROM agents WHERE batch_id = ?",
            )
            .bind(id.to_string())
            .fetch_one(pool)
            .await?
        }
        SpendScope::Tenant(tenant) => {
            sqlx::query_as(
                "SELECT COALESCE(SUM(cost_usd), 0.0), COALESCE(SUM(input_tokens + \
                 cache_creation_input_tokens + cache_read_input_tokens + output_tokens), 0) \
                 FROM agents WHERE session_id IN (SELECT id FROM sessions WHERE tenant = ?)",
            )
            .bind(tenant)
            .fetch_one(pool)
            .await?
        }
    };
    Ok(Spend {
        usd,
        tokens: from_i64(tokens, "spent tokens")?,
    })
}
