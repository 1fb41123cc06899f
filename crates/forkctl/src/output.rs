//! What forkctl prints: `--json` shapes (docs/contracts.md, “JSON shapes”) and, in [`human`], the
//! tables and lines for people. Both are built from the proto messages by hand, because the
//! generated types carry no serde and the wire names are not the JSON names.

pub mod human;

use std::io::Write as _;

use forkd_proto::v1::{
    Agent, AgentState, EstimateForkCostResponse, ForkBatchResponse, GetCacheStatsResponse,
    Notification, NotificationStatus, Report, Session, TranscriptMessage, Usage,
};
use serde_json::{Value, json};

/// Writes to stdout, one line (or one table) at a time; messages go to stderr elsewhere.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    json: bool,
}

impl Printer {
    pub fn new(json: bool) -> Self {
        Self { json }
    }

    /// Whether `--json` was given.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// One JSON object on one line.
    pub fn value(&self, value: &Value) -> std::io::Result<()> {
        self.line(value)
    }

    /// Text followed by a newline. Errors (a closed pipe) are returned, not panicked on as
    /// `println!` would. Stdout is line-buffered, so `watch | jq` sees each line at once.
    pub fn line(&self, text: impl std::fmt::Display) -> std::io::Result<()> {
        writeln!(std::io::stdout().lock(), "{text}")
    }

    /// A task notification: its JSON shape, or one line for people (`watch`, `fork`, `run`).
    pub fn notification(&self, n: &Notification) -> std::io::Result<()> {
        if self.json {
            self.value(&notification_json(n))
        } else {
            self.line(human::notification_line(n))
        }
    }
}

/// The state a wire state names, from core's one table of states: the wire's names are
/// core's, upper-cased and prefixed (`AGENT_STATE_RUNNING`). `None` for `unspecified`.
pub fn core_state(state: AgentState) -> Option<forkd_core::AgentState> {
    wire_name(state.as_str_name(), "AGENT_STATE_").and_then(|n| forkd_core::AgentState::parse(&n))
}

/// The wire's name of a state.
pub fn wire_state(state: forkd_core::AgentState) -> AgentState {
    let name = format!("AGENT_STATE_{}", state.as_str().to_ascii_uppercase());
    AgentState::from_str_name(&name).unwrap_or(AgentState::Unspecified)
}

/// The status a wire status names, from core's table (`NOTIFICATION_STATUS_FAILED`).
pub fn core_status(status: NotificationStatus) -> Option<forkd_core::NotificationStatus> {
    wire_name(status.as_str_name(), "NOTIFICATION_STATUS_")
        .and_then(|n| forkd_core::NotificationStatus::parse(&n))
}

/// A protobuf enum value's name without its enum's prefix, lower-cased.
fn wire_name(name: &str, prefix: &str) -> Option<String> {
    name.strip_prefix(prefix).map(str::to_ascii_lowercase)
}

/// `pending`, `running`, `idle`, `completed`, `failed`, `killed`, `timed_out` (or
/// `unspecified`).
pub fn state_name(state: AgentState) -> &'static str {
    core_state(state).map_or("unspecified", forkd_core::AgentState::as_str)
}

/// An agent's state as people read it: [`state_name`], and `running (throttled)` while the
/// provider's limits hold its request back.
pub fn agent_state_label(agent: &Agent) -> &'static str {
    match agent.state() {
        AgentState::Running if agent.throttled_since.is_some() => "running (throttled)",
        state => state_name(state),
    }
}

/// `completed`, `failed`, `killed`, `timed_out` (or `unspecified`).
pub fn status_name(status: NotificationStatus) -> &'static str {
    core_status(status).map_or("unspecified", forkd_core::NotificationStatus::as_str)
}

/// An empty id on the wire means "none"; scripts test for `null` more naturally than for "".
pub(crate) fn optional_id(id: &str) -> Value {
    if id.is_empty() {
        Value::Null
    } else {
        json!(id)
    }
}

/// The four usage counters, zero when the daemon sent none.
pub fn usage_json(usage: Option<&Usage>) -> Value {
    let usage = usage.copied().unwrap_or_default();
    json!({
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": usage.output_tokens,
    })
}

fn report_json(report: Option<&Report>) -> Value {
    let empty = Report::default();
    let report = report.unwrap_or(&empty);
    let mut value = json!({
        "scope": report.scope,
        "result": report.result,
        "key_files": report.key_files,
        "files_changed": report.files_changed,
        "issues": report.issues,
    });
    // Under an output schema only: the object itself, not its text.
    if let Some(structured) = structured(report)
        && let Some(map) = value.as_object_mut()
    {
        map.insert("structured".into(), structured);
    }
    value
}

/// The limit that stopped a timed-out agent, as its report's `issues` (or its error) names it:
/// the first line that starts `timed out`.
pub fn timed_out_reason(text: &str) -> Option<&str> {
    text.lines()
        .map(str::trim)
        .find(|line| line.starts_with("timed out"))
}

/// The object a report's final reply held under an output schema, if any.
pub fn structured(report: &Report) -> Option<Value> {
    if report.structured_json.is_empty() {
        return None;
    }
    serde_json::from_str(&report.structured_json).ok()
}

/// A task notification (`watch`, `fork --wait`).
pub fn notification_json(n: &Notification) -> Value {
    json!({
        "seq": n.seq,
        "session_id": n.session_id,
        "batch_id": optional_id(&n.batch_id),
        "agent_id": n.agent_id,
        "kind": n.kind,
        "status": status_name(n.status()),
        "summary": n.summary,
        "report": report_json(n.report.as_ref()),
        "usage": usage_json(n.usage.as_ref()),
        "cost_usd": n.cost_usd,
        "schedule": (!n.schedule.is_empty()).then_some(&n.schedule),
    })
}

/// One agent of `ps`: with the limits it runs under and when it first started (`null` until
/// it has).
pub fn agent_json(a: &Agent) -> Value {
    json!({
        "agent_id": a.agent_id,
        "session_id": a.session_id,
        "batch_id": optional_id(&a.batch_id),
        "kind": a.kind,
        "state": state_name(a.state()),
        "usage": usage_json(a.usage.as_ref()),
        "cost_usd": a.cost_usd,
        "cache_read_share": a.cache_read_share,
        "description": a.description,
        "error": if a.error.is_empty() { Value::Null } else { json!(a.error) },
        "daemon": optional_id(&a.daemon),
        "changes": if a.changes.is_empty() { Value::Null } else { json!(a.changes) },
        "limits": crate::limits::limits_json(a.limits.as_ref()),
        "started_at": a.started_at.map(|t| t.to_string()),
    })
}

/// A session of `session get` / `session list`.
pub fn session_json(s: &Session) -> Value {
    json!({
        "session_id": s.session_id,
        "model": s.model,
        "workspace": s.workspace,
        "coordinator": s.coordinator,
        "interactive": s.interactive,
        "permission_mode": s.permission_mode,
        "sandbox": s.sandbox,
        "allow_network": s.allow_network,
        "unix_sockets": s.unix_sockets,
        "sandbox_layers": s.sandbox_layers,
        "mcp_servers": s.mcp_servers,
        "hook_events": s.hook_events,
        "thinking_budget_tokens": s.thinking_budget_tokens,
        "tool_names": s.tool_names,
        "system_prompt_bytes": s.system_prompt_bytes,
        "message_count": s.message_count,
        "created_at": s.created_at.map(|t| t.to_string()),
        "turn_seqs": s.turn_seqs,
        "finished_turns": s.finished_turns,
        "branch": (!s.branch_of.is_empty()).then(|| json!({
            "origin": s.branch_of,
            "point": s.branch_point,
            "turn": s.branch_turn,
        })),
        "branches": s.branches,
        "upload": s.upload_origin.as_ref().map(|o| json!({
            "upload_id": o.upload_id,
            "files": o.files,
            "bytes": o.bytes,
            "git_commit": o.git_commit,
        })),
    })
}

/// The reply to `fork`.
pub fn fork_json(r: &ForkBatchResponse) -> Value {
    json!({ "batch_id": r.batch_id, "agent_ids": r.agent_ids })
}

/// `stats`: the usage counters flattened beside the cost figures.
pub fn stats_json(s: &GetCacheStatsResponse) -> Value {
    let usage = s.usage.unwrap_or_default();
    json!({
        "children": s.children,
        "shared_prefix_tokens": s.shared_prefix_tokens,
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": s.cost_usd,
        "independent_cost_usd": s.independent_cost_usd,
        "saving": s.saving,
        "cache_read_share": s.cache_read_share,
        "requests": s.requests,
    })
}

/// `calc`: `break_even_children` is `null` when forking never pays.
pub fn estimate_json(e: &EstimateForkCostResponse) -> Value {
    json!({
        "independent_cost_usd": e.independent_cost_usd,
        "fork_cost_usd": e.fork_cost_usd,
        "saving": e.saving,
        "break_even_children": (e.break_even_children != 0).then_some(e.break_even_children),
        "seed_simplified_saving": e.seed_simplified_saving,
        "model": e.model,
    })
}

/// One transcript message of `logs`: its content parsed, so scripts get structure, not a string.
/// Content that is not JSON (which the daemon should never send) is passed through as a string.
pub fn message_json(m: &TranscriptMessage) -> Value {
    let content = serde_json::from_str::<Value>(&m.content_json)
        .unwrap_or_else(|_| Value::String(m.content_json.clone()));
    json!({
        "role": m.role,
        "content": content,
        "shared": m.shared,
        "compaction": m.compaction,
        "note": m.note,
        "seq": m.seq,
        "turn": (m.turn > 0).then_some(m.turn),
    })
}

/// One hook's run, as `logs --json` prints it beside the messages (told apart by `hook`).
pub fn hook_run_json(h: &forkd_proto::v1::HookRun) -> Value {
    json!({
        "hook": h.event,
        "tool_use_id": (!h.tool_use_id.is_empty()).then_some(&h.tool_use_id),
        "tool_name": (!h.tool_name.is_empty()).then_some(&h.tool_name),
        "program": h.program,
        "exit_code": h.exit_code,
        "decision": h.decision,
        "output": h.output,
        "started_at": h.started_at.map(|t| t.to_string()),
        "duration_ms": h.duration_ms,
    })
}

#[cfg(test)]
mod json_tests;
