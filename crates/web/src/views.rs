//! The JSON shapes the page reads, built from domain types in one place.
//!
//! Transcript content goes out as the stored content arrays (model output, tool output): the
//! page renders every string of it as text, never as markup.

use forkd_core::query::RequestRecord;
use forkd_core::{Agent, AgentKind, Notification, Usage};
use forkd_engine::TranscriptEntry;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct AgentRow {
    pub id: String,
    pub session_id: String,
    pub batch_id: Option<String>,
    pub kind: &'static str,
    pub index: u32,
    pub state: &'static str,
    pub description: String,
    /// The type of a typed agent (its query source), else empty.
    pub subagent_type: String,
    pub usage: Usage,
    /// Cache reads over all input.
    pub read_share: f64,
    pub cost_usd: f64,
    pub error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub ended: bool,
    /// While the agent runs and the provider's limits hold its request back: since when.
    pub throttled_since_ms: Option<i64>,
}

pub(crate) fn read_share(u: &Usage) -> f64 {
    let total = u.total_input();
    if total == 0 {
        0.0
    } else {
        u.cache_read_input_tokens as f64 / total as f64
    }
}

impl From<&Agent> for AgentRow {
    fn from(a: &Agent) -> Self {
        let subagent_type = match a.kind {
            AgentKind::Typed => a
                .query_source
                .as_deref()
                .map(|s| s.rsplit(':').next().unwrap_or(s).to_owned())
                .unwrap_or_default(),
            _ => String::new(),
        };
        Self {
            id: a.id.to_string(),
            session_id: a.session_id.to_string(),
            batch_id: a.batch_id.map(|b| b.to_string()),
            kind: a.kind.as_str(),
            index: a.index,
            state: a.state.as_str(),
            description: a
                .directive
                .as_ref()
                .map(|d| d.description.clone())
                .unwrap_or_default(),
            subagent_type,
            usage: a.usage,
            read_share: read_share(&a.usage),
            cost_usd: a.cost_usd,
            error: a.error.clone(),
            created_at_ms: a.created_at_ms,
            updated_at_ms: a.updated_at_ms,
            ended: a.state.is_terminal(),
            throttled_since_ms: a
                .throttled_since_ms
                .filter(|_| a.state == forkd_core::AgentState::Running),
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct MessageView {
    pub role: &'static str,
    /// The stored content array, parsed.
    pub content: serde_json::Value,
    /// Inherited from the parent (shared with the siblings).
    pub shared: bool,
    /// A compaction's summary, shown where its boundary is.
    pub compaction: bool,
    /// One of forkd's notes (a task notification, a batch's launch note or digest, a branch's
    /// report): drawn as forkd's by this mark, never by its text.
    pub note: bool,
    /// Its position among the agent's own messages, when it is one.
    pub seq: Option<u64>,
}

pub(crate) fn message(m: &forkd_core::Message, seq: Option<u64>) -> MessageView {
    MessageView {
        role: m.role.as_str(),
        content: serde_json::from_str(&m.content_json()).unwrap_or(serde_json::Value::Null),
        shared: false,
        compaction: false,
        note: false,
        seq,
    }
}

pub(crate) fn entry(e: &TranscriptEntry, seq: Option<u64>) -> MessageView {
    MessageView {
        shared: e.shared,
        compaction: e.compaction,
        note: e.note,
        ..message(&e.message, seq)
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct NotificationView {
    pub seq: u64,
    pub session_id: String,
    pub batch_id: Option<String>,
    pub agent_id: String,
    pub kind: &'static str,
    pub status: &'static str,
    pub summary: String,
    pub report: forkd_core::report::Report,
    pub usage: Usage,
    pub cost_usd: f64,
    pub created_at_ms: i64,
}

impl From<&Notification> for NotificationView {
    fn from(n: &Notification) -> Self {
        Self {
            seq: n.tenant_seq,
            session_id: n.session_id.to_string(),
            batch_id: n.batch_id.map(|b| b.to_string()),
            agent_id: n.agent_id.to_string(),
            kind: n.kind.as_str(),
            status: n.status.as_str(),
            summary: n.summary.clone(),
            report: n.report.clone(),
            usage: n.usage,
            cost_usd: n.cost_usd,
            created_at_ms: n.created_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct RequestView {
    pub id: String,
    pub agent_id: String,
    pub turn: u32,
    pub model: String,
    pub usage: Usage,
    pub read_share: f64,
    pub cost_usd: f64,
    pub prefix_fingerprint: String,
    pub first_token_ms: Option<u64>,
    pub body_bytes: u64,
    pub stop_reason: Option<String>,
    pub created_at_ms: i64,
}

impl From<&RequestRecord> for RequestView {
    fn from(r: &RequestRecord) -> Self {
        Self {
            id: r.id.to_string(),
            agent_id: r.agent_id.to_string(),
            turn: r.turn,
            model: r.model.clone(),
            usage: r.usage,
            read_share: read_share(&r.usage),
            cost_usd: r.cost_usd,
            prefix_fingerprint: r.prefix_fingerprint.clone(),
            first_token_ms: r.first_token_ms,
            body_bytes: r.body_bytes,
            stop_reason: r.stop_reason.clone(),
            created_at_ms: r.created_at_ms,
        }
    }
}
