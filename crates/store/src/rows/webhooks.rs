//! Rows of `webhooks`, `webhook_deliveries` and `webhook_attempts`, and their domain values.

use forkd_core::NotificationKind;
use forkd_core::webhook::{
    Attempt, AttemptRecord, Delivery, DeliveryState, Disabled, Event, Secrets, Webhook,
};

use super::convert::{corrupt, from_i64, parse_id};
use crate::error::Result;

/// The columns [`WebhookRow`] reads.
pub(crate) const WEBHOOK_COLUMNS: &str = "id, tenant, url, kinds, session_id, named_only, \
     secret_sealed, previous_secret_sealed, previous_secret_until_ms, created_at_ms, \
     failing_since_ms, disabled_at_ms, disabled_reason";

#[derive(sqlx::FromRow)]
pub(crate) struct WebhookRow {
    id: String,
    tenant: String,
    url: String,
    kinds: String,
    session_id: Option<String>,
    named_only: bool,
    secret_sealed: String,
    previous_secret_sealed: Option<String>,
    previous_secret_until_ms: Option<i64>,
    created_at_ms: i64,
    failing_since_ms: Option<i64>,
    disabled_at_ms: Option<i64>,
    disabled_reason: Option<String>,
}

impl WebhookRow {
    /// The webhook and its secrets; the previous secret only while it still signs (at `now_ms`).
    pub(crate) fn into_webhook(self, now_ms: i64) -> Result<(Webhook, Secrets)> {
        let kinds = kinds_from_column(&self.kinds)?;
        let previous_live = self
            .previous_secret_until_ms
            .is_some_and(|until| until > now_ms);
        let webhook = Webhook {
            id: parse_id(&self.id, "webhook id")?,
            tenant: self.tenant,
            url: self.url,
            kinds,
            session_id: self
                .session_id
                .map(|s| parse_id(&s, "webhook session"))
                .transpose()?,
            named_only: self.named_only,
            created_at_ms: self.created_at_ms,
            failing_since_ms: self.failing_since_ms,
            disabled: self.disabled_at_ms.map(|at_ms| Disabled {
                at_ms,
                reason: self.disabled_reason.unwrap_or_default(),
            }),
            previous_secret_until_ms: self.previous_secret_until_ms.filter(|_| previous_live),
        };
        let secrets = Secrets {
            current: self.secret_sealed,
            previous: self.previous_secret_sealed.filter(|_| previous_live),
        };
        Ok((webhook, secrets))
    }
}

/// Kinds as their column stores them: comma-separated names, empty for every kind.
pub(crate) fn kinds_column(kinds: &[NotificationKind]) -> String {
    kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn kinds_from_column(text: &str) -> Result<Vec<NotificationKind>> {
    text.split(',')
        .filter(|k| !k.is_empty())
        .map(|k| NotificationKind::parse(k).ok_or_else(|| corrupt("webhook kinds", k)))
        .collect()
}

/// The columns [`DeliveryRow`] reads.
pub(crate) const DELIVERY_COLUMNS: &str = "id, webhook_id, event, notification_seq, state, \
     attempts, created_at_ms, next_attempt_at_ms";

#[derive(sqlx::FromRow)]
pub(crate) struct DeliveryRow {
    id: String,
    webhook_id: String,
    event: String,
    notification_seq: Option<i64>,
    state: String,
    attempts: i64,
    created_at_ms: i64,
    next_attempt_at_ms: i64,
}

impl DeliveryRow {
    pub(crate) fn into_delivery(self) -> Result<Delivery> {
        Ok(Delivery {
            id: parse_id(&self.id, "delivery id")?,
            webhook_id: parse_id(&self.webhook_id, "delivery webhook")?,
            event: event(&self.event, self.notification_seq)?,
            state: state(&self.state)?,
            attempts: from_i64(self.attempts, "delivery attempts")?,
            created_at_ms: self.created_at_ms,
            next_attempt_at_ms: self.next_attempt_at_ms,
        })
    }
}

/// An event's column values: its name and the notification's seq.
pub(crate) fn event_columns(event: Event) -> (&'static str, Option<i64>) {
    match event {
        Event::Notification(seq) => ("notification", Some(i64::try_from(seq).unwrap_or(i64::MAX))),
        Event::Ping => ("ping", None),
    }
}

fn event(name: &str, seq: Option<i64>) -> Result<Event> {
    match (name, seq) {
        ("notification", Some(seq)) => Ok(Event::Notification(from_i64(seq, "delivery seq")?)),
        ("ping", None) => Ok(Event::Ping),
        (other, _) => Err(corrupt("delivery event", other)),
    }
}

fn state(name: &str) -> Result<DeliveryState> {
    DeliveryState::parse(name).ok_or_else(|| corrupt("delivery state", name))
}

#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRow {
    delivery_id: String,
    number: i64,
    at_ms: i64,
    status: Option<i64>,
    error: Option<String>,
    latency_ms: i64,
    event: String,
    notification_seq: Option<i64>,
    state: String,
}

impl AttemptRow {
    pub(crate) fn into_record(self) -> Result<AttemptRecord> {
        Ok(AttemptRecord {
            attempt: Attempt {
                delivery_id: parse_id(&self.delivery_id, "attempt delivery")?,
                number: from_i64(self.number, "attempt number")?,
                at_ms: self.at_ms,
                status: self
                    .status
                    .map(|s| from_i64(s, "attempt status"))
                    .transpose()?,
                error: self.error,
                latency_ms: from_i64(self.latency_ms, "attempt latency")?,
            },
            event: event(&self.event, self.notification_seq)?,
            state: state(&self.state)?,
        })
    }
}
