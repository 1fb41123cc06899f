//! Conversions from domain values to their wire messages.

use forkd_core::calc::ForkCostEstimate;
use forkd_core::report::Report;
use forkd_core::session::Session;
use forkd_core::{Agent, AgentState, Notification, NotificationStatus, Usage};
use forkd_engine::CacheStats;
use forkd_proto::v1 as pb;

pub(crate) fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

pub(crate) fn usage(u: &Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        cache_creation_input_tokens: u.cache_creation_input_tokens,
        cache_read_input_tokens: u.cache_read_input_tokens,
        output_tokens: u.output_tokens,
    }
}

pub(crate) fn session(s: &Session, message_count: u64, sandbox_layers: &str) -> pb::Session {
    pb::Session {
        session_id: s.id.to_string(),
        model: s.params.model.clone(),
        workspace: s.workspace.display().to_string(),
        coordinator: s.coordinator,
        interactive: s.interactive,
        permission_mode: s.permission_mode.as_str().to_owned(),
        thinking_budget_tokens: s.params.thinking.map_or(0, |t| t.budget_tokens),
        tool_names: s.params.tools.names(),
        system_prompt_bytes: s.params.system.as_str().len() as u64,
        message_count,
        created_at: Some(timestamp(s.created_at_ms)),
        allow_rules: s.rules.allow.clone(),
        deny_rules: s.rules.deny.clone(),
        sandbox: s.sandbox.mode.as_str().to_owned(),
        allow_network: s.sandbox.allow_network,
        mcp_servers: s.mcp.servers.iter().map(|m| m.name.clone()).collect(),
        unix_sockets: s.sandbox.unix_sockets,
        sandbox_layers: sandbox_layers.to_owned(),
    }
}

fn agent_state(s: AgentState) -> pb::AgentState {
    match s {
        AgentState::Pending => pb::AgentState::Pending,
        AgentState::Running => pb::AgentState::Running,
        AgentState::Idle => pb::AgentState::Idle,
        AgentState::Completed => pb::AgentState::Completed,
        AgentState::Failed => pb::AgentState::Failed,
        AgentState::Killed => pb::AgentState::Killed,
    }
}

pub(crate) fn agent(a: &Agent) -> pb::Agent {
    let (description, prompt) = a
        .directive
        .as_ref()
        .map(|d| (d.description.clone(), d.prompt.clone()))
        .unwrap_or_default();
    pb::Agent {
        agent_id: a.id.to_string(),
        session_id: a.session_id.to_string(),
        batch_id: a.batch_id.map(|b| b.to_string()).unwrap_or_default(),
        kind: a.kind.as_str().to_owned(),
        state: agent_state(a.state) as i32,
        description,
        prompt,
        usage: Some(usage(&a.usage)),
        cost_usd: a.cost_usd,
        cache_read_share: a.usage.cache_read_share(),
        error: a.error.clone().unwrap_or_default(),
        index: a.index,
        created_at: Some(timestamp(a.created_at_ms)),
        updated_at: Some(timestamp(a.updated_at_ms)),
        daemon: a.held_by.map(|d| d.to_string()).unwrap_or_default(),
        throttled_since: a
            .throttled_since_ms
            .filter(|_| a.state == forkd_core::AgentState::Running)
            .map(timestamp),
    }
}

fn report(r: &Report) -> pb::Report {
    pb::Report {
        scope: r.scope.clone(),
        result: r.result.clone(),
        key_files: r.key_files.clone(),
        files_changed: r.files_changed.clone(),
        issues: r.issues.clone(),
    }
}

pub(crate) fn notification(n: &Notification) -> pb::Notification {
    let status = match n.status {
        NotificationStatus::Completed => pb::NotificationStatus::Completed,
        NotificationStatus::Failed => pb::NotificationStatus::Failed,
        NotificationStatus::Killed => pb::NotificationStatus::Killed,
    };
    pb::Notification {
        seq: n.seq,
        session_id: n.session_id.to_string(),
        batch_id: n.batch_id.map(|b| b.to_string()).unwrap_or_default(),
        agent_id: n.agent_id.to_string(),
        kind: n.kind.as_str().to_owned(),
        status: status as i32,
        summary: n.summary.clone(),
        report: Some(report(&n.report)),
        usage: Some(usage(&n.usage)),
        cost_usd: n.cost_usd,
        created_at: Some(timestamp(n.created_at_ms)),
    }
}

pub(crate) fn cache_stats(s: &CacheStats) -> pb::GetCacheStatsResponse {
    pb::GetCacheStatsResponse {
        children: s.children,
        shared_prefix_tokens: s.shared_prefix_tokens,
        usage: Some(usage(&s.usage)),
        cost_usd: s.cost_usd,
        independent_cost_usd: s.independent_cost_usd,
        saving: s.saving,
        requests: s.requests,
        cache_read_share: s.usage.cache_read_share(),
        input_cost_usd: s.input_cost_usd,
    }
}

pub(crate) fn request_record(r: &forkd_core::query::RequestRecord) -> pb::ModelRequestRecord {
    pb::ModelRequestRecord {
        request_id: r.id.to_string(),
        agent_id: r.agent_id.to_string(),
        session_id: r.session_id.to_string(),
        batch_id: r.batch_id.map(|b| b.to_string()).unwrap_or_default(),
        turn: r.turn,
        model: r.model.clone(),
        usage: Some(usage(&r.usage)),
        cost_usd: r.cost_usd,
        prefix_fingerprint: r.prefix_fingerprint.clone(),
        body_bytes: r.body_bytes,
        stop_reason: r.stop_reason.clone().unwrap_or_default(),
        created_at: Some(timestamp(r.created_at_ms)),
        first_token_ms: r.first_token_ms,
        sent_at: r.sent_at_ms.map(timestamp),
    }
}

pub(crate) fn estimate(e: &ForkCostEstimate, model: &str) -> pb::EstimateForkCostResponse {
    pb::EstimateForkCostResponse {
        independent_cost_usd: e.independent_cost_usd,
        fork_cost_usd: e.fork_cost_usd,
        saving: e.saving,
        break_even_children: e.break_even_children.unwrap_or(0),
        seed_simplified_saving: e.seed_simplified_saving,
        model: model.to_owned(),
    }
}

/// A directive from the wire: the one place its proto shape becomes the domain's.
pub(crate) fn directive(d: pb::Directive) -> forkd_core::Directive {
    forkd_core::Directive {
        description: d.description,
        prompt: d.prompt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_split_milliseconds() {
        let t = timestamp(1_700_000_000_123);
        assert_eq!((t.seconds, t.nanos), (1_700_000_000, 123_000_000));
        let t = timestamp(-1);
        assert_eq!((t.seconds, t.nanos), (-1, 999_000_000));
    }
}
