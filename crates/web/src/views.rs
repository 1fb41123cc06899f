//! The JSON shapes the page reads, built from domain types in one place.
//!
//! Transcript content goes out as the stored content arrays (model output, tool output): the
//! page renders every string of it as text, never as markup.

use forkd_core::query::RequestRecord;
use forkd_core::{Agent, AgentKind, Limits, Notification, Usage};
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
    /// The limits it runs under, as the object of the fields set; `None` when none is (or for
    /// an agent made before limits were stored). Past one it ends `timed_out`.
    pub limits: Option<Limits>,
    /// When a run first claimed it: where its wall-time limit counts from.
    pub started_at_ms: Option<i64>,
    /// How long its requests waited out the provider's limits, over the waits that ended.
    pub throttled_ms: u64,
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
            limits: a.limits.filter(|l| !l.is_empty()),
            started_at_ms: a.started_at_ms,
            throttled_ms: a.throttled_ms,
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

#[cfg(test)]
mod tests {
    use forkd_core::{AgentId, AgentState, SessionId};
    use serde_json::json;

    use super::*;

    fn agent(state: AgentState) -> Agent {
        Agent::new(
            AgentId::new(),
            SessionId::new(),
            AgentKind::Fork,
            state,
            1_000,
        )
    }

    #[test]
    fn an_agents_row_carries_its_limits_as_the_fields_set_and_its_start() {
        let mut a = agent(AgentState::TimedOut);
        a.limits = Some(Limits {
            timeout_ms: Some(600_000),
            max_turns: Some(30),
            ..Limits::default()
        });
        a.started_at_ms = Some(2_000);
        a.throttled_ms = 1_500;
        let row = serde_json::to_value(AgentRow::from(&a)).unwrap_or_default();
        assert_eq!(row["state"], "timed_out");
        assert_eq!(row["ended"], true);
        assert_eq!(
            row["limits"],
            json!({ "timeout_ms": 600_000, "max_turns": 30 })
        );
        assert_eq!(row["started_at_ms"], 2_000);
        assert_eq!(row["throttled_ms"], 1_500);
    }

    #[test]
    fn an_agent_without_limits_has_none_in_its_row() {
        let mut a = agent(AgentState::Pending);
        let row = serde_json::to_value(AgentRow::from(&a)).unwrap_or_default();
        assert_eq!(row["limits"], serde_json::Value::Null);
        assert_eq!(row["started_at_ms"], serde_json::Value::Null);
        // Limits with no field set read as none, too.
        a.limits = Some(Limits::default());
        assert_eq!(AgentRow::from(&a).limits, None);
    }

    #[test]
    fn a_timed_out_notification_carries_its_status_and_partial_report() {
        let a = agent(AgentState::TimedOut);
        let n = Notification {
            seq: 1,
            tenant_seq: 7,
            session_id: a.session_id,
            batch_id: None,
            agent_id: a.id,
            kind: forkd_core::NotificationKind::Fork,
            status: forkd_core::NotificationStatus::TimedOut,
            summary: "partial".into(),
            report: forkd_core::report::Report {
                issues: "timed out: its timeout of 10m (wall time since it started) ran out".into(),
                ..Default::default()
            },
            usage: Usage::default(),
            cost_usd: 0.0,
            created_at_ms: 5_000,
            schedule: None,
        };
        let view = serde_json::to_value(NotificationView::from(&n)).unwrap_or_default();
        assert_eq!(view["status"], "timed_out");
        assert_eq!(
            view["report"]["issues"],
            "timed out: its timeout of 10m (wall time since it started) ran out"
        );
    }
}
