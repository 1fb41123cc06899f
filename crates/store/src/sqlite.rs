//! The SQLite implementation of [`Store`](crate::Store): WAL, one writer connection, a small
//! reader pool.
//!
//! SQLite in WAL mode has exactly one writer at a time, and a deferred transaction that reads and
//! then writes fails at once with `SQLITE_BUSY_SNAPSHOT` (the busy timeout does not apply) when
//! another write landed in between. So every write goes through a pool of one connection and
//! opens its transaction with `BEGIN IMMEDIATE`: writers in this process queue on the pool, and
//! writers in another process (a second daemon on the same file, a CLI) wait on the busy timeout.
//! Reads use their own pool and never block on the writer (WAL readers see the last commit).
//!
//! The statements and the `Store` methods are the ones `shared/` holds for both drivers, compiled
//! here with SQLite's `dialect`; this file keeps the connections and the transactions.

mod dialect;
#[allow(clippy::duplicate_mod)] // On purpose: the other driver compiles it again for itself.
#[path = "shared/mod.rs"]
mod shared;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use forkd_core::store::{DiskSpace, Holder};
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection as _, Sqlite, Transaction};

use crate::DbError;
use crate::error::Result;

type StoreResult<T> = std::result::Result<T, crate::StoreError>;

/// A store operation's outcome at the interface: the driver's errors become [`crate::StoreError`].
fn db<T>(outcome: Result<T>) -> StoreResult<T> {
    outcome.map_err(Into::into)
}

/// The schema, embedded at build time from the workspace's `migrations/` and applied at open.
static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// How long a statement waits for another process's lock before failing with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a write waits for its turn on the single writer connection. Write transactions are
/// short (a handful of rows), so a long queue means the process is overloaded, not just busy.
const WRITE_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// Reader connections: enough for concurrent RPCs, few enough to keep file handles modest.
const READERS: u32 = 4;

/// When a committed write reaches the disk.
///
/// Either way a write is committed (and visible to every reader) before the store method returns,
/// and the database is never corrupted. The choice is only what a *power loss* (or an OS crash)
/// may take back:
///
/// - [`Durability::Normal`] (the default) runs WAL with `synchronous=NORMAL`: a commit is written
///   to the WAL but only synced to disk at checkpoints. It survives the daemon crashing or being
///   killed (`kill -9`), because the OS still holds the written pages; a power loss may roll back
///   the last few commits. forkd's writes are cheap to redo (an agent resumes from its stored
///   transcript and re-requests what was lost, which the prompt cache serves), so the default
///   trades that window for not paying an `fsync` per message.
/// - [`Durability::Full`] runs `synchronous=FULL`: every commit syncs the WAL before returning,
///   so an acknowledged write survives a power loss too, at one `fsync` per transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    #[default]
    Normal,
    Full,
}

impl Durability {
    fn synchronous(self) -> SqliteSynchronous {
        match self {
            Durability::Normal => SqliteSynchronous::Normal,
            Durability::Full => SqliteSynchronous::Full,
        }
    }
}

/// forkd's store on a SQLite database file. Cheap to clone: clones share the pools.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Exactly one connection: the only writer, so write transactions never race each other.
    writer: SqlitePool,
    /// Connections that only read (`query_only`), so a bug cannot write around the writer.
    reader: SqlitePool,
    /// The daemon this store claims agents for.
    holder: Holder,
    /// The database file (`None` in memory).
    path: Option<PathBuf>,
    /// A cap on the database's size, injected by tests.
    page_limit: PageLimit,
    /// The database's fault that a write last met, until a probe succeeds.
    faults: Arc<crate::error::FaultLatch>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `path` and brings its schema up to date.
    pub async fn open(path: &Path, durability: Durability) -> StoreResult<Self> {
        db(async move {
            let base = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .foreign_keys(true)
                .busy_timeout(BUSY_TIMEOUT)
                .synchronous(durability.synchronous());
            // WAL is a property of the file; switching into it needs an exclusive lock that does not
            // wait on the busy timeout, so only the writer asks for it, once, before any reader opens.
            let writer = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                // Keeping the one connection open keeps the WAL and its index in place between writes.
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(WRITE_QUEUE_TIMEOUT)
                .connect_with(base.clone().journal_mode(SqliteJournalMode::Wal))
                .await?;
            MIGRATOR.run(&writer).await?;
            // The daemon that held these agents is gone: only one daemon uses a SQLite database
            // (it serves on the socket in its home, and a second one refuses to start there).
            {
                let mut conn = writer.acquire().await?;
                forget_the_last_daemon(&mut conn).await?;
            }
            let reader = SqlitePoolOptions::new()
                .max_connections(READERS)
                .connect_with(base.pragma("query_only", "ON"))
                .await?;
            Ok(Self {
                writer,
                reader,
                holder: Holder::new(),
                faults: Arc::default(),
                path: Some(path.to_owned()),
                page_limit: PageLimit::default(),
            })
        }
        .await)
    }

    /// This store, claiming agents for `holder` (a daemon's id and lease) instead of a fresh one.
    pub fn with_holder(mut self, holder: Holder) -> Self {
        self.holder = holder;
        self
    }

    /// A private database in memory, for tests: one connection serves reads and writes, and the
    /// database lives as long as the store.
    pub async fn open_in_memory() -> StoreResult<Self> {
        db(async move {
            let options = SqliteConnectOptions::new()
                .in_memory(true)
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                // Closing the only connection would drop the database.
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(WRITE_QUEUE_TIMEOUT)
                .connect_with(options)
                .await?;
            MIGRATOR.run(&pool).await?;
            Ok(Self {
                writer: pool.clone(),
                reader: pool,
                holder: Holder::new(),
                faults: Arc::default(),
                path: None,
                page_limit: PageLimit::default(),
            })
        }
        .await)
    }

    /// Closes every connection, waiting for them; the writer goes last so that its close
    /// checkpoints the WAL into the main file.
    pub async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }

    /// Checks the database file and its foreign keys; `Corrupt` lists what is wrong.
    pub async fn integrity_check(&self) -> StoreResult<()> {
        db(async move {
            let mut problems: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
                .fetch_all(&self.reader)
                .await?;
            problems.retain(|p| p != "ok");
            let fk: Vec<(String, Option<i64>, String)> =
                sqlx::query_as("SELECT \"table\", rowid, parent FROM pragma_foreign_key_check")
                    .fetch_all(&self.reader)
                    .await?;
            problems.extend(fk.into_iter().map(|(table, rowid, parent)| {
                format!("{table} row {rowid:?} references a missing {parent} row")
            }));
            if problems.is_empty() {
                Ok(())
            } else {
                Err(DbError::Store(crate::StoreError::Corrupt(
                    problems.join("; "),
                )))
            }
        }
        .await)
    }

    /// The cap on the database's size that [`PageLimit`] injects; unset unless a test sets it.
    pub fn page_limit(&self) -> &PageLimit {
        &self.page_limit
    }

    /// The database's size in pages now.
    pub async fn page_count(&self) -> StoreResult<u64> {
        db(async move {
            let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
                .fetch_one(&self.reader)
                .await?;
            Ok(u64::try_from(pages).unwrap_or(0))
        }
        .await)
    }

    /// The writer connection, for one write transaction (with the injected page limit, if any).
    async fn write_connection(&self) -> Result<PoolConnection<Sqlite>> {
        let mut conn = self.writer.acquire().await?;
        self.page_limit.apply(&mut conn).await?;
        Ok(conn)
    }

    /// A write transaction that holds the write lock from its first statement (see the module
    /// docs). Dropping it without `commit` rolls it back.
    async fn begin_write(conn: &mut SqliteConnection) -> Result<Transaction<'_, Sqlite>> {
        Ok(conn.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// A failed write's error, a full disk's saying how much space is left and where.
    fn explain(&self, err: DbError) -> crate::StoreError {
        match crate::StoreError::from(err) {
            crate::StoreError::DiskFull { detail } => crate::StoreError::DiskFull {
                detail: match self.filesystem_space() {
                    Some(space) => format!(
                        "{} free on the filesystem holding {}; SQLite said: {detail}",
                        bytesize::ByteSize(space.available).display().iec(),
                        space.path.display()
                    ),
                    None => detail,
                },
            },
            other => other,
        }
    }

    /// The space on the filesystem holding the database file (none for a database in memory).
    fn filesystem_space(&self) -> Option<DiskSpace> {
        let path = self.path.as_deref()?;
        crate::disk::space(path)
            .inspect_err(|e| tracing::debug!(error = %e, "Cannot read the database's free space"))
            .ok()
    }

    /// The pool reads use.
    fn readers(&self) -> &SqlitePool {
        &self.reader
    }
}

/// A cap on the database's size, for fault injection: `PRAGMA max_page_count` on the writer, so
/// that a write that would grow the file past it fails with `SQLITE_FULL` ("database or disk is
/// full"), as a write on a full disk does. Tests set it to fill a database at a chosen size
/// without a small filesystem, and lift it to give the space back. Clones share the cap; a store
/// has one from its start, unset, and costs nothing until it is set.
#[derive(Debug, Clone, Default)]
pub struct PageLimit(Arc<AtomicU64>);

impl PageLimit {
    /// Never set: no pragma runs.
    const UNSET: u64 = 0;
    /// Set once, then lifted: the writer is given SQLite's own maximum back.
    const LIFTED: u64 = u64::MAX;
    /// SQLite's largest `max_page_count`.
    const SQLITE_MAX: u64 = 4_294_967_294;

    /// Caps the database at `pages` pages from the next write on (SQLite keeps its size now
    /// instead when it is larger).
    pub fn set(&self, pages: u64) {
        self.0
            .store(pages.clamp(1, Self::SQLITE_MAX), Ordering::Release);
    }

    /// Lifts the cap from the next write on.
    pub fn lift(&self) {
        if self.0.load(Ordering::Acquire) != Self::UNSET {
            self.0.store(Self::LIFTED, Ordering::Release);
        }
    }

    async fn apply(&self, conn: &mut SqliteConnection) -> Result<()> {
        let pages = match self.0.load(Ordering::Acquire) {
            Self::UNSET => return Ok(()),
            Self::LIFTED => Self::SQLITE_MAX,
            pages => pages,
        };
        sqlx::query(AssertSqlSafe(format!("PRAGMA max_page_count = {pages}")))
            .execute(conn)
            .await?;
        Ok(())
    }
}

/// Ends every lease, every webhook delivery's and schedule firing's claim, and removes every
/// permission prompt: a SQLite database is one daemon's, so whoever held its agents, attempted
/// its deliveries and fired its schedules before this daemon opened it is gone, and the waits its
/// prompts belonged to ended with it.
async fn forget_the_last_daemon(conn: &mut SqliteConnection) -> Result<()> {
    sqlx::query(
        "UPDATE agents SET lease_expires_at_ms = NULL WHERE lease_expires_at_ms IS NOT NULL",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE webhook_deliveries SET claimed_by = NULL, claim_until_ms = NULL \
         WHERE claimed_by IS NOT NULL",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE schedule_firings SET claimed_by = NULL, claim_until_ms = 0 \
         WHERE state = 'firing'",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM permission_prompts")
        .execute(conn)
        .await?;
    Ok(())
}
