//! Compaction boundary rows: a session's main loop's (`compactions`) and an agent's own
//! (`agent_compactions`), which share their columns besides the owner's id.

use forkd_core::compaction::Compaction;
use forkd_core::{Message, Role};

use super::convert::{corrupt, from_i64};
use crate::error::Result;

#[derive(sqlx::FromRow)]
pub(crate) struct CompactionRow {
    to_seq: i64,
    from_seq: i64,
    summary_json: String,
    created_at_ms: i64,
}

/// The columns [`CompactionRow`] reads.
macro_rules! compaction_columns {
    () => {
        "to_seq, from_seq, summary_json, created_at_ms"
    };
}
pub(crate) use compaction_columns;

/// Inserts a boundary: session id, `to_seq`, `from_seq`, the summary's bytes, the time.
pub(crate) const INSERT_COMPACTION: &str = "INSERT INTO compactions (session_id, to_seq, \
     from_seq, summary_json, created_at_ms) VALUES ($1, $2, $3, $4, $5)";

/// Inserts an agent's boundary: agent id, `to_seq`, `from_seq`, the summary's bytes, the time.
pub(crate) const INSERT_AGENT_COMPACTION: &str = "INSERT INTO agent_compactions (agent_id, \
     to_seq, from_seq, summary_json, created_at_ms) VALUES ($1, $2, $3, $4, $5)";

impl TryFrom<CompactionRow> for Compaction {
    type Error = crate::DbError;

    fn try_from(row: CompactionRow) -> Result<Self> {
        Ok(Compaction {
            from_seq: from_i64(row.from_seq, "from_seq")?,
            to_seq: from_i64(row.to_seq, "to_seq")?,
            summary: Message::from_stored(Role::User, &row.summary_json)
                .map_err(|e| corrupt("compaction summary", e))?,
            created_at_ms: row.created_at_ms,
        })
    }
}

/// Why a boundary of `owner`'s transcript ("session ID", "agent ID") cannot go before message
/// `to_seq` (of role `role`, `None` when there is no such message) when it is compacted up to
/// `last` already; `None` when it can.
pub(crate) fn refusal(
    owner: &str,
    to_seq: i64,
    role: Option<&str>,
    last: Option<i64>,
) -> Option<String> {
    if role != Some(Role::Assistant.as_str()) {
        return Some(format!(
            "a compaction boundary of {owner} must come before an assistant message; \
             message {to_seq} is {role:?}"
        ));
    }
    last.filter(|last| *last >= to_seq)
        .map(|last| format!("{owner} is compacted up to message {last} already"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boundary_goes_before_an_assistant_message_past_the_last_one() {
        assert_eq!(refusal("agent a", 3, Some("assistant"), Some(1)), None);
        assert_eq!(refusal("agent a", 3, Some("assistant"), None), None);
        let user = refusal("agent a", 2, Some("user"), None).unwrap_or_default();
        assert!(
            user.contains("agent a") && user.contains("Some(\"user\")"),
            "{user}"
        );
        assert!(refusal("session s", 9, None, None).is_some());
        let again = refusal("session s", 3, Some("assistant"), Some(3)).unwrap_or_default();
        assert_eq!(again, "session s is compacted up to message 3 already");
    }
}
