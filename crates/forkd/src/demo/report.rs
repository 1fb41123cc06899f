//! The demo's report: the per-child table and the cost comparison, for people and as JSON.

use forkd_core::pricing::{self, CacheTtl};
use forkd_proto::v1 as pb;

/// What the demo measured.
pub(crate) struct DemoReport {
    pub model: String,
    pub session_id: String,
    pub batch_id: String,
    /// In directive order.
    pub children: Vec<pb::Notification>,
    pub stats: pb::GetCacheStatsResponse,
    pub estimate: pb::EstimateForkCostResponse,
    pub directive_tokens: u64,
    /// The directives' descriptions, in order.
    pub labels: Vec<String>,
}

fn usage_of(n: &pb::Notification) -> pb::Usage {
    n.usage.unwrap_or_default()
}

fn status_name(n: &pb::Notification) -> &'static str {
    match pb::NotificationStatus::try_from(n.status) {
        Ok(pb::NotificationStatus::Completed) => "completed",
        Ok(pb::NotificationStatus::Failed) => "failed",
        Ok(pb::NotificationStatus::Killed) => "killed",
        Ok(pb::NotificationStatus::TimedOut) => "timed_out",
        _ => "unknown",
    }
}

impl DemoReport {
    /// The input cost of the children's requests, as measured.
    fn measured_input_cost(&self) -> f64 {
        self.stats.input_cost_usd
    }

    fn prediction_error(&self) -> f64 {
        let predicted = self.estimate.fork_cost_usd;
        if predicted > 0.0 {
            (self.measured_input_cost() - predicted) / predicted
        } else {
            0.0
        }
    }

    /// The smallest share of the shared prefix read from cache by children 2..N.
    fn min_sibling_prefix_read(&self) -> f64 {
        let p = self.stats.shared_prefix_tokens.max(1) as f64;
        self.children
            .iter()
            .skip(1)
            .map(|c| usage_of(c).cache_read_input_tokens as f64 / p)
            .fold(f64::INFINITY, f64::min)
    }

    fn cost_of(&self, u: &pb::Usage) -> f64 {
        let core = forkd_core::Usage {
            input_tokens: u.input_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            output_tokens: u.output_tokens,
        };
        pricing::model(&self.model)
            .map(|m| core.input_cost_usd(m, CacheTtl::FiveMinutes))
            .unwrap_or(0.0)
    }

    fn calc_command(&self) -> String {
        format!(
            "forkctl calc --prefix {} --directive {} --children {} --model {}",
            self.stats.shared_prefix_tokens,
            self.directive_tokens,
            self.children.len(),
            self.model
        )
    }

    pub(crate) fn print(&self) {
        use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
        let n = self.children.len();
        println!(
            "forkd demo: {n} fork children from a {}-token shared prefix ({}, simulated provider)\n",
            self.stats.shared_prefix_tokens, self.model
        );
        for (i, c) in self.children.iter().enumerate() {
            println!(
                "child {} {} — {}: {}",
                i + 1,
                c.agent_id,
                status_name(c),
                c.summary
            );
        }
        println!();
        let mut table = Table::new();
        table.load_style(UTF8_FULL_CONDENSED).set_header(vec![
            "child",
            "directive",
            "input",
            "cache write",
            "cache read",
            "read share",
            "input cost",
        ]);
        let right = |v: String| Cell::new(v).set_alignment(CellAlignment::Right);
        for (i, c) in self.children.iter().enumerate() {
            let u = usage_of(c);
            let total = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
            let description = c
                .report
                .as_ref()
                .map(|r| r.scope.clone())
                .unwrap_or_default();
            let label: String = self.labels.get(i).cloned().unwrap_or(description);
            table.add_row(vec![
                right((i + 1).to_string()),
                Cell::new(label),
                right(u.input_tokens.to_string()),
                right(u.cache_creation_input_tokens.to_string()),
                right(u.cache_read_input_tokens.to_string()),
                right(format!(
                    "{:.1}%",
                    100.0 * u.cache_read_input_tokens as f64 / total.max(1) as f64
                )),
                right(format!("${:.4}", self.cost_of(&u))),
            ]);
        }
        let u = self.stats.usage.unwrap_or_default();
        table.add_row(vec![
            Cell::new("all"),
            Cell::new(""),
            right(u.input_tokens.to_string()),
            right(u.cache_creation_input_tokens.to_string()),
            right(u.cache_read_input_tokens.to_string()),
            right(format!("{:.1}%", 100.0 * self.stats.cache_read_share)),
            right(format!("${:.4}", self.measured_input_cost())),
        ]);
        println!("{table}\n");
        let independent = self.estimate.independent_cost_usd;
        println!(
            "batch input cost, measured        ${:.4}",
            self.measured_input_cost()
        );
        println!(
            "calculator's prediction           ${:.4}  ({:+.2}% off; {})",
            self.estimate.fork_cost_usd,
            100.0 * self.prediction_error(),
            self.calc_command()
        );
        println!(
            "{n} independent agents             ${independent:.4}  (same prefix and directives, no shared cache)"
        );
        println!(
            "saving                            {:.1}% of the independent agents' input cost",
            100.0 * (1.0 - self.measured_input_cost() / independent.max(f64::MIN_POSITIVE))
        );
        println!(
            "batch cost with output tokens     ${:.4}",
            self.stats.cost_usd
        );
        println!(
            "children 2..{n} read at least {:.2}% of the shared prefix from cache",
            100.0 * self.min_sibling_prefix_read()
        );
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let children: Vec<serde_json::Value> = self
            .children
            .iter()
            .map(|c| {
                let u = usage_of(c);
                let r = c.report.clone().unwrap_or_default();
                serde_json::json!({
                    "seq": c.seq,
                    "session_id": c.session_id,
                    "batch_id": c.batch_id,
                    "agent_id": c.agent_id,
                    "status": status_name(c),
                    "summary": c.summary,
                    "report": {
                        "scope": r.scope, "result": r.result, "key_files": r.key_files,
                        "files_changed": r.files_changed, "issues": r.issues,
                    },
                    "usage": {
                        "input_tokens": u.input_tokens,
                        "cache_creation_input_tokens": u.cache_creation_input_tokens,
                        "cache_read_input_tokens": u.cache_read_input_tokens,
                        "output_tokens": u.output_tokens,
                    },
                    "cost_usd": c.cost_usd,
                })
            })
            .collect();
        serde_json::json!({
            "model": self.model,
            "session_id": self.session_id,
            "batch_id": self.batch_id,
            "children": children,
            "shared_prefix_tokens": self.stats.shared_prefix_tokens,
            "directive_tokens": self.directive_tokens,
            "measured_input_cost_usd": self.measured_input_cost(),
            "measured_cost_usd": self.stats.cost_usd,
            "predicted_fork_cost_usd": self.estimate.fork_cost_usd,
            "prediction_error": self.prediction_error(),
            "independent_cost_usd": self.estimate.independent_cost_usd,
            "min_sibling_prefix_read_share": self.min_sibling_prefix_read(),
            "calc_command": self.calc_command(),
        })
    }
}
