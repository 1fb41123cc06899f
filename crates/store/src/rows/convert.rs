//! Conversions between column values and domain values, shared by the table modules of both
//! implementations.
//!
//! Both databases store integers as `i64`; forkd counts in `u64`/`u32`. A value that does not fit
//! on the way in is an encoding error (nothing is written); on the way out it is a corrupt row.

use std::fmt::Display;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use forkd_core::{Block, Message, Role, Usage};

use crate::StoreError;
use crate::error::Result;
use crate::{DbError, StoredMessage};

/// A stored value that no longer decodes.
pub(crate) fn corrupt(what: &str, err: impl Display) -> DbError {
    DbError::Store(StoreError::Corrupt(format!("{what}: {err}")))
}

/// A `u64` (or `u32`) as a 64-bit integer column.
pub(crate) fn to_i64(value: impl Into<u64>, what: &'static str) -> Result<i64> {
    let value = value.into();
    i64::try_from(value).map_err(|_| {
        DbError::Database(sqlx::Error::Encode(
            format!("{what} {value} does not fit a 64-bit integer column").into(),
        ))
    })
}

/// A stored 64-bit integer as an unsigned count.
pub(crate) fn from_i64<T: TryFrom<i64>>(value: i64, what: &'static str) -> Result<T> {
    T::try_from(value).map_err(|_| corrupt(what, format!("{value} is out of range")))
}

/// A bound on a stored position (a seq, a cursor): any bound past `i64::MAX` is past every
/// position either database can hold.
pub(crate) fn bound(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A stored id string as its typed id.
pub(crate) fn parse_id<T>(text: &str, what: &'static str) -> Result<T>
where
    T: FromStr,
    T::Err: Display,
{
    text.parse().map_err(|e| corrupt(what, e))
}

/// Optional ids are stored as NULL or their string.
pub(crate) fn opt_id(id: Option<impl Display>) -> Option<String> {
    id.map(|id| id.to_string())
}

/// The current time, for the writes whose callers pass no timestamp.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A block list as one JSON content array: the blocks' bytes joined, nothing re-encoded.
pub(crate) fn content_array(blocks: &[Block]) -> String {
    let mut out =
        String::with_capacity(2 + blocks.iter().map(|b| b.raw().len() + 1).sum::<usize>());
    out.push('[');
    for (i, block) in blocks.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(block.raw().as_str());
    }
    out.push(']');
    out
}

/// Splits a stored content array back into blocks, each keeping its bytes verbatim.
pub(crate) fn blocks_from_array(text: &str, what: &'static str) -> Result<Vec<Block>> {
    let raw: Vec<&serde_json::value::RawValue> =
        serde_json::from_str(text).map_err(|e| corrupt(what, e))?;
    raw.into_iter()
        .map(|b| Block::from_stored(b.get()).map_err(|e| corrupt(what, e)))
        .collect()
}

/// The four usage columns every accounting table carries.
#[derive(sqlx::FromRow)]
pub(crate) struct UsageRow {
    pub input_tokens: i64,
    pub cache_creation_input_tokens: i64,
    pub cache_read_input_tokens: i64,
    pub output_tokens: i64,
}

impl UsageRow {
    pub fn from_usage(u: &Usage) -> Result<Self> {
        Ok(Self {
            input_tokens: to_i64(u.input_tokens, "input_tokens")?,
            cache_creation_input_tokens: to_i64(
                u.cache_creation_input_tokens,
                "cache_creation_input_tokens",
            )?,
            cache_read_input_tokens: to_i64(u.cache_read_input_tokens, "cache_read_input_tokens")?,
            output_tokens: to_i64(u.output_tokens, "output_tokens")?,
        })
    }

    pub fn into_usage(self) -> Result<Usage> {
        Ok(Usage {
            input_tokens: from_i64(self.input_tokens, "input_tokens")?,
            cache_creation_input_tokens: from_i64(
                self.cache_creation_input_tokens,
                "cache_creation_input_tokens",
            )?,
            cache_read_input_tokens: from_i64(
                self.cache_read_input_tokens,
                "cache_read_input_tokens",
            )?,
            output_tokens: from_i64(self.output_tokens, "output_tokens")?,
        })
    }
}

/// One transcript row, of a session or of an agent.
#[derive(sqlx::FromRow)]
pub(crate) struct MessageRow {
    seq: i64,
    role: String,
    content_json: String,
    created_at_ms: i64,
    /// Only a session's rows have it.
    #[sqlx(default)]
    starts_turn: bool,
    /// Only a session's rows have it.
    #[sqlx(default)]
    note: bool,
}

impl TryFrom<MessageRow> for StoredMessage {
    type Error = DbError;

    fn try_from(row: MessageRow) -> Result<Self> {
        let role = Role::parse(&row.role)
            .ok_or_else(|| corrupt("message role", format!("unknown role {:?}", row.role)))?;
        let message =
            Message::from_stored(role, &row.content_json).map_err(|e| corrupt("message", e))?;
        Ok(StoredMessage {
            seq: from_i64(row.seq, "message seq")?,
            message,
            created_at_ms: row.created_at_ms,
            starts_turn: row.starts_turn,
            note: row.note,
        })
    }
}

/// Converts fetched transcript rows, in order.
pub(crate) fn stored_messages(rows: Vec<MessageRow>) -> Result<Vec<StoredMessage>> {
    rows.into_iter().map(StoredMessage::try_from).collect()
}

/// Appends a message to a session's transcript: session id, seq, role, content, time.
pub(crate) const INSERT_SESSION_MESSAGE: &str = "INSERT INTO session_messages (session_id, seq, role, content_json, created_at_ms, \
     starts_turn, note) VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// Appends a message to an agent's own transcript: agent id, seq, role, content, time.
pub(crate) const INSERT_AGENT_MESSAGE: &str = "INSERT INTO agent_messages (agent_id, seq, role, content_json, created_at_ms) \
     VALUES ($1, $2, $3, $4, $5)";

/// Turns a unique-key violation into a `Conflict` naming what already exists.
pub(crate) fn conflict_if_duplicate(err: sqlx::Error, what: impl FnOnce() -> String) -> DbError {
    match err.as_database_error() {
        Some(db) if db.is_unique_violation() => DbError::Store(StoreError::Conflict(what())),
        _ => DbError::Database(err),
    }
}
