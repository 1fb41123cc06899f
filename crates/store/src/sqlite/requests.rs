//! Model request records and the agents' running totals.

use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqlitePool};

use super::convert::{UsageRow, conflict_if_duplicate, from_i64, opt_id, parse_id, to_i64};
use forkd_core::RequestId;

use crate::StoreError;
use crate::error::Result;
use crate::{DbError, RequestFilter, RequestRecord};

#[derive(sqlx::FromRow)]
struct RequestRow {
    id: String,
    agent_id: String,
    session_id: String,
    batch_id: Option<String>,
    turn: i64,
    model: String,
    #[sqlx(flatten)]
    usage: UsageRow,
    cost_usd: f64,
    prefix_fingerprint: String,
    prefix_parts: String,
    message_count: Option<i64>,
    body_bytes: i64,
    first_token_ms: Option<i64>,
    stop_reason: Option<String>,
    created_at_ms: i64,
}

impl TryFrom<RequestRow> for RequestRecord {
    type Error = DbError;

    fn try_from(row: RequestRow) -> Result<Self> {
        Ok(RequestRecord {
            id: parse_id(&row.id, "request id")?,
            agent_id: parse_id(&row.agent_id, "request agent id")?,
            session_id: parse_id(&row.session_id, "request session id")?,
            batch_id: row
                .batch_id
                .as_deref()
                .map(|b| parse_id(b, "request batch id"))
                .transpose()?,
            turn: from_i64(row.turn, "request turn")?,
            model: row.model,
            usage: row.usage.into_usage()?,
            cost_usd: row.cost_usd,
            prefix_fingerprint: row.prefix_fingerprint,
            prefix_parts: serde_json::from_str(&row.prefix_parts).map_err(|e| {
                DbError::Store(StoreError::Corrupt(format!(
                    "request {}: prefix_parts: {e}",
                    row.id
                )))
            })?,
            message_count: row
                .message_count
                .map(|n| from_i64(n, "request message_count"))
                .transpose()?,
            body_bytes: from_i64(row.body_bytes, "request body_bytes")?,
            first_token_ms: row
                .first_token_ms
                .map(|n| from_i64(n, "request first_token_ms"))
                .transpose()?,
            stop_reason: row.stop_reason,
            created_at_ms: row.created_at_ms,
        })
    }
}

/// Runs inside the caller's write transaction, so the record and the totals never disagree.
pub(super) async fn record(conn: &mut SqliteConnection, r: &RequestRecord) -> Result<()> {
    let agent_id = r.agent_id.to_string();
    let usage = UsageRow::from_usage(&r.usage)?;
    // Updating first doubles as the existence check, with a clear NotFound instead of a foreign
    // key failure from the insert.
    let updated = sqlx::query(
        "UPDATE agents SET input_tokens = input_tokens + ?, \
         cache_creation_input_tokens = cache_creation_input_tokens + ?, \
         cache_read_input_tokens = cache_read_input_tokens + ?, \
         output_tokens = output_tokens + ?, cost_usd = cost_usd + ? WHERE id = ?",
    )
    .bind(usage.input_tokens)
    .bind(usage.cache_creation_input_tokens)
    .bind(usage.cache_read_input_tokens)
    .bind(usage.output_tokens)
    .bind(r.cost_usd)
    .bind(&agent_id)
    .execute(&mut *conn)
    .await?;
    if updated.rows_affected() == 0 {
        return Err(DbError::Store(StoreError::NotFound {
            kind: "agent",
            id: agent_id,
        }));
    }

    let id = r.id.to_string();
    let parts = serde_json::to_string(&r.prefix_parts).map_err(|e| {
        DbError::Store(StoreError::Corrupt(format!(
            "request {id}: prefix_parts: {e}"
        )))
    })?;
    sqlx::query(
        "INSERT INTO requests (id, agent_id, session_id, batch_id, turn, model, input_tokens, \
         cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd, \
         prefix_fingerprint, prefix_parts, message_count, body_bytes, first_token_ms, stop_reason, \
         created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&id)
    .bind(&agent_id)
    .bind(r.session_id.to_string())
    .bind(opt_id(r.batch_id))
    .bind(to_i64(r.turn, "turn")?)
    .bind(&r.model)
    .bind(usage.input_tokens)
    .bind(usage.cache_creation_input_tokens)
    .bind(usage.cache_read_input_tokens)
    .bind(usage.output_tokens)
    .bind(r.cost_usd)
    .bind(&r.prefix_fingerprint)
    .bind(parts)
    .bind(r.message_count.map(i64::from))
    .bind(to_i64(r.body_bytes, "body_bytes")?)
    .bind(
        r.first_token_ms
            .map(|n| to_i64(n, "first_token_ms"))
            .transpose()?,
    )
    .bind(r.stop_reason.as_deref())
    .bind(r.created_at_ms)
    .execute(conn)
    .await
    .map_err(|e| conflict_if_duplicate(e, || format!("request {id} already recorded")))?;
    Ok(())
}

const COLUMNS: &str = "SELECT id, agent_id, session_id, batch_id, turn, model, input_tokens, \
     cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd, \
     prefix_fingerprint, prefix_parts, message_count, body_bytes, first_token_ms, stop_reason, \
     created_at_ms FROM requests";

pub(super) async fn get(pool: &SqlitePool, id: RequestId) -> Result<Option<RequestRecord>> {
    let mut q = QueryBuilder::<Sqlite>::new(COLUMNS);
    q.push(" WHERE id = ").push_bind(id.to_string());
    let row: Option<RequestRow> = q.build_query_as().fetch_optional(pool).await?;
    row.map(RequestRecord::try_from).transpose()
}

/// Requests in id (creation) order.
pub(super) async fn list(pool: &SqlitePool, filter: &RequestFilter) -> Result<Vec<RequestRecord>> {
    let mut q = QueryBuilder::<Sqlite>::new(COLUMNS);
    q.push(" WHERE TRUE");
    if let Some(session_id) = filter.session_id {
        q.push(" AND session_id = ")
            .push_bind(session_id.to_string());
    }
    if let Some(batch_id) = filter.batch_id {
        q.push(" AND batch_id = ").push_bind(batch_id.to_string());
    }
    if let Some(agent_id) = filter.agent_id {
        q.push(" AND agent_id = ").push_bind(agent_id.to_string());
    }
    q.push(" ORDER BY id");
    let rows: Vec<RequestRow> = q.build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(RequestRecord::try_from).collect()
}
