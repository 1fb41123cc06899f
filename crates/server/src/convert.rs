//! The one place wire messages and domain values turn into each other: requests into what the
//! engine takes, the engine's values and events into messages.

use forkd_core::calc::ForkCostEstimate;
use forkd_core::output::OutputSchema;
use forkd_core::report::Report;
use forkd_core::session::{PermissionMode, SandboxMode};
use forkd_core::tenant::Budget;
use forkd_core::{Agent, AgentState, Notification, NotificationStatus, Usage};
use forkd_engine::{
    BatchOptions, CacheStats, ContextFile, NewSession, SessionView, TranscriptEntry,
};
use forkd_proto::v1 as pb;

use crate::status::ApiError;

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

pub(crate) fn session_view(view: &SessionView) -> pb::Session {
    let s = &view.session;
    let turns = &view.turns;
    let branch_point = s.branch.map_or(0, |b| b.point);
    let branch_turn = turns
        .starts
        .iter()
        .filter(|seq| **seq < branch_point)
        .count();
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
        message_count: view.message_count,
        created_at: Some(timestamp(s.created_at_ms)),
        allow_rules: s.rules.allow.clone(),
        deny_rules: s.rules.deny.clone(),
        sandbox: s.sandbox.mode.as_str().to_owned(),
        allow_network: s.sandbox.allow_network,
        mcp_servers: s.mcp.servers.iter().map(|m| m.name.clone()).collect(),
        unix_sockets: s.sandbox.unix_sockets,
        sandbox_layers: view.sandbox_layers.clone(),
        turn_seqs: turns.starts.clone(),
        finished_turns: turns.finished(),
        branch_of: s.branch.map(|b| b.origin.to_string()).unwrap_or_default(),
        branch_point,
        branch_turn: u32::try_from(branch_turn).unwrap_or(u32::MAX),
        branches: view.branches.iter().map(ToString::to_string).collect(),
        upload_origin: view.origin.as_ref().map(|o| pb::UploadOrigin {
            upload_id: o.upload_id.to_string(),
            files: o.files,
            bytes: o.bytes,
            git_commit: o.git_commit.clone().unwrap_or_default(),
        }),
        hook_events: s
            .hooks
            .as_ref()
            .map(|h| h.events.clone())
            .unwrap_or_default(),
    }
}

/// One hook command's run.
pub(crate) fn hook_run(run: &forkd_core::hooks::runs::HookRunRecord) -> pb::HookRun {
    pb::HookRun {
        event: run.event.as_str().to_owned(),
        tool_use_id: run.tool_use_id.clone().unwrap_or_default(),
        tool_name: run.tool_name.clone().unwrap_or_default(),
        program: run.program.clone(),
        exit_code: run.exit_code,
        decision: run.decision.as_str().to_owned(),
        output: run.output.clone(),
        started_at: Some(timestamp(run.started_at_ms)),
        duration_ms: u64::try_from(run.finished_at_ms - run.started_at_ms).unwrap_or(0),
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
        AgentState::TimedOut => pb::AgentState::TimedOut,
    }
}

/// Running slots as the wire carries them (0 free and 0 total: no cap).
pub(crate) fn run_slots(s: &forkd_engine::Slots) -> pb::RunSlots {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    pb::RunSlots {
        used: count(s.used),
        free: count(s.cap.map_or(0, |cap| cap.saturating_sub(s.used))),
        total: count(s.cap.unwrap_or(0)),
    }
}

/// A dry run's answer.
pub(crate) fn dry_run(d: &forkd_engine::DryRun) -> pb::DryRun {
    pb::DryRun {
        children: u32::try_from(d.children).unwrap_or(u32::MAX),
        prefix_tokens: d.prefix_tokens,
        directive_tokens: d.directive_tokens,
        fork_cost_usd: d.estimate.fork_cost_usd,
        independent_cost_usd: d.estimate.independent_cost_usd,
        saving: d.estimate.saving,
        slots: Some(run_slots(&d.slots)),
        queued: u32::try_from(d.slots.queued).unwrap_or(u32::MAX),
        start_in_ms: d.eta.start.map(millis),
        finish_in_ms: d.eta.finish.map(millis),
        estimate_basis: d.eta.basis.clone(),
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Limits as the wire carries them: 0 and unset for "none at this layer".
pub(crate) fn limits(l: &forkd_core::Limits) -> pb::Limits {
    pb::Limits {
        timeout_ms: l.timeout_ms.unwrap_or(0),
        idle_timeout_ms: l.idle_timeout_ms.unwrap_or(0),
        max_turns: l.max_turns.unwrap_or(0),
        max_output_tokens: l.max_output_tokens.unwrap_or(0),
        timeout_excludes_throttle: l.timeout_excludes_throttle,
    }
}

/// Limits a request gives: 0 reads as unset.
pub(crate) fn limits_from(l: Option<&pb::Limits>) -> forkd_core::Limits {
    let Some(l) = l else {
        return forkd_core::Limits::default();
    };
    let set = |v: u64| (v > 0).then_some(v);
    forkd_core::Limits {
        timeout_ms: set(l.timeout_ms),
        idle_timeout_ms: set(l.idle_timeout_ms),
        max_turns: (l.max_turns > 0).then_some(l.max_turns),
        max_output_tokens: set(l.max_output_tokens),
        timeout_excludes_throttle: l.timeout_excludes_throttle,
    }
}

pub(crate) fn agent(a: &Agent, changes: Option<&forkd_core::isolation::AgentChanges>) -> pb::Agent {
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
        changes: changes
            .map(|c| format!("{}, {}", c.summary(), c.state.as_str()))
            .unwrap_or_default(),
        limits: a.limits.as_ref().map(limits),
        started_at: a.started_at_ms.map(timestamp),
    }
}

fn report(r: &Report) -> pb::Report {
    pb::Report {
        scope: r.scope.clone(),
        result: r.result.clone(),
        key_files: r.key_files.clone(),
        files_changed: r.files_changed.clone(),
        issues: r.issues.clone(),
        structured_json: r
            .structured
            .as_ref()
            .map(serde_json::Value::to_string)
            .unwrap_or_default(),
    }
}

pub(crate) fn notification(n: &Notification) -> pb::Notification {
    let status = match n.status {
        NotificationStatus::Completed => pb::NotificationStatus::Completed,
        NotificationStatus::Failed => pb::NotificationStatus::Failed,
        NotificationStatus::Killed => pb::NotificationStatus::Killed,
        NotificationStatus::TimedOut => pb::NotificationStatus::TimedOut,
    };
    pb::Notification {
        // The tenant's own count: every caller is a tenant, and sees its numbers alone.
        seq: n.tenant_seq,
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
        schedule: n.schedule.clone().unwrap_or_default(),
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

/// A session as `CreateSession`, `GetSession` and `ListSessions` answer with it.
/// What `CreateSession` asks the engine for.
pub(crate) fn new_session(req: pb::CreateSessionRequest) -> Result<NewSession, ApiError> {
    let permission_mode = match req.permission_mode.as_str() {
        "" => PermissionMode::Default,
        other => PermissionMode::parse(other).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "unknown permission_mode {:?}; use {}",
                other.chars().take(64).collect::<String>(),
                PermissionMode::choices()
            ))
        })?,
    };
    let sandbox = match req.sandbox.as_str() {
        "" => None,
        other => Some(SandboxMode::parse(other).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "unknown sandbox {:?}; use {}",
                other.chars().take(64).collect::<String>(),
                SandboxMode::choices()
            ))
        })?),
    };
    #[allow(deprecated, reason = "read only to refuse it")]
    if !req.external_tools_json.is_empty() {
        return Err(ApiError::BadRequest(
            "external_tools_json is no longer accepted: it advertised tools that nothing \
             could run. Enable MCP servers instead (mcp_servers: the operator's, by name; \
             mcp_config_json: the session's own .mcp.json), whose tools forkd runs"
                .into(),
        ));
    }
    Ok(NewSession {
        system_prompt: req.system_prompt,
        context_files: req
            .context_files
            .into_iter()
            .map(|f| ContextFile {
                path: f.path,
                content: f.content,
            })
            .collect(),
        model: Some(req.model).filter(|m| !m.is_empty()),
        workspace: Some(req.workspace)
            .filter(|w| !w.is_empty())
            .map(Into::into),
        coordinator: req.coordinator,
        interactive: req.interactive,
        permission_mode,
        thinking_budget: Some(req.thinking_budget_tokens).filter(|b| *b > 0),
        mcp: forkd_engine::McpRequest {
            servers: req.mcp_servers,
            config_json: Some(req.mcp_config_json).filter(|c| !c.trim().is_empty()),
        },
        max_tokens: Some(req.max_tokens).filter(|m| *m > 0),
        allow_rules: req.allow_rules,
        deny_rules: req.deny_rules,
        tenant: String::new(),
        idempotency_key: Some(req.idempotency_key).filter(|k| !k.is_empty()),
        sandbox,
        allow_network: req.allow_network,
        unix_sockets: req.unix_sockets,
        capacity_tool: req.capacity_tool,
        hooks_json: Some(req.hooks_json).filter(|h| !h.trim().is_empty()),
        upload: match req.upload_id.as_str() {
            "" => None,
            id => Some(id.parse().map_err(|_| {
                ApiError::BadRequest(format!(
                    "upload_id {:?} is not an upload id",
                    id.chars().take(64).collect::<String>()
                ))
            })?),
        },
    })
}

/// A `ForkBatch` request's options.
pub(crate) fn batch_options(req: &pb::ForkBatchRequest) -> Result<BatchOptions, String> {
    Ok(BatchOptions {
        warmup_gating: req.warmup_gating,
        idempotency_key: Some(req.idempotency_key.clone()).filter(|k| !k.is_empty()),
        budget: Budget {
            usd: Some(req.budget_usd).filter(|u| *u != 0.0),
            tokens: Some(req.budget_tokens).filter(|t| *t != 0),
        },
        isolation: req.isolation.parse()?,
        at_turn: req.at_turn,
        fork_point_of: Some(req.fork_point_of.trim())
            .filter(|id| !id.is_empty())
            .map(|id| {
                id.parse()
                    .map_err(|e| format!("fork_point_of is not a batch id: {e}"))
            })
            .transpose()?,
        output_schema: output_schema(&req.output_schema)?,
        limits: limits_from(req.limits.as_ref()),
        child_limits: req
            .directives
            .iter()
            .map(|d| limits_from(d.limits.as_ref()))
            .collect(),
        webhook: Some(req.webhook_id.trim())
            .filter(|id| !id.is_empty())
            .map(|id| {
                id.parse()
                    .map_err(|e| format!("webhook_id is not a webhook id: {e}"))
            })
            .transpose()?,
        schedule: None,
    })
}

/// A request's `output_schema`: empty for none, else a schema the daemon accepts.
pub(crate) fn output_schema(text: &str) -> Result<Option<OutputSchema>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    OutputSchema::parse(text)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// An isolated child's changes on the wire.
pub(crate) fn changes(c: forkd_core::isolation::AgentChanges) -> pb::GetChangesResponse {
    pb::GetChangesResponse {
        agent_id: c.agent_id.to_string(),
        batch_id: c.batch_id.to_string(),
        files: c.files.into_iter().map(file_change).collect(),
        diff: c.diff,
        state: c.state.as_str().to_owned(),
        conflicts: c.conflicts.into_iter().map(conflict).collect(),
        outside_possible: c.outside_possible,
    }
}

pub(crate) fn file_change(f: forkd_core::isolation::FileChange) -> pb::FileChange {
    use forkd_core::isolation::Special;
    pb::FileChange {
        path: f.path,
        kind: f.kind.as_str().to_owned(),
        added_lines: f.added,
        removed_lines: f.removed,
        binary: f.binary,
        special: match f.special {
            None => String::new(),
            Some(Special::Symlink(target)) => format!(
                "symbolic link -> {}",
                forkd_core::isolation::quote_path(&target)
            ),
            Some(Special::Other(what)) => what,
        },
    }
}

pub(crate) fn conflict(c: forkd_core::isolation::Conflict) -> pb::ChangeConflict {
    pb::ChangeConflict {
        path: c.path,
        reason: c.reason,
    }
}

pub(crate) fn transcript_message(e: TranscriptEntry) -> pb::TranscriptMessage {
    pb::TranscriptMessage {
        role: e.message.role.as_str().to_owned(),
        content_json: e.message.content_json(),
        shared: e.shared,
        compaction: e.compaction,
        note: e.note,
        seq: e.seq,
        turn: e.turn.unwrap_or(0),
    }
}

/// What `BranchSession` asks the engine for.
pub(crate) fn new_branch(
    origin: forkd_core::SessionId,
    req: pb::BranchSessionRequest,
) -> forkd_engine::NewBranch {
    use forkd_core::branch::At;
    use pb::branch_session_request::Point;
    let at = match req.point {
        None => At::Latest,
        Some(Point::AtTurn(k)) => At::AfterTurn(k),
        Some(Point::BeforeSeq(seq)) => At::Before(seq),
    };
    forkd_engine::NewBranch {
        origin,
        at,
        workspace: Some(req.workspace)
            .filter(|w| !w.is_empty())
            .map(Into::into),
        idempotency_key: Some(req.idempotency_key).filter(|k| !k.is_empty()),
    }
}

pub(crate) fn session_event(event: forkd_engine::ParentEvent) -> pb::SessionEvent {
    use forkd_engine::ParentEvent as E;
    use pb::session_event::Event;
    let event = match event {
        E::TextDelta(text) => Event::TextDelta(text),
        E::ToolCall {
            tool_use_id,
            name,
            input_json,
        } => Event::ToolCall(pb::ToolCall {
            tool_use_id,
            name,
            input_json,
        }),
        E::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => Event::ToolResult(pb::ToolResult {
            tool_use_id,
            content,
            is_error,
        }),
        E::AsyncLaunched(agent) => Event::AsyncLaunched(pb::AsyncLaunched {
            agent_id: agent.to_string(),
        }),
        E::ForkLaunched(batch) => Event::ForkLaunched(pb::ForkLaunched {
            batch_id: batch.batch_id.to_string(),
            agent_ids: batch.agent_ids.iter().map(ToString::to_string).collect(),
        }),
        E::TurnEnded {
            stop_reason,
            usage,
            cost_usd,
            text,
        } => Event::TurnEnded(pb::TurnEnded {
            stop_reason: stop_reason.unwrap_or_default(),
            usage: Some(self::usage(&usage)),
            cost_usd,
            text,
        }),
    };
    pb::SessionEvent { event: Some(event) }
}

pub(crate) fn agent_event(event: forkd_engine::AgentEvent, agent_id: &str) -> pb::AgentEvent {
    use forkd_engine::AgentEvent as E;
    use pb::agent_event::Event;
    let event = match event {
        E::Message { seq, message } => Event::Message(pb::TranscriptEvent {
            seq,
            role: message.role.as_str().to_owned(),
            content_json: message.content_json(),
        }),
        E::Ended(n) => Event::Ended(notification(&n)),
        E::AsyncLaunched => Event::AsyncLaunched(pb::AsyncLaunched {
            agent_id: agent_id.to_owned(),
        }),
        E::Interrupted { reason } => Event::Interrupted(pb::Interrupted { reason }),
        E::Resumed => Event::Resumed(pb::Resumed {}),
    };
    pb::AgentEvent { event: Some(event) }
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
