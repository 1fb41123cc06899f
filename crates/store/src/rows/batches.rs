//! Fork batch rows, and the checks a batch passes before it is stored.

use forkd_core::fork::{ForkBatch, ForkShape};
use forkd_core::output::OutputSchema;
use forkd_core::{Message, Role};

use super::convert::{blocks_from_array, content_array, corrupt, from_i64, parse_id, to_i64};
use crate::StoreError;
use crate::error::Result;
use crate::{BatchExtras, DbError, NewChild};

#[derive(sqlx::FromRow)]
pub(crate) struct BatchRow {
    id: String,
    session_id: String,
    fork_point: i64,
    compacted_to: Option<i64>,
    shape: String,
    assistant_json: String,
    shared_user_blocks_json: String,
    output_schema: Option<String>,
    trace_parent: Option<String>,
    created_at_ms: i64,
}

/// The columns [`BatchRow`] reads.
macro_rules! batch_columns {
    () => {
        "id, session_id, fork_point, compacted_to, shape, assistant_json, shared_user_blocks_json, \
         output_schema, trace_parent, created_at_ms"
    };
}
pub(crate) use batch_columns;

impl TryFrom<BatchRow> for ForkBatch {
    type Error = DbError;

    /// Rebuilt field by field from the stored bytes, never through [`ForkBatch::new`]: the shared
    /// blocks are what the children were sent, not what today's code would build.
    fn try_from(row: BatchRow) -> Result<Self> {
        Ok(ForkBatch {
            id: parse_id(&row.id, "batch id")?,
            session_id: parse_id(&row.session_id, "batch session id")?,
            fork_point: from_i64(row.fork_point, "fork_point")?,
            compacted_to: row
                .compacted_to
                .map(|to| from_i64(to, "compacted_to"))
                .transpose()?,
            shape: match row.shape.as_str() {
                "model" => ForkShape::Model {
                    assistant: Message::from_stored(Role::Assistant, &row.assistant_json)
                        .map_err(|e| corrupt("batch assistant message", e))?,
                },
                "client" => ForkShape::Client,
                other => return Err(corrupt("batch shape", format!("unknown {other:?}"))),
            },
            shared_user_blocks: blocks_from_array(
                &row.shared_user_blocks_json,
                "batch shared user blocks",
            )?,
            output_schema: row.output_schema.map(OutputSchema::from_stored),
            trace_parent: row.trace_parent,
            created_at_ms: row.created_at_ms,
        })
    }
}

/// Whether a batch may be stored on a transcript of `len` messages: a model's fork message must
/// come right after the history its children inherit; a client's batch may fork at the end of a
/// finished turn while a later one is in flight. `Conflict` when it may not.
pub(crate) fn check_placed(batch: &ForkBatch, len: i64) -> Result<()> {
    let fork_point = to_i64(batch.fork_point, "fork_point")?;
    let placed = match batch.shape {
        ForkShape::Model { .. } => len == fork_point,
        ForkShape::Client => len >= fork_point,
    };
    if placed {
        return Ok(());
    }
    Err(DbError::Store(StoreError::Conflict(format!(
        "session {} has {len} messages; batch {} forks at {fork_point}",
        batch.session_id, batch.id
    ))))
}

/// `Conflict` unless every child belongs to the batch and its session.
pub(crate) fn check_children(batch: &ForkBatch, children: &[NewChild]) -> Result<()> {
    for child in children {
        let agent = &child.agent;
        if agent.session_id != batch.session_id || agent.batch_id != Some(batch.id) {
            return Err(DbError::Store(StoreError::Conflict(format!(
                "agent {} does not belong to batch {} of session {}",
                agent.id, batch.id, batch.session_id
            ))));
        }
    }
    Ok(())
}

/// Inserts a batch: bind [`BatchValues`] with [`bind_batch!`].
pub(crate) const INSERT_BATCH: &str = "INSERT INTO batches (id, session_id, fork_point, shape, assistant_json, \
     shared_user_blocks_json, created_at_ms, budget_usd, budget_tokens, compacted_to, \
     output_schema, trace_parent) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// A batch as its row stores it.
pub(crate) struct BatchValues {
    pub id: String,
    pub session_id: String,
    pub fork_point: i64,
    pub shape: &'static str,
    pub assistant_json: String,
    pub shared_user_blocks_json: String,
    pub created_at_ms: i64,
    pub budget_usd: Option<f64>,
    pub budget_tokens: Option<i64>,
    pub compacted_to: Option<i64>,
    pub output_schema: Option<String>,
    pub trace_parent: Option<String>,
}

impl BatchValues {
    pub fn new(batch: &ForkBatch, extras: &BatchExtras<'_>) -> Result<Self> {
        let (shape, assistant_json) = match &batch.shape {
            ForkShape::Model { assistant } => ("model", assistant.content_json()),
            // No fork message: an empty content array, never read back.
            ForkShape::Client => ("client", "[]".to_owned()),
        };
        Ok(Self {
            id: batch.id.to_string(),
            session_id: batch.session_id.to_string(),
            fork_point: to_i64(batch.fork_point, "fork_point")?,
            shape,
            assistant_json,
            shared_user_blocks_json: content_array(&batch.shared_user_blocks),
            created_at_ms: batch.created_at_ms,
            budget_usd: extras.budget.usd,
            budget_tokens: extras
                .budget
                .tokens
                .map(|t| to_i64(t, "budget_tokens"))
                .transpose()?,
            compacted_to: batch
                .compacted_to
                .map(|to| to_i64(to, "compacted_to"))
                .transpose()?,
            output_schema: batch.output_schema.as_ref().map(|s| s.as_str().to_owned()),
            trace_parent: batch.trace_parent.clone(),
        })
    }
}

/// Binds [`BatchValues`] to [`INSERT_BATCH`], on either driver.
macro_rules! bind_batch {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::batches::BatchValues = $values;
        $query
            .bind(&v.id)
            .bind(&v.session_id)
            .bind(v.fork_point)
            .bind(v.shape)
            .bind(&v.assistant_json)
            .bind(&v.shared_user_blocks_json)
            .bind(v.created_at_ms)
            .bind(v.budget_usd)
            .bind(v.budget_tokens)
            .bind(v.compacted_to)
            .bind(&v.output_schema)
            .bind(&v.trace_parent)
    }};
}
pub(crate) use bind_batch;

/// A batch's budget as stored: NULL for none.
pub(crate) fn budget(usd: Option<f64>, tokens: Option<i64>) -> Result<crate::Budget> {
    Ok(crate::Budget {
        usd,
        tokens: tokens.map(|t| from_i64(t, "budget_tokens")).transpose()?,
    })
}
