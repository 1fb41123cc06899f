//! The fork cost calculator (docs/contracts.md, “The fork cost rule”): forks vs independent agents.

use serde::Serialize;

use crate::pricing::{CacheTtl, ModelSpec, READ_MULTIPLIER};

/// The calculator's answer. Costs are USD of input tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForkCostEstimate {
    pub independent_cost_usd: f64,
    pub fork_cost_usd: f64,
    /// `1 - fork / independent`.
    pub saving: f64,
    /// The smallest N at which forking is cheaper (None if it never is).
    pub break_even_children: Option<u64>,
    /// The seed document's figure, which ignores the write premium: children 2..N at 10%.
    pub seed_simplified_saving: f64,
}

/// Input cost of `n` forks as forkd sends them: `P·w·b + N·D·w·b + (N−1)·P·r·b`. Child 1 writes
/// the shared prefix; children 2..N read it; every child's directive block carries its own
/// breakpoint (so its later turns read its own prefix), so each directive is written too.
fn fork_cost(p: f64, d: f64, n: f64, b: f64, w: f64) -> f64 {
    p * w * b + n * d * w * b + (n - 1.0) * p * READ_MULTIPLIER * b
}

/// Estimates a batch of `children` forks over a `prefix`-token shared prefix with
/// `directive`-token directives, when the parent has not cached the prefix yet.
pub fn estimate(
    model: &ModelSpec,
    prefix: u64,
    directive: u64,
    children: u64,
    ttl: CacheTtl,
) -> ForkCostEstimate {
    let b = model.input_per_mtok / 1e6;
    let (p, d, n) = (prefix as f64, directive as f64, children as f64);
    let w = ttl.write_multiplier();
    let independent = n * (p + d) * b;
    let fork = fork_cost(p, d, n, b, w);
    let saving = if independent > 0.0 {
        1.0 - fork / independent
    } else {
        0.0
    };
    let break_even_children = (1..=10_000u64).find(|k| {
        let k = *k as f64;
        fork_cost(p, d, k, b, w) < k * (p + d) * b
    });
    let seed_fork = (p + d) + (n - 1.0) * (p * READ_MULTIPLIER + d);
    let seed_simplified_saving = if n > 0.0 && p + d > 0.0 {
        1.0 - seed_fork / (n * (p + d))
    } else {
        0.0
    };
    ForkCostEstimate {
        independent_cost_usd: independent,
        fork_cost_usd: fork,
        saving,
        break_even_children,
        seed_simplified_saving,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pricing;

    #[test]
    fn the_specs_example_saves_about_two_thirds() {
        let Some(model) = pricing::model("claude-sonnet-4-5") else {
            panic!("model missing")
        };
        let e = estimate(model, 48_500, 200, 5, CacheTtl::FiveMinutes);
        // 5·48.7k = 243.5k token-units against 60.6k + 1.25k + 19.4k = 81.3k.
        assert!((e.independent_cost_usd - 243_500.0 * 3e-6).abs() < 1e-9);
        assert!((e.fork_cost_usd - 81_275.0 * 3e-6).abs() < 1e-9);
        assert!((e.saving - 0.6662).abs() < 1e-3);
        assert_eq!(e.break_even_children, Some(2));
        assert!(e.seed_simplified_saving > e.saving);
    }

    #[test]
    fn one_child_never_saves() {
        let Some(model) = pricing::model("claude-sonnet-4-5") else {
            panic!("model missing")
        };
        let e = estimate(model, 10_000, 100, 1, CacheTtl::OneHour);
        assert!(e.saving < 0.0);
    }
}
