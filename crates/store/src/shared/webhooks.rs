//! Webhooks: the registry, the outbox rows a notification's transaction writes, claims and
//! attempts ([`forkd_core::webhook::WebhookStore`]).

use std::time::Duration;

use async_trait::async_trait;
use forkd_core::webhook::{
    Attempt, AttemptRecord, Delivery, Disabled, Next, Secrets, Webhook, WebhookStore,
};
use forkd_core::{DaemonId, DeliveryId, Notification, WebhookId};

use crate::NotificationFilter;

use super::dialect::{CLAIM_SKIP_LOCKED, Conn, DriverStore, NOW_MS};
use super::notifications;
use super::tx::{StoreResult, db};
use crate::error::Result;
use crate::rows::convert::{bound, now_ms, opt_id, to_i64};
use crate::rows::webhooks::{
    AttemptRow, DELIVERY_COLUMNS, DeliveryRow, WEBHOOK_COLUMNS, WebhookRow, event_columns,
    kinds_column,
};

/// How long the daemon that creates a delivery (a ping it sends at once) holds it.
const CREATED_CLAIM_MS: i64 = 60_000;

/// Runs inside a notification's transaction: one delivery for each enabled webhook of the
/// session's tenant that receives it — its kind and session match and it is not `named_only`,
/// or its batch named it.
pub(crate) async fn enqueue(conn: &mut Conn, stored: &Notification, tenant: &str) -> Result<()> {
    let kind = format!("%,{},%", stored.kind.as_str());
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM webhooks WHERE tenant = $1 AND disabled_at_ms IS NULL AND ( \
             (NOT named_only AND (session_id IS NULL OR session_id = $2) \
              AND (kinds = '' OR ',' || kinds || ',' LIKE $3)) \
             OR id = (SELECT webhook_id FROM batches WHERE id = $4))",
    )
    .bind(tenant)
    .bind(stored.session_id.to_string())
    .bind(&kind)
    .bind(opt_id(stored.batch_id))
    .fetch_all(&mut *conn)
    .await?;
    let seq = bound(stored.seq);
    for webhook in ids {
        sqlx::query(
            "INSERT INTO webhook_deliveries (id, webhook_id, event, notification_seq, \
             created_at_ms, next_attempt_at_ms) VALUES ($1, $2, 'notification', $3, $4, $4)",
        )
        .bind(DeliveryId::new().to_string())
        .bind(webhook)
        .bind(seq)
        .bind(stored.created_at_ms)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

async fn create(conn: &mut Conn, w: &Webhook, sealed_secret: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO webhooks (id, tenant, url, kinds, session_id, named_only, secret_sealed, \
         created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(w.id.to_string())
    .bind(&w.tenant)
    .bind(&w.url)
    .bind(kinds_column(&w.kinds))
    .bind(opt_id(w.session_id))
    .bind(w.named_only)
    .bind(sealed_secret)
    .bind(w.created_at_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn delete(conn: &mut Conn, tenant: &str, id: WebhookId) -> Result<bool> {
    let id = id.to_string();
    let owned: Option<String> =
        sqlx::query_scalar("SELECT id FROM webhooks WHERE id = $1 AND tenant = $2")
            .bind(&id)
            .bind(tenant)
            .fetch_optional(&mut *conn)
            .await?;
    if owned.is_none() {
        return Ok(false);
    }
    sqlx::query("DELETE FROM webhook_attempts WHERE webhook_id = $1")
        .bind(&id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM webhook_deliveries WHERE webhook_id = $1")
        .bind(&id)
        .execute(&mut *conn)
        .await?;
    // A batch that named it names nothing now.
    sqlx::query("UPDATE batches SET webhook_id = NULL WHERE webhook_id = $1")
        .bind(&id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM webhooks WHERE id = $1")
        .bind(&id)
        .execute(&mut *conn)
        .await?;
    Ok(true)
}

async fn claim(
    conn: &mut Conn,
    daemon: DaemonId,
    limit: u32,
    claim_for: Duration,
) -> Result<Vec<Delivery>> {
    let claim_ms = i64::try_from(claim_for.as_millis()).unwrap_or(i64::MAX);
    let rows: Vec<DeliveryRow> = sqlx::query_as(super::sql(format!(
        "UPDATE webhook_deliveries SET claimed_by = $1, claim_until_ms = {NOW_MS} + $2 \
         WHERE id IN (SELECT id FROM webhook_deliveries WHERE state = 'pending' \
             AND next_attempt_at_ms <= {NOW_MS} \
             AND (claim_until_ms IS NULL OR claim_until_ms < {NOW_MS}) \
             ORDER BY next_attempt_at_ms LIMIT $3{CLAIM_SKIP_LOCKED}) \
         RETURNING {DELIVERY_COLUMNS}"
    )))
    .bind(daemon.to_string())
    .bind(claim_ms)
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter().map(DeliveryRow::into_delivery).collect()
}

/// Records an attempt and moves its delivery on; `None` when the delivery is gone or no longer
/// pending (deleted with its webhook, or taken by another attempt).
async fn record(
    conn: &mut Conn,
    daemon: DaemonId,
    attempt: &Attempt,
    next: &Next,
    disable_after: Duration,
) -> Result<Option<Disabled>> {
    let (state, next_at) = match next {
        Next::Delivered => ("delivered", None),
        Next::RetryAt(at) => ("pending", Some(*at)),
        Next::Failed(_) => ("failed", None),
    };
    let moved: Option<(String, i64)> = sqlx::query_as(
        "UPDATE webhook_deliveries SET attempts = attempts + 1, state = $2, \
         next_attempt_at_ms = COALESCE($3, next_attempt_at_ms), claimed_by = NULL, \
         claim_until_ms = NULL \
         WHERE id = $1 AND state = 'pending' AND (claimed_by IS NULL OR claimed_by = $4) \
         RETURNING webhook_id, attempts",
    )
    .bind(attempt.delivery_id.to_string())
    .bind(state)
    .bind(next_at)
    .bind(daemon.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    let Some((webhook_id, number)) = moved else {
        return Ok(None);
    };
    sqlx::query(
        "INSERT INTO webhook_attempts (delivery_id, number, webhook_id, at_ms, status, error, \
         latency_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(attempt.delivery_id.to_string())
    .bind(number)
    .bind(&webhook_id)
    .bind(attempt.at_ms)
    .bind(attempt.status.map(i64::from))
    .bind(attempt.error.as_deref())
    .bind(to_i64(attempt.latency_ms, "latency")?)
    .execute(&mut *conn)
    .await?;
    if attempt.succeeded() {
        sqlx::query("UPDATE webhooks SET failing_since_ms = NULL WHERE id = $1")
            .bind(&webhook_id)
            .execute(&mut *conn)
            .await?;
        return Ok(None);
    }
    let since: Option<i64> = sqlx::query_scalar(
        "UPDATE webhooks SET failing_since_ms = COALESCE(failing_since_ms, $2) \
         WHERE id = $1 AND disabled_at_ms IS NULL RETURNING failing_since_ms",
    )
    .bind(&webhook_id)
    .bind(attempt.at_ms)
    .fetch_optional(&mut *conn)
    .await?
    .flatten();
    let limit = i64::try_from(disable_after.as_millis()).unwrap_or(i64::MAX);
    let Some(since) = since.filter(|since| attempt.at_ms.saturating_sub(*since) >= limit) else {
        return Ok(None);
    };
    let disabled = Disabled {
        at_ms: attempt.at_ms,
        reason: format!(
            "disabled: every attempt failed for {} s (since {since} ms); the latest: {}",
            disable_after.as_secs(),
            attempt.error.as_deref().unwrap_or("no answer")
        ),
    };
    sqlx::query("UPDATE webhooks SET disabled_at_ms = $2, disabled_reason = $3 WHERE id = $1")
        .bind(&webhook_id)
        .bind(disabled.at_ms)
        .bind(&disabled.reason)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE webhook_deliveries SET state = 'failed', claimed_by = NULL, \
         claim_until_ms = NULL WHERE webhook_id = $1 AND state = 'pending'",
    )
    .bind(&webhook_id)
    .execute(&mut *conn)
    .await?;
    Ok(Some(disabled))
}

#[async_trait]
impl WebhookStore for DriverStore {
    async fn create_webhook(&self, webhook: &Webhook, sealed_secret: &str) -> StoreResult<()> {
        write_tx!(self, |tx| create(&mut tx, webhook, sealed_secret).await?)
    }

    async fn webhooks(&self, tenant: &str) -> StoreResult<Vec<Webhook>> {
        let rows: Result<Vec<WebhookRow>> = sqlx::query_as(super::sql(format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE tenant = $1 ORDER BY created_at_ms, id"
        )))
        .bind(tenant)
        .fetch_all(self.readers())
        .await
        .map_err(Into::into);
        let now = now_ms();
        db(rows.and_then(|rows| {
            rows.into_iter()
                .map(|r| r.into_webhook(now).map(|(w, _)| w))
                .collect()
        }))
    }

    async fn webhook(
        &self,
        tenant: Option<&str>,
        id: WebhookId,
    ) -> StoreResult<Option<(Webhook, Secrets)>> {
        let row: Result<Option<WebhookRow>> = sqlx::query_as(super::sql(format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE id = $1 AND ($2 IS NULL OR tenant = $2)"
        )))
        .bind(id.to_string())
        .bind(tenant)
        .fetch_optional(self.readers())
        .await
        .map_err(Into::into);
        db(row.and_then(|row| row.map(|r| r.into_webhook(now_ms())).transpose()))
    }

    async fn delete_webhook(&self, tenant: &str, id: WebhookId) -> StoreResult<bool> {
        write_tx!(self, |tx| delete(&mut tx, tenant, id).await?)
    }

    async fn rotate_webhook_secret(
        &self,
        tenant: &str,
        id: WebhookId,
        sealed_secret: &str,
        previous_until_ms: i64,
    ) -> StoreResult<bool> {
        write_tx!(self, |tx| {
            sqlx::query(
                "UPDATE webhooks SET previous_secret_sealed = secret_sealed, \
                 previous_secret_until_ms = $3, secret_sealed = $4 \
                 WHERE id = $1 AND tenant = $2",
            )
            .bind(id.to_string())
            .bind(tenant)
            .bind(previous_until_ms)
            .bind(sealed_secret)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1
        })
    }

    async fn create_delivery(&self, d: &Delivery, daemon: DaemonId) -> StoreResult<()> {
        let (event, seq) = event_columns(d.event);
        write_tx!(self, |tx| {
            sqlx::query(
                "INSERT INTO webhook_deliveries (id, webhook_id, event, notification_seq, state, \
                 attempts, created_at_ms, next_attempt_at_ms, claimed_by, claim_until_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(d.id.to_string())
            .bind(d.webhook_id.to_string())
            .bind(event)
            .bind(seq)
            .bind(d.state.as_str())
            .bind(i64::from(d.attempts))
            .bind(d.created_at_ms)
            .bind(d.next_attempt_at_ms)
            .bind(daemon.to_string())
            // Held by its caller while it attempts it (the loop must not attempt it too).
            .bind(d.next_attempt_at_ms.saturating_add(CREATED_CLAIM_MS))
            .execute(&mut *tx)
            .await?;
        })
    }

    async fn claim_deliveries(
        &self,
        daemon: DaemonId,
        limit: u32,
        claim_for: Duration,
    ) -> StoreResult<Vec<Delivery>> {
        write_tx!(self, |tx| claim(&mut tx, daemon, limit, claim_for).await?)
    }

    async fn record_attempt(
        &self,
        daemon: DaemonId,
        attempt: &Attempt,
        next: &Next,
        disable_after: Duration,
    ) -> StoreResult<Option<Disabled>> {
        write_tx!(self, |tx| record(
            &mut tx,
            daemon,
            attempt,
            next,
            disable_after
        )
        .await?)
    }

    async fn attempts(
        &self,
        tenant: &str,
        id: WebhookId,
        limit: u32,
    ) -> StoreResult<Vec<AttemptRecord>> {
        let rows: Result<Vec<AttemptRow>> = sqlx::query_as(
            "SELECT a.delivery_id, a.number, a.at_ms, a.status, a.error, a.latency_ms, d.event, \
             n.tenant_seq AS notification_seq, d.state FROM webhook_attempts a \
             JOIN webhook_deliveries d ON d.id = a.delivery_id \
             JOIN webhooks w ON w.id = a.webhook_id \
             LEFT JOIN notifications n ON n.seq = d.notification_seq \
             WHERE a.webhook_id = $1 AND w.tenant = $2 \
             ORDER BY a.at_ms DESC, a.number DESC LIMIT $3",
        )
        .bind(id.to_string())
        .bind(tenant)
        .bind(super::limit_param(limit))
        .fetch_all(self.readers())
        .await
        .map_err(Into::into);
        db(rows.and_then(|rows| rows.into_iter().map(AttemptRow::into_record).collect()))
    }

    async fn notification_by_seq(&self, seq: u64) -> StoreResult<Option<Notification>> {
        let found = notifications::list(
            self.readers(),
            seq.saturating_sub(1),
            &NotificationFilter::default(),
            1,
        )
        .await;
        db(found.map(|list| list.into_iter().find(|n| n.seq == seq)))
    }
}
