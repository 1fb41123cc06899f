//! Webhooks (docs/operations.md, "Webhooks and schedules"): a tenant's endpoints, registered
//! with a signing secret sealed in the database, and the loop that delivers the outbox the store
//! writes with every notification.
//!
//! Delivery is at least once: a delivery is attempted until a receiver answers 2xx, under one
//! `webhook-id` for all its attempts, so receivers drop repeats. Each daemon claims due
//! deliveries for one attempt's time on the database's clock (with several daemons, one attempts
//! a delivery at a time); a failed attempt is retried after an exponential backoff with jitter,
//! no sooner than a `retry-after`, until [`RetryPolicy::retry_for`] has passed; an endpoint that
//! failed every attempt for [`RetryPolicy::disable_after`] is disabled and says why. The loop
//! wakes on every notification (this daemon's, or another's through the store's feed) and once a
//! second for retries that fall due.
//!
//! [`RetryPolicy::retry_for`]: forkd_core::webhook::RetryPolicy
//! [`RetryPolicy::disable_after`]: forkd_core::webhook::RetryPolicy

mod deliver;
pub(crate) mod payload;

use std::sync::Arc;
use std::time::Duration;

use forkd_core::store::Store;
use forkd_core::webhook::{Attempt, AttemptRecord, Delivery, DeliveryState, Event, Next, Webhook};
use forkd_core::{DaemonId, DeliveryId, Notification, NotificationKind, SessionId, WebhookId};
use forkd_egress::Egress;
use ring::rand::SecureRandom;
use tokio::sync::{Notify, Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::config::WebhookConfig;
use crate::error::{EngineError, Result};
use crate::sealed::SecretKey;

/// The most webhooks one tenant may have: each notification is posted to each of them.
pub(crate) const MAX_WEBHOOKS: usize = 32;

/// Bytes of randomness in a signing secret (Standard Webhooks asks for 24 to 64).
const SECRET_BYTES: usize = 32;

/// How often due retries are looked for when nothing wakes the loop.
const POLL: Duration = Duration::from_secs(1);

/// How many deliveries one claim takes at most.
const CLAIM_BATCH: u32 = 64;

/// What a tenant asks for when it adds a webhook.
#[derive(Debug, Clone, Default)]
pub struct NewWebhook {
    pub url: String,
    /// Empty for every kind.
    pub kinds: Vec<NotificationKind>,
    /// One of the tenant's sessions (checked by the caller).
    pub session_id: Option<SessionId>,
    pub named_only: bool,
}

/// The registry and the delivery loop.
pub(crate) struct Webhooks {
    store: Arc<dyn Store>,
    config: WebhookConfig,
    key: Option<Arc<SecretKey>>,
    egress: Egress,
    daemon: DaemonId,
    /// Wakes the loop: a ping recorded, a notification committed.
    wake: Notify,
    /// Attempts in flight on this daemon.
    in_flight: Arc<Semaphore>,
}

impl Webhooks {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        config: WebhookConfig,
        key: Option<Arc<SecretKey>>,
    ) -> Self {
        let egress = config.egress(Some(config.timeout));
        let daemon = store.holder().daemon;
        let in_flight = Arc::new(Semaphore::new(config.concurrency.max(1)));
        Self {
            store,
            config,
            key,
            egress,
            daemon,
            wake: Notify::new(),
            in_flight,
        }
    }

    /// Registers a webhook: its URL checked now (and again at each delivery), a fresh secret
    /// sealed. Returns the webhook and its secret, which is never shown again.
    pub(crate) async fn create(&self, tenant: &str, new: NewWebhook) -> Result<(Webhook, String)> {
        let url = self
            .egress
            .check_url(new.url.trim())
            .await
            .map_err(|e| EngineError::InvalidRequest(format!("webhook URL refused: {e}")))?;
        let held = self.store.webhooks(tenant).await?.len();
        if held >= MAX_WEBHOOKS {
            return Err(EngineError::OverLimit(format!(
                "tenant {tenant} has {held} webhooks, the most a tenant may have \
                 ({MAX_WEBHOOKS}); delete one first"
            )));
        }
        let webhook = Webhook {
            id: WebhookId::new(),
            tenant: tenant.to_owned(),
            url: url.to_string(),
            kinds: new.kinds,
            session_id: new.session_id,
            named_only: new.named_only,
            created_at_ms: now_ms(),
            failing_since_ms: None,
            disabled: None,
            previous_secret_until_ms: None,
        };
        let (secret, sealed) = self.new_secret(webhook.id)?;
        self.store.create_webhook(&webhook, &sealed).await?;
        // The host alone: a URL's path or query may hold a secret (chat services' do).
        tracing::info!(
            webhook.id = %webhook.id,
            tenant,
            host = url.host_str().unwrap_or(""),
            "Webhook added"
        );
        Ok((webhook, secret))
    }

    /// A new secret for a tenant's webhook; the one it replaces signs too for the overlap.
    pub(crate) async fn rotate(&self, tenant: &str, id: WebhookId) -> Result<(Webhook, String)> {
        let (secret, sealed) = self.new_secret(id)?;
        let until =
            now_ms().saturating_add(crate::clock::millis(self.config.rotation_overlap) as i64);
        if !self
            .store
            .rotate_webhook_secret(tenant, id, &sealed, until)
            .await?
        {
            return Err(not_found(id));
        }
        Ok((self.get(tenant, id).await?, secret))
    }

    pub(crate) async fn get(&self, tenant: &str, id: WebhookId) -> Result<Webhook> {
        match self.store.webhook(Some(tenant), id).await? {
            Some((webhook, _)) => Ok(webhook),
            None => Err(not_found(id)),
        }
    }

    pub(crate) async fn list(&self, tenant: &str) -> Result<Vec<Webhook>> {
        Ok(self.store.webhooks(tenant).await?)
    }

    pub(crate) async fn delete(&self, tenant: &str, id: WebhookId) -> Result<()> {
        if self.store.delete_webhook(tenant, id).await? {
            Ok(())
        } else {
            Err(not_found(id))
        }
    }

    pub(crate) async fn attempts(
        &self,
        tenant: &str,
        id: WebhookId,
        limit: u32,
    ) -> Result<Vec<AttemptRecord>> {
        self.get(tenant, id).await?;
        Ok(self.store.attempts(tenant, id, limit).await?)
    }

    /// Sends a ping now, once, and says how it went (recorded with the other attempts).
    pub(crate) async fn ping(&self, tenant: &str, id: WebhookId) -> Result<Attempt> {
        let Some((webhook, secrets)) = self.store.webhook(Some(tenant), id).await? else {
            return Err(not_found(id));
        };
        let now = now_ms();
        let delivery = Delivery {
            id: DeliveryId::new(),
            webhook_id: id,
            event: Event::Ping,
            state: DeliveryState::Pending,
            attempts: 0,
            created_at_ms: now,
            next_attempt_at_ms: now,
        };
        self.store.create_delivery(&delivery, self.daemon).await?;
        let body = payload::ping(id, now).to_string();
        let secrets = self.open(&webhook, &secrets)?;
        let outcome = self.send(&webhook.url, delivery.id, &body, &secrets).await;
        let next = if outcome.attempt.succeeded() {
            Next::Delivered
        } else {
            Next::Failed("a ping is sent once".to_owned())
        };
        self.store
            .record_attempt(
                self.daemon,
                &outcome.attempt,
                &next,
                self.config.retry.disable_after,
            )
            .await?;
        Ok(Attempt {
            number: 1,
            ..outcome.attempt
        })
    }

    /// Starts the delivery loop; it stops at shutdown (attempts in flight are cut off: their
    /// claims lapse and another attempt, here after a restart or on another daemon, follows).
    pub(crate) fn start(
        self: &Arc<Self>,
        mut live: broadcast::Receiver<Notification>,
        shutdown: CancellationToken,
    ) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut poll = tokio::time::interval(POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                this.deliver_due(&shutdown).await;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = this.wake.notified() => {}
                    _ = poll.tick() => {}
                    received = live.recv() => {
                        if matches!(received, Err(broadcast::error::RecvError::Closed)) {
                            return;
                        }
                    }
                }
            }
        });
    }

    /// Claims what is due, as many as there are free attempt slots, and attempts each in a task
    /// of its own; again while claims come back full.
    async fn deliver_due(self: &Arc<Self>, shutdown: &CancellationToken) {
        loop {
            let free = u32::try_from(self.in_flight.available_permits()).unwrap_or(u32::MAX);
            if free == 0 {
                return;
            }
            let limit = free.min(CLAIM_BATCH);
            let claimed = match self
                .store
                .claim_deliveries(self.daemon, limit, self.claim_for())
                .await
            {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(error = %e, "Could not claim webhook deliveries; trying again");
                    return;
                }
            };
            let full = u32::try_from(claimed.len()).unwrap_or(u32::MAX) == limit;
            for delivery in claimed {
                let Ok(permit) = Arc::clone(&self.in_flight).try_acquire_owned() else {
                    break;
                };
                let this = Arc::clone(self);
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = this.deliver(delivery) => {}
                    }
                    drop(permit);
                    // A slot is free: anything claimed-out waits no longer than it must.
                    this.wake.notify_one();
                });
            }
            if !full {
                return;
            }
        }
    }

    /// How long a claim lasts: one attempt's time and a lease's margin.
    fn claim_for(&self) -> Duration {
        self.config.timeout + self.store.holder().lease
    }

    /// One attempt at one delivery, recorded with what follows it.
    async fn deliver(&self, delivery: Delivery) {
        let id = delivery.id;
        let (attempt, next) = match self.prepare(&delivery).await {
            Ok(Some((url, body, secrets))) => {
                let outcome = self.send(&url, id, &body, &secrets).await;
                let next = if outcome.attempt.succeeded() {
                    Next::Delivered
                } else {
                    self.config.retry.after_failure(
                        delivery.attempts + 1,
                        delivery.created_at_ms,
                        now_ms(),
                        outcome.retry_after,
                        fastrand::f64(),
                    )
                };
                (outcome.attempt, next)
            }
            // Deleted with its webhook since it was claimed: nothing to send or record.
            Ok(None) => return,
            Err(why) => {
                let attempt = Attempt {
                    delivery_id: id,
                    number: 0,
                    at_ms: now_ms(),
                    status: None,
                    error: Some(why.clone()),
                    latency_ms: 0,
                };
                (attempt, Next::Failed(why))
            }
        };
        match &next {
            Next::Delivered => tracing::debug!(delivery.id = %id, "Webhook delivered"),
            Next::RetryAt(_) => tracing::debug!(
                delivery.id = %id,
                error = attempt.error.as_deref().unwrap_or(""),
                "Webhook attempt failed; it is retried"
            ),
            Next::Failed(why) => tracing::warn!(
                delivery.id = %id,
                webhook.id = %delivery.webhook_id,
                why,
                "Webhook delivery given up"
            ),
        }
        match self
            .store
            .record_attempt(
                self.daemon,
                &attempt,
                &next,
                self.config.retry.disable_after,
            )
            .await
        {
            Ok(Some(disabled)) => tracing::warn!(
                webhook.id = %delivery.webhook_id,
                reason = %disabled.reason,
                "Webhook disabled"
            ),
            Ok(None) => {}
            // Its claim lapses and the attempt is made again: at least once.
            Err(e) => {
                tracing::warn!(delivery.id = %id, error = %e, "Could not record a webhook attempt")
            }
        }
    }

    /// One attempt at `delivery`: `body` signed with each of `secrets`, posted to `url`.
    async fn send(
        &self,
        url: &str,
        delivery: DeliveryId,
        body: &str,
        secrets: &[String],
    ) -> deliver::Outcome {
        let request = deliver::Request {
            url,
            delivery,
            body,
            secrets,
        };
        deliver::attempt(&self.egress, request).await
    }

    /// The URL, body and open secrets of a claimed delivery; `None` when its webhook is gone,
    /// an error (the delivery fails) when it cannot be sent at all.
    async fn prepare(
        &self,
        delivery: &Delivery,
    ) -> std::result::Result<Option<(String, String, Vec<String>)>, String> {
        let found = self
            .store
            .webhook(None, delivery.webhook_id)
            .await
            .map_err(|e| e.to_string())?;
        let Some((webhook, secrets)) = found else {
            return Ok(None);
        };
        if let Some(disabled) = &webhook.disabled {
            return Err(format!("the webhook is {}", disabled.reason));
        }
        let body = match delivery.event {
            Event::Notification(seq) => match self.store.notification_by_seq(seq).await {
                Ok(Some(n)) => payload::notification(&n).to_string(),
                Ok(None) => return Err(format!("notification {seq} is no longer stored")),
                Err(e) => return Err(e.to_string()),
            },
            Event::Ping => payload::ping(webhook.id, delivery.created_at_ms).to_string(),
        };
        let secrets = self.open(&webhook, &secrets).map_err(|e| e.to_string())?;
        Ok(Some((webhook.url, body, secrets)))
    }

    /// A webhook's secrets in the clear, the current one first.
    fn open(
        &self,
        webhook: &Webhook,
        secrets: &forkd_core::webhook::Secrets,
    ) -> Result<Vec<String>> {
        let key = self.key()?;
        let owner = webhook.id.to_string();
        std::iter::once(&secrets.current)
            .chain(&secrets.previous)
            .map(|sealed| {
                let plain = key.open(&owner, sealed).map_err(|e| {
                    EngineError::Invariant(format!("webhook {owner}'s secret: {e}"))
                })?;
                String::from_utf8(plain)
                    .map_err(|_| EngineError::Invariant(format!("webhook {owner}'s secret")))
            })
            .collect()
    }

    /// A fresh `whsec_` secret and its sealed form, bound to the webhook.
    fn new_secret(&self, id: WebhookId) -> Result<(String, String)> {
        let key = self.key()?;
        let mut bytes = [0u8; SECRET_BYTES];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| EngineError::Invariant("no randomness for a webhook secret".into()))?;
        let secret = format!(
            "whsec_{}",
            base64::display::Base64Display::new(&bytes, &base64::engine::general_purpose::STANDARD)
        );
        let sealed = key
            .seal(&id.to_string(), secret.as_bytes())
            .map_err(|e| EngineError::Invariant(format!("sealing a webhook secret: {e}")))?;
        Ok((secret, sealed))
    }

    fn key(&self) -> Result<&SecretKey> {
        self.key.as_deref().ok_or_else(|| {
            EngineError::WrongState(
                "webhooks need the daemon's secret key (secret_key_file) to seal their secrets"
                    .into(),
            )
        })
    }
}

fn not_found(id: WebhookId) -> EngineError {
    EngineError::NotFound {
        kind: "webhook",
        id: id.to_string(),
    }
}
