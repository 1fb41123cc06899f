//! The engine: sessions, fork batches, agent runs and task notifications — forkd without the wire.
//!
//! The engine owns every agent's life. It never imports tonic (the server converts) and never
//! speaks SQL (the store does). Each agent run is one task with its own span, tracked by the
//! engine's [`TaskTracker`] and stopped by its [`CancellationToken`].

mod admission;
pub mod agent_types;
mod agents;
mod attach;
mod batch;
mod branch;
mod clock;
mod compact;
mod config;
mod copies;
mod diagnose;
mod divergence;
mod error;
mod eta;
mod fair_queue;
mod faults;
mod handoff;
mod hooks;
mod leases;
mod locks;
mod lookup;
pub mod mcp;
pub mod metrics;
mod model;
mod notify;
mod parent;
mod permissions;
mod progress;
mod recovery;
mod run;
mod scoped;
pub mod sealed;
mod session;
mod stats;
mod supervisor;
mod tenancy;
pub mod trace;
mod trees;
mod uploads;
mod webhooks;
mod window;
mod workspaces;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use forkd_core::session::Session;
use forkd_core::store::Store;
use forkd_core::store::{NotificationFilter, Wakeup};
use forkd_core::{AgentId, SessionId};
use forkd_provider::Provider;

use crate::locks::LockMap;
use tokio_util::sync::CancellationToken;

pub use admission::{Class, KeyCapacity, LimitSource, PacedLimit};
pub use agents::TranscriptEntry;
pub use attach::{AgentEvent, AgentEventStream, auto_background};
pub use batch::{BatchOptions, DryRun, SubmittedBatch};
pub use branch::NewBranch;
pub use config::{
    AdmissionConfig, EngineConfig, HooksConfig, IsolationConfig, McpConfig, MinFreeDisk,
    SandboxConfig, WebhookConfig, WorkspacesConfig,
};
pub use copies::Applied;
pub use diagnose::CacheExplanation;
pub use divergence::{Divergence, first_differing_part};
pub use error::EngineError;
pub use eta::Eta;
pub use faults::StoreHealth;
pub use forkd_provider::{FailureKind, ProviderError};
pub use mcp::McpRequest;
pub use notify::NotificationStream;
pub use parent::{Merged, ParentEvent, ParentEventStream};
pub use permissions::{PermissionAnswer, PermissionPrompt, PromptStream};
pub use run::typed::TypedOptions;
pub use scoped::{RunCapacity, SessionView, TenantEngine};
pub use session::{ContextFile, NewSession, context_block};
pub use stats::{CacheStats, StatsScope};
pub use supervisor::{RunTime, Slots};
pub use uploads::{MAX_HASHES_PER_CALL, Received, Receiver};
pub use webhooks::NewWebhook;

/// The running engine. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    config: Arc<EngineConfig>,
    /// Notifications after their commit: the live broadcast and subscriptions.
    notifications: Arc<notify::Notifications>,
    /// Parent turns.
    turns: Arc<parent::Turns>,
    /// Fork batches: planned, stored, started.
    batches: Arc<batch::Batches>,
    /// Agents' transcripts as they grow, for attached clients, and hand-offs to the background.
    attach: Arc<attach::Attach>,
    /// Every run in progress (children, typed agents, parent turns), their kills, tasks, slots.
    supervisor: Arc<supervisor::Supervisor>,
    /// Permission prompts waiting for an interactive client's answer.
    permissions: Arc<permissions::Permissions>,
    /// Runs of fork children and typed agents.
    runs: Arc<run::Runs>,
    /// Compaction of transcripts, and what requests see of a compacted one.
    compaction: Arc<compact::Compactor>,
    /// Session owners and per-key locks of idempotent calls.
    tenancy: Arc<tenancy::Tenancy>,
    /// Sessions whose workspace this machine lacks (their agents are left to other daemons),
    /// so that the log says so once.
    missing_workspaces: StdMutex<std::collections::HashSet<SessionId>>,
    /// Sibling prefix checks, and how many differed.
    divergences: Arc<divergence::Divergences>,
    /// Sessions' MCP servers: what each may use, and the calls.
    mcp: Arc<mcp::McpServers>,
    /// Sessions: created and read.
    sessions: Arc<session::Sessions>,
    /// Uploaded workspaces: received, stored, written out for sessions.
    uploads: Arc<uploads::Uploads>,
    /// Uploaded trees kept here, and the layers of sessions made from them.
    trees: Arc<trees::Trees>,
    /// Branches of sessions.
    branches: Arc<branch::Branches>,
    /// Isolated batches' snapshots and their children's copies.
    copies: Arc<copies::Copies>,
    /// The database's health, the agents a fault stopped, the disk-space check.
    faults: Arc<faults::Faults>,
    /// Model calls, and the provider limiter they pass through.
    calls: Arc<model::ModelCalls>,
    /// Tenants' webhooks and the loop that delivers to them.
    webhooks: Arc<webhooks::Webhooks>,
    /// Cancelled when shutdown begins: runs finish the call in flight and start no other.
    draining: CancellationToken,
    shutdown: CancellationToken,
}

impl Engine {
    /// Makes the services, lowest layer first, each with the handles it needs.
    pub fn new(store: Arc<dyn Store>, provider: Arc<dyn Provider>, config: EngineConfig) -> Self {
        let config = Arc::new(config);
        let shutdown = CancellationToken::new();
        let draining = CancellationToken::new();
        let session_locks = Arc::new(LockMap::default());
        let window = Arc::new(window::Window::new(
            store.clone(),
            provider.clone(),
            config.models.clone(),
        ));
        let tenancy = Arc::new(tenancy::Tenancy::new(
            store.clone(),
            config.tenant_budgets.clone(),
        ));
        let mcp = Arc::new(mcp::McpServers::new(
            store.clone(),
            config.mcp.clone(),
            config.sandbox.clone(),
            config.webhooks.egress(None),
        ));
        let supervisor = Arc::new(supervisor::Supervisor::new(
            config.max_running_agents,
            draining.clone(),
            shutdown.clone(),
        ));
        let divergences = Arc::new(divergence::Divergences::new(store.clone()));
        let faults = Arc::new(faults::Faults::new(store.clone(), config.min_free_disk));
        let calls = Arc::new(model::ModelCalls::new(model::ModelCallParts {
            store: store.clone(),
            provider,
            admission: config.admission.clone(),
            window: window.clone(),
            tenancy: tenancy.clone(),
            models: config.models.clone(),
            draining: draining.clone(),
            trace_content: config.trace_content,
        }));
        let webhooks = Arc::new(webhooks::Webhooks::new(
            store.clone(),
            config.webhooks.clone(),
            config.mcp.secret_key.clone(),
        ));
        let notifications = Arc::new(notify::Notifications::new(
            store.clone(),
            tenancy.clone(),
            shutdown.clone(),
        ));
        let permissions = Arc::new(permissions::Permissions::new(
            store.clone(),
            notifications.clone(),
            shutdown.clone(),
        ));
        let attach = Arc::new(attach::Attach::new(
            store.clone(),
            notifications.clone(),
            faults.clone(),
            config.auto_background,
            shutdown.clone(),
        ));
        let uploads = Arc::new(uploads::Uploads::new(store.clone(), config.uploads.clone()));
        let trees = Arc::new(trees::Trees::new(config.clone(), uploads.clone()));
        let sessions = Arc::new(session::Sessions::new(
            store.clone(),
            config.clone(),
            tenancy.clone(),
            mcp.clone(),
            window.clone(),
            uploads.clone(),
            trees.clone(),
        ));
        let compaction = Arc::new(compact::Compactor::new(
            store.clone(),
            calls.clone(),
            window.clone(),
            config.models.clone(),
            config.compact_threshold,
        ));
        let copies = Arc::new(copies::Copies::new(
            store.clone(),
            config.clone(),
            session_locks.clone(),
            trees.clone(),
        ));
        let runs = Arc::new(run::Runs::new(run::RunParts {
            copies: copies.clone(),
            trees: trees.clone(),
            store: store.clone(),
            config: config.clone(),
            calls: calls.clone(),
            compaction: compaction.clone(),
            window: window.clone(),
            tenancy: tenancy.clone(),
            notifications: notifications.clone(),
            attach: attach.clone(),
            permissions: permissions.clone(),
            mcp: mcp.clone(),
            sessions: sessions.clone(),
            supervisor: supervisor.clone(),
            divergences: divergences.clone(),
            session_locks: session_locks.clone(),
            faults: faults.clone(),
        }));
        let turn_starts = Arc::new(batch::TurnStarts::default());
        let batches = Arc::new(batch::Batches::new(batch::BatchParts {
            store: store.clone(),
            config: config.clone(),
            tenancy: tenancy.clone(),
            window: window.clone(),
            compaction: compaction.clone(),
            sessions: sessions.clone(),
            runs: runs.clone(),
            copies: copies.clone(),
            supervisor: supervisor.clone(),
            session_locks: session_locks.clone(),
            turn_starts: turn_starts.clone(),
        }));
        let branches = Arc::new(branch::Branches::new(
            store.clone(),
            sessions.clone(),
            tenancy.clone(),
            mcp.clone(),
            compaction.clone(),
            batches.clone(),
        ));
        let turns = Arc::new(parent::Turns::new(parent::TurnParts {
            store: store.clone(),
            config: config.clone(),
            calls: calls.clone(),
            compaction: compaction.clone(),
            tenancy: tenancy.clone(),
            notifications: notifications.clone(),
            attach: attach.clone(),
            supervisor: supervisor.clone(),
            runs: runs.clone(),
            batches: batches.clone(),
            sessions: sessions.clone(),
            session_locks: session_locks.clone(),
            turn_starts,
            faults: faults.clone(),
            shutdown: shutdown.clone(),
        }));
        Self {
            inner: Arc::new(Inner {
                store,
                config,
                notifications,
                turns,
                batches,
                attach,
                supervisor,
                permissions,
                runs,
                compaction,
                tenancy,
                missing_workspaces: StdMutex::default(),
                divergences,
                mcp,
                sessions,
                uploads,
                trees,
                branches,
                copies,
                faults,
                calls,
                webhooks,
                draining,
                shutdown,
            }),
        }
    }

    /// Starts delivering webhooks: the loop claims due deliveries, woken by every notification
    /// and once a second, until shutdown.
    pub fn start_webhooks(&self) {
        self.inner
            .webhooks
            .start(self.inner.notifications.live(), self.inner.shutdown.clone());
    }

    /// Cancelled when the daemon's drain begins: background work that starts new runs (the
    /// schedules' clock) stops then.
    pub fn drain_token(&self) -> CancellationToken {
        self.inner.draining.clone()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Whether the database takes writes, as the daemon last saw it, and its changes.
    pub fn store_health(&self) -> tokio::sync::watch::Receiver<StoreHealth> {
        self.inner.faults.health()
    }

    /// Creates a session: validates the request, renders the system prompt and assembles the tool
    /// pool once, and stores them with the session's first message. With an idempotency key, a
    /// retry returns the session the key first created.
    pub async fn create_session(&self, req: NewSession) -> Result<Session, EngineError> {
        self.inner.faults.check_space()?;
        self.inner.sessions.create(req, &self.inner.runs).await
    }

    pub async fn get_session(&self, id: SessionId) -> Result<Session, EngineError> {
        self.inner.sessions.get(id).await
    }

    /// Branches `origin` (read by the caller, who checked its owner) at the point `req` names.
    pub async fn branch_session(
        &self,
        origin: Session,
        req: NewBranch,
    ) -> Result<Session, EngineError> {
        self.inner.faults.check_space()?;
        self.inner.branches.branch(origin, req).await
    }

    /// Appends a branch's report (its point, its turns, its last reply or its model's summary)
    /// to its origin's transcript.
    pub async fn merge_branch(
        &self,
        branch: Session,
        summary: bool,
        idempotency_key: Option<String>,
    ) -> Result<Merged, EngineError> {
        self.inner
            .turns
            .merge_branch(branch, summary, idempotency_key)
            .await
    }

    /// Where each of the session's turns began, its length and its turn in flight.
    pub async fn session_turns(
        &self,
        id: SessionId,
    ) -> Result<forkd_core::branch::TurnIndex, EngineError> {
        self.inner.branches.turns(id).await
    }

    /// The branches made from a session, in creation order.
    pub async fn branches_of(&self, id: SessionId) -> Result<Vec<Session>, EngineError> {
        Ok(self.inner.store.branches(id).await?)
    }

    /// Sessions of one tenant (or of all, for `None`), in creation order after the cursor.
    pub async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<SessionId>,
        limit: u32,
    ) -> Result<Vec<Session>, EngineError> {
        self.inner.sessions.list(tenant, after, limit).await
    }

    pub async fn session_message_count(&self, id: SessionId) -> Result<u64, EngineError> {
        self.inner.sessions.message_count(id).await
    }

    /// Of `hashes` (blobs' SHA-256), those `tenant` lacks.
    pub async fn missing_blobs(
        &self,
        tenant: &str,
        hashes: &[String],
    ) -> Result<Vec<String>, EngineError> {
        self.inner.uploads.missing(tenant, hashes).await
    }

    /// Starts receiving `tenant`'s uploaded tree: the manifest is checked now, the blobs follow
    /// ([`Receiver::chunk`]), and [`Receiver::finish`] stores it.
    pub async fn receive_upload(
        &self,
        tenant: &str,
        manifest: forkd_core::upload::Manifest,
    ) -> Result<Receiver, EngineError> {
        self.inner.uploads.receive(tenant, manifest).await
    }

    /// What `tenant`'s uploaded session `session` changed in its workspace since its upload: the
    /// upload's id and the changes.
    pub async fn session_changes(
        &self,
        tenant: &str,
        session: &forkd_core::session::Session,
    ) -> Result<(forkd_core::UploadId, forkd_tools::isolation::Changes), EngineError> {
        let files = self.inner.trees.files(session).await?;
        self.inner
            .uploads
            .session_changes(tenant, session, &files.path)
            .await
    }

    /// Runs one parent turn on `text`. Turns of one session run one at a time.
    pub async fn send_message(
        &self,
        session_id: SessionId,
        text: String,
    ) -> Result<ParentEventStream, EngineError> {
        self.inner.faults.check_space()?;
        self.inner.turns.send_message(session_id, text).await
    }

    /// Compacts a session now, at a client's request: refused while a turn runs.
    pub async fn compact_session(
        &self,
        session_id: SessionId,
        instructions: Option<String>,
    ) -> Result<forkd_core::compaction::Compaction, EngineError> {
        self.inner
            .turns
            .compact_session(session_id, instructions)
            .await
    }

    /// Submits a client's fork batch: appends the `Agent` tool_use message to the parent, stores
    /// the batch and its children, and starts them (child 1 first under warm-up gating).
    pub async fn fork_batch(
        &self,
        session_id: SessionId,
        directives: Vec<forkd_core::Directive>,
        options: BatchOptions,
    ) -> Result<SubmittedBatch, EngineError> {
        self.inner.faults.check_space()?;
        self.inner
            .batches
            .fork_batch(session_id, directives, options)
            .await
    }

    /// Starts a new run of an existing agent from wherever its transcript stands; nothing when
    /// a run of it is in progress.
    pub async fn start_agent(&self, id: AgentId) -> Result<(), EngineError> {
        self.inner.runs.start_agent(id).await
    }

    /// Kills an agent (a session's main loop: cancels its turn); see [`run::Runs::kill`].
    pub async fn kill(&self, id: AgentId) -> Result<(), EngineError> {
        self.inner.runs.kill(id).await
    }

    /// Creates a typed agent in `session_id` and starts it; it reports through a notification.
    /// With `isolation: copy` it works in its own copy of the workspace; with an output schema,
    /// its final reply is an object valid against it.
    pub async fn spawn_typed(
        &self,
        session_id: SessionId,
        subagent_type: &str,
        directive: forkd_core::Directive,
        options: &TypedOptions,
    ) -> Result<AgentId, EngineError> {
        self.inner.faults.check_space()?;
        self.inner
            .runs
            .spawn_typed(session_id, (subagent_type, options), directive)
            .await
    }

    /// Cancels every agent run (at its next await point) and waits at most `grace` for the
    /// tasks to wind down. Agents that were still running stay `running` in the store.
    pub async fn shutdown(&self, grace: Duration) {
        // First drain: runs start no new model request or tool call, and those in flight may
        // finish (and be stored) within the grace period. Then whatever is left is cancelled.
        self.inner.draining.cancel();
        self.inner.supervisor.tasks().close();
        if tokio::time::timeout(grace, self.inner.supervisor.tasks().wait())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = self.inner.supervisor.tasks().len(),
                "Agent runs did not finish their calls within the grace period; cancelling them"
            );
        }
        self.inner.shutdown.cancel();
        // Cancelled runs stop at their next await point; give them a moment to unwind.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.supervisor.tasks().wait())
            .await;
        // No run calls a server any more: stop them all (their process groups are killed).
        self.inner.mcp.shutdown().await;
    }

    /// On a database several daemons share, starts the tasks that bring other daemons' news to
    /// this one: every daemon's notifications, delivered to this daemon's subscribers in seq
    /// order (see [`notify::Notifications::start_feed`]), permission prompts and answers (see
    /// `permissions.rs`), and background signals for clients attached here. Does nothing on a
    /// database only this daemon uses.
    pub async fn start_notification_feed(&self) -> Result<(), EngineError> {
        let Some(mut wakeups) = self.inner.store.listen().await? else {
            return Ok(());
        };
        let Some(listening) = self.inner.notifications.start_feed().await? else {
            return Ok(());
        };
        let stop = self.inner.shutdown.clone();
        let engine = self.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = stop.cancelled() => return,
                    next = wakeups.next() => next,
                };
                match next {
                    Ok(Wakeup::Notifications) => listening.notify_one(),
                    Ok(Wakeup::Background(id)) => {
                        engine.inner.attach.signal_background(id);
                    }
                    Ok(Wakeup::Prompt(id)) => engine.inner.permissions.relay_prompt(id).await,
                    Ok(Wakeup::Answer(id)) => engine.inner.permissions.deliver_answer(id).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "Not hearing from the other daemons; reading their notifications every {} s", notify::FEED_POLL.as_secs());
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(notify::FEED_POLL) => {}
                        }
                        listening.notify_one();
                    }
                }
            }
        });
        Ok(())
    }

    /// Subscribes to notifications with `seq > since_seq` that pass `filter`. With `follow` the
    /// stream stays open for live notifications; without it the stream ends after the replay.
    /// A filter naming a session, batch or agent that does not exist is `NotFound`: following
    /// a typo would otherwise wait forever.
    pub async fn subscribe(
        &self,
        since_seq: u64,
        filter: NotificationFilter,
        follow: bool,
    ) -> Result<NotificationStream, EngineError> {
        if let Some(id) = filter.session_id {
            self.get_session(id).await?;
        }
        if let Some(id) = filter.batch_id {
            self.get_batch(id).await?;
        }
        if let Some(id) = filter.agent_id {
            self.get_agent(id).await?;
        }
        Ok(self
            .inner
            .notifications
            .subscribe(since_seq, filter, follow))
    }

    /// Whether the engine is draining for shutdown: runs start nothing new.
    pub(crate) fn draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }
}

/// Which isolated children's copies a call applies or discards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyTargets {
    /// These children, in this order.
    Agents(Vec<AgentId>),
    /// Every child of the batch, in its order.
    Batch(forkd_core::BatchId),
}

impl Engine {
    /// An ended isolated child's changes against its batch's snapshot.
    pub async fn changes(
        &self,
        id: AgentId,
    ) -> Result<forkd_core::isolation::AgentChanges, EngineError> {
        let agent = self.get_agent(id).await?;
        self.inner.copies.changes(&agent).await
    }

    /// The copies of those of `agents` that worked in one and have ended, by agent: one read
    /// per batch.
    pub async fn copies_of_agents(
        &self,
        agents: &[forkd_core::Agent],
    ) -> Result<std::collections::HashMap<AgentId, forkd_core::isolation::AgentChanges>, EngineError>
    {
        let batches: std::collections::BTreeSet<forkd_core::BatchId> = agents
            .iter()
            .filter(|a| a.state.is_terminal())
            .filter_map(|a| a.batch_id)
            .collect();
        let mut copies = std::collections::HashMap::new();
        for batch in batches {
            for changes in self.inner.store.batch_changes(batch).await? {
                copies.insert(changes.agent_id, changes);
            }
        }
        // A typed agent's copy is its own.
        for agent in agents
            .iter()
            .filter(|a| a.kind == forkd_core::AgentKind::Typed && a.state.is_terminal())
        {
            if let Some(changes) = self.inner.store.agent_changes(agent.id).await? {
                copies.insert(agent.id, changes);
            }
        }
        Ok(copies)
    }

    /// The session and the children `targets` names; all must be of one session.
    async fn copies_of(
        &self,
        targets: &CopyTargets,
    ) -> Result<(forkd_core::session::Session, Vec<forkd_core::Agent>), EngineError> {
        let agents = match targets {
            CopyTargets::Agents(ids) => {
                let mut agents = Vec::new();
                for id in ids {
                    agents.push(self.get_agent(*id).await?);
                }
                agents
            }
            CopyTargets::Batch(batch) => {
                let mut agents = self
                    .list_agents(&forkd_core::store::AgentFilter {
                        batch_id: Some(*batch),
                        include_ended: true,
                        ..Default::default()
                    })
                    .await?;
                agents.sort_by_key(|a| a.index);
                // A model's batch may isolate some calls only: the others have no copy.
                self.inner
                    .copies
                    .isolated(agents)
                    .await?
                    .into_iter()
                    .map(|(agent, _)| agent)
                    .collect()
            }
        };
        let Some(first) = agents.first() else {
            return Err(match targets {
                CopyTargets::Batch(batch) => EngineError::WrongState(format!(
                    "batch {batch} has no isolated children (it was forked without isolation: \
                     copy)"
                )),
                CopyTargets::Agents(_) => {
                    EngineError::InvalidRequest("name at least one agent, or a batch".into())
                }
            });
        };
        if let Some(other) = agents.iter().find(|a| a.session_id != first.session_id) {
            return Err(EngineError::InvalidRequest(format!(
                "agents {} and {} are of different sessions; apply one session's at a time",
                first.id, other.id
            )));
        }
        let session = self.get_session(first.session_id).await?;
        Ok((session, agents))
    }

    /// Applies isolated children's changes to their session's workspace, in order: those whose
    /// hunks do not overlap merge; a child with a conflict stays unapplied, reported per file.
    pub async fn apply_changes(&self, targets: &CopyTargets) -> Result<Vec<Applied>, EngineError> {
        let (session, agents) = self.copies_of(targets).await?;
        self.inner.copies.apply(&session, &agents).await
    }

    /// Discards the isolated copies kept past the retention (the heartbeat calls this; it looks
    /// at most every ten minutes); how many.
    pub async fn discard_expired_copies(&self) -> Result<usize, EngineError> {
        self.inner.copies.sweep().await
    }

    /// Removes uploads past their retention and the blobs no upload names past their grace (the
    /// heartbeat calls this; it looks at most every ten minutes); how many of each.
    pub async fn expire_uploads(&self) -> Result<(u64, u64), EngineError> {
        let trees = self.inner.trees.sweep().await?;
        if trees > 0 {
            tracing::info!(trees, "Kept uploaded trees no session works over removed");
        }
        self.inner.uploads.sweep().await
    }

    /// Discards isolated children's copies (their changes stay on record); the ids discarded.
    pub async fn discard_changes(
        &self,
        targets: &CopyTargets,
    ) -> Result<Vec<AgentId>, EngineError> {
        let (_, agents) = self.copies_of(targets).await?;
        self.inner.copies.discard(&agents).await
    }
}
