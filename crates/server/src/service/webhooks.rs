//! Webhook RPCs: a tenant's endpoints, their secrets (shown once) and their attempts. Free
//! functions on the engine, so this file reaches nothing of the service's own.

use forkd_core::webhook::{AttemptRecord, Event, Webhook};
use forkd_core::{NotificationKind, WebhookId};
use forkd_engine::{Engine, NewWebhook};
use forkd_proto::v1 as pb;

use super::sessions::parse_session_id;
use crate::auth::Tenant;
use crate::convert::timestamp;
use crate::status::{ApiError, bad_id};

/// Attempts listed when a client asks for no number, and the most.
const DEFAULT_ATTEMPTS: u32 = 50;
const MAX_ATTEMPTS: u32 = 1000;

fn parse_webhook_id(s: &str) -> Result<WebhookId, ApiError> {
    if s.trim().is_empty() {
        return Err(ApiError::BadRequest("webhook_id is required".into()));
    }
    s.parse().map_err(|e| bad_id("webhook_id", e))
}

fn kinds(names: &[String]) -> Result<Vec<NotificationKind>, ApiError> {
    names
        .iter()
        .map(|name| {
            NotificationKind::parse(name.trim()).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "{name:?} is not a notification kind (fork, typed, turn)"
                ))
            })
        })
        .collect()
}

pub(super) async fn create(
    engine: &Engine,
    tenant: Tenant,
    req: pb::CreateWebhookRequest,
) -> Result<pb::CreateWebhookResponse, ApiError> {
    let session_id = match req.session_id.trim() {
        "" => None,
        id => Some(parse_session_id(id)?),
    };
    let new = NewWebhook {
        url: req.url,
        kinds: kinds(&req.kinds)?,
        session_id,
        named_only: req.named_only,
    };
    let (webhook, secret) = engine.for_tenant(tenant).create_webhook(new).await?;
    Ok(pb::CreateWebhookResponse {
        webhook: Some(to_pb(&webhook)),
        secret,
    })
}

pub(super) async fn list(
    engine: &Engine,
    tenant: Tenant,
) -> Result<pb::ListWebhooksResponse, ApiError> {
    let webhooks = engine.for_tenant(tenant).webhooks().await?;
    Ok(pb::ListWebhooksResponse {
        webhooks: webhooks.iter().map(to_pb).collect(),
    })
}

pub(super) async fn get(
    engine: &Engine,
    tenant: Tenant,
    req: pb::GetWebhookRequest,
) -> Result<pb::GetWebhookResponse, ApiError> {
    let id = parse_webhook_id(&req.webhook_id)?;
    let webhook = engine.for_tenant(tenant).webhook(id).await?;
    Ok(pb::GetWebhookResponse {
        webhook: Some(to_pb(&webhook)),
    })
}

pub(super) async fn delete(
    engine: &Engine,
    tenant: Tenant,
    req: pb::DeleteWebhookRequest,
) -> Result<pb::DeleteWebhookResponse, ApiError> {
    let id = parse_webhook_id(&req.webhook_id)?;
    engine.for_tenant(tenant).delete_webhook(id).await?;
    Ok(pb::DeleteWebhookResponse {})
}

pub(super) async fn rotate(
    engine: &Engine,
    tenant: Tenant,
    req: pb::RotateWebhookSecretRequest,
) -> Result<pb::CreateWebhookResponse, ApiError> {
    let id = parse_webhook_id(&req.webhook_id)?;
    let (webhook, secret) = engine.for_tenant(tenant).rotate_webhook_secret(id).await?;
    Ok(pb::CreateWebhookResponse {
        webhook: Some(to_pb(&webhook)),
        secret,
    })
}

pub(super) async fn test(
    engine: &Engine,
    tenant: Tenant,
    req: pb::TestWebhookRequest,
) -> Result<pb::TestWebhookResponse, ApiError> {
    let id = parse_webhook_id(&req.webhook_id)?;
    let attempt = engine.for_tenant(tenant).test_webhook(id).await?;
    let record = AttemptRecord {
        state: if attempt.succeeded() {
            forkd_core::webhook::DeliveryState::Delivered
        } else {
            forkd_core::webhook::DeliveryState::Failed
        },
        attempt,
        event: Event::Ping,
    };
    Ok(pb::TestWebhookResponse {
        attempt: Some(attempt_to_pb(&record)),
    })
}

pub(super) async fn attempts(
    engine: &Engine,
    tenant: Tenant,
    req: pb::ListWebhookAttemptsRequest,
) -> Result<pb::ListWebhookAttemptsResponse, ApiError> {
    let id = parse_webhook_id(&req.webhook_id)?;
    let limit = match req.limit {
        0 => DEFAULT_ATTEMPTS,
        n => n.min(MAX_ATTEMPTS),
    };
    let records = engine
        .for_tenant(tenant)
        .webhook_attempts(id, limit)
        .await?;
    Ok(pb::ListWebhookAttemptsResponse {
        attempts: records.iter().map(attempt_to_pb).collect(),
    })
}

fn to_pb(w: &Webhook) -> pb::Webhook {
    pb::Webhook {
        webhook_id: w.id.to_string(),
        url: w.url.clone(),
        kinds: w.kinds.iter().map(|k| k.as_str().to_owned()).collect(),
        session_id: w.session_id.map(|s| s.to_string()).unwrap_or_default(),
        named_only: w.named_only,
        created_at: Some(timestamp(w.created_at_ms)),
        failing_since: w.failing_since_ms.map(timestamp),
        disabled_reason: w
            .disabled
            .as_ref()
            .map(|d| d.reason.clone())
            .unwrap_or_default(),
        disabled_at: w.disabled.as_ref().map(|d| timestamp(d.at_ms)),
        previous_secret_until: w.previous_secret_until_ms.map(timestamp),
    }
}

fn attempt_to_pb(r: &AttemptRecord) -> pb::WebhookAttempt {
    let a = &r.attempt;
    pb::WebhookAttempt {
        delivery_id: a.delivery_id.to_string(),
        number: a.number,
        at: Some(timestamp(a.at_ms)),
        status: a.status.map_or(0, u32::from),
        error: a.error.clone().unwrap_or_default(),
        latency_ms: a.latency_ms,
        event: r.event.type_name().to_owned(),
        notification_seq: match r.event {
            Event::Notification(seq) => seq,
            Event::Ping => 0,
        },
        state: r.state.as_str().to_owned(),
    }
}
