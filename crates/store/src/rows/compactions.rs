//! Compaction boundary rows.

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

/// Why a boundary cannot go before message `to_seq` (of role `role`) when the session is
/// compacted up to `last` already; `None` when it can.
pub(crate) fn refusal(
    session: &str,
    to_seq: i64,
    role: Option<&str>,
    last: Option<i64>,
) -> Option<String> {
    if role != Some(Role::Assistant.as_str()) {
        return Some(format!(
            "a compaction boundary of session {session} must come before an assistant message; \
             message {to_seq} is {role:?}"
        ));
    }
    last.filter(|last| *last >= to_seq)
        .map(|last| format!("session {session} is compacted up to message {last} already"))
}
