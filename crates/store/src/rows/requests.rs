//! Model request rows.

use super::convert::{UsageRow, from_i64, opt_id, parse_id, to_i64};
use crate::StoreError;
use crate::error::Result;
use crate::{DbError, RequestRecord};

#[derive(sqlx::FromRow)]
pub(crate) struct RequestRow {
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
    sent_at_ms: Option<i64>,
    stop_reason: Option<String>,
    created_at_ms: i64,
}

/// The columns of a request row, in the order [`RequestRow`] reads and [`bind_request!`] binds.
macro_rules! request_columns {
    () => {
        "id, agent_id, session_id, batch_id, turn, model, input_tokens, \
         cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd, \
         prefix_fingerprint, prefix_parts, message_count, body_bytes, first_token_ms, stop_reason, \
         created_at_ms, sent_at_ms"
    };
}

/// Reads requests: append the `WHERE` clause.
pub(crate) const SELECT_REQUESTS: &str = concat!("SELECT ", request_columns!(), " FROM requests");

/// Stores a request: bind [`RequestValues`] with [`bind_request!`].
pub(crate) const INSERT_REQUEST: &str = concat!(
    "INSERT INTO requests (",
    request_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)"
);

/// Adds a request's usage and cost to its agent's totals: bind the [`RequestValues`]' usage and
/// cost, then the agent id.
pub(crate) const ADD_TO_TOTALS: &str = "UPDATE agents SET input_tokens = input_tokens + $1, \
     cache_creation_input_tokens = cache_creation_input_tokens + $2, \
     cache_read_input_tokens = cache_read_input_tokens + $3, \
     output_tokens = output_tokens + $4, cost_usd = cost_usd + $5 WHERE id = $6";

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
            sent_at_ms: row.sent_at_ms,
            created_at_ms: row.created_at_ms,
        })
    }
}

/// A request as its row stores it.
pub(crate) struct RequestValues<'a> {
    pub id: String,
    pub agent_id: String,
    pub session_id: String,
    pub batch_id: Option<String>,
    pub turn: i64,
    pub model: &'a str,
    pub usage: UsageRow,
    pub cost_usd: f64,
    pub prefix_fingerprint: &'a str,
    pub prefix_parts: String,
    pub message_count: Option<i64>,
    pub body_bytes: i64,
    pub first_token_ms: Option<i64>,
    pub stop_reason: Option<&'a str>,
    pub created_at_ms: i64,
    pub sent_at_ms: Option<i64>,
}

impl<'a> RequestValues<'a> {
    pub fn new(r: &'a RequestRecord) -> Result<Self> {
        let id = r.id.to_string();
        let prefix_parts = serde_json::to_string(&r.prefix_parts).map_err(|e| {
            DbError::Store(StoreError::Corrupt(format!(
                "request {id}: prefix_parts: {e}"
            )))
        })?;
        Ok(Self {
            id,
            agent_id: r.agent_id.to_string(),
            session_id: r.session_id.to_string(),
            batch_id: opt_id(r.batch_id),
            turn: to_i64(r.turn, "turn")?,
            model: &r.model,
            usage: UsageRow::from_usage(&r.usage)?,
            cost_usd: r.cost_usd,
            prefix_fingerprint: &r.prefix_fingerprint,
            prefix_parts,
            message_count: r.message_count.map(i64::from),
            body_bytes: to_i64(r.body_bytes, "body_bytes")?,
            first_token_ms: r
                .first_token_ms
                .map(|n| to_i64(n, "first_token_ms"))
                .transpose()?,
            stop_reason: r.stop_reason.as_deref(),
            created_at_ms: r.created_at_ms,
            sent_at_ms: r.sent_at_ms,
        })
    }
}

/// Binds [`RequestValues`] to [`INSERT_REQUEST`], on either driver.
macro_rules! bind_request {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::requests::RequestValues<'_> = $values;
        $query
            .bind(&v.id)
            .bind(&v.agent_id)
            .bind(&v.session_id)
            .bind(&v.batch_id)
            .bind(v.turn)
            .bind(v.model)
            .bind(v.usage.input_tokens)
            .bind(v.usage.cache_creation_input_tokens)
            .bind(v.usage.cache_read_input_tokens)
            .bind(v.usage.output_tokens)
            .bind(v.cost_usd)
            .bind(v.prefix_fingerprint)
            .bind(&v.prefix_parts)
            .bind(v.message_count)
            .bind(v.body_bytes)
            .bind(v.first_token_ms)
            .bind(v.stop_reason)
            .bind(v.created_at_ms)
            .bind(v.sent_at_ms)
    }};
}
pub(crate) use bind_request;

/// Binds a request's usage and cost, then its agent, to [`ADD_TO_TOTALS`], on either driver.
macro_rules! bind_totals {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::requests::RequestValues<'_> = $values;
        $query
            .bind(v.usage.input_tokens)
            .bind(v.usage.cache_creation_input_tokens)
            .bind(v.usage.cache_read_input_tokens)
            .bind(v.usage.output_tokens)
            .bind(v.cost_usd)
            .bind(&v.agent_id)
    }};
}
pub(crate) use bind_totals;
