//! The engine's metrics, through the `metrics` facade: without a recorder installed (the daemon
//! installs a Prometheus one under `--metrics-listen`) every call here does nothing.

use std::time::Duration;

use forkd_core::Usage;
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

pub const REQUESTS: &str = "forkd_requests_total";
pub const TOKENS: &str = "forkd_tokens_total";
pub const COST: &str = "forkd_cost_usd";
pub const PREFIX_DIVERGENCES: &str = "forkd_prefix_divergences_total";
pub const NOTIFICATION_LAG: &str = "forkd_notification_lag_seconds";
pub const AGENT_RUNS: &str = "forkd_agent_runs";
pub const AGENTS_ENDED: &str = "forkd_agents_ended_total";
pub const REQUEST_SECONDS: &str = "forkd_model_request_seconds";
pub const AGENTS: &str = "forkd_agents";
pub const FIRST_TOKEN_SECONDS: &str = "forkd_model_first_token_seconds";
pub const MCP_CALLS: &str = "forkd_mcp_calls_total";
pub const MCP_CALL_SECONDS: &str = "forkd_mcp_call_seconds";
pub const THROTTLED: &str = "forkd_provider_throttled_total";
pub const THROTTLED_SECONDS: &str = "forkd_provider_throttled_seconds";
pub const LIMITER_RATE: &str = "forkd_provider_limiter_rate";
pub const LIMITER_CONCURRENCY: &str = "forkd_provider_limiter_concurrency";
pub const LIMITER_IN_FLIGHT: &str = "forkd_provider_limiter_in_flight";
pub const LIMITER_WAITING: &str = "forkd_provider_limiter_waiting";
pub const SNAPSHOT_SECONDS: &str = "forkd_isolation_snapshot_seconds";
pub const SNAPSHOT_BYTES: &str = "forkd_isolation_snapshot_bytes";
pub const SCHEMA_MISMATCHES: &str = "forkd_output_schema_mismatches_total";
pub const STORE_RECOVERY_SECONDS: &str = "forkd_store_recovery_seconds";

/// Describes every metric, and sets the counters that matter when they are zero (a divergence
/// counter that is absent until the first divergence is hard to alert on).
pub fn describe() {
    describe_counter!(
        REQUESTS,
        "Model requests recorded, by model and kind of agent (parent, fork, typed)"
    );
    describe_counter!(
        TOKENS,
        Unit::Count,
        "Tokens of recorded requests, by kind: input, cache_write, cache_read, output"
    );
    describe_gauge!(
        COST,
        "Spend on model requests since the daemon started, in USD"
    );
    describe_counter!(
        PREFIX_DIVERGENCES,
        "Fork children whose first request's prefix differed from their first sibling's"
    );
    describe_histogram!(
        NOTIFICATION_LAG,
        Unit::Seconds,
        "From a task notification's commit starting to its broadcast to subscribers"
    );
    describe_gauge!(
        AGENT_RUNS,
        "Agent runs in progress (fork children and typed agents)"
    );
    describe_counter!(AGENTS_ENDED, "Agents that ended, by status");
    describe_histogram!(
        SNAPSHOT_SECONDS,
        Unit::Seconds,
        "Time to take an isolated batch's snapshot of its session's workspace"
    );
    describe_histogram!(
        SNAPSHOT_BYTES,
        Unit::Bytes,
        "Bytes in an isolated batch's snapshot of its session's workspace"
    );
    describe_histogram!(
        REQUEST_SECONDS,
        Unit::Seconds,
        "Model request time, retries included, to the end of the response"
    );
    describe_counter!(
        MCP_CALLS,
        "MCP tool calls, by server and outcome (ok, or error: the server's isError, a crash, a timeout, a server that cannot be reached)"
    );
    describe_histogram!(
        MCP_CALL_SECONDS,
        Unit::Seconds,
        "MCP tool call time, by server, from the call to its result"
    );
    describe_histogram!(
        FIRST_TOKEN_SECONDS,
        Unit::Seconds,
        "Time to first token: a model request, retries included, to its first content block"
    );
    describe_gauge!(
        AGENTS,
        "Stored agents by kind (parent, fork, typed) and state (pending, running, completed, \
         failed, killed), read from the database at each scrape"
    );
    describe_counter!(
        THROTTLED,
        "Model requests the provider refused and forkd sent again, by provider, model and \
         status (429, 529, 503, …, unreachable, stream)"
    );
    describe_histogram!(
        THROTTLED_SECONDS,
        Unit::Seconds,
        "From a request's first refusal to its admission that succeeded, by provider and model"
    );
    describe_gauge!(
        LIMITER_RATE,
        "The refill rate per second the limiter learned from the provider's headers, by \
         provider, model and limit (requests, tokens, input_tokens, output_tokens)"
    );
    describe_gauge!(
        LIMITER_CONCURRENCY,
        "The limiter's concurrency window (AIMD on overload), by provider and model"
    );
    describe_gauge!(
        LIMITER_IN_FLIGHT,
        "Model requests in flight, by provider and model"
    );
    describe_gauge!(
        LIMITER_WAITING,
        "Model requests waiting for admission, by provider and model"
    );
    describe_counter!(
        SCHEMA_MISMATCHES,
        "Final replies that did not match their output schema, by outcome: follow_up (asked \
         once more) or failed (the second mismatch ended the agent)"
    );
    describe_histogram!(
        STORE_RECOVERY_SECONDS,
        Unit::Seconds,
        "From the database refusing writes (a full disk, a server out of reach) to a write probe succeeding"
    );
    counter!(PREFIX_DIVERGENCES).absolute(0);
}

/// A final reply did not match its output schema: `follow_up` or `failed`.
pub(crate) fn schema_mismatch(outcome: &'static str) {
    counter!(SCHEMA_MISMATCHES, "outcome" => outcome).increment(1);
}

/// The database took writes again, `after` its fault began.
pub(crate) fn store_recovered(after: Duration) {
    histogram!(STORE_RECOVERY_SECONDS).record(after.as_secs_f64());
}

/// A refusal that the limiter answers by waiting and sending again.
pub(crate) fn throttled(provider: &'static str, model: &str, status: String) {
    counter!(THROTTLED, "provider" => provider, "model" => model.to_owned(), "status" => status)
        .increment(1);
}

/// How long a request that was refused waited before it went through.
pub(crate) fn throttle_wait(provider: &'static str, model: &str, waited: Duration) {
    histogram!(THROTTLED_SECONDS, "provider" => provider, "model" => model.to_owned())
        .record(waited.as_secs_f64());
}

/// The state of one key's limiter.
pub(crate) fn limiter(
    provider: &'static str,
    model: &str,
    window: f64,
    in_flight: usize,
    waiting: usize,
    rates: &[(&'static str, Option<f64>)],
) {
    let model = || model.to_owned();
    gauge!(LIMITER_CONCURRENCY, "provider" => provider, "model" => model()).set(window);
    gauge!(LIMITER_IN_FLIGHT, "provider" => provider, "model" => model()).set(in_flight as f64);
    gauge!(LIMITER_WAITING, "provider" => provider, "model" => model()).set(waiting as f64);
    for (limit, rate) in rates {
        if let Some(rate) = rate {
            gauge!(LIMITER_RATE, "provider" => provider, "model" => model(), "limit" => *limit)
                .set(*rate);
        }
    }
}

/// Sets how many stored agents of `kind` are in `state` (the metrics endpoint does, from the
/// store, at each scrape).
pub fn agents(kind: forkd_core::AgentKind, state: forkd_core::AgentState, n: u64) {
    gauge!(AGENTS, "kind" => kind.as_str(), "state" => state.as_str()).set(n as f64);
}

pub(crate) fn request(
    model: &str,
    kind: &'static str,
    usage: &Usage,
    cost_usd: f64,
    took: Duration,
    first_token: Option<Duration>,
) {
    counter!(REQUESTS, "model" => model.to_owned(), "kind" => kind).increment(1);
    for (name, n) in [
        ("input", usage.input_tokens),
        ("cache_write", usage.cache_creation_input_tokens),
        ("cache_read", usage.cache_read_input_tokens),
        ("output", usage.output_tokens),
    ] {
        counter!(TOKENS, "kind" => name).increment(n);
    }
    gauge!(COST).increment(cost_usd);
    histogram!(REQUEST_SECONDS).record(took.as_secs_f64());
    if let Some(first) = first_token {
        histogram!(FIRST_TOKEN_SECONDS).record(first.as_secs_f64());
    }
}

pub(crate) fn mcp_call(server: &str, error: bool, took: Duration) {
    let outcome = if error { "error" } else { "ok" };
    counter!(MCP_CALLS, "server" => server.to_owned(), "outcome" => outcome).increment(1);
    histogram!(MCP_CALL_SECONDS, "server" => server.to_owned()).record(took.as_secs_f64());
}

pub(crate) fn snapshot(took: Duration, bytes: u64) {
    histogram!(SNAPSHOT_SECONDS).record(took.as_secs_f64());
    histogram!(SNAPSHOT_BYTES).record(bytes as f64);
}

pub(crate) fn prefix_divergence() {
    counter!(PREFIX_DIVERGENCES).increment(1);
}

pub(crate) fn notification(status: &'static str, lag: Duration) {
    counter!(AGENTS_ENDED, "status" => status).increment(1);
    histogram!(NOTIFICATION_LAG).record(lag.as_secs_f64());
}

/// Counts an agent run while it lives.
pub(crate) struct RunGauge;

impl RunGauge {
    pub(crate) fn start() -> Self {
        gauge!(AGENT_RUNS).increment(1.0);
        RunGauge
    }
}

impl Drop for RunGauge {
    fn drop(&mut self) {
        gauge!(AGENT_RUNS).decrement(1.0);
    }
}
