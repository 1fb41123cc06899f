//! A tenant's webhooks: its own alone, another tenant's answered as missing.

use forkd_core::WebhookId;
use forkd_core::webhook::{Attempt, AttemptRecord, Webhook};

use super::TenantEngine;
use crate::NewWebhook;
use crate::error::Result;

impl TenantEngine<'_> {
    /// Adds a webhook; the secret it returns is shown this once.
    pub async fn create_webhook(&self, new: NewWebhook) -> Result<(Webhook, String)> {
        if let Some(session) = new.session_id {
            self.own_session_id(session).await?;
        }
        self.engine.inner.faults.check_space()?;
        self.engine
            .inner
            .webhooks
            .create(self.tenant.name(), new)
            .await
    }

    pub async fn webhooks(&self) -> Result<Vec<Webhook>> {
        self.engine.inner.webhooks.list(self.tenant.name()).await
    }

    pub async fn webhook(&self, id: WebhookId) -> Result<Webhook> {
        self.engine.inner.webhooks.get(self.tenant.name(), id).await
    }

    pub async fn delete_webhook(&self, id: WebhookId) -> Result<()> {
        self.engine
            .inner
            .webhooks
            .delete(self.tenant.name(), id)
            .await
    }

    /// A new secret; the old one signs too for the daemon's rotation overlap.
    pub async fn rotate_webhook_secret(&self, id: WebhookId) -> Result<(Webhook, String)> {
        self.engine
            .inner
            .webhooks
            .rotate(self.tenant.name(), id)
            .await
    }

    /// Sends a ping now and says how it went.
    pub async fn test_webhook(&self, id: WebhookId) -> Result<Attempt> {
        self.engine
            .inner
            .webhooks
            .ping(self.tenant.name(), id)
            .await
    }

    /// The webhook's latest attempts, newest first.
    pub async fn webhook_attempts(&self, id: WebhookId, limit: u32) -> Result<Vec<AttemptRecord>> {
        self.engine
            .inner
            .webhooks
            .attempts(self.tenant.name(), id, limit)
            .await
    }
}
