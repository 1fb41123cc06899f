//! Compaction boundary rows: a session's main loop's (`compactions`) and an agent's own
//! (`agent_compactions`), which share their columns besides the owner's id.

use forkd_core::compaction::Compaction;
use forkd_core::{AgentId, Message, Role, SessionId};

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

/// Whose transcript a boundary cuts: a session's (its main loop's) or an agent's own. Each names
/// the statements that read and write its boundaries, with `$N` placeholders (which SQLite reads
/// as PostgreSQL does).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transcript {
    Session(SessionId),
    Agent(AgentId),
}

impl Transcript {
    /// The owner's id, as its rows store it.
    pub(crate) fn key(self) -> String {
        match self {
            Self::Session(id) => id.to_string(),
            Self::Agent(id) => id.to_string(),
        }
    }

    /// The owner in words ("session ID", "agent ID"), for refusals.
    pub(crate) fn owner(self) -> String {
        match self {
            Self::Session(id) => format!("session {id}"),
            Self::Agent(id) => format!("agent {id}"),
        }
    }

    /// The role of the owner's message `$2` (`$1`: the owner's id).
    pub(crate) fn role_at(self) -> &'static str {
        match self {
            Self::Session(_) => {
                "SELECT role FROM session_messages WHERE session_id = $1 AND seq = $2"
            }
            Self::Agent(_) => "SELECT role FROM agent_messages WHERE agent_id = $1 AND seq = $2",
        }
    }

    /// The owner's last boundary's `to_seq`, NULL when none.
    pub(crate) fn last(self) -> &'static str {
        match self {
            Self::Session(_) => "SELECT MAX(to_seq) FROM compactions WHERE session_id = $1",
            Self::Agent(_) => "SELECT MAX(to_seq) FROM agent_compactions WHERE agent_id = $1",
        }
    }

    /// Inserts a boundary: the owner's id, `to_seq`, `from_seq`, the summary's bytes, the time.
    pub(crate) fn insert(self) -> &'static str {
        match self {
            Self::Session(_) => {
                "INSERT INTO compactions (session_id, to_seq, from_seq, summary_json, \
                 created_at_ms) VALUES ($1, $2, $3, $4, $5)"
            }
            Self::Agent(_) => {
                "INSERT INTO agent_compactions (agent_id, to_seq, from_seq, summary_json, \
                 created_at_ms) VALUES ($1, $2, $3, $4, $5)"
            }
        }
    }

    /// The owner's boundaries in order (`$1`: the owner's id), as [`CompactionRow`]s.
    pub(crate) fn list(self) -> &'static str {
        match self {
            Self::Session(_) => concat!(
                "SELECT ",
                compaction_columns!(),
                " FROM compactions WHERE session_id = $1 ORDER BY to_seq"
            ),
            Self::Agent(_) => concat!(
                "SELECT ",
                compaction_columns!(),
                " FROM agent_compactions WHERE agent_id = $1 ORDER BY to_seq"
            ),
        }
    }
}

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
