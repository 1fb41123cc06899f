//! Idempotency key rows.

use super::convert::corrupt;
use crate::error::Result;
use crate::{DbError, IdempotencyRecord, IdempotentCall};

#[derive(sqlx::FromRow)]
pub(crate) struct KeyRow {
    tenant: String,
    key: String,
    kind: String,
    request_sha256: String,
    resource_id: String,
    created_at_ms: i64,
}

/// The columns [`KeyRow`] reads, in the order [`INSERT_KEY`] binds them.
macro_rules! key_columns {
    () => {
        "tenant, key, kind, request_sha256, resource_id, created_at_ms"
    };
}
pub(crate) use key_columns;

/// Stores a key: bind it with [`bind_key!`].
pub(crate) const INSERT_KEY: &str = "INSERT INTO idempotency_keys (tenant, key, kind, \
     request_sha256, resource_id, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)";

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

/// What a taken key's `Conflict` says.
pub(crate) fn taken(r: &IdempotencyRecord) -> String {
    format!(
        "idempotency key {:?} of tenant {} is taken",
        r.key, r.tenant
    )
}

/// Binds an [`IdempotencyRecord`] to [`INSERT_KEY`], on either driver.
macro_rules! bind_key {
    ($query:expr, $record:expr) => {{
        let r: &$crate::IdempotencyRecord = $record;
        $query
            .bind(&r.tenant)
            .bind(&r.key)
            .bind(r.kind.as_str())
            .bind(&r.request_sha256)
            .bind(&r.resource_id)
            .bind(r.created_at_ms)
    }};
}
pub(crate) use bind_key;
