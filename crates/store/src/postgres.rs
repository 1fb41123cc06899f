//! The PostgreSQL implementation of [`Store`](crate::Store): a connection pool, one transaction
//! per method. The statements and the `Store` methods are the ones `shared/` holds for both
//! drivers, compiled here with PostgreSQL's `dialect`, which owns the locks described below.
//!
//! # How writes are serialized
//!
//! SQLite runs one writer at a time; PostgreSQL runs every transaction at once. So wherever a
//! method reads and then writes because of what it read, it first locks the row that the decision
//! is about, with `SELECT … FOR NO KEY UPDATE` (`dialect::FOR_UPDATE`, empty on SQLite), and holds
//! it until commit. Transactions run at `READ COMMITTED`: each statement sees what committed
//! before it began, so a transaction that waited for a lock reads, after it gets it, what the
//! holder wrote.
//!
//! - **An agent's row** is locked by every write that checks a lease or an agent's state (the
//!   lease check is the lock): claiming, moving, ending an agent; appending to its own transcript
//!   (its next seq is read under the lock); its tool calls; a turn's messages and pending reply
//!   (the main loop's row). A newer claim therefore waits for the older run's write in flight
//!   and fences every later one, and one agent's seqs never collide.
//! - **A session's row** is locked by every write that appends to its transcript (a turn, a fork
//!   batch, a `<task-notification>`, a batch digest, a handed-back report), before it reads the
//!   transcript's length: seqs stay contiguous, and a model's fork finds the transcript exactly
//!   as long as it expects or fails with `Conflict`.
//! - **A batch's row** is locked by a child that ends and reports to the transcript, before it
//!   reads the batch's shape; a client batch's child counts its live siblings under that lock, so
//!   of two last children ending at once, the second sees the first ended and appends the one
//!   digest (and the others append nothing, so they need not lock the session).
//! - **The notification counter** (`notification_seq`, one row) gives each notification its seq
//!   inside the inserting transaction and stays locked until commit, so seqs commit in order: a
//!   reader that has seen seq n has seen every seq below it. The tenant's own counter
//!   (`tenant_notification_seqs`, a row per tenant: the `tenant_seq` its clients see) is taken
//!   right after it, in the same transaction.
//! - **Unique keys** decide the rest: a session, batch, agent or request id taken, an idempotency
//!   key taken (a second transaction inserting the same key waits for the first and then fails
//!   with `Conflict`), an agent notified twice.
//!
//! Locks are always taken in one order — agents (several at once in id order), then the batch,
//! then the session, then the counter, then the tenant's counter — and the `NO KEY UPDATE` strength does not block the
//! foreign-key checks of rows inserted elsewhere, so writers queue but never deadlock.
//!
//! This serializes writes between the tasks of one daemon and equally between daemons sharing the
//! database. Which daemon runs an agent is decided by leases (see `Holder` in
//! `forkd_core::store`): a claim makes its daemon the running agent's holder until a deadline
//! on the database's clock (`clock_timestamp()`), which the holder's heartbeat pushes back;
//! another daemon's claim is refused (`Held`) until the deadline has passed. The heartbeat
//! locks the rows it renews in id order, like every write that locks several agents.

mod dialect;
#[allow(clippy::duplicate_mod)] // On purpose: the other driver compiles it again for itself.
#[path = "shared/mod.rs"]
mod shared;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use forkd_core::PromptId;
use forkd_core::store::{Holder, Wakeup, Wakeups};
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection as _, Postgres, Transaction};

use crate::error::Result;
use shared::prompts;

type StoreResult<T> = std::result::Result<T, crate::StoreError>;

/// A store operation's outcome at the interface: the driver's errors become [`crate::StoreError`].
fn db<T>(outcome: Result<T>) -> StoreResult<T> {
    outcome.map_err(Into::into)
}

/// The schema, embedded at build time from the workspace's `migrations/postgres/` and applied at
/// connect (sqlx holds an advisory lock while it migrates, so daemons starting together take
/// turns).
static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/postgres");

/// Connections [`PgStore::connect`] keeps at most: enough for a daemon's concurrent writes and
/// RPCs, few enough for several daemons under PostgreSQL's default of 100.
pub const DEFAULT_CONNECTIONS: u32 = 16;

/// How long a statement waits for a connection from the pool. Transactions are short (a handful
/// of rows), so a long wait means the database or the process is overloaded.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// A database URL with its password replaced by `***` (in the user part and in a `password=`
/// parameter), for logs and error messages.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The user part ends at the last `@`: a password may hold any character, `/` and `@` too.
    let (user, host) = match rest.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _password)) => (format!("{name}:***@"), host),
            None => (format!("{user}@"), host),
        },
        None => (String::new(), rest),
    };
    let host = match host.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => host.to_owned(),
    };
    format!("{scheme}://{user}{host}")
}

/// forkd's store on a PostgreSQL database. Cheap to clone: clones share the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The daemon this store claims agents for.
    holder: Holder,
    /// The database's fault that a write last met, until a probe succeeds.
    faults: Arc<crate::error::FaultLatch>,
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`) with a
    /// pool of up to [`DEFAULT_CONNECTIONS`], and brings its schema up to date.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::connect_with(url, DEFAULT_CONNECTIONS).await
    }

    /// [`PgStore::connect`] with a pool of up to `max_connections`.
    pub async fn connect_with(url: &str, max_connections: u32) -> StoreResult<Self> {
        db(async move {
            let pool = PgPoolOptions::new()
                .max_connections(max_connections.max(1))
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect(url)
                .await?;
            MIGRATOR.run(&pool).await?;
            Ok(Self {
                pool,
                holder: Holder::new(),
                faults: Arc::default(),
            })
        }
        .await)
    }

    /// This store, claiming agents for `holder` (a daemon's id and lease) instead of a fresh one.
    pub fn with_holder(mut self, holder: Holder) -> Self {
        self.holder = holder;
        self
    }

    /// Closes every connection, waiting for those in use.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// A connection for one write transaction.
    async fn write_connection(&self) -> Result<PoolConnection<Postgres>> {
        Ok(self.pool.acquire().await?)
    }

    /// A write transaction (see the module docs). Dropping it without `commit` rolls it back.
    async fn begin_write(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>> {
        // Stated, not left to the server's default: the locking above relies on each statement
        // seeing the latest commit, which REPEATABLE READ or SERIALIZABLE would not give.
        Ok(conn
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await?)
    }

    /// A failed write's error: the server's disk-full and connection errors are told apart
    /// (see `error.rs`), with the server's own words.
    fn explain(&self, err: crate::DbError) -> crate::StoreError {
        err.into()
    }

    /// The server's disk is not this daemon's to measure.
    fn filesystem_space(&self) -> Option<forkd_core::store::DiskSpace> {
        None
    }

    /// The pool reads use.
    fn readers(&self) -> &PgPool {
        &self.pool
    }
}

/// The channel of background signals; the payload is the agent's id.
const BACKGROUNDS: &str = "forkd_backgrounds";

/// `LISTEN` on the notification, background and prompt channels, on a connection of its own.
pub(super) struct Listener(PgListener);

#[async_trait]
impl Wakeups for Listener {
    async fn next(&mut self) -> StoreResult<Wakeup> {
        loop {
            // `None`: the connection was lost (and is reopened at the next call); notifications
            // sent meanwhile are lost, so the caller catches up from the table.
            let received = self.0.try_recv().await.map_err(crate::DbError::from);
            let Some(note) = received.map_err(crate::StoreError::from)? else {
                return Ok(Wakeup::Notifications);
            };
            match note.channel() {
                BACKGROUNDS => match note.payload().parse() {
                    Ok(id) => return Ok(Wakeup::Background(id)),
                    Err(e) => tracing::warn!(error = %e, "A background signal without an agent id"),
                },
                prompts::CHANNEL => match parse_wakeup(note.payload()) {
                    Some((false, id)) => return Ok(Wakeup::Prompt(id)),
                    Some((true, id)) => return Ok(Wakeup::Answer(id)),
                    None => {
                        tracing::warn!(payload = note.payload(), "A prompt wake-up not understood")
                    }
                },
                _ => return Ok(Wakeup::Notifications),
            }
        }
    }
}

/// A prompt wake-up's payload (`ask:ID` or `answer:ID`) as the prompt it names and whether it
/// was answered; `None` for a payload this version does not know.
fn parse_wakeup(payload: &str) -> Option<(bool, PromptId)> {
    let (what, id) = payload.split_once(':')?;
    let id = id.parse().ok()?;
    match what {
        "ask" => Some((false, id)),
        "answer" => Some((true, id)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn urls_lose_their_passwords() {
        for (url, shown) in [
            (
                "postgres://forkd:s3cr3t@db.example:5432/forkd",
                "postgres://forkd:***@db.example:5432/forkd",
            ),
            (
                "postgresql://forkd@localhost/forkd?sslmode=require&password=s3cr3t",
                "postgresql://forkd@localhost/forkd?sslmode=require&password=***",
            ),
            ("postgres://localhost/forkd", "postgres://localhost/forkd"),
            ("postgres://a:b:c/d@e@h/d?x=1", "postgres://a:***@h/d?x=1"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redacted_url(url), shown);
        }
    }
}
