//! What the engine's callers ask for by: list filters, and the record of one model request.
//!
//! These are the engine's API and the store's both, so they live in the domain crate: the
//! server builds them without knowing the store exists.

use crate::tenant::Tenant;
use crate::{AgentId, BatchId, Notification, RequestId, SessionId, Usage};

/// Which agents to list. Ordered by id (creation order); `after` is the pagination cursor.
#[derive(Debug, Clone, Default)]
pub struct AgentFilter {
    /// Only agents of this tenant's sessions.
    pub tenant: Option<Tenant>,
    pub session_id: Option<SessionId>,
    pub batch_id: Option<BatchId>,
    /// When false, only agents that have not ended: pending, running and idle ones.
    pub include_ended: bool,
    pub after: Option<AgentId>,
    /// 0 means no limit.
    pub limit: u32,
}

/// Which notifications to read.
#[derive(Debug, Clone, Default)]
pub struct NotificationFilter {
    /// Only notifications of this tenant's sessions. [`NotificationFilter::matches`] cannot see a
    /// notification's tenant: whoever matches live notifications checks it.
    pub tenant: Option<Tenant>,
    pub session_id: Option<SessionId>,
    pub batch_id: Option<BatchId>,
    pub agent_id: Option<AgentId>,
}

impl NotificationFilter {
    /// Whether a notification passes the filter (for live events, which skip the database).
    pub fn matches(&self, n: &Notification) -> bool {
        self.session_id.is_none_or(|s| s == n.session_id)
            && self.batch_id.is_none_or(|b| Some(b) == n.batch_id)
            && self.agent_id.is_none_or(|a| a == n.agent_id)
    }

    /// Where `n` stands for this filter's cursor (`since_seq`): its tenant's own count when the
    /// filter names a tenant, the daemon's otherwise.
    pub fn cursor(&self, n: &Notification) -> u64 {
        match self.tenant {
            Some(_) => n.tenant_seq,
            None => n.seq,
        }
    }
}

/// Which requests to list; at least one field should be set.
#[derive(Debug, Clone, Default)]
pub struct RequestFilter {
    pub session_id: Option<SessionId>,
    pub batch_id: Option<BatchId>,
    pub agent_id: Option<AgentId>,
}

/// One model request, recorded when its response ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub id: RequestId,
    pub agent_id: AgentId,
    pub session_id: SessionId,
    pub batch_id: Option<BatchId>,
    /// The agent's turn this request served (0-based).
    pub turn: u32,
    pub model: String,
    pub usage: Usage,
    pub cost_usd: f64,
    /// Fingerprint of the body up to the child's own first block (its directive): siblings must
    /// agree on it.
    pub prefix_fingerprint: String,
    /// The prefix's parts with their digests (empty for records made before they were kept):
    /// what `ExplainCache` compares to find where two requests part.
    pub prefix_parts: Vec<PrefixPart>,
    /// How many conversation messages the request carried (`None` for records made before it
    /// was kept): what rebuilds a session's main-loop request once its transcript has moved on.
    pub message_count: Option<u32>,
    pub body_bytes: u64,
    /// Time to first token: from the request being sent (retries included) to the response's
    /// first content block, in milliseconds. `None` for older records and for responses that
    /// started none.
    pub first_token_ms: Option<u64>,
    pub stop_reason: Option<String>,
    /// When the request was first sent (before any retry); `None` for older records.
    pub sent_at_ms: Option<i64>,
    /// When the record was made: the response's end.
    pub created_at_ms: i64,
}

/// One part of a request body's prefix: the request head (model, max_tokens, stream, thinking),
/// the tools array, the system prompt, or one message block (with the bytes that open its message).
/// Parts are contiguous: each runs from its offset to the next one's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefixPart {
    /// `head`, `tools`, `system` or `message N` (0-based positions in the conversation).
    #[serde(rename = "l")]
    pub label: String,
    /// Where the part starts in the body, in bytes.
    #[serde(rename = "o")]
    pub offset: u64,
    /// A short hex digest of the part's bytes.
    #[serde(rename = "d")]
    pub digest: String,
}
