//! forkd's durable state as the engine needs it: one narrow interface, [`Store`], and the types
//! it speaks. The interface lives in the domain crate so the engine depends on it alone; its
//! implementations (SQLite today) live in `forkd-store`, the only crate that speaks SQL.
//!
//! Every method is one transaction; a write is durable when it returns. The shared prefix of a
//! batch is stored once (the parent's transcript plus one batch row); each child stores only its
//! directive block and its own later messages.

use async_trait::async_trait;

use crate::fork::ForkBatch;
use crate::prompt::{PermissionAnswer, PermissionPrompt};
use crate::report::Report;
use crate::session::Session;
use crate::{
    Agent, AgentId, AgentState, BatchId, Block, DaemonId, Message, Notification,
    NotificationStatus, PromptId, RequestId, SessionId, Usage,
};

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    /// The write conflicts with what is stored (a transcript that moved on, an agent that ended).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A newer run claimed the agent after the run making this write: the write was refused, and
    /// the older run must stop (the newer one owns the transcript now).
    #[error(
        "agent {agent} was claimed by a newer run (generation {current}; this run holds {held})"
    )]
    Superseded {
        agent: AgentId,
        held: u64,
        current: u64,
    },
    /// Another daemon holds the agent: it is running there, under a lease that has not expired.
    /// It may be claimed once the lease expires (the holder died) or the holder lets it go.
    #[error("agent {agent} is running on daemon {daemon}")]
    Held { agent: AgentId, daemon: DaemonId },
    /// Stored bytes that no longer decode: a bug or a damaged database.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The database is out of disk space: the write was rolled back whole, and the same write
    /// succeeds once space returns. `detail` says how much is free where, when the store can
    /// tell (SQLite's file), or what the server said (PostgreSQL).
    #[error("forkd's database is out of disk space ({detail})")]
    DiskFull { detail: String },
    /// The database cannot be reached now: its server is restarting or gone, a connection was
    /// lost, no connection came in time. Nothing of the write was stored; it may be retried.
    #[error("forkd's database cannot be reached ({detail})")]
    Unreachable { detail: String },
    /// The database failed (its driver's error, kept as the source).
    #[error(transparent)]
    Database(Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    /// The database's fault, one that passes by itself (its disk filled, its server restarts):
    /// a write refused for it stored nothing, and the same write succeeds once the fault is
    /// gone. Every other error is about the write itself, or is a bug.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            StoreError::DiskFull { .. } | StoreError::Unreachable { .. }
        )
    }

    /// A short name for the error's kind: the `kind` label of `forkd_store_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::NotFound { .. } => "not_found",
            StoreError::Conflict(_) => "conflict",
            StoreError::Superseded { .. } => "superseded",
            StoreError::Held { .. } => "held",
            StoreError::Corrupt(_) => "corrupt",
            StoreError::DiskFull { .. } => "disk_full",
            StoreError::Unreachable { .. } => "unreachable",
            StoreError::Database(_) => "database",
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub use crate::query::{AgentFilter, NotificationFilter, PrefixPart, RequestFilter, RequestRecord};
pub use crate::tenant::Budget;

/// What a call made with an idempotency key created. Written in the same transaction as what it
/// names, so a key never points at nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub tenant: String,
    pub key: String,
    /// `session`, `batch` or `message`: one key names one call.
    pub kind: IdempotentCall,
    /// A digest of the call's parameters: a retry must carry the same.
    pub request_sha256: String,
    /// What the call created: a session or batch id, or a stored message as `SESSION_ID/SEQ`.
    pub resource_id: String,
    pub created_at_ms: i64,
}

/// The calls that take an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdempotentCall {
    CreateSession,
    ForkBatch,
    SendMessage,
}

impl IdempotentCall {
    pub fn as_str(self) -> &'static str {
        match self {
            IdempotentCall::CreateSession => "session",
            IdempotentCall::ForkBatch => "batch",
            IdempotentCall::SendMessage => "message",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            IdempotentCall::CreateSession,
            IdempotentCall::ForkBatch,
            IdempotentCall::SendMessage,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// What agents have spent so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spend {
    pub usd: f64,
    pub tokens: u64,
}

/// Whose spending to add up.
#[derive(Debug, Clone, Copy)]
pub enum SpendScope<'a> {
    Batch(BatchId),
    Tenant(&'a str),
}

/// What a fork batch is stored with besides its messages and children.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchExtras<'a> {
    /// The parent turn that forks: its lease (checked) and the typed agents whose reports the
    /// parent's results carry (marked delivered, see [`Store::append_turn`]).
    pub turn: Option<(&'a Lease, &'a [AgentId])>,
    /// The client's idempotency key, stored with the batch.
    pub idempotency: Option<&'a IdempotencyRecord>,
    pub budget: Budget,
    /// The snapshot of an isolated batch (`isolation: copy`), stored with it.
    pub snapshot: Option<&'a crate::isolation::BatchSnapshot>,
    /// The children are stored held by no daemon, for the one that holds the session's
    /// workspace to adopt; otherwise the daemon that stores them holds them until it runs them.
    pub unheld: bool,
    /// The webhook the batch named: it receives the batch's notifications whatever its filter
    /// says (one of the session's tenant's, else `NotFound`).
    pub webhook: Option<crate::WebhookId>,
    /// The schedule whose firing forks the batch: its notifications carry the name.
    pub schedule: Option<&'a str>,
}

/// A run's claim on an agent: the agent's generation when the run claimed it.
///
/// Claiming increments the generation, so the newest claim wins: every write a run makes on the
/// agent's behalf (its messages, tool calls, state, end) checks the generation inside the write's
/// transaction and fails with [`StoreError::Superseded`] once another run has claimed the agent.
/// Two runs of one agent can therefore never interleave their writes, whether they are in one
/// daemon (a handoff) or in two processes sharing the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    pub agent_id: AgentId,
    pub generation: u64,
}

/// The daemon a store works for, and how long its claims on agents last without renewal.
///
/// A run's claim (see [`Lease`]) also makes its daemon the agent's *holder* until a deadline that
/// the daemon pushes back by heartbeat ([`Store::renew_leases`]). While that deadline has not
/// passed, no other daemon may claim the running agent ([`StoreError::Held`]); once it has (the
/// holder died, or lost its database), any daemon may adopt the agent
/// ([`Store::adoptable_agents`]) and resume it from its transcript. Deadlines are read on the
/// database's clock where it has one, so daemons on several machines agree on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub daemon: DaemonId,
    /// How long a claim lasts without renewal.
    pub lease: std::time::Duration,
}

impl Holder {
    /// The lease a daemon takes unless configured otherwise: a dead daemon's agents are adopted
    /// within this (plus one heartbeat of the adopter); a live one renews three times within it.
    pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(5);

    /// A fresh daemon id with the default lease.
    pub fn new() -> Self {
        Self {
            daemon: DaemonId::new(),
            lease: Self::DEFAULT_LEASE,
        }
    }

    /// The lease in whole milliseconds, for the `lease_expires_at_ms` column.
    pub fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }
}

impl Default for Holder {
    fn default() -> Self {
        Self::new()
    }
}

/// What woke a daemon that listens to a database it shares with other daemons (see
/// [`Store::listen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// Notifications may have been stored (or the connection was lost and reopened, and some
    /// may have been missed): the stored rows are the truth, read from the last seq seen.
    Notifications,
    /// A client asked, through some daemon, for the agent's attached clients to be handed to
    /// the background ([`Store::signal_background`]).
    Background(AgentId),
    /// A daemon stored a permission prompt ([`Store::insert_prompt`]): its session's clients on
    /// other daemons are shown it.
    Prompt(PromptId),
    /// A client answered a permission prompt through some daemon ([`Store::answer_prompt`]):
    /// the daemon whose agent waits on it reads the answer.
    Answer(PromptId),
}

/// Wake-ups from a database several daemons share (see [`Store::listen`]).
#[async_trait]
pub trait Wakeups: Send {
    /// Returns the next wake-up. An error means none for now: the caller reads the tables
    /// anyway, waits, and calls again.
    async fn next(&mut self) -> Result<Wakeup>;
}

/// What a heartbeat found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Agents whose leases were pushed back.
    pub renewed: u64,
    /// Agents this daemon holds that a client asked to kill through another daemon
    /// ([`Store::request_kill`]): their runs must stop and record the kill.
    pub kills: Vec<AgentId>,
}

/// A message of a transcript with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// 0-based position in its transcript.
    pub seq: u64,
    pub message: Message,
    pub created_at_ms: i64,
    /// A session's message that began a turn (the user's, stored by
    /// [`Store::append_user_message`]); `false` for every other message and for agents'.
    pub starts_turn: bool,
    /// A note forkd appended for the session's model (a task notification, a client batch's
    /// launch note or digest, a branch's report): views draw it as forkd's by this mark, never
    /// by its text. `false` for every other message and for agents'.
    pub note: bool,
}

/// A fork child to insert with its batch.
#[derive(Debug, Clone)]
pub struct NewChild {
    pub agent: Agent,
    /// The child's own directive block: the only bytes of its first request that differ from
    /// its siblings'.
    pub directive_block: Block,
}

/// A notification to store; the store assigns its `seq`.
#[derive(Debug, Clone)]
pub struct NewNotification {
    pub session_id: SessionId,
    pub batch_id: Option<BatchId>,
    pub agent_id: AgentId,
    pub status: NotificationStatus,
    pub summary: String,
    pub report: Report,
    pub usage: Usage,
    pub cost_usd: f64,
    pub created_at_ms: i64,
}

/// The cache-safe params and permission mode of an agent that does not share its session's.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentParams {
    pub params: crate::session::CacheSafeParams,
    pub permission_mode: crate::session::PermissionMode,
    /// The JSON Schema the agent's final reply must match (docs/contracts.md, "Output schemas").
    pub output_schema: Option<crate::output::OutputSchema>,
}

/// One tool call: its intent (stored before it runs) and its result (stored after).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub agent_id: AgentId,
    pub tool_use_id: String,
    pub name: String,
    /// The tool_use block's input, as the model wrote it.
    pub input_json: String,
    /// Read-only calls may run again after an interruption; mutating ones never blindly do.
    pub read_only: bool,
    /// The tool_result block the model sees; `None` while the call runs or if it was cut off.
    pub result: Option<Block>,
    /// The whole output when the model was shown a shortened form.
    pub full_output: Option<String>,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    /// The process group a Bash call started, recorded while it runs, so that a later daemon
    /// can stop it if the call was cut off.
    pub process: Option<ProcessGroup>,
}

/// A tool call's process group, as a later daemon needs it to find that same group again: its
/// id alone could name another group by then (ids are reused), so the group is known by its
/// leader's start time and the boot it ran in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessGroup {
    /// The process group id: the leader's pid.
    pub pgid: i32,
    /// The leader's start time, in clock ticks since boot (field 22 of `/proc/PID/stat`).
    pub start_ticks: u64,
    /// The machine's boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
}

/// A snapshot of the stored agents, for the metrics endpoint: how many of each kind are in each
/// state, and the batches still running or ended recently with their token totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Every (kind, state) pair that has at least one agent.
    pub agents: Vec<AgentCount>,
    /// In batch id (creation) order.
    pub batches: Vec<BatchStats>,
}

/// How many agents of one kind are in one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentCount {
    pub kind: crate::AgentKind,
    pub state: crate::AgentState,
    pub count: u64,
}

/// One fork batch's children, summed.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStats {
    pub batch_id: BatchId,
    pub session_id: SessionId,
    pub tenant: String,
    pub children: u64,
    /// Children in a terminal state.
    pub ended: u64,
    pub usage: Usage,
    pub cost_usd: f64,
}

/// forkd's durable state. Every method is one transaction; a write is durable when it returns.
#[async_trait]
pub trait Store:
    crate::webhook::WebhookStore
    + crate::schedule::ScheduleStore
    + crate::hooks::runs::HookRunStore
    + Send
    + Sync
    + 'static
{
    /// Stores a new session and its first messages (seq 0..), and the idempotency key it was
    /// created with (`Conflict` if the key is taken).
    async fn create_session(
        &self,
        session: &Session,
        first_messages: &[Message],
        idempotency: Option<&IdempotencyRecord>,
    ) -> Result<()>;
    /// Stores a branch (`session.branch` set): its row and, copied from its origin, the tools
    /// allowed always. None of the origin's transcript is copied, nor its system prompt and
    /// tools when the branch keeps them (the row names the session that holds them). `Conflict`
    /// when the origin has fewer messages than the point; `NotFound` without the origin.
    async fn create_branch(
        &self,
        session: &Session,
        idempotency: Option<&IdempotencyRecord>,
    ) -> Result<()>;
    /// The branches made from `origin` (not theirs), in creation order.
    async fn branches(&self, origin: SessionId) -> Result<Vec<Session>>;
    /// The seq of each message that began one of the session's turns (its origins' included,
    /// for a branch), in order: turn `K` begins at the `K`-th.
    async fn session_turns(&self, id: SessionId) -> Result<Vec<u64>>;
    /// Keeps the W3C trace context (`traceparent`) of the session's latest turn, so that a turn
    /// resumed later goes on in its trace.
    async fn set_turn_trace(&self, id: SessionId, trace_parent: &str) -> Result<()>;
    /// The trace context [`Store::set_turn_trace`] kept, if any.
    async fn turn_trace(&self, id: SessionId) -> Result<Option<String>>;
    async fn get_session(&self, id: SessionId) -> Result<Option<Session>>;
    /// Sessions in creation order after the cursor, of one tenant or all; `limit` 0 means no
    /// limit.
    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<SessionId>,
        limit: u32,
    ) -> Result<Vec<Session>>;
    /// The distinct workspaces of every session (of every tenant), each with its tenant: what a
    /// sandboxed command of one session must not read of the others, and what a new session of
    /// another tenant may not share.
    async fn workspaces(&self) -> Result<Vec<(String, std::path::PathBuf)>>;
    /// What a tenant's idempotency key created, if it was used.
    async fn idempotency_key(&self, tenant: &str, key: &str) -> Result<Option<IdempotencyRecord>>;
    /// The number of messages in a session's transcript.
    async fn session_message_count(&self, id: SessionId) -> Result<u64>;
    /// A session's messages with `from <= seq` (and `seq < before` when given), in order.
    async fn session_messages_from(
        &self,
        id: SessionId,
        from: u64,
        before: Option<u64>,
    ) -> Result<Vec<StoredMessage>>;
    /// A session's transcript in order, only messages with `seq < before` when given.
    async fn session_messages(
        &self,
        id: SessionId,
        before: Option<u64>,
    ) -> Result<Vec<StoredMessage>>;

    /// Appends a parent turn's messages to its session's transcript in one transaction, checking
    /// the parent's lease; the agents in `delivered` (reporting to their caller) are marked as
    /// delivered, since their reports are in these messages; the client's idempotency key, if
    /// any, is stored with them (`Conflict` if it is taken); the session's pending reply is
    /// deleted (it is answered, or a new turn begins). Returns the first message's seq.
    async fn append_turn(
        &self,
        lease: &Lease,
        session: SessionId,
        messages: &[Message],
        delivered: &[AgentId],
        idempotency: Option<&IdempotencyRecord>,
        at_ms: i64,
    ) -> Result<u64>;

    /// Appends one of forkd's notes (a branch's report) to the end of a session's transcript,
    /// whether or not a turn runs (it joins that turn's next request, as a notification does),
    /// with the idempotency key that asked for it (its resource id becomes `SESSION/SEQ`;
    /// `Conflict` if the key is taken); returns its seq.
    async fn append_note(
        &self,
        session: SessionId,
        note: &Message,
        idempotency: Option<&IdempotencyRecord>,
        at_ms: i64,
    ) -> Result<u64>;

    /// Appends the user's message that begins a turn, as [`Store::append_turn`] appends one
    /// message; it counts as the turn's ([`StoredMessage::starts_turn`]).
    async fn append_user_message(
        &self,
        lease: &Lease,
        session: SessionId,
        message: &Message,
        idempotency: Option<&IdempotencyRecord>,
        at_ms: i64,
    ) -> Result<u64>;

    /// Stores the reply a parent turn is about to answer (its tool calls not run yet), checking
    /// the parent's lease; it replaces any earlier one of the session. [`Store::append_turn`] and
    /// a turn's [`Store::create_fork_batch`] delete it with the reply stored.
    async fn set_pending_reply(
        &self,
        lease: &Lease,
        session: SessionId,
        reply: &Message,
    ) -> Result<()>;
    /// Stores a compaction boundary of the session's transcript, checking the lease of the
    /// session's main loop: `to_seq` must name an assistant message of the transcript past the
    /// previous boundary (`Conflict` otherwise).
    async fn append_compaction(
        &self,
        lease: &Lease,
        session: SessionId,
        compaction: &crate::compaction::Compaction,
    ) -> Result<()>;
    /// The session's compaction boundaries, oldest first.
    async fn compactions(&self, session: SessionId) -> Result<Vec<crate::compaction::Compaction>>;
    /// Stores a compaction boundary of the leased agent's own transcript (a fork child's part
    /// after its fork point, a typed agent's after its prompt), checking the lease: `to_seq`
    /// must name an assistant message of the agent's own transcript past its previous boundary
    /// (`Conflict` otherwise).
    async fn append_agent_compaction(
        &self,
        lease: &Lease,
        compaction: &crate::compaction::Compaction,
    ) -> Result<()>;
    /// The compaction boundaries of an agent's own transcript, oldest first.
    async fn agent_compactions(&self, agent: AgentId)
    -> Result<Vec<crate::compaction::Compaction>>;
    /// The reply a parent turn was answering when it was cut off, if any.
    async fn pending_reply(&self, session: SessionId) -> Result<Option<Message>>;

    /// Inserts an agent that is not a fork child (a session's own main loop, a typed agent),
    /// with its directive block and its own params if it has them. `NotFound` if its session is
    /// missing.
    async fn insert_agent(
        &self,
        agent: &Agent,
        directive_block: Option<&Block>,
        params: Option<&AgentParams>,
    ) -> Result<()>;
    /// The params of an agent that has its own (a typed agent); `None` for the others.
    async fn agent_params(&self, id: AgentId) -> Result<Option<AgentParams>>;

    /// In one transaction: appends to the session's transcript what the batch gives its parent
    /// — a model's fork: its assistant message (at seq `batch.fork_point`, which must be the
    /// transcript's current length, else `Conflict`) then `parent_messages` (the results of its
    /// tool calls); a client's batch: `parent_messages` (its launch note) at the transcript's end,
    /// which must not be before `batch.fork_point` — and inserts the batch and its children as
    /// `pending` agents, with its [`BatchExtras`].
    async fn create_fork_batch(
        &self,
        batch: &ForkBatch,
        parent_messages: &[Message],
        children: &[NewChild],
        extras: &BatchExtras<'_>,
    ) -> Result<()>;
    async fn get_batch(&self, id: BatchId) -> Result<Option<ForkBatch>>;
    /// The budget a batch was forked with.
    async fn batch_budget(&self, id: BatchId) -> Result<Budget>;
    /// Stores the snapshot of an isolated typed agent's workspace (a batch's is stored with the
    /// batch).
    async fn put_snapshot(&self, snapshot: &crate::isolation::BatchSnapshot) -> Result<()>;
    /// An isolated batch's snapshot; `None` for a batch without isolation.
    async fn batch_snapshot(&self, id: BatchId) -> Result<Option<crate::isolation::BatchSnapshot>>;
    /// Stores (or replaces) an isolated child's changes and where its copy stands.
    async fn put_changes(&self, changes: &crate::isolation::AgentChanges) -> Result<()>;
    /// An isolated child's changes, once it has ended.
    async fn agent_changes(&self, id: AgentId) -> Result<Option<crate::isolation::AgentChanges>>;
    /// The changes of a batch's isolated children that have ended.
    async fn batch_changes(&self, id: BatchId) -> Result<Vec<crate::isolation::AgentChanges>>;
    /// Isolated children whose copies were neither applied nor discarded since `before_ms`,
    /// at most `limit`: past their retention.
    async fn expired_copies(&self, before_ms: i64, limit: u32) -> Result<Vec<AgentId>>;
    /// What the agents of a batch, or of a tenant's sessions, have spent so far.
    async fn spend(&self, scope: SpendScope<'_>) -> Result<Spend>;

    async fn get_agent(&self, id: AgentId) -> Result<Option<Agent>>;
    /// A session's main-loop agent (its parent), once its first turn or compaction created it.
    async fn main_loop_agent(&self, session: SessionId) -> Result<Option<Agent>>;
    async fn list_agents(&self, filter: &AgentFilter) -> Result<Vec<Agent>>;
    /// A fork child's directive block.
    async fn agent_directive_block(&self, id: AgentId) -> Result<Option<Block>>;
    /// Moves a non-terminal agent to `state` (`Conflict` if it already ended). This also fences
    /// any run of the agent (its lease is superseded), like a claim that nobody holds.
    async fn set_agent_state(
        &self,
        id: AgentId,
        state: AgentState,
        error: Option<&str>,
    ) -> Result<()>;
    /// Claims a live agent for a new run (`Conflict` if it already ended; `Held` while another
    /// daemon holds it, pending or running, under a lease that has not expired): increments its generation, sets it
    /// `running` and held by this store's daemon ([`Store::holder`]) for one lease, and returns
    /// the lease every later write of the run checks.
    async fn claim_agent(&self, id: AgentId) -> Result<Lease>;
    /// The daemon this store claims agents for.
    fn holder(&self) -> Holder;
    /// The heartbeat: pushes back the lease of every live agent this daemon holds, and says
    /// which of them a client asked to kill through another daemon.
    async fn renew_leases(&self) -> Result<Renewal>;
    /// Live agents that no daemon holds any longer: `pending` or `running`, with no holder or
    /// a lease that has expired (their daemon died). Any daemon may claim them.
    async fn adoptable_agents(&self) -> Result<Vec<Agent>>;
    /// Asks for a live agent to be killed, wherever it runs: the request is stored with the
    /// agent, so its holder finds it at its next heartbeat and any later claim sees it
    /// ([`Store::kill_requested`]). Returns the daemon that holds the agent under a lease that
    /// has not expired, if one does (`Conflict` if the agent already ended).
    async fn request_kill(&self, id: AgentId) -> Result<Option<DaemonId>>;
    /// Whether a kill was asked for the agent ([`Store::request_kill`]).
    async fn kill_requested(&self, id: AgentId) -> Result<bool>;
    /// Records that the batch's warm-up gate opened (idempotent): its pending children may now
    /// run on any daemon ([`Store::take_pending`]).
    async fn open_gate(&self, batch: BatchId) -> Result<()>;
    /// Records that a live agent's model request is held back by the provider's limits since
    /// `since_ms`, or (`None`) that it no longer is ([`Agent::throttled_since_ms`]). An agent
    /// that has ended is left as it is.
    async fn set_throttled(&self, id: AgentId, since_ms: Option<i64>) -> Result<()>;
    /// Takes up to `limit` pending fork children that another daemon holds, for this daemon to
    /// run at once: they become `running`, held by this daemon (no other daemon takes or claims
    /// them while it renews; its runs claim them again). Children of batches whose warm-up gate opened, or was
    /// created more than `gate_timeout` ago (a gate never waits forever) unless its first child
    /// is throttled under a live lease (its siblings would miss the cache), first batch first, in
    /// index order. Rows another daemon is taking at the same moment are skipped, not waited
    /// for (`FOR UPDATE SKIP LOCKED`). A child whose gate opened is taken only once it has
    /// stayed pending `queued_for` since: its own daemon's runs claim it within moments of the
    /// gate opening, so one still pending after that waits behind its daemon's cap.
    async fn take_pending(
        &self,
        limit: u32,
        gate_timeout: std::time::Duration,
        queued_for: std::time::Duration,
    ) -> Result<Vec<AgentId>>;
    /// Moves the leased agent to a live `state` (a parent back to `pending` between turns).
    async fn release_agent(&self, lease: &Lease, state: AgentState) -> Result<()>;
    /// Appends one message to the leased agent's own transcript; returns its seq.
    async fn append_agent_message(&self, lease: &Lease, message: &Message) -> Result<u64>;
    /// An agent's own transcript (for a fork child: the messages after its first user message).
    async fn agent_messages(&self, id: AgentId) -> Result<Vec<StoredMessage>>;

    /// Records a tool call's intent before it runs (a repeat keeps the first intent). The call
    /// must be the leased agent's.
    async fn begin_tool_call(&self, lease: &Lease, call: &ToolCall) -> Result<()>;
    /// Records a tool call's result (`Conflict` if no open intent).
    async fn finish_tool_call(
        &self,
        lease: &Lease,
        tool_use_id: &str,
        result: &Block,
        full_output: Option<&str>,
        at_ms: i64,
    ) -> Result<()>;
    /// Records the process group a running tool call started (`Conflict` if the call has no
    /// open intent). The call must be the leased agent's.
    async fn record_tool_process(
        &self,
        lease: &Lease,
        tool_use_id: &str,
        process: &ProcessGroup,
    ) -> Result<()>;
    /// An agent's tool calls in the order they started.
    async fn tool_calls(&self, agent: AgentId) -> Result<Vec<ToolCall>>;

    /// Stores a request's record and adds its usage and cost to its agent's totals. Not fenced
    /// by a lease: a request that a superseded run made was still billed, and totals must say so.
    async fn record_request(&self, record: &RequestRecord) -> Result<()>;
    async fn list_requests(&self, filter: &RequestFilter) -> Result<Vec<RequestRecord>>;
    async fn get_request(&self, id: RequestId) -> Result<Option<RequestRecord>>;

    /// In one transaction: ends the leased agent (`Conflict` if it already ended), stores the
    /// notification with the next sequence number, and — unless the agent reports to its caller
    /// — appends its `<task-notification>` text to the parent session's transcript as a user
    /// message.
    async fn finish_agent(
        &self,
        lease: &Lease,
        notification: &NewNotification,
        error: Option<&str>,
    ) -> Result<Notification>;
    /// In one transaction: a session's main-loop agent ends its turn — it goes `idle`, its lease
    /// checked — and, for a turn that was handed to the background, stores `notification` with
    /// kind `turn` (nothing is appended to the transcript: the turn's reply is in it already).
    async fn end_turn(
        &self,
        lease: &Lease,
        notification: Option<&NewNotification>,
    ) -> Result<Option<Notification>>;
    /// Marks agents whose reports their caller delivered in a tool result (they will not be
    /// handed to the transcript).
    async fn mark_delivered(&self, agents: &[AgentId]) -> Result<()>;
    /// Agents whose report still waits for a caller to deliver it.
    async fn caller_reports(&self) -> Result<Vec<AgentId>>;
    /// Hands the reports of agents that report to a caller back to the transcript: for an agent
    /// that already ended, its `<task-notification>` is appended now; a live one will append it
    /// when it ends. Agents that report to the transcript already are left alone. Returns how
    /// many notifications were appended.
    async fn redirect_reports(&self, agents: &[AgentId]) -> Result<usize>;
    /// Stored notifications with `seq > since_seq`, in seq order; `limit` 0 means no limit.
    async fn notifications(
        &self,
        since_seq: u64,
        filter: &NotificationFilter,
        limit: u32,
    ) -> Result<Vec<Notification>>;
    /// The highest notification seq stored (0 when none).
    async fn last_notification_seq(&self) -> Result<u64>;
    /// Wake-ups from the daemons sharing this database: whenever any of them stores a
    /// notification or passes on a background signal. `None` for a database only this daemon
    /// uses (SQLite), where its own commits and signals are all there is.
    async fn listen(&self) -> Result<Option<Box<dyn Wakeups>>>;
    /// Passes a background signal for the agent to every daemon listening ([`Wakeup::Background`]):
    /// clients attached to it through another daemon are handed to the background too. A
    /// signal, not state: a daemon that is not listening at that moment does not get it. Does
    /// nothing on a database only this daemon uses.
    async fn signal_background(&self, id: AgentId) -> Result<()>;
    /// Stores a permission prompt the leased agent puts to its session's clients, asked by this
    /// store's daemon (`Superseded` when a newer run claimed the agent), and wakes the daemons
    /// listening ([`Wakeup::Prompt`]). Prompts of the same agent that another daemon asked (it
    /// died, and this daemon adopted the agent) are removed.
    async fn insert_prompt(&self, lease: &Lease, prompt: &PermissionPrompt) -> Result<()>;
    /// The session's open prompts, oldest first: not answered, and asked by the daemon that
    /// still holds the agent (a prompt whose daemon died is nobody's to answer).
    async fn open_prompts(&self, session: SessionId) -> Result<Vec<PermissionPrompt>>;
    /// A stored prompt and its answer, if it has one (open or not).
    async fn prompt(
        &self,
        id: PromptId,
    ) -> Result<Option<(PermissionPrompt, Option<PermissionAnswer>)>>;
    /// Answers an open prompt (`NotFound` when it is not open: answered already, its wait over,
    /// or its daemon gone); "allow always" also allows its tool for the rest of the session, in
    /// the same transaction. Wakes the daemons listening ([`Wakeup::Answer`]).
    async fn answer_prompt(
        &self,
        id: PromptId,
        answer: &PermissionAnswer,
    ) -> Result<PermissionPrompt>;
    /// Removes a prompt whose wait is over (answered, or its agent stopped).
    async fn close_prompt(&self, id: PromptId) -> Result<()>;
    /// Whether a client of the session answered "allow always" for `tool`.
    async fn tool_always_allowed(&self, session: SessionId, tool: &str) -> Result<bool>;
    /// Agents counted by kind and state, and the fork batches that have a child not yet ended or
    /// a child that changed at or after `batches_since_ms`.
    async fn stats(&self, batches_since_ms: i64) -> Result<Stats>;
    /// Whether the database takes writes now: writes, and removes in the same transaction, a
    /// row of [`PROBE_BYTES`], so that a database short of space for an ordinary write fails it
    /// (`DiskFull`) as that write would. Nothing stays behind.
    async fn probe_write(&self) -> Result<()>;
    /// The space on the filesystem holding the database, where the store can see it (SQLite's
    /// file); `None` for a database server's, or when the filesystem cannot be asked.
    fn disk_space(&self) -> Option<DiskSpace>;
    /// The database's fault ([`StoreError::is_fault`]) that a write last met, as its message:
    /// held from that write until a [`Store::probe_write`] succeeds, whatever other writes do
    /// meanwhile (a write that grows nothing may succeed on a full disk).
    fn fault(&self) -> Option<String>;

    /// Of `hashes`, those `tenant` has no blob for, in their order: never a word about another
    /// tenant's blobs.
    async fn missing_blobs(&self, tenant: &str, hashes: &[String]) -> Result<Vec<String>>;
    /// Stores a blob of `tenant`'s under `sha256` (its content's hash, checked by the caller);
    /// one it has already is no change.
    async fn put_blob(&self, tenant: &str, sha256: &str, content: &[u8]) -> Result<()> {
        self.put_blobs(tenant, &[(sha256, content)], None)
            .await
            .map(|_| ())
    }
    /// Stores blobs of `tenant`'s, each under its content's hash (checked by the caller), in one
    /// transaction; one it has already is no change. With a `quota`, what the tenant holds is
    /// counted while no other such call of the tenant's runs (on any daemon), and when these
    /// blobs would take it past the quota none is stored.
    async fn put_blobs(
        &self,
        tenant: &str,
        blobs: &[(&str, &[u8])],
        quota: Option<u64>,
    ) -> Result<crate::upload::BlobsStored>;
    /// A blob of `tenant`'s.
    async fn blob(&self, tenant: &str, sha256: &str) -> Result<Option<Vec<u8>>>;
    /// Stores an upload whose every blob its tenant has (else `Conflict`, nothing stored).
    async fn create_upload(&self, upload: &crate::upload::Upload) -> Result<()>;
    /// Records where session `session`'s files came from (its upload).
    async fn record_session_origin(
        &self,
        session: SessionId,
        origin: &crate::upload::Origin,
    ) -> Result<()>;
    /// Where a session's files came from, if it was made from an upload.
    async fn session_origin(&self, session: SessionId) -> Result<Option<crate::upload::Origin>>;
    /// The bytes of the blobs `tenant` holds (its quota counts these).
    async fn blob_bytes(&self, tenant: &str) -> Result<u64>;
    /// Removes the uploads made before `uploads_before_ms`, then the blobs that arrived before
    /// `blobs_before_ms` and that no upload names; how many of each.
    async fn expire_uploads(
        &self,
        uploads_before_ms: i64,
        blobs_before_ms: i64,
    ) -> Result<(u64, u64)>;
    /// `tenant`'s upload `id` (another tenant's is `None`).
    async fn get_upload(
        &self,
        tenant: &str,
        id: crate::UploadId,
    ) -> Result<Option<crate::upload::Upload>>;
}

/// How much [`Store::probe_write`] writes: more than most single writes (a tool call's output is
/// capped at 30 000 characters by default), so that a database with room for the probe has room
/// for them.
pub const PROBE_BYTES: usize = 64 * 1024;

/// The space on the filesystem holding a database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpace {
    /// The database's file.
    pub path: std::path::PathBuf,
    /// Bytes an unprivileged process may still write there.
    pub available: u64,
    /// The filesystem's size in bytes.
    pub total: u64,
}
