//! `forkctl fork --dry-run`: what the daemon says of a batch it checked and did not fork.

use forkd_proto::v1::DryRun;
use serde_json::{Value, json};

use crate::output::human;

/// `in ~12s`, `now` (under half a second), `unknown`.
fn from_now(ms: Option<u64>) -> String {
    match ms {
        None => "unknown".to_owned(),
        Some(ms) if ms < 500 => "now".to_owned(),
        Some(ms) => {
            let rounded = std::time::Duration::from_secs(ms.saturating_add(500) / 1000);
            format!("in ~{}", humantime::format_duration(rounded))
        }
    }
}

/// `dry run: 10 children over a 12,345-token prefix (directives ~40 tokens each): first
/// requests' input $0.0123 (as independent agents $0.0456; 73% saved) · slots: 3 of 256 used,
/// 253 free · your queue: 0`, then `estimated start now, finish in ~42s (BASIS)`.
pub(super) fn text(d: &DryRun) -> String {
    let slots = crate::commands::capacity::slots_text(&d.slots.unwrap_or_default());
    format!(
        "dry run: {} children over a {}-token prefix (directives ~{} tokens each): first \
         requests' input {} (as independent agents {}; {:.0}% saved) · {slots} · your queue: \
         {}\nestimated start {}, finish {} ({})",
        d.children,
        human::tokens(d.prefix_tokens),
        human::tokens(d.directive_tokens),
        human::usd(d.fork_cost_usd),
        human::usd(d.independent_cost_usd),
        d.saving * 100.0,
        d.queued,
        from_now(d.start_in_ms),
        from_now(d.finish_in_ms),
        d.estimate_basis,
    )
}

/// `{"dry_run": {"children", "prefix_tokens", "directive_tokens", "fork_cost_usd",
/// "independent_cost_usd", "saving", "slots": {"used", "free", "total"}, "queued",
/// "start_in_ms", "finish_in_ms" (null when unknown), "estimate_basis"}}`.
pub(super) fn to_json(d: &DryRun) -> Value {
    let slots = d.slots.unwrap_or_default();
    json!({
        "dry_run": {
            "children": d.children,
            "prefix_tokens": d.prefix_tokens,
            "directive_tokens": d.directive_tokens,
            "fork_cost_usd": d.fork_cost_usd,
            "independent_cost_usd": d.independent_cost_usd,
            "saving": d.saving,
            "slots": { "used": slots.used, "free": slots.free, "total": slots.total },
            "queued": d.queued,
            "start_in_ms": d.start_in_ms,
            "finish_in_ms": d.finish_in_ms,
            "estimate_basis": d.estimate_basis,
        }
    })
}

#[cfg(test)]
mod tests {
    use forkd_proto::v1::RunSlots;

    use super::*;

    fn dry() -> DryRun {
        DryRun {
            children: 10,
            prefix_tokens: 12_345,
            directive_tokens: 40,
            fork_cost_usd: 0.0123,
            independent_cost_usd: 0.0456,
            saving: 0.73,
            slots: Some(RunSlots {
                used: 3,
                free: 253,
                total: 256,
            }),
            queued: 0,
            start_in_ms: Some(120),
            finish_in_ms: Some(41_700),
            estimate_basis: "no cap on running agents".into(),
        }
    }

    #[test]
    fn the_line_says_cost_and_room() {
        assert_eq!(
            text(&dry()),
            "dry run: 10 children over a 12,345-token prefix (directives ~40 tokens each): first \
             requests' input $0.0123 (as independent agents $0.0456; 73% saved) · slots: 3 of \
             256 used, 253 free · your queue: 0\nestimated start now, finish in ~42s (no cap \
             on running agents)"
        );
        let unknown = DryRun {
            start_in_ms: Some(90_000),
            finish_in_ms: None,
            ..dry()
        };
        assert!(
            text(&unknown).contains("estimated start in ~1m 30s, finish unknown"),
            "{}",
            text(&unknown)
        );
    }

    #[test]
    fn the_json_carries_every_field() {
        let value = to_json(&dry());
        assert_eq!(value["dry_run"]["children"], 10);
        assert_eq!(value["dry_run"]["slots"]["free"], 253);
        assert_eq!(value["dry_run"]["fork_cost_usd"], 0.0123);
    }
}
