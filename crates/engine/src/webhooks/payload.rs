//! What a delivery's body says: the Standard Webhooks envelope (`type`, `timestamp`, `data`)
//! around the notification exactly as `forkctl --json` prints it (docs/contracts.md, "JSON
//! shapes"), so a receiver parses one shape whether it is called back or watches.
//!
//! The body is the same on every attempt: its timestamp is the notification's, not the
//! attempt's (the `webhook-timestamp` header is the attempt's, as the signature needs).

use forkd_core::report::Report;
use forkd_core::webhook::Event;
use forkd_core::{Notification, Usage, WebhookId};
use serde_json::{Value, json};

/// The body of a notification's delivery.
pub(crate) fn notification(n: &Notification) -> Value {
    envelope(
        Event::Notification(n.seq).type_name(),
        n.created_at_ms,
        notification_json(n),
    )
}

/// The body of `forkctl webhook test`'s ping.
pub(crate) fn ping(webhook: WebhookId, at_ms: i64) -> Value {
    envelope(
        Event::Ping.type_name(),
        at_ms,
        json!({ "webhook_id": webhook.to_string() }),
    )
}

fn envelope(kind: &str, at_ms: i64, data: Value) -> Value {
    json!({ "type": kind, "timestamp": rfc3339(at_ms), "data": data })
}

/// The notification as forkctl prints it: the tenant's own seq, `null` for no batch.
pub(crate) fn notification_json(n: &Notification) -> Value {
    json!({
        "seq": n.tenant_seq,
        "session_id": n.session_id.to_string(),
        "batch_id": n.batch_id.map(|b| b.to_string()),
        "agent_id": n.agent_id.to_string(),
        "kind": n.kind.as_str(),
        "status": n.status.as_str(),
        "summary": n.summary,
        "report": report_json(&n.report),
        "usage": usage_json(&n.usage),
        "cost_usd": n.cost_usd,
        "schedule": n.schedule,
    })
}

fn report_json(r: &Report) -> Value {
    let mut value = json!({
        "scope": r.scope,
        "result": r.result,
        "key_files": r.key_files,
        "files_changed": r.files_changed,
        "issues": r.issues,
    });
    if let (Some(structured), Some(map)) = (&r.structured, value.as_object_mut()) {
        map.insert("structured".into(), structured.clone());
    }
    value
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "cache_creation_input_tokens": u.cache_creation_input_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens,
        "output_tokens": u.output_tokens,
    })
}

/// Milliseconds since the epoch as RFC 3339 with milliseconds, UTC.
fn rfc3339(ms: i64) -> String {
    let at =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_envelope_carries_its_type_and_the_notification_s_time() {
        let body = ping(WebhookId::new(), 1_765_000_000_123);
        assert_eq!(body["type"], "ping");
        assert_eq!(body["timestamp"], "2025-12-06T05:46:40.123Z");
        assert!(body["data"]["webhook_id"].is_string());
    }
}
