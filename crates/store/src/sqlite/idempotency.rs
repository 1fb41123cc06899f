//! Idempotency keys and spending totals.

use sqlx::{SqliteConnection, SqlitePool};

use super::convert::{conflict_if_duplicate, corrupt, from_i64};
use crate::error::Result;
use crate::{DbError, IdempotencyRecord, IdempotentCall, Spend, SpendScope};

#[derive(sqlx::FromRow)]
struct KeyRow {
    tenant: String,
    key: String,
    kind: String,
    request_sha256: String,
    resource_id: String,
    created_at_ms: i64,
}

impl TryFrom<KeyRow> for IdempotencyRecord {
    type Error = DbError;

    fn try_from(row: KeyRow) -> Result<Self> {
        Ok(IdempotencyRecord {
            kind: IdempotentCall::parse(&row.kind).ok_or_else(|| {
                corrupt("idempotency key kind", format!("unknown {:?}", row.kind))
            })?,
            tenant: row.tenant,
            key: row.key,
            request_sha256: row.request_sha256,
            resource_id: row.resource_id,
            created_at_ms: row.created_at_ms,
        })
    }
}

pub(super) async fn get(
    pool: &SqlitePool,
    tenant: &str,
    key: &str,
) -> Result<Option<IdempotencyRecord>> {
    let row: Option<KeyRow> = sqlx::query_as(
        "SELECT tenant, key, kind, request_sha256, resource_id, created_at_ms \
         FROM idempotency_keys WHERE tenant = ? AND key = ?",
    )
    .bind(tenant)
    .bind(key)
    .fetch_optional(pool)
    .await?;
    row.map(IdempotencyRecord::try_from).transpose()
}

/// Runs inside the write transaction that creates the key's resource.
pub(super) async fn insert(conn: &mut SqliteConnection, r: &IdempotencyRecord) -> Result<()> {
    sqlx::query(
        "INSERT INTO idempotency_keys (tenant, key, kind, request_sha256, resource_id, \
         created_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(&r.tenant)
    .bind(&r.key)
    .bind(r.kind.as_str())
    .bind(&r.request_sha256)
    .bind(&r.resource_id)
    .bind(r.created_at_ms)
    .execute(conn)
    .await
    .map_err(|e| {
        conflict_if_duplicate(e, || {
            format!(
                "idempotency key {:?} of tenant {} is taken",
                r.key, r.tenant
            )
        })
    })?;
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
