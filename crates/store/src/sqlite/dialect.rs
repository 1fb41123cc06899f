//! SQLite's side of what the two drivers say differently (see `shared/mod.rs`; the PostgreSQL
//! dialect has the same items). SQLite runs one writer at a time (`BEGIN IMMEDIATE` on the one
//! writer connection, see `sqlite.rs`), so there is nothing to lock row by row: the lock clauses
//! are empty and the lock helpers do nothing, while the reads they wrap still run.

use forkd_core::AgentId;
use forkd_core::store::Wakeups;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::error::Result;

/// The driver, its connection and its pool.
pub(super) type Db = Sqlite;
pub(super) type Conn = SqliteConnection;
pub(super) type Pool = SqlitePool;
/// The store the shared `impl Store` is for.
pub(super) type DriverStore = super::SqliteStore;

/// Appended to a `SELECT` that reads a row a write decides on: nothing, the writer is alone.
pub(super) const FOR_UPDATE: &str = "";

/// Appended to the `SELECT` of the pending children a daemon takes: nothing to skip either.
pub(super) const SKIP_LOCKED: &str = "";

/// Appended to the `SELECT` of the webhook deliveries a daemon claims: nothing to skip, the writer is alone.
pub(super) const CLAIM_SKIP_LOCKED: &str = "";

/// Milliseconds since the Unix epoch, as SQL: SQLite's reading of the system clock.
pub(super) const NOW_MS: &str = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)";

/// The condition, on a row of `permission_prompts`, that its daemon still holds its agent: one
/// daemon uses a SQLite database, so every unanswered prompt in it is open (the store removes
/// them all when it opens).
pub(super) const PROMPT_HELD: &str = "TRUE";

/// Locks the rows of several agents: nothing to do.
pub(super) async fn lock_agents<'a>(
    _: &mut Conn,
    _: impl IntoIterator<Item = &'a AgentId>,
) -> Result<()> {
    Ok(())
}

/// Locks a tenant's blobs for counting them against its quota: nothing to do (one writer at a
/// time, `BEGIN IMMEDIATE`).
pub(super) async fn lock_tenant_blobs(_: &mut Conn, _: &str) -> Result<()> {
    Ok(())
}

/// Locks the sessions of several agents: nothing to do.
pub(super) async fn lock_sessions_of(_: &mut Conn, _: &[String]) -> Result<()> {
    Ok(())
}

/// Pushes ` IN` a list of ids, as one JSON array parameter.
pub(super) fn push_ids(q: &mut QueryBuilder<Db>, ids: &[String]) {
    let list = serde_json::Value::from(ids.to_vec()).to_string();
    q.push(" IN (SELECT value FROM json_each(")
        .push_bind(list)
        .push("))");
}

/// A read transaction whose statements all see one snapshot (a deferred transaction does).
pub(super) async fn begin_snapshot(pool: &Pool) -> Result<Transaction<'static, Db>> {
    Ok(pool.begin().await?)
}

/// The seq of a notification about to be inserted: none given, the `AUTOINCREMENT` column picks
/// the next (never reusing one), and the single writer commits them in order.
pub(super) async fn next_notification_seq(_: &mut Conn) -> Result<Option<i64>> {
    Ok(None)
}

/// A wake-up for the daemons listening on `channel`: one daemon uses the database, and it sees
/// its own writes as it commits them.
pub(super) async fn notify(_: &mut Conn, _channel: &str, _payload: &str) -> Result<()> {
    Ok(())
}

/// A tool call's whole output as its column stores it: text.
pub(super) fn output_param(text: Option<&str>) -> Option<&str> {
    text
}

/// The order of insertion of `tool_calls` rows, for calls started in one millisecond.
pub(super) const INSERTION_ORDER: &str = "rowid";

/// Wake-ups from other daemons: none, one daemon uses this database and sees its own
/// notifications as it commits them.
pub(super) async fn listen(_: &Pool) -> Result<Option<Box<dyn Wakeups>>> {
    Ok(None)
}

/// Tells the daemon running an agent to hand its turn to the background: that is this daemon.
pub(super) async fn signal_background(_: &Pool, _: AgentId) -> Result<()> {
    Ok(())
}
