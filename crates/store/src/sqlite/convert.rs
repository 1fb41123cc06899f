//! Conversions between rows and domain values, shared by the table modules.
//!
//! SQLite stores integers as `i64`; forkd counts in `u64`/`u32`. A value that does not fit on the
//! way in is an encoding error (nothing is written); on the way out it is a corrupt row.

use std::fmt::Display;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use forkd_core::{Block, Message, Role, Usage};
use sqlx::SqliteConnection;

use crate::StoreError;
use crate::error::Result;
use crate::{DbError, StoredMessage};

/// A stored value that no longer decodes.
pub(super) fn corrupt(what: &str, err: impl Display) -> DbError {
    DbError::Store(StoreError::Corrupt(format!("{what}: {err}")))
}

/// A `u64` (or `u32`) as SQLite's `INTEGER`.
pub(super) fn to_i64(value: impl Into<u64>, what: &'static str) -> Result<i64> {
    let value = value.into();
    i64::try_from(value).map_err(|_| {
        DbError::Database(sqlx::Error::Encode(
            format!("{what} {value} does not fit SQLite's INTEGER").into(),
        ))
    })
}

/// A stored `INTEGER` as an unsigned count.
pub(super) fn from_i64<T: TryFrom<i64>>(value: i64, what: &'static str) -> Result<T> {
    T::try_from(value).map_err(|_| corrupt(what, format!("{value} is out of range")))
}

/// A stored id string as its typed id.
pub(super) fn parse_id<T>(text: &str, what: &'static str) -> Result<T>
where
    T: FromStr,
    T::Err: Display,
{
    text.parse().map_err(|e| corrupt(what, e))
}

/// A `limit` argument where 0 means none, as SQLite's `LIMIT`.
pub(super) fn limit_param(limit: u32) -> i64 {
    if limit == 0 { -1 } else { i64::from(limit) }
}

/// Optional ids are stored as NULL or their string.
pub(super) fn opt_id(id: Option<impl Display>) -> Option<String> {
    id.map(|id| id.to_string())
}

/// The current time, for the writes whose callers pass no timestamp.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A block list as one JSON content array: the blocks' bytes joined, nothing re-encoded.
pub(super) fn content_array(blocks: &[Block]) -> String {
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
pub(super) fn blocks_from_array(text: &str, what: &'static str) -> Result<Vec<Block>> {
    let raw: Vec<&serde_json::value::RawValue> =
        serde_json::from_str(text).map_err(|e| corrupt(what, e))?;
    raw.into_iter()
        .map(|b| Block::from_stored(b.get()).map_err(|e| corrupt(what, e)))
        .collect()
}

/// The four usage columns every accounting table carries.
#[derive(sqlx::FromRow)]
pub(super) struct UsageRow {
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
pub(super) struct MessageRow {
    seq: i64,
    role: String,
    content_json: String,
    created_at_ms: i64,
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
        })
    }
}

/// Converts fetched transcript rows, in order.
pub(super) fn stored_messages(rows: Vec<MessageRow>) -> Result<Vec<StoredMessage>> {
    rows.into_iter().map(StoredMessage::try_from).collect()
}

/// The length of a session's transcript: the seq its next message gets.
pub(super) async fn session_len(conn: &mut SqliteConnection, session_id: &str) -> Result<i64> {
    // Seqs are contiguous from 0, so MAX + 1 is the length; unlike COUNT it is one index seek.
    let len: i64 = sqlx::query_scalar(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM session_messages WHERE session_id = ?",
    )
    .bind(session_id)
    .fetch_one(conn)
    .await?;
    Ok(len)
}

/// Appends `message` to a session's transcript at `seq`.
pub(super) async fn insert_session_message(
    conn: &mut SqliteConnection,
    session_id: &str,
    seq: i64,
    message: &Message,
    created_at_ms: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO session_messages (session_id, seq, role, content_json, created_at_ms) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(session_id)
    .bind(seq)
    .bind(message.role.as_str())
    .bind(message.content_json())
    .bind(created_at_ms)
    .execute(conn)
    .await?;
    Ok(())
}

/// Turns a unique-key violation into a `Conflict` naming what already exists.
pub(super) fn conflict_if_duplicate(err: sqlx::Error, what: impl FnOnce() -> String) -> DbError {
    match err.as_database_error() {
        Some(db) if db.is_unique_violation() => DbError::Store(StoreError::Conflict(what())),
        _ => DbError::Database(err),
    }
}
