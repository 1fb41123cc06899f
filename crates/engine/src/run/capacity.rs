//! The `Capacity` tool, in sessions created with `capacity_tool`: how busy the daemon is, as
//! `GetCapacity` tells a client (the slots in total, the tenant's own queue and budget, the
//! limiter of the session's model), and when a fork of so many children would start and end —
//! for a coordinator sizing its fan-out. Read-only, and nothing of another tenant's.

use std::time::Duration;

use forkd_tools::ToolOutput;
use serde_json::{Value, json};

use super::Runs;
use super::tools::ToolTurn;
use crate::eta::{self, Demand, Load};

/// The most children the tool estimates for.
const MOST_CHILDREN: u64 = 10_000;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Runs {
    /// Answers a `Capacity` call: a JSON object the model reads.
    pub(super) async fn capacity_tool(&self, turn: &ToolTurn<'_>, input: &Value) -> ToolOutput {
        let children = match input.get("children") {
            None | Some(Value::Null) => None,
            Some(n) => match n.as_u64() {
                Some(n @ 1..=MOST_CHILDREN) => Some(n),
                _ => {
                    return ToolOutput::error(format!(
                        "children must be a whole number from 1 to {MOST_CHILDREN}, not {n}"
                    ));
                }
            },
        };
        let session = turn.session;
        let tenant = session.tenant.as_str();
        let slots = self.supervisor.slots(tenant);
        let budget = match self.tenancy.budget_left(tenant).await {
            Ok(budget) => budget,
            Err(e) => return ToolOutput::error(format!("The budget cannot be read now: {e}")),
        };
        let keys = self.calls.capacity();
        let limiter = keys.iter().find(|k| k.model == session.params.model);
        let run_time = self.supervisor.run_time();
        let mut answer = json!({
            "slots": {
                "used": slots.used,
                "free": slots.cap.map(|cap| cap.saturating_sub(slots.used)),
                "total": slots.cap,
            },
            "queued": slots.queued,
            "budget_left": budget.map(|b| json!({"usd": b.usd, "tokens": b.tokens})),
            "model": {
                "name": session.params.model,
                "limiter": limiter.map(|k| json!({
                    "in_flight": k.in_flight,
                    "waiting": k.waiting,
                    "throttled": k.throttled,
                    "refusals_last_minute": k.refusals_last_minute,
                    "paused_for_ms": millis(k.paused_for),
                    "limits": k.limits.iter().map(|l| json!({
                        "name": l.name,
                        "per_second": l.per_second,
                        "burst": l.burst,
                        "source": l.source.as_str(),
                    })).collect::<Vec<_>>(),
                })),
            },
            "latest_runs": run_time.map(|t| json!({
                "median_ms": millis(t.median),
                "runs": t.runs,
            })),
        });
        if let Some(n) = children {
            // What the fork's first requests would share: the history so far.
            let prefix = self
                .window
                .history_tokens(session, None)
                .await
                .unwrap_or_default() as f64;
            let max_tokens = f64::from(session.params.max_tokens);
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let eta = eta::estimate(&Load {
                slots,
                before_first: self.supervisor.served_before(tenant, 1),
                before_last: self.supervisor.served_before(tenant, n),
                run_time,
                limiter,
                first: Demand {
                    requests: 1.0,
                    input_tokens: prefix,
                    output_tokens: max_tokens,
                },
                all: Demand {
                    requests: n as f64,
                    input_tokens: prefix,
                    output_tokens: max_tokens * n as f64,
                },
            });
            answer["fork"] = json!({
                "children": n,
                "start_in_ms": eta.start.map(millis),
                "finish_in_ms": eta.finish.map(millis),
                "basis": eta.basis,
            });
        }
        ToolOutput::ok(answer.to_string())
    }
}
