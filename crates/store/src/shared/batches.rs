//! Fork batches: the shared assistant message, the children's shared user blocks, the children.

use forkd_core::fork::ForkBatch;
use forkd_core::{BatchId, Message};

use super::dialect::{self, Conn, Pool};
use super::{agents, sessions};
use crate::StoreError;
use crate::error::Result;
use crate::rows::batches::{
    BatchRow, BatchValues, INSERT_BATCH, batch_columns, bind_batch, budget as stored_budget,
    check_children, check_placed,
};
use crate::rows::convert::conflict_if_duplicate;
use crate::rows::sessions::not_found;
use crate::{BatchExtras, Budget, DbError, NewChild};

/// Runs inside the caller's write transaction. The session's lock makes the transcript check and
/// the appends atomic: of two batches forking a model's reply at one point, the second finds the
/// first's messages and fails with `Conflict`.
pub(crate) async fn create(
    conn: &mut Conn,
    batch: &ForkBatch,
    parent_messages: &[Message],
    children: &[NewChild],
    extras: &BatchExtras<'_>,
) -> Result<()> {
    if let Some((lease, delivered)) = extras.turn {
        dialect::lock_agents(conn, std::iter::once(&lease.agent_id).chain(delivered)).await?;
        agents::check_lease(conn, lease).await?;
    }
    let session_id = batch.session_id.to_string();
    let exists = sessions::lock(conn, &session_id).await?;
    if let Some((_, delivered)) = extras.turn {
        agents::mark_delivered(conn, delivered).await?;
        // The turn's reply is answered: it is the fork message stored below.
        super::pending::clear(conn, &session_id).await?;
    }
    if !exists {
        return Err(not_found(session_id));
    }
    let len = sessions::len(conn, &session_id).await?;
    check_placed(batch, len)?;
    check_children(batch, children)?;

    // A model's fork: its reply, then its tool calls' results. A client's batch: forkd's note
    // that it was launched.
    let mut seq = len;
    if let Some(assistant) = batch.assistant() {
        sessions::insert_message(conn, &session_id, seq, assistant, batch.created_at_ms).await?;
        seq += 1;
    }
    for message in parent_messages {
        if batch.assistant().is_some() {
            sessions::insert_message(conn, &session_id, seq, message, batch.created_at_ms).await?;
        } else {
            sessions::insert_note(conn, &session_id, seq, message, batch.created_at_ms).await?;
        }
        seq += 1;
    }

    let values = BatchValues::new(batch, extras)?;
    bind_batch!(sqlx::query(INSERT_BATCH), &values)
        .execute(&mut *conn)
        .await
        .map_err(|e| conflict_if_duplicate(e, || format!("batch {} already exists", values.id)))?;
    if let Some(webhook) = extras.webhook {
        name_webhook(conn, &values.id, webhook).await?;
    }
    if let Some(schedule) = extras.schedule {
        sqlx::query("UPDATE batches SET schedule = $2 WHERE id = $1")
            .bind(&values.id)
            .bind(schedule)
            .execute(&mut *conn)
            .await?;
    }

    for child in children {
        agents::insert(conn, &child.agent, Some(&child.directive_block)).await?;
    }
    Ok(())
}

pub(crate) async fn get(pool: &Pool, id: BatchId) -> Result<Option<ForkBatch>> {
    let row: Option<BatchRow> = sqlx::query_as(concat!(
        "SELECT ",
        batch_columns!(),
        " FROM batches WHERE id = $1"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(ForkBatch::try_from).transpose()
}

pub(crate) async fn budget(pool: &Pool, id: BatchId) -> Result<Budget> {
    let row: Option<(Option<f64>, Option<i64>)> =
        sqlx::query_as("SELECT budget_usd, budget_tokens FROM batches WHERE id = $1")
            .bind(id.to_string())
            .fetch_optional(pool)
            .await?;
    let (usd, tokens) = row.ok_or_else(|| {
        DbError::Store(StoreError::NotFound {
            kind: "batch",
            id: id.to_string(),
        })
    })?;
    stored_budget(usd, tokens)
}

/// Names the webhook a batch's notifications go to: one of its session's tenant's (else
/// `NotFound`, as for a webhook deleted since the caller looked).
async fn name_webhook(conn: &mut Conn, batch: &str, webhook: forkd_core::WebhookId) -> Result<()> {
    let named = sqlx::query(
        "UPDATE batches SET webhook_id = $2 WHERE id = $1 AND EXISTS (SELECT 1 FROM webhooks w \
         JOIN sessions s ON s.tenant = w.tenant WHERE w.id = $2 AND s.id = batches.session_id)",
    )
    .bind(batch)
    .bind(webhook.to_string())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if named == 0 {
        return Err(DbError::Store(crate::StoreError::NotFound {
            kind: "webhook",
            id: webhook.to_string(),
        }));
    }
    Ok(())
}
