//! `forkctl capacity`: what the daemon's provider limiter believes now, per provider key and
//! model — the limits it paces by and where each came from (the provider's headers or its
//! refusals), requests in flight, waiting and throttled, and the last minute's refusals.

use clap::Args;
use forkd_proto::v1::{GetCapacityRequest, GetCapacityResponse, ProviderCapacity};
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
        out.line(table(&capacity))?;
    }
    Ok(exit::OK)
}

/// `{"providers": [{"provider", "endpoint", "model", "limits": [{"name", "per_second",
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
    json!({ "providers": providers })
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
        });
        let p = &value["providers"][0];
        assert_eq!(p["limits"][1]["source"], "refusals");
        assert_eq!(p["limits"][1]["per_second"], 19.0);
        assert_eq!(p["throttled"], 2);
        assert_eq!(p["refusals_last_minute"], 4);
        assert_eq!(p["paused_for_ms"], 1500);
    }
}
