//! The digest a client's batch's idempotency key is stored with.

use forkd_core::isolation::Isolation;
use forkd_core::{Directive, SessionId};

use super::BatchOptions;

/// The digest of a batch's parameters its idempotency key is stored with: a retry with other
/// parameters is refused.
pub(super) fn digest(
    session_id: SessionId,
    directives: &[Directive],
    options: &BatchOptions,
) -> String {
    let mut canonical = serde_json::json!([
        session_id.to_string(),
        directives
            .iter()
            .map(|d| (&d.description, &d.prompt))
            .collect::<Vec<_>>(),
        options.warmup_gating,
        options.budget.usd,
        options.budget.tokens,
    ]);
    // Only where set, so that keys stored before isolation existed keep their digest.
    if options.isolation != Isolation::None
        && let Some(parts) = canonical.as_array_mut()
    {
        parts.push(options.isolation.as_str().into());
    }
    if let Some(k) = options.at_turn
        && let Some(parts) = canonical.as_array_mut()
    {
        parts.push(serde_json::json!({ "at_turn": k }));
    }
    if let Some(earlier) = options.fork_point_of
        && let Some(parts) = canonical.as_array_mut()
    {
        parts.push(serde_json::json!({ "fork_point_of": earlier.to_string() }));
    }
    if let Some(schema) = &options.output_schema
        && let Some(parts) = canonical.as_array_mut()
    {
        parts.push(serde_json::json!({ "output_schema": schema.as_str() }));
    }
    if (!options.limits.is_empty() || options.child_limits.iter().any(|l| !l.is_empty()))
        && let Some(parts) = canonical.as_array_mut()
    {
        parts.push(serde_json::json!({
            "limits": options.limits,
            "child_limits": options.child_limits,
        }));
    }
    if let Some(webhook) = options.webhook
        && let Some(parts) = canonical.as_array_mut()
    {
        parts.push(serde_json::json!({ "webhook": webhook.to_string() }));
    }
    forkd_core::request::fingerprint(canonical.to_string().as_bytes())
}
