//! The page's view of a tenant's webhooks and schedules: each webhook with its latest attempts
//! (status, latency, error), each schedule with its latest firings and their batches.

use axum::Json;
use axum::extract::State;
use forkd_core::webhook::{Event, Webhook};
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::Caller;
use crate::error::WebError;

/// Attempts and firings shown per webhook and per schedule.
const LATEST: u32 = 10;

pub(crate) async fn automations(
    caller: Caller,
    State(state): State<AppState>,
) -> Result<Json<Value>, WebError> {
    let scoped = state.engine.for_tenant(caller.tenant.clone());
    let mut webhooks = Vec::new();
    for webhook in scoped.webhooks().await? {
        let attempts = scoped.webhook_attempts(webhook.id, LATEST).await?;
        let attempts: Vec<Value> = attempts
            .iter()
            .map(|r| {
                json!({
                    "delivery_id": r.attempt.delivery_id.to_string(),
                    "number": r.attempt.number,
                    "at_ms": r.attempt.at_ms,
                    "status": r.attempt.status,
                    "error": r.attempt.error,
                    "latency_ms": r.attempt.latency_ms,
                    "event": r.event.type_name(),
                    "notification_seq": match r.event {
                        Event::Notification(seq) => Some(seq),
                        Event::Ping => None,
                    },
                    "state": r.state.as_str(),
                })
            })
            .collect();
        webhooks.push(json!({ "webhook": webhook_json(&webhook), "attempts": attempts }));
    }
    let store = state.engine.store();
    let mut schedules = Vec::new();
    for schedule in store
        .schedules(caller.tenant.name())
        .await
        .map_err(store_error)?
    {
        let firings = store
            .firings(caller.tenant.name(), &schedule.name, LATEST)
            .await
            .map_err(store_error)?;
        let firings: Vec<Value> = firings
            .iter()
            .map(|f| {
                json!({
                    "fire_at_ms": f.fire_at_ms,
                    "state": f.state.as_str(),
                    "manual": f.manual,
                    "batch_id": f.batch_id.map(|b| b.to_string()),
                    "reason": f.reason,
                })
            })
            .collect();
        schedules.push(json!({
            "name": schedule.name,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "paused": schedule.paused,
            "next_fire_at_ms": if schedule.paused { None } else { schedule.next_fire_at_ms },
            "firings": firings,
        }));
    }
    Ok(Json(
        json!({ "webhooks": webhooks, "schedules": schedules }),
    ))
}

fn webhook_json(w: &Webhook) -> Value {
    json!({
        "webhook_id": w.id.to_string(),
        "url": w.url,
        "kinds": w.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        "session_id": w.session_id.map(|s| s.to_string()),
        "named_only": w.named_only,
        "failing_since_ms": w.failing_since_ms,
        "disabled": w.disabled.as_ref().map(|d| json!({ "at_ms": d.at_ms, "reason": d.reason })),
    })
}

/// A store error as the page's error.
fn store_error(e: forkd_core::store::StoreError) -> WebError {
    WebError::Engine(e.into())
}
