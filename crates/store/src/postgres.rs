//! The PostgreSQL implementation of [`Store`]: a connection pool, one transaction per method.
//!
//! # How writes are serialized
//!
//! SQLite runs one writer at a time; PostgreSQL runs every transaction at once. So wherever the
//! SQLite implementation reads and then writes because of what it read, this one first locks the
//! row that the decision is about, with `SELECT … FOR NO KEY UPDATE`, and holds it until commit.
//! Transactions run at `READ COMMITTED`: each statement sees what committed before it began, so
//! a transaction that waited for a lock reads, after it gets it, what the holder wrote.
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
//!   reader that has seen seq n has seen every seq below it.
//! - **Unique keys** decide the rest: a session, batch, agent or request id taken, an idempotency
//!   key taken (a second transaction inserting the same key waits for the first and then fails
//!   with `Conflict`), an agent notified twice.
//!
//! Locks are always taken in one order — agents (several at once in id order), then the batch,
//! then the session, then the counter — and the `NO KEY UPDATE` strength does not block the
//! foreign-key checks of rows inserted elsewhere, so writers queue but never deadlock.
//!
//! This serializes writes between the tasks of one daemon and equally between daemons sharing the
//! database. Which daemon runs an agent is decided by leases (see `Holder` in
//! `forkd_core::store`): a claim makes its daemon the running agent's holder until a deadline
//! on the database's clock (`clock_timestamp()`), which the holder's heartbeat pushes back;
//! another daemon's claim is refused (`Held`) until the deadline has passed. The heartbeat
//! locks the rows it renews in id order, like every write that locks several agents.

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

use std::time::Duration;

use async_trait::async_trait;
use forkd_core::fork::ForkBatch;
use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};
use forkd_core::session::Session;
use forkd_core::store::{Holder, Renewal, Wakeup, Wakeups};
use forkd_core::{
    Agent, AgentId, AgentState, BatchId, Block, DaemonId, Message, Notification, PromptId,
    SessionId,
};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::rows::agents::NewAgents;

use crate::error::Result;
use crate::rows::convert::{from_i64, now_ms};
use crate::rows::sessions::not_found as session_not_found;
use crate::{
    AgentFilter, AgentParams, BatchExtras, Budget, IdempotencyRecord, Lease, NewChild,
    NewNotification, NotificationFilter, ProcessGroup, RequestFilter, RequestRecord, Spend,
    SpendScope, Store, StoredMessage, ToolCall,
};

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

/// `LIMIT` with 0 meaning none: PostgreSQL reads `LIMIT NULL` as no limit.
fn limit_param(limit: u32) -> Option<i64> {
    (limit > 0).then(|| i64::from(limit))
}

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

    /// A write transaction (see the module docs). Dropping it without `commit` rolls it back.
    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>> {
        // Stated, not left to the server's default: the locking above relies on each statement
        // seeing the latest commit, which REPEATABLE READ or SERIALIZABLE would not give.
        Ok(self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await?)
    }
}

/// The channel of background signals; the payload is the agent's id.
const BACKGROUNDS: &str = "forkd_backgrounds";

/// `LISTEN` on the notification, background and prompt channels, on a connection of its own.
struct Listener(PgListener);

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
                prompts::CHANNEL => match prompts::parse_wakeup(note.payload()) {
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

#[async_trait]
impl Store for PgStore {
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
        db(async move { sessions::get(&self.pool, id).await }.await)
    }

    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<SessionId>,
        limit: u32,
    ) -> StoreResult<Vec<Session>> {
        db(async move { sessions::list(&self.pool, tenant, after, limit).await }.await)
    }

    async fn workspaces(&self) -> StoreResult<Vec<std::path::PathBuf>> {
        db(async move { sessions::workspaces(&self.pool).await }.await)
    }

    async fn idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> StoreResult<Option<IdempotencyRecord>> {
        db(async move { idempotency::get(&self.pool, tenant, key).await }.await)
    }

    async fn session_message_count(&self, id: SessionId) -> StoreResult<u64> {
        db(async move { sessions::message_count(&self.pool, id).await }.await)
    }

    async fn session_messages_from(
        &self,
        id: SessionId,
        from: u64,
        before: Option<u64>,
    ) -> StoreResult<Vec<StoredMessage>> {
        db(async move { sessions::messages(&self.pool, id, from, before).await }.await)
    }

    async fn session_messages(
        &self,
        id: SessionId,
        before: Option<u64>,
    ) -> StoreResult<Vec<StoredMessage>> {
        db(async move { sessions::messages(&self.pool, id, 0, before).await }.await)
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
            // The main loop and the agents it delivers, then the session: the store's lock order.
            agents::lock_all(&mut tx, std::iter::once(&lease.agent_id).chain(delivered)).await?;
            agents::check_lease(&mut tx, lease).await?;
            let session_id = session.to_string();
            let exists = sessions::lock(&mut tx, &session_id).await?;
            if let Some(record) = idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
            if !exists {
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
        db(async move { compactions::list(&self.pool, session).await }.await)
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
        db(async move { compactions::list_agent(&self.pool, agent).await }.await)
    }

    async fn pending_reply(&self, session: SessionId) -> StoreResult<Option<Message>> {
        db(async move { pending::get(&self.pool, session).await }.await)
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
            // Sessions are never deleted: one that exists now still does at commit.
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

    async fn agent_params(&self, id: AgentId) -> StoreResult<Option<AgentParams>> {
        db(async move { agent_params::get(&self.pool, id).await }.await)
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
        db(async move { batches::get(&self.pool, id).await }.await)
    }

    async fn batch_budget(&self, id: BatchId) -> StoreResult<Budget> {
        db(async move { batches::budget(&self.pool, id).await }.await)
    }

    async fn spend(&self, scope: SpendScope<'_>) -> StoreResult<Spend> {
        db(async move { idempotency::spend(&self.pool, scope).await }.await)
    }

    async fn get_agent(&self, id: AgentId) -> StoreResult<Option<Agent>> {
        db(async move { agents::get(&self.pool, id).await }.await)
    }

    async fn list_agents(&self, filter: &AgentFilter) -> StoreResult<Vec<Agent>> {
        db(async move { agents::list(&self.pool, filter).await }.await)
    }

    async fn agent_directive_block(&self, id: AgentId) -> StoreResult<Option<Block>> {
        db(async move { agents::directive_block(&self.pool, id).await }.await)
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
        db(async move { agents::adoptable(&self.pool).await }.await)
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
        db(async move { agents::kill_requested(&self.pool, id).await }.await)
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
        db(async move { agents::messages(&self.pool, id).await }.await)
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
        db(async move { tool_calls::list(&self.pool, agent).await }.await)
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
        db(async move { requests::list(&self.pool, filter).await }.await)
    }

    async fn get_request(&self, id: forkd_core::RequestId) -> StoreResult<Option<RequestRecord>> {
        db(async move { requests::get(&self.pool, id).await }.await)
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
            agents::lock_all(&mut tx, agents_delivered).await?;
            agents::mark_delivered(&mut tx, agents_delivered).await?;
            tx.commit().await?;
            Ok(())
        }
        .await)
    }

    async fn caller_reports(&self) -> StoreResult<Vec<AgentId>> {
        db(async move { notifications::caller_reports(&self.pool).await }.await)
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
        db(async move { notifications::list(&self.pool, since_seq, filter, limit).await }.await)
    }

    async fn last_notification_seq(&self) -> StoreResult<u64> {
        db(async move { notifications::last_seq(&self.pool).await }.await)
    }

    async fn listen(&self) -> StoreResult<Option<Box<dyn Wakeups>>> {
        db(async move {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener
                .listen_all([notifications::CHANNEL, BACKGROUNDS, prompts::CHANNEL])
                .await?;
            let wakeups: Box<dyn Wakeups> = Box::new(Listener(listener));
            Ok(Some(wakeups))
        }
        .await)
    }

    async fn signal_background(&self, id: AgentId) -> StoreResult<()> {
        db(async move {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(BACKGROUNDS)
                .bind(id.to_string())
                .execute(&self.pool)
                .await?;
            Ok(())
        }
        .await)
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
        db(async move { prompts::open(&self.pool, session).await }.await)
    }

    async fn prompt(
        &self,
        id: PromptId,
    ) -> StoreResult<Option<(PermissionPrompt, Option<PermissionAnswer>)>> {
        db(async move { prompts::get(&self.pool, id).await }.await)
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
        db(async move { prompts::always_allowed(&self.pool, session, tool).await }.await)
    }

    async fn stats(&self, batches_since_ms: i64) -> StoreResult<crate::Stats> {
        db(async move { stats::stats(&self.pool, batches_since_ms).await }.await)
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
