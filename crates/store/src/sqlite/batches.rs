//! Fork batches: the shared assistant message, the children's shared user blocks, the children.

use forkd_core::fork::{ForkBatch, ForkShape};
use forkd_core::{BatchId, Message, Role};
use sqlx::{SqliteConnection, SqlitePool};

use super::convert::{
    blocks_from_array, conflict_if_duplicate, content_array, corrupt, from_i64,
    insert_session_message, parse_id, session_len, to_i64,
};
use super::{agents, sessions};
use crate::StoreError;
use crate::error::Result;
use crate::{BatchExtras, Budget, DbError, NewChild};

#[derive(sqlx::FromRow)]
struct BatchRow {
    id: String,
    session_id: String,
    fork_point: i64,
    compacted_to: Option<i64>,
    shape: String,
    assistant_json: String,
    shared_user_blocks_json: String,
    created_at_ms: i64,
}

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
            created_at_ms: row.created_at_ms,
        })
    }
}

/// Runs inside the caller's write transaction, so the transcript check and the appends are atomic.
pub(super) async fn create(
    conn: &mut SqliteConnection,
    batch: &ForkBatch,
    parent_messages: &[Message],
    children: &[NewChild],
    extras: &BatchExtras<'_>,
) -> Result<()> {
    if let Some((lease, delivered)) = extras.turn {
        agents::check_lease(conn, lease).await?;
        agents::mark_delivered(conn, delivered).await?;
    }
    let session_id = batch.session_id.to_string();
    if extras.turn.is_some() {
        // The turn's reply is answered: it is the fork message stored below.
        super::pending::clear(conn, &session_id).await?;
    }
    if !sessions::exists(conn, &session_id).await? {
        return Err(DbError::Store(StoreError::NotFound {
            kind: "session",
            id: session_id,
        }));
    }
    let fork_point = to_i64(batch.fork_point, "fork_point")?;
    let len = session_len(conn, &session_id).await?;
    // A model's fork message must come right after the history its children inherit; a client's
    // batch may fork at the end of a finished turn while a later one is in flight.
    let placed = match batch.shape {
        ForkShape::Model { .. } => len == fork_point,
        ForkShape::Client => len >= fork_point,
    };
    if !placed {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "session {session_id} has {len} messages; batch {} forks at {fork_point}",
            batch.id
        ))));
    }
    for child in children {
        let agent = &child.agent;
        if agent.session_id != batch.session_id || agent.batch_id != Some(batch.id) {
            return Err(DbError::Store(StoreError::Conflict(format!(
                "agent {} does not belong to batch {} of session {session_id}",
                agent.id, batch.id
            ))));
        }
    }

    let (shape, assistant_json) = match &batch.shape {
        ForkShape::Model { assistant } => ("model", assistant.content_json()),
        // No fork message: an empty content array, never read back.
        ForkShape::Client => ("client", "[]".to_owned()),
    };
    let appended = batch.assistant().into_iter().chain(parent_messages);
    for (seq, message) in (len..).zip(appended) {
        insert_session_message(conn, &session_id, seq, message, batch.created_at_ms).await?;
    }

    let id = batch.id.to_string();
    sqlx::query(
        "INSERT INTO batches (id, session_id, fork_point, shape, assistant_json, \
         shared_user_blocks_json, created_at_ms, budget_usd, budget_tokens, compacted_to) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&id)
    .bind(&session_id)
    .bind(fork_point)
    .bind(shape)
    .bind(assistant_json)
    .bind(content_array(&batch.shared_user_blocks))
    .bind(batch.created_at_ms)
    .bind(extras.budget.usd)
    .bind(
        extras
            .budget
            .tokens
            .map(|t| to_i64(t, "budget_tokens"))
            .transpose()?,
    )
    .bind(
        batch
            .compacted_to
            .map(|to| to_i64(to, "compacted_to"))
            .transpose()?,
    )
    .execute(&mut *conn)
    .await
    .map_err(|e| conflict_if_duplicate(e, || format!("batch {id} already exists")))?;

    for child in children {
        agents::insert(conn, &child.agent, Some(&child.directive_block)).await?;
    }
    Ok(())
}

pub(super) async fn get(pool: &SqlitePool, id: BatchId) -> Result<Option<ForkBatch>> {
    let row: Option<BatchRow> = sqlx::query_as(
        "SELECT id, session_id, fork_point, compacted_to, shape, assistant_json, \
         shared_user_blocks_json, created_at_ms FROM batches WHERE id = ?",
    )
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(ForkBatch::try_from).transpose()
}

pub(super) async fn budget(pool: &SqlitePool, id: BatchId) -> Result<Budget> {
    let row: Option<(Option<f64>, Option<i64>)> =
        sqlx::query_as("SELECT budget_usd, budget_tokens FROM batches WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(pool)
            .await?;
    let (usd, tokens) = row.ok_or_else(|| {
        DbError::Store(StoreError::NotFound {
            kind: "batch",
            id: id.to_string(),
        })
    })?;
    Ok(Budget {
        usd,
        tokens: tokens.map(|t| from_i64(t, "budget_tokens")).transpose()?,
    })
}
