//! PostgreSQL's side of what the two drivers say differently (see `shared/mod.rs`; the SQLite
//! dialect has the same items): the row locks of the module docs of `postgres.rs`, the
//! notification counter, `LISTEN`/`NOTIFY`, the database's clock, arrays and bytes.

use forkd_core::AgentId;
use forkd_core::store::Wakeups;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool, Postgres, QueryBuilder, Transaction};

use super::{BACKGROUNDS, Listener};
use crate::error::Result;
use crate::postgres::shared::{notifications, prompts};

/// The driver, its connection and its pool.
pub(super) type Db = Postgres;
pub(super) type Conn = PgConnection;
pub(super) type Pool = PgPool;
/// The store the shared `impl Store` is for.
pub(super) type DriverStore = super::PgStore;

/// Appended to a `SELECT` that reads a row a write decides on: locks the row until commit. `NO
/// KEY` does not block the foreign-key checks of rows inserted elsewhere.
pub(super) const FOR_UPDATE: &str = " FOR NO KEY UPDATE";

/// Appended to the `SELECT` (on `agents AS a`) of the pending children a daemon takes: rows
/// another transaction holds (a daemon taking or claiming them) are skipped, not waited for.
pub(super) const SKIP_LOCKED: &str = " FOR NO KEY UPDATE OF a SKIP LOCKED";

/// Appended to the `SELECT` of the webhook deliveries a daemon claims: rows another daemon is claiming are skipped, not waited for.
pub(super) const CLAIM_SKIP_LOCKED: &str = " FOR UPDATE SKIP LOCKED";

/// Milliseconds since the Unix epoch on the database's clock, as SQL: leases are written and
/// compared on it, so daemons on machines whose clocks differ agree on when one expires.
macro_rules! now_ms {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}
pub(super) const NOW_MS: &str = now_ms!();

/// The condition, on a row of `permission_prompts`, that its daemon still holds its agent under
/// a live lease: a dead daemon's prompts are nobody's to answer, and the daemon that adopts the
/// agent asks again.
pub(super) const PROMPT_HELD: &str = concat!(
    "EXISTS (SELECT 1 FROM agents a WHERE a.id = permission_prompts.agent_id \
     AND a.held_by = permission_prompts.daemon AND a.lease_expires_at_ms > ",
    now_ms!(),
    ")"
);

/// Locks a tenant's blobs for counting them against its quota, until the transaction ends: a
/// transaction-scoped advisory lock keyed by the tenant's name, which only `put_blobs` takes
/// (first in its transaction, so it waits on nothing else), and which two tenants share only
/// when their keys' 64-bit hashes collide (they then wait for each other, nothing more).
pub(super) async fn lock_tenant_blobs(conn: &mut Conn, tenant: &str) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('forkd.blobs/' || $1, 0))")
        .bind(tenant)
        .execute(conn)
        .await?;
    Ok(())
}

/// Locks the rows of several agents, in id order (the order every transaction that locks more
/// than one agent takes them in, so that two of them never wait for each other). Missing agents
/// are skipped.
pub(super) async fn lock_agents<'a>(
    conn: &mut Conn,
    ids: impl IntoIterator<Item = &'a AgentId>,
) -> Result<()> {
    let mut ids: Vec<String> = ids.into_iter().map(ToString::to_string).collect();
    if ids.is_empty() {
        return Ok(());
    }
    ids.sort_unstable();
    ids.dedup();
    sqlx::query("SELECT id FROM agents WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
        .bind(&ids)
        .fetch_all(conn)
        .await?;
    Ok(())
}

/// Locks the sessions of the agents `ids` (whose rows the caller has locked), in id order.
pub(super) async fn lock_sessions_of(conn: &mut Conn, ids: &[String]) -> Result<()> {
    sqlx::query(
        "SELECT id FROM sessions WHERE id IN (SELECT session_id FROM agents WHERE id = ANY($1)) \
         ORDER BY id FOR NO KEY UPDATE",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(())
}

/// Pushes `= ANY(` a list of ids `)`, as one array parameter.
pub(super) fn push_ids(q: &mut QueryBuilder<Db>, ids: &[String]) {
    q.push(" = ANY(").push_bind(ids.to_vec()).push(")");
}

/// A read transaction whose statements all see one snapshot: `READ COMMITTED` would give each
/// statement its own.
pub(super) async fn begin_snapshot(pool: &Pool) -> Result<Transaction<'static, Db>> {
    Ok(pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?)
}

/// The seq of a notification about to be inserted, taken from the counter row, which stays
/// locked until this transaction ends: seqs commit in the order they are taken.
pub(super) async fn next_notification_seq(conn: &mut Conn) -> Result<Option<i64>> {
    let seq = sqlx::query_scalar("UPDATE notification_seq SET last = last + 1 RETURNING last")
        .fetch_one(conn)
        .await?;
    Ok(Some(seq))
}

/// A wake-up for every daemon listening on `channel`, delivered at commit (and only then).
pub(super) async fn notify(conn: &mut Conn, channel: &str, payload: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel)
        .bind(payload)
        .execute(conn)
        .await?;
    Ok(())
}

/// A tool call's whole output as its column stores it: bytes, since a command's output may hold
/// NUL bytes, which PostgreSQL's text cannot.
pub(super) fn output_param(text: Option<&str>) -> Option<&[u8]> {
    text.map(str::as_bytes)
}

/// The order of insertion of `tool_calls` rows (SQLite's rowid), for calls started in one
/// millisecond.
pub(super) const INSERTION_ORDER: &str = "ord";

/// `LISTEN` on the notification, background and prompt channels, on a connection of its own.
pub(super) async fn listen(pool: &Pool) -> Result<Option<Box<dyn Wakeups>>> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener
        .listen_all([notifications::CHANNEL, BACKGROUNDS, prompts::CHANNEL])
        .await?;
    Ok(Some(Box::new(Listener(listener))))
}

/// Tells the daemon running an agent (whichever it is) to hand its turn to the background.
pub(super) async fn signal_background(pool: &Pool, id: AgentId) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(BACKGROUNDS)
        .bind(id.to_string())
        .execute(pool)
        .await?;
    Ok(())
}
