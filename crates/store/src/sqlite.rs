//! The SQLite implementation of [`Store`]: WAL, one writer connection, a small reader pool.
//!
//! SQLite in WAL mode has exactly one writer at a time, and a deferred transaction that reads and
//! then writes fails at once with `SQLITE_BUSY_SNAPSHOT` (the busy timeout does not apply) when
//! another write landed in between. So every write goes through a pool of one connection and
//! opens its transaction with `BEGIN IMMEDIATE`: writers in this process queue on the pool, and
//! writers in another process (a second daemon on the same file, a CLI) wait on the busy timeout.
//! Reads use their own pool and never block on the writer (WAL readers see the last commit).

mod agent_params;
mod agents;
mod batches;
mod compactions;
mod idempotency;
mod notifications;
mod pending;
mod prompts;
mod requests;
mod sessions;
mod stats;
mod tool_calls;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use forkd_core::fork::ForkBatch;
use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};
use forkd_core::session::Session;
use forkd_core::store::{Holder, Renewal, Wakeups};
use forkd_core::{
    Agent, AgentId, AgentState, BatchId, Block, DaemonId, Message, Notification, PromptId,
    SessionId,
};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};

use crate::error::Result;
use crate::rows::agents::NewAgents;
use crate::rows::convert::{from_i64, now_ms};
use crate::rows::sessions::not_found as session_not_found;
use crate::{
    AgentFilter, AgentParams, BatchExtras, Budget, DbError, IdempotencyRecord, Lease, NewChild,
    NewNotification, NotificationFilter, ProcessGroup, RequestFilter, RequestRecord, Spend,
    SpendScope, Store, StoredMessage, ToolCall,
};

type StoreResult<T> = std::result::Result<T, crate::StoreError>;

/// A `limit` argument where 0 means none, as SQLite's `LIMIT` (which reads -1 as none).
fn limit_param(limit: u32) -> i64 {
    if limit == 0 { -1 } else { i64::from(limit) }
}

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
                agents::expire_all(&mut conn).await?;
                prompts::remove_all(&mut conn).await?;
            }
            let reader = SqlitePoolOptions::new()
                .max_connections(READERS)
                .connect_with(base.pragma("query_only", "ON"))
                .await?;
            Ok(Self {
                writer,
                reader,
                holder: Holder::new(),
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

    /// A write transaction that holds the write lock from its first statement (see the module
    /// docs). Dropping it without `commit` rolls it back.
    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_session(
        &self,
        session: &Session,
        first_messages: &[Message],
        idempotency: Option<&IdempotencyRecord>,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            sessions::create(&mut tx, session, first_messages).await?;
            if let Some(record) = idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn get_session(&self, id: SessionId) -> StoreResult<Option<Session>> {
        db(async move { sessions::get(&self.reader, id).await }.await)
    }

    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<SessionId>,
        limit: u32,
    ) -> StoreResult<Vec<Session>> {
        db(async move { sessions::list(&self.reader, tenant, after, limit).await }.await)
    }

    async fn idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> StoreResult<Option<IdempotencyRecord>> {
        db(async move { idempotency::get(&self.reader, tenant, key).await }.await)
    }

    async fn session_message_count(&self, id: SessionId) -> StoreResult<u64> {
        db(async move { sessions::message_count(&self.reader, id).await }.await)
    }

    async fn session_messages(
        &self,
        id: SessionId,
        before: Option<u64>,
    ) -> StoreResult<Vec<StoredMessage>> {
        db(async move { sessions::messages(&self.reader, id, 0, before).await }.await)
    }

    async fn session_messages_from(
        &self,
        id: SessionId,
        from: u64,
        before: Option<u64>,
    ) -> StoreResult<Vec<StoredMessage>> {
        db(async move { sessions::messages(&self.reader, id, from, before).await }.await)
    }

    async fn create_fork_batch(
        &self,
        batch: &ForkBatch,
        parent_messages: &[Message],
        children: &[NewChild],
        extras: &BatchExtras<'_>,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            batches::create(&mut tx, batch, parent_messages, children, extras).await?;
            let id = batch.id.to_string();
            agents::hold_new(&mut tx, NewAgents::Batch, &id, &self.holder).await?;
            if let Some(record) = extras.idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn get_batch(&self, id: BatchId) -> StoreResult<Option<ForkBatch>> {
        db(async move { batches::get(&self.reader, id).await }.await)
    }

    async fn batch_budget(&self, id: BatchId) -> StoreResult<Budget> {
        db(async move { batches::budget(&self.reader, id).await }.await)
    }

    async fn spend(&self, scope: SpendScope<'_>) -> StoreResult<Spend> {
        db(async move { idempotency::spend(&self.reader, scope).await }.await)
    }

    async fn get_agent(&self, id: AgentId) -> StoreResult<Option<Agent>> {
        db(async move { agents::get(&self.reader, id).await }.await)
    }

    async fn list_agents(&self, filter: &AgentFilter) -> StoreResult<Vec<Agent>> {
        db(async move { agents::list(&self.reader, filter).await }.await)
    }

    async fn agent_directive_block(&self, id: AgentId) -> StoreResult<Option<Block>> {
        db(async move { agents::directive_block(&self.reader, id).await }.await)
    }

    async fn set_agent_state(
        &self,
        id: AgentId,
        state: AgentState,
        error: Option<&str>,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            agents::set_state(&mut tx, id, state, error).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn claim_agent(&self, id: AgentId) -> StoreResult<Lease> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let lease = agents::claim(&mut tx, id, &self.holder).await?;
            tx.commit().await?;
            Ok(lease)
        }
        .await)
    }

    fn holder(&self) -> Holder {
        self.holder
    }

    async fn renew_leases(&self) -> StoreResult<Renewal> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let renewal = agents::renew(&mut tx, &self.holder).await?;
            tx.commit().await?;
            Ok(renewal)
        }
        .await)
    }

    async fn adoptable_agents(&self) -> StoreResult<Vec<Agent>> {
        db(async move { agents::adoptable(&self.reader).await }.await)
    }

    async fn request_kill(&self, id: AgentId) -> StoreResult<Option<DaemonId>> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let holder = agents::request_kill(&mut tx, id).await?;
            tx.commit().await?;
            Ok(holder)
        }
        .await)
    }

    async fn kill_requested(&self, id: AgentId) -> StoreResult<bool> {
        db(async move { agents::kill_requested(&self.reader, id).await }.await)
    }

    async fn open_gate(&self, batch: BatchId) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            agents::open_gate(&mut tx, batch).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn set_throttled(&self, id: AgentId, since_ms: Option<i64>) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            agents::set_throttled(&mut tx, id, since_ms).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn take_pending(
        &self,
        limit: u32,
        gate_timeout: std::time::Duration,
        queued_for: std::time::Duration,
    ) -> StoreResult<Vec<AgentId>> {
        let timeout_ms = i64::try_from(gate_timeout.as_millis()).unwrap_or(i64::MAX);
        let queued_ms = i64::try_from(queued_for.as_millis()).unwrap_or(i64::MAX);
        db(async move {
            let mut tx = self.begin_write().await?;
            let taken =
                agents::take_pending(&mut tx, &self.holder, limit, timeout_ms, queued_ms).await?;
            tx.commit().await?;
            Ok(taken)
        }
        .await)
    }

    async fn release_agent(&self, lease: &Lease, state: AgentState) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            agents::release(&mut tx, lease, state).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn append_agent_message(&self, lease: &Lease, message: &Message) -> StoreResult<u64> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let seq = agents::append_message(&mut tx, lease, message).await?;
            tx.commit().await?;
            Ok(seq)
        }
        .await)
    }

    async fn agent_messages(&self, id: AgentId) -> StoreResult<Vec<StoredMessage>> {
        db(async move { agents::messages(&self.reader, id).await }.await)
    }

    async fn insert_agent(
        &self,
        agent: &Agent,
        directive_block: Option<&Block>,
        params: Option<&AgentParams>,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let session_id = agent.session_id.to_string();
            if !sessions::exists(&mut tx, &session_id).await? {
                return Err(session_not_found(session_id));
            }
            agents::insert(&mut tx, agent, directive_block).await?;
            let id = agent.id.to_string();
            agents::hold_new(&mut tx, NewAgents::Agent, &id, &self.holder).await?;
            if let Some(params) = params {
                agent_params::insert(&mut tx, agent.id, params).await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn workspaces(&self) -> StoreResult<Vec<std::path::PathBuf>> {
        db(async move {
            let rows: Vec<String> =
                sqlx::query_scalar("SELECT DISTINCT workspace FROM sessions ORDER BY workspace")
                    .fetch_all(&self.reader)
                    .await?;
            Ok(rows.into_iter().map(std::path::PathBuf::from).collect())
        }
        .await)
    }

    async fn set_pending_reply(
        &self,
        lease: &Lease,
        session: SessionId,
        reply: &Message,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            pending::set(&mut tx, lease, session, reply, now_ms()).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn append_compaction(
        &self,
        lease: &Lease,
        session: SessionId,
        compaction: &forkd_core::compaction::Compaction,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            compactions::append(&mut tx, lease, session, compaction).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn compactions(
        &self,
        session: SessionId,
    ) -> StoreResult<Vec<forkd_core::compaction::Compaction>> {
        db(async move { compactions::list(&self.reader, session).await }.await)
    }

    async fn append_agent_compaction(
        &self,
        lease: &Lease,
        compaction: &forkd_core::compaction::Compaction,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            compactions::append_agent(&mut tx, lease, compaction).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn agent_compactions(
        &self,
        agent: AgentId,
    ) -> StoreResult<Vec<forkd_core::compaction::Compaction>> {
        db(async move { compactions::list_agent(&self.reader, agent).await }.await)
    }

    async fn pending_reply(&self, session: SessionId) -> StoreResult<Option<Message>> {
        db(async move { pending::get(&self.reader, session).await }.await)
    }

    async fn agent_params(&self, id: AgentId) -> StoreResult<Option<AgentParams>> {
        db(async move { agent_params::get(&self.reader, id).await }.await)
    }

    async fn append_turn(
        &self,
        lease: &Lease,
        session: SessionId,
        messages: &[Message],
        delivered: &[AgentId],
        idempotency: Option<&IdempotencyRecord>,
        at_ms: i64,
    ) -> StoreResult<u64> {
        db(async move {
            let mut tx = self.begin_write().await?;
            agents::check_lease(&mut tx, lease).await?;
            if let Some(record) = idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
            let session_id = session.to_string();
            if !sessions::exists(&mut tx, &session_id).await? {
                return Err(session_not_found(session_id));
            }
            let first = sessions::len(&mut tx, &session_id).await?;
            for (seq, message) in (first..).zip(messages) {
                sessions::insert_message(&mut tx, &session_id, seq, message, at_ms).await?;
            }
            agents::mark_delivered(&mut tx, delivered).await?;
            pending::clear(&mut tx, &session_id).await?;
            tx.commit().await?;
            from_i64(first, "session message seq")
        }
        .await)
    }

    async fn begin_tool_call(&self, lease: &Lease, call: &ToolCall) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            tool_calls::begin(&mut tx, lease, call).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn finish_tool_call(
        &self,
        lease: &Lease,
        tool_use_id: &str,
        result: &Block,
        full_output: Option<&str>,
        at_ms: i64,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            tool_calls::finish(&mut tx, lease, tool_use_id, result, full_output, at_ms).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn record_tool_process(
        &self,
        lease: &Lease,
        tool_use_id: &str,
        process: &ProcessGroup,
    ) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            tool_calls::record_process(&mut tx, lease, tool_use_id, process).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn tool_calls(&self, agent: AgentId) -> StoreResult<Vec<ToolCall>> {
        db(async move { tool_calls::list(&self.reader, agent).await }.await)
    }

    async fn record_request(&self, record: &RequestRecord) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            requests::record(&mut tx, record).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn list_requests(&self, filter: &RequestFilter) -> StoreResult<Vec<RequestRecord>> {
        db(async move { requests::list(&self.reader, filter).await }.await)
    }

    async fn get_request(&self, id: forkd_core::RequestId) -> StoreResult<Option<RequestRecord>> {
        db(async move { requests::get(&self.reader, id).await }.await)
    }

    async fn finish_agent(
        &self,
        lease: &Lease,
        notification: &NewNotification,
        error: Option<&str>,
    ) -> StoreResult<Notification> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let stored = notifications::finish_agent(&mut tx, lease, notification, error).await?;
            tx.commit().await?;
            Ok(stored)
        }
        .await)
    }

    async fn end_turn(
        &self,
        lease: &Lease,
        notification: Option<&NewNotification>,
    ) -> StoreResult<Option<Notification>> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let stored = notifications::end_turn(&mut tx, lease, notification).await?;
            tx.commit().await?;
            Ok(stored)
        }
        .await)
    }

    async fn mark_delivered(&self, agents_delivered: &[AgentId]) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            agents::mark_delivered(&mut tx, agents_delivered).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn caller_reports(&self) -> StoreResult<Vec<AgentId>> {
        db(async move { notifications::caller_reports(&self.reader).await }.await)
    }

    async fn redirect_reports(&self, agents: &[AgentId]) -> StoreResult<usize> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let appended = notifications::redirect_reports(&mut tx, agents).await?;
            tx.commit().await?;
            Ok(appended)
        }
        .await)
    }

    async fn notifications(
        &self,
        since_seq: u64,
        filter: &NotificationFilter,
        limit: u32,
    ) -> StoreResult<Vec<Notification>> {
        db(async move { notifications::list(&self.reader, since_seq, filter, limit).await }.await)
    }

    async fn last_notification_seq(&self) -> StoreResult<u64> {
        db(async move { notifications::last_seq(&self.reader).await }.await)
    }

    async fn listen(&self) -> StoreResult<Option<Box<dyn Wakeups>>> {
        // One daemon uses this database: it sees its own notifications as it commits them.
        Ok(None)
    }

    async fn signal_background(&self, _: AgentId) -> StoreResult<()> {
        Ok(())
    }

    async fn insert_prompt(&self, lease: &Lease, prompt: &PermissionPrompt) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            prompts::insert(&mut tx, lease, prompt, self.holder.daemon).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn open_prompts(&self, session: SessionId) -> StoreResult<Vec<PermissionPrompt>> {
        db(async move { prompts::open(&self.reader, session).await }.await)
    }

    async fn prompt(
        &self,
        id: PromptId,
    ) -> StoreResult<Option<(PermissionPrompt, Option<PermissionAnswer>)>> {
        db(async move { prompts::get(&self.reader, id).await }.await)
    }

    async fn answer_prompt(
        &self,
        id: PromptId,
        answer: &PermissionAnswer,
    ) -> StoreResult<PermissionPrompt> {
        db(async move {
            let mut tx = self.begin_write().await?;
            let prompt = prompts::answer(&mut tx, id, answer).await?;
            tx.commit().await?;
            Ok(prompt)
        }
        .await)
    }

    async fn close_prompt(&self, id: PromptId) -> StoreResult<()> {
        db(async move {
            let mut tx = self.begin_write().await?;
            prompts::close(&mut tx, id).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn tool_always_allowed(&self, session: SessionId, tool: &str) -> StoreResult<bool> {
        db(async move { prompts::always_allowed(&self.reader, session, tool).await }.await)
    }

    async fn stats(&self, batches_since_ms: i64) -> StoreResult<crate::Stats> {
        db(async move { stats::stats(&self.reader, batches_since_ms).await }.await)
    }
}
