//! Webhooks: a tenant's HTTP endpoints that its notifications are pushed to, signed to the
//! Standard Webhooks specification, from an outbox the store writes in the notification's own
//! transaction (docs/operations.md, "Webhooks and schedules").
//!
//! What is here is the data and the arithmetic: the registered endpoint, one delivery of one event
//! and its attempts, the retry schedule, and [`WebhookStore`], the store's part. Sending, signing
//! and the address checks are the engine's and `forkd-egress`'s.

use std::time::Duration;

use async_trait::async_trait;

use crate::store::Result;
use crate::{DaemonId, DeliveryId, Notification, NotificationKind, SessionId, WebhookId};

/// A registered webhook. Its signing secret is stored apart, sealed ([`Secrets`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    pub id: WebhookId,
    pub tenant: String,
    /// Where deliveries are posted: `http` or `https`, checked when added and at each delivery.
    pub url: String,
    /// The notification kinds it receives; empty for every kind.
    pub kinds: Vec<NotificationKind>,
    /// The one session whose notifications it receives, if narrowed to one.
    pub session_id: Option<SessionId>,
    /// Receives only the batches that name it (`webhook` on a fork), nothing else.
    pub named_only: bool,
    pub created_at_ms: i64,
    /// When its latest run of failures began (none since its latest success).
    pub failing_since_ms: Option<i64>,
    /// Set once it failed for longer than the daemon allows: nothing more is delivered to it.
    pub disabled: Option<Disabled>,
    /// Until when the secret before the latest rotation still signs too.
    pub previous_secret_until_ms: Option<i64>,
}

/// Why and when a webhook stopped receiving deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub at_ms: i64,
    pub reason: String,
}

/// A webhook's signing secrets as stored: sealed with the daemon's secret key, bound to the
/// webhook's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secrets {
    pub current: String,
    /// The secret before the latest rotation, while it still signs.
    pub previous: Option<String>,
}

/// What a delivery carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A task notification, by its seq.
    Notification(u64),
    /// `forkctl webhook test`: a ping, sent once.
    Ping,
}

impl Event {
    /// The event's `type` in the payload.
    pub fn type_name(self) -> &'static str {
        match self {
            Event::Notification(_) => "notification",
            Event::Ping => "ping",
        }
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Not delivered yet: its next attempt is due at `next_attempt_at_ms`.
    Pending,
    /// A receiver answered 2xx.
    Delivered,
    /// Given up: every attempt within the retry window failed, or the webhook was disabled.
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Delivered, Self::Failed]
            .into_iter()
            .find(|state| state.as_str() == s)
    }
}

/// One event for one webhook, retried until delivered or given up.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The `webhook-id` of every attempt.
    pub id: DeliveryId,
    pub webhook_id: WebhookId,
    pub event: Event,
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempts: u32,
    pub created_at_ms: i64,
    pub next_attempt_at_ms: i64,
}

/// One attempt at a delivery, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub delivery_id: DeliveryId,
    /// 1 for the first attempt.
    pub number: u32,
    pub at_ms: i64,
    /// The receiver's HTTP status, if it answered.
    pub status: Option<u16>,
    /// Why it failed, when it did: no answer, a refused address, a status that is not 2xx.
    pub error: Option<String>,
    pub latency_ms: u64,
}

impl Attempt {
    /// Whether the receiver took it (2xx).
    pub fn succeeded(&self) -> bool {
        self.error.is_none() && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// A recorded attempt with what its delivery carried, for listings.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub attempt: Attempt,
    /// What the delivery carried; a notification by its tenant's own seq (the one its clients
    /// see), not the daemon's.
    pub event: Event,
    /// The delivery's state after this attempt's delivery moved on (its state now).
    pub state: DeliveryState,
}

/// What follows an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Delivered,
    RetryAt(i64),
    /// Given up, and why.
    Failed(String),
}

/// How long deliveries are retried and when a failing endpoint is disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// A delivery not taken within this of its first attempt is given up.
    pub retry_for: Duration,
    /// An endpoint failing every attempt for this long is disabled.
    pub disable_after: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            retry_for: Duration::from_secs(24 * 3600),
            disable_after: Duration::from_secs(5 * 24 * 3600),
            max_backoff: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// The first wait, doubled after each failed attempt up to `max_backoff`.
    const FIRST_BACKOFF: Duration = Duration::from_secs(1);

    /// What follows a failed attempt number `attempts` (1 for the first) at `now_ms` of a
    /// delivery created at `created_ms`: the next attempt after an exponential backoff with
    /// jitter (`jitter` in `[0, 1)`, spreading the wait over ±25 %), no sooner than the
    /// receiver's `retry-after`, or giving up when that would fall past the retry window.
    pub fn after_failure(
        &self,
        attempts: u32,
        created_ms: i64,
        now_ms: i64,
        retry_after: Option<Duration>,
        jitter: f64,
    ) -> Next {
        let doubled = Self::FIRST_BACKOFF
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(20))
            .min(self.max_backoff);
        let spread = doubled.mul_f64(0.75 + 0.5 * jitter.clamp(0.0, 1.0));
        let wait = retry_after.map_or(spread, |r| r.max(spread));
        let at = now_ms.saturating_add(millis(wait));
        if at > created_ms.saturating_add(millis(self.retry_for)) {
            Next::Failed(format!(
                "not delivered within {} of its first attempt ({attempts} attempts)",
                humantime_secs(self.retry_for)
            ))
        } else {
            Next::RetryAt(at)
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A duration in the largest whole unit that fits, for messages (`24h`, `90s`).
fn humantime_secs(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 2 * 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// The store's part of webhooks. Notifications' outbox rows are written by the store itself, in
/// the notification's transaction: one per enabled webhook of the session's tenant that matches
/// it (kind, session, not `named_only`) or that its batch names.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Stores a new webhook with its sealed secret.
    async fn create_webhook(&self, webhook: &Webhook, sealed_secret: &str) -> Result<()>;
    /// A tenant's webhooks, oldest first.
    async fn webhooks(&self, tenant: &str) -> Result<Vec<Webhook>>;
    /// A webhook and its secrets; `tenant` narrows it to that tenant's (another's is `None`).
    async fn webhook(
        &self,
        tenant: Option<&str>,
        id: WebhookId,
    ) -> Result<Option<(Webhook, Secrets)>>;
    /// Removes a tenant's webhook with its deliveries and their attempts; whether it was there.
    async fn delete_webhook(&self, tenant: &str, id: WebhookId) -> Result<bool>;
    /// Replaces a tenant's webhook's secret; the one it replaces still signs until
    /// `previous_until_ms`. Whether the webhook was there.
    async fn rotate_webhook_secret(
        &self,
        tenant: &str,
        id: WebhookId,
        sealed_secret: &str,
        previous_until_ms: i64,
    ) -> Result<bool>;
    /// Stores a delivery made outside the outbox (a ping), claimed by `daemon`.
    async fn create_delivery(&self, delivery: &Delivery, daemon: DaemonId) -> Result<()>;
    /// Claims up to `limit` pending deliveries whose attempt is due and that no live claim holds,
    /// for `claim_for` on the database's clock: while it lasts no other daemon attempts them.
    async fn claim_deliveries(
        &self,
        daemon: DaemonId,
        limit: u32,
        claim_for: Duration,
    ) -> Result<Vec<Delivery>>;
    /// Records an attempt by `daemon` and what follows it, and the webhook's failing streak: a
    /// success ends it, a failure begins it or, when it began `disable_after` ago, disables the
    /// webhook (its pending deliveries fail with it). Returns the webhook's `Disabled` when this
    /// attempt disabled it.
    async fn record_attempt(
        &self,
        daemon: DaemonId,
        attempt: &Attempt,
        next: &Next,
        disable_after: Duration,
    ) -> Result<Option<Disabled>>;
    /// A tenant's webhook's latest attempts, newest first.
    async fn attempts(&self, tenant: &str, id: WebhookId, limit: u32)
    -> Result<Vec<AttemptRecord>>;
    /// The stored notification with daemon-wide seq `seq`.
    async fn notification_by_seq(&self, seq: u64) -> Result<Option<Notification>>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    const HOUR_MS: i64 = 3_600_000;

    #[test]
    fn backoff_doubles_with_jitter_up_to_its_cap() {
        let policy = RetryPolicy::default();
        let at = |attempts, jitter| match policy.after_failure(attempts, 0, 0, None, jitter) {
            Next::RetryAt(at) => at,
            other => panic!("expected a retry, got {other:?}"),
        };
        assert_eq!(at(1, 0.5), 1000);
        assert_eq!(at(2, 0.5), 2000);
        assert_eq!(at(3, 0.0), 3000, "a quarter sooner");
        assert_eq!(at(3, 1.0), 5000, "a quarter later");
        assert_eq!(at(30, 0.5), HOUR_MS, "capped at max_backoff");
    }

    #[test]
    fn retry_after_is_a_floor_and_the_window_ends_the_retries() {
        let policy = RetryPolicy::default();
        let ten_minutes = Duration::from_secs(600);
        assert_eq!(
            policy.after_failure(1, 0, 0, Some(ten_minutes), 0.5),
            Next::RetryAt(600_000)
        );
        // A retry-after shorter than the backoff does not shorten it.
        assert_eq!(
            policy.after_failure(13, 0, 0, Some(Duration::from_secs(1)), 0.5),
            Next::RetryAt(HOUR_MS)
        );
        let late = policy.after_failure(40, 0, 23 * HOUR_MS + 1, None, 0.5);
        match late {
            Next::Failed(why) => assert!(why.contains("within 24h"), "{why}"),
            other => panic!("expected to give up, got {other:?}"),
        }
    }

    #[test]
    fn states_round_trip() {
        for state in [
            DeliveryState::Pending,
            DeliveryState::Delivered,
            DeliveryState::Failed,
        ] {
            assert_eq!(DeliveryState::parse(state.as_str()), Some(state));
        }
        assert_eq!(DeliveryState::parse("nope"), None);
    }
}
