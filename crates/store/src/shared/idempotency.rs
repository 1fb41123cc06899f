//! Idempotency keys and spending totals.

use super::dialect::{Conn, Pool};
use crate::error::Result;
use crate::rows::convert::{conflict_if_duplicate, from_i64};
use crate::rows::idempotency::{INSERT_KEY, KeyRow, bind_key, key_columns, taken};
use crate::{IdempotencyRecord, Spend, SpendScope};

pub(crate) async fn get(pool: &Pool, tenant: &str, key: &str) -> Result<Option<IdempotencyRecord>> {
    let row: Option<KeyRow> = sqlx::query_as(concat!(
        "SELECT ",
        key_columns!(),
        " FROM idempotency_keys WHERE tenant = $1 AND key = $2"
    ))
    .bind(tenant)
    .bind(key)
    .fetch_optional(pool)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

/// Runs inside the write transaction that creates the key's resource. A transaction inserting the
/// same key at the same time waits for this one, then fails with `Conflict` if it committed.
pub(crate) async fn insert(conn: &mut Conn, r: &IdempotencyRecord) -> Result<()> {
    bind_key!(sqlx::query(INSERT_KEY), r)
        .execute(conn)
        .await
        .map_err(|e| conflict_if_duplicate(e, || taken(r)))?;
    Ok(())
}

/// What the agents `scope` covers have spent (a sum over `agents` WHERE this, with `$1`).
fn spend_of(scope: SpendScope<'_>) -> (&'static str, String) {
    match scope {
        SpendScope::Batch(id) => ("batch_id = $1", id.to_string()),
        SpendScope::Tenant(tenant) => (
            "session_id IN (SELECT id FROM sessions WHERE tenant = $1)",
            tenant.to_owned(),
        ),
    }
}

pub(crate) async fn spend(pool: &Pool, scope: SpendScope<'_>) -> Result<Spend> {
    let (condition, key) = spend_of(scope);
    // SUM over BIGINT is NUMERIC in PostgreSQL: cast back.
    let (usd, tokens): (f64, i64) = sqlx::query_as(super::sql(format!(
        "SELECT CAST(COALESCE(SUM(cost_usd), 0.0) AS DOUBLE PRECISION), \
         CAST(COALESCE(SUM(input_tokens + cache_creation_input_tokens + \
         cache_read_input_tokens + output_tokens), 0) AS BIGINT) \
         FROM agents WHERE {condition}"
    )))
    .bind(key)
    .fetch_one(pool)
    .await?;
    Ok(Spend {
        usd,
        tokens: from_i64(tokens, "spent tokens")?,
    })
}
