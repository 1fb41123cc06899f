//! Agents, their lifecycle and the task notifications they emit when they end.

use serde::{Deserialize, Serialize};

use crate::ids::{AgentId, BatchId, SessionId};
use crate::report::Report;
use crate::usage::Usage;

/// Where an agent is in its life: `pending → running → completed | failed | killed | timed_out`.
/// A session's main-loop agent is `running` during a turn and `idle` between turns; it never ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    Pending,
    Running,
    Idle,
    Completed,
    Failed,
    Killed,
    /// Stopped by one of its limits (see [`crate::limits`]).
    TimedOut,
}

impl AgentState {
    /// Every state, in lifecycle order: the one table of states.
    pub const ALL: [AgentState; 7] = [
        AgentState::Pending,
        AgentState::Running,
        AgentState::Idle,
        AgentState::Completed,
        AgentState::Failed,
        AgentState::Killed,
        AgentState::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Pending => "pending",
            AgentState::Running => "running",
            AgentState::Idle => "idle",
            AgentState::Completed => "completed",
            AgentState::Failed => "failed",
            AgentState::Killed => "killed",
            AgentState::TimedOut => "timed_out",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            AgentState::Completed | AgentState::Failed | AgentState::Killed | AgentState::TimedOut
        )
    }
}

/// What kind of agent this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    /// A session's own main loop.
    Parent,
    /// A fork child: inherits the parent's whole context.
    Fork,
    /// A typed sub-agent: its own system prompt and tools.
    Typed,
}

impl AgentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Parent => "parent",
            AgentKind::Fork => "fork",
            AgentKind::Typed => "typed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [AgentKind::Parent, AgentKind::Fork, AgentKind::Typed]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// A child's own instruction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Directive {
    /// A short label (the Agent tool's `description`).
    pub description: String,
    /// The instruction itself (the Agent tool's `prompt`).
    pub prompt: String,
}

impl Directive {
    /// The directive an `Agent` tool call's input describes (missing fields read as empty).
    pub fn from_agent_input(input: &serde_json::Value) -> Self {
        let text = |k: &str| {
            input
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned()
        };
        Directive {
            description: text("description"),
            prompt: text("prompt"),
        }
    }
}

/// Where an agent's report goes when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportTo {
    /// Its `<task-notification>` is appended to the parent's transcript (forks, spawned agents).
    #[default]
    Transcript,
    /// A parent turn waits for it and puts the report in the calling `Agent` tool_use's result,
    /// so the transcript must not carry it a second time. Should that turn never store its
    /// reply (a cancelled turn, a restart), the report goes to the transcript after all.
    Caller,
}

impl ReportTo {
    pub fn as_str(self) -> &'static str {
        match self {
            ReportTo::Transcript => "transcript",
            ReportTo::Caller => "caller",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [ReportTo::Transcript, ReportTo::Caller]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// The query source of fork children: the first of the two recursion checks.
pub const FORK_QUERY_SOURCE: &str = "agent:builtin:fork";

/// An agent as the store and the API see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    pub id: AgentId,
    pub session_id: SessionId,
    pub batch_id: Option<BatchId>,
    pub kind: AgentKind,
    /// Position in its batch (0-based); decides which child goes first under warm-up gating.
    pub index: u32,
    pub state: AgentState,
    pub directive: Option<Directive>,
    /// `agent:builtin:fork` for fork children; may be absent (the tag scan still catches forks).
    pub query_source: Option<String>,
    pub report_to: ReportTo,
    pub usage: Usage,
    pub cost_usd: f64,
    pub error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The daemon that last claimed the agent: the one running it while it runs (see
    /// [`crate::store::Holder`]), the one that ran it last once it has ended.
    pub held_by: Option<crate::DaemonId>,
    /// Since when (ms) the agent's model request has been held back by the provider's limits
    /// (a 429, 529 or 503 it is waiting out); `None` while it is not. The agent stays
    /// `running`.
    pub throttled_since_ms: Option<i64>,
    /// The limits it runs under, resolved when it was created; `None` for an agent created
    /// before limits were stored, which runs under the daemon's defaults.
    pub limits: Option<crate::limits::Limits>,
    /// When a run first claimed it: the start its wall-time limit counts from.
    pub started_at_ms: Option<i64>,
    /// How long its requests waited out the provider's limits, summed over the waits that
    /// ended (the one in progress is `throttled_since_ms`).
    pub throttled_ms: u64,
}

impl Agent {
    /// A new agent of `kind` in `session`, created at `now_ms` in `state`: nothing spent, held
    /// by no daemon, in no batch, reporting to the session's transcript. Callers set the rest.
    pub fn new(
        id: AgentId,
        session_id: SessionId,
        kind: AgentKind,
        state: AgentState,
        now_ms: i64,
    ) -> Self {
        Self {
            id,
            session_id,
            batch_id: None,
            kind,
            index: 0,
            state,
            directive: None,
            query_source: None,
            report_to: ReportTo::Transcript,
            usage: Usage::default(),
            cost_usd: 0.0,
            error: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            held_by: None,
            throttled_since_ms: None,
            limits: None,
            started_at_ms: None,
            throttled_ms: 0,
        }
    }
}

/// What a notification is about: a fork child or a typed agent that ended, or a parent turn
/// that was handed to the background and has ended (the main-loop agent itself goes on, idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationKind {
    Fork,
    Typed,
    Turn,
}

impl NotificationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationKind::Fork => "fork",
            NotificationKind::Typed => "typed",
            NotificationKind::Turn => "turn",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            NotificationKind::Fork,
            NotificationKind::Typed,
            NotificationKind::Turn,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }

    /// The kind of an agent's notification: a main loop's is about a turn.
    pub fn of(kind: AgentKind) -> Self {
        match kind {
            AgentKind::Parent => NotificationKind::Turn,
            AgentKind::Fork => NotificationKind::Fork,
            AgentKind::Typed => NotificationKind::Typed,
        }
    }
}

/// How an agent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationStatus {
    Completed,
    Failed,
    Killed,
    /// Stopped by one of its limits, with a partial report.
    TimedOut,
}

impl NotificationStatus {
    /// Every status: the one table of how agents end.
    pub const ALL: [NotificationStatus; 4] = [
        NotificationStatus::Completed,
        NotificationStatus::Failed,
        NotificationStatus::Killed,
        NotificationStatus::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotificationStatus::Completed => "completed",
            NotificationStatus::Failed => "failed",
            NotificationStatus::Killed => "killed",
            NotificationStatus::TimedOut => "timed_out",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn agent_state(self) -> AgentState {
        match self {
            NotificationStatus::Completed => AgentState::Completed,
            NotificationStatus::Failed => AgentState::Failed,
            NotificationStatus::Killed => AgentState::Killed,
            NotificationStatus::TimedOut => AgentState::TimedOut,
        }
    }

    /// Whether the agent ended without its work done: anything but `completed`.
    pub fn is_failure(self) -> bool {
        self != NotificationStatus::Completed
    }
}

/// The event an agent emits when it ends. `seq` is assigned by the store, strictly increasing
/// across the daemon (the order daemons deliver in); `tenant_seq` counts its tenant's
/// notifications alone (1, 2, 3… for a new tenant): the cursor clients see and resume from, so a
/// tenant's numbers say nothing of the others'.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub seq: u64,
    pub tenant_seq: u64,
    pub session_id: SessionId,
    pub batch_id: Option<BatchId>,
    pub agent_id: AgentId,
    pub kind: NotificationKind,
    pub status: NotificationStatus,
    pub summary: String,
    pub report: Report,
    pub usage: Usage,
    pub cost_usd: f64,
    pub created_at_ms: i64,
    /// The schedule whose firing forked its batch, if one did.
    pub schedule: Option<String>,
}

impl Notification {
    /// The `<task-notification>` text the parent model sees on its next turn.
    pub fn to_parent_text(&self) -> String {
        let u = &self.usage;
        format!(
            "<task-notification>\n<agent-id>{}</agent-id>\n<status>{}</status>\n<summary>{}</summary>\n\
             <report>\n{}\n</report>\n<usage>input_tokens: {}, cache_creation_input_tokens: {}, \
             cache_read_input_tokens: {}, output_tokens: {}</usage>\n</task-notification>",
            self.agent_id,
            self.status.as_str(),
            self.summary,
            self.report.to_text(),
            u.input_tokens,
            u.cache_creation_input_tokens,
            u.cache_read_input_tokens,
            u.output_tokens,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_know_what_is_terminal() {
        for s in ["pending", "running", "completed", "failed", "killed"] {
            assert_eq!(AgentState::parse(s).map(AgentState::as_str), Some(s));
        }
        assert!(AgentState::Killed.is_terminal());
        assert!(!AgentState::Running.is_terminal());
    }
}
