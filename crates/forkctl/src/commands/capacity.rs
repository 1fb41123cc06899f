//! `forkctl capacity`: what the daemon can take before a batch is submitted — its running slots
//! (used and free, totals only), the caller's own children queued for one and its tenant's
//! budget left — and what its provider limiter believes now, per provider key and model: the
//! limits it paces by and where each came from (the provider's headers or its refusals),
//! requests in flight, waiting and throttled, and the last minute's refusals.

use clap::Args;
use forkd_proto::v1::{
    BudgetLeft, GetCapacityRequest, GetCapacityResponse, ProviderCapacity, RunSlots,
};
use serde_json::{Value, json};

use crate::client::Client;
use crate::exit;
use crate::output::{Printer, human};

#[derive(Debug, Args)]
pub struct CapacityArgs {}

pub async fn run(_: CapacityArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let capacity = client
        .get_capacity(GetCapacityRequest {})
        .await?
        .into_inner();
    if out.is_json() {
        out.value(&to_json(&capacity))?;
    } else {
        out.line(runs(&capacity))?;
        out.line(table(&capacity))?;
    }
    Ok(exit::OK)
}

/// `slots: 3 of 256 used, 253 free · your queue: 0 · budget left: $1.2000, 50,000 tokens`.
fn runs(capacity: &GetCapacityResponse) -> String {
    let slots = slots_text(&capacity.slots.unwrap_or_default());
    let budget = match &capacity.budget_left {
        None => "no budget".to_owned(),
        Some(left) => format!("budget left: {}", budget_left(left)),
    };
    format!("{slots} · your queue: {} · {budget}", capacity.queued)
}

/// `slots: 3 of 256 used, 253 free`, or `slots: 3 running, no cap`.
pub(crate) fn slots_text(slots: &RunSlots) -> String {
    if slots.total == 0 {
        format!("slots: {} running, no cap", slots.used)
    } else {
        format!(
            "slots: {} of {} used, {} free",
            slots.used, slots.total, slots.free
        )
    }
}

fn budget_left(left: &BudgetLeft) -> String {
    let mut parts = Vec::new();
    if let Some(usd) = left.usd {
        parts.push(human::usd(usd));
    }
    if let Some(tokens) = left.tokens {
        parts.push(format!("{} tokens", human::tokens(tokens)));
    }
    parts.join(", ")
}

/// `{"slots": {"used", "free", "total"}, "queued", "budget_left": {"usd", "tokens"} | null,
/// "providers": [{"provider", "endpoint", "model", "limits": [{"name", "per_second",
/// "burst", "source"}], "concurrency", "in_flight", "waiting", "throttled",
/// "refusals_last_minute", "paused_for_ms"}]}`.
fn to_json(capacity: &GetCapacityResponse) -> Value {
    let providers: Vec<Value> = capacity
        .providers
        .iter()
        .map(|p| {
            json!({
                "provider": p.provider,
                "endpoint": p.endpoint,
                "model": p.model,
                "limits": p.limits.iter().map(|l| json!({
                    "name": l.name,
                    "per_second": l.per_second,
                    "burst": l.burst,
                    "source": l.source,
                })).collect::<Vec<_>>(),
                "concurrency": p.concurrency,
                "in_flight": p.in_flight,
                "waiting": p.waiting,
                "throttled": p.throttled,
                "refusals_last_minute": p.refusals_last_minute,
                "paused_for_ms": p.paused_for_ms,
            })
        })
        .collect();
    let slots = capacity.slots.unwrap_or_default();
    json!({
        "slots": { "used": slots.used, "free": slots.free, "total": slots.total },
        "queued": capacity.queued,
        "budget_left": capacity.budget_left.as_ref().map(|b| json!({
            "usd": b.usd,
            "tokens": b.tokens,
        })),
        "providers": providers,
    })
}

/// One line per key: `PROVIDER MODEL PACED BY IN FLIGHT WAITING THROTTLED 429s/MIN PAUSED`.
fn table(capacity: &GetCapacityResponse) -> String {
    if capacity.providers.is_empty() {
        return "No model request has gone through this daemon yet.".into();
    }
    let mut table = human::table(Some(&[
        "PROVIDER",
        "MODEL",
        "PACED BY",
        "IN FLIGHT",
        "WAITING",
        "THROTTLED",
        "REFUSED/MIN",
        "PAUSED",
    ]));
    for p in &capacity.providers {
        table.add_row(vec![
            provider(p),
            p.model.clone(),
            paced_by(p),
            p.in_flight.to_string(),
            p.waiting.to_string(),
            p.throttled.to_string(),
            p.refusals_last_minute.to_string(),
            if p.paused_for_ms == 0 {
                "—".into()
            } else {
                format!("{:.1}s", p.paused_for_ms as f64 / 1000.0)
            },
        ]);
    }
    human::right_align(&mut table, 3..8);
    human::finish(table)
}

fn provider(p: &ProviderCapacity) -> String {
    if p.endpoint.is_empty() {
        p.provider.clone()
    } else {
        format!("{} ({})", p.provider, p.endpoint)
    }
}

/// `requests 20.0/s burst 20 (headers); requests 19.0/s burst 1 (refusals)`, or `nothing
/// stated or refused`.
fn paced_by(p: &ProviderCapacity) -> String {
    if p.limits.is_empty() {
        return "nothing stated or refused".into();
    }
    p.limits
        .iter()
        .map(|l| {
            format!(
                "{} {}/s burst {:.0} ({})",
                l.name.replace('_', " "),
                rate(l.per_second),
                l.burst,
                l.source
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Three significant digits or so: `19.0`, `0.833`, `6667`.
fn rate(per_second: f64) -> String {
    if per_second >= 100.0 {
        format!("{per_second:.0}")
    } else if per_second >= 1.0 {
        format!("{per_second:.1}")
    } else {
        format!("{per_second:.3}")
    }
}

#[cfg(test)]
mod tests {
    use forkd_proto::v1::PacedLimit;

    use super::*;

    fn key() -> ProviderCapacity {
        ProviderCapacity {
            provider: "anthropic".into(),
            endpoint: "https://gateway.example".into(),
            model: "claude-sonnet-4-5".into(),
            limits: vec![
                PacedLimit {
                    name: "input_tokens".into(),
                    per_second: 6666.67,
                    burst: 400_000.0,
                    source: "headers".into(),
                },
                PacedLimit {
                    name: "requests".into(),
                    per_second: 19.0,
                    burst: 1.0,
                    source: "refusals".into(),
                },
            ],
            concurrency: 64.0,
            in_flight: 3,
            waiting: 120,
            throttled: 2,
            refusals_last_minute: 4,
            paused_for_ms: 1_500,
        }
    }

    #[test]
    fn the_table_says_what_paces_each_key_and_whence() {
        let text = table(&GetCapacityResponse {
            providers: vec![key()],
            ..Default::default()
        });
        assert!(
            text.contains(
                "input tokens 6667/s burst 400000 (headers); requests 19.0/s burst 1 (refusals)"
            ),
            "{text}"
        );
        assert!(
            text.contains("anthropic (https://gateway.example)"),
            "{text}"
        );
        assert!(text.contains("1.5s"), "{text}");
        let empty = table(&GetCapacityResponse::default());
        assert!(empty.contains("No model request"), "{empty}");
    }

    #[test]
    fn the_json_carries_every_field() {
        let value = to_json(&GetCapacityResponse {
            providers: vec![key()],
            ..Default::default()
        });
        let p = &value["providers"][0];
        assert_eq!(p["limits"][1]["source"], "refusals");
        assert_eq!(p["limits"][1]["per_second"], 19.0);
        assert_eq!(p["throttled"], 2);
        assert_eq!(p["refusals_last_minute"], 4);
        assert_eq!(p["paused_for_ms"], 1500);
    }

    #[test]
    fn the_runs_line_gives_slots_queue_and_budget() {
        let capacity = GetCapacityResponse {
            slots: Some(forkd_proto::v1::RunSlots {
                used: 3,
                free: 253,
                total: 256,
            }),
            queued: 2,
            budget_left: Some(BudgetLeft {
                usd: Some(1.2),
                tokens: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            runs(&capacity),
            "slots: 3 of 256 used, 253 free · your queue: 2 · budget left: $1.2000"
        );
        let json = to_json(&capacity);
        assert_eq!(json["slots"]["free"], 253);
        assert_eq!(json["budget_left"]["usd"], 1.2);
        assert!(json["budget_left"]["tokens"].is_null());
        let uncapped = GetCapacityResponse::default();
        assert_eq!(
            runs(&uncapped),
            "slots: 0 running, no cap · your queue: 0 · no budget"
        );
        assert!(to_json(&uncapped)["budget_left"].is_null());
    }
}
