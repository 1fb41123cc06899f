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
mod compact;
mod config;
mod diagnose;
mod error;
mod fair_queue;
mod leases;
pub mod mcp;
pub mod metrics;
mod model;
mod notify;
mod parent;
mod permissions;
mod run;
mod scoped;
pub mod sealed;
mod session;
mod stats;
mod tenancy;
mod tools;
mod typed;
mod window;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use forkd_core::store::Store;
use forkd_core::{Notification, SessionId};
use forkd_provider::Provider;
use tokio::sync::{Mutex, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use admission::{AdmissionConfig, Class};
pub use agents::TranscriptEntry;
pub use attach::{AgentEvent, AgentEventStream, auto_background};
pub use batch::{BatchOptions, SubmittedBatch};
pub use config::{EngineConfig, SandboxConfig};
pub use diagnose::{CacheExplanation, Divergence, first_differing_part};
pub use error::EngineError;
pub use forkd_provider::{FailureKind, ProviderError};
pub use mcp::{McpConfig, McpRequest};
pub use notify::NotificationStream;
pub use parent::{ParentEvent, ParentEventStream};
pub use permissions::{PermissionAnswer, PermissionPrompt, PromptStream};
pub use scoped::{SessionView, TenantEngine};
pub use session::{ContextFile, NewSession, context_block};
pub use stats::{CacheStats, StatsScope};

/// How many live notifications a slow subscriber may fall behind before it catches up from the
/// store. Bounded so that no subscriber can hold memory or delay the agents.
const NOTIFICATION_BUFFER: usize = 1024;

/// The running engine. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    provider: Arc<dyn Provider>,
    config: EngineConfig,
    /// Live notifications, sent after they are committed to the store.
    notifications: broadcast::Sender<Notification>,
    /// Set on a database several daemons share: the live notifications are then read back from
    /// the store in seq order by one task (see `notify::feed_from_store`), which this wakes
    /// after each of this daemon's own commits.
    store_feed: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
    /// One lock per session: appends to a session's transcript (a fork batch, a notification)
    /// must see the transcript's current length, so they are serialized per session.
    session_locks: LockMap<SessionId>,
    /// One parent turn per session at a time (held for the whole turn, unlike the session lock).
    turn_locks: LockMap<SessionId>,
    /// Where each turn in flight began in its session's transcript: a client's batch forks
    /// before it (the end of the last finished turn).
    turn_starts: StdMutex<HashMap<SessionId, u64>>,
    /// Held across a notification's commit and its broadcast, so live subscribers receive
    /// notifications in sequence order (they drop anything at or below the last seq they saw).
    notify_order: Mutex<()>,
    /// Messages as they are stored, for attached clients.
    messages: broadcast::Sender<attach::Published>,
    /// Requests to hand an agent's attached clients to the background.
    backgrounds: broadcast::Sender<forkd_core::AgentId>,
    /// The token of every agent run in progress, to kill one.
    runs: StdMutex<HashMap<forkd_core::AgentId, CancellationToken>>,
    /// Runs cancelled by a kill rather than by shutdown.
    killed: StdMutex<std::collections::HashSet<forkd_core::AgentId>>,
    /// Permission prompts waiting for an interactive client's answer.
    prompts: permissions::Prompts,
    /// Batch prefixes shared by the running children of each batch.
    batches: run::BatchCache,
    /// Slots for running agents when their number is capped, and the runs waiting for one.
    run_slots: Option<Arc<run::RunSlots>>,
    /// When model requests may go, per credential and model, and what follows a refusal.
    admission: admission::Admission,
    /// Whose limits the provider's requests count against.
    credential: forkd_provider::Credential,
    /// Session owners and per-key locks of idempotent calls.
    tenancy: tenancy::Tenancy,
    /// Token counts of transcripts, for the context-window checks.
    token_counts: window::TokenCounts,
    /// Process groups of tool calls that a kill cut off, by agent, until the kill has waited
    /// for them (see `tools::GroupWatch`).
    cut_off_groups: StdMutex<HashMap<forkd_core::AgentId, Vec<forkd_core::store::ProcessGroup>>>,
    /// Sessions whose workspace this machine lacks (their agents are left to other daemons),
    /// so that the log says so once.
    missing_workspaces: StdMutex<std::collections::HashSet<SessionId>>,
    /// Sibling prefix divergences seen (also counted in the metrics).
    divergences: std::sync::atomic::AtomicU64,
    tasks: TaskTracker,
    /// The MCP servers this daemon started (one per tenant and definition).
    mcp: forkd_mcp::Pool,
    /// Sessions' own MCP server definitions: in memory only, since they may hold secrets.
    mcp_own: StdMutex<HashMap<SessionId, Vec<forkd_mcp::ServerSpec>>>,
    /// Cancelled when shutdown begins: runs finish the call in flight and start no other.
    draining: CancellationToken,
    shutdown: CancellationToken,
}

impl Engine {
    pub fn new(store: Arc<dyn Store>, provider: Arc<dyn Provider>, config: EngineConfig) -> Self {
        let (notifications, _) = broadcast::channel(NOTIFICATION_BUFFER);
        Self {
            inner: Arc::new(Inner {
                run_slots: config.max_running_agents.map(run::RunSlots::new),
                admission: admission::Admission::new(config.admission.clone()),
                credential: provider.credential(),
                store,
                provider,
                config,
                notifications,
                store_feed: std::sync::OnceLock::new(),
                session_locks: LockMap::default(),
                turn_locks: LockMap::default(),
                turn_starts: StdMutex::default(),
                notify_order: Mutex::new(()),
                batches: run::BatchCache::default(),
                tenancy: tenancy::Tenancy::default(),
                divergences: std::sync::atomic::AtomicU64::new(0),
                missing_workspaces: StdMutex::default(),
                cut_off_groups: StdMutex::default(),
                token_counts: window::TokenCounts::default(),
                prompts: permissions::Prompts::default(),
                runs: StdMutex::new(HashMap::new()),
                killed: StdMutex::default(),
                messages: broadcast::channel(NOTIFICATION_BUFFER).0,
                backgrounds: broadcast::channel(NOTIFICATION_BUFFER).0,
                tasks: TaskTracker::new(),
                mcp: forkd_mcp::Pool::default(),
                mcp_own: StdMutex::default(),
                draining: CancellationToken::new(),
                shutdown: CancellationToken::new(),
            }),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Cancels every agent run (at its next await point) and waits at most `grace` for the
    /// tasks to wind down. Agents that were still running stay `running` in the store.
    pub async fn shutdown(&self, grace: Duration) {
        // First drain: runs start no new model request or tool call, and those in flight may
        // finish (and be stored) within the grace period. Then whatever is left is cancelled.
        self.inner.draining.cancel();
        self.inner.tasks.close();
        if tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = self.inner.tasks.len(),
                "Agent runs did not finish their calls within the grace period; cancelling them"
            );
        }
        self.inner.shutdown.cancel();
        // Cancelled runs stop at their next await point; give them a moment to unwind.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.tasks.wait()).await;
        // No run calls a server any more: stop them all (their process groups are killed).
        self.inner.mcp.shutdown().await;
    }

    /// Whether the engine is draining for shutdown: runs start nothing new.
    pub(crate) fn draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }

    pub(crate) fn turn_lock(&self, id: SessionId) -> Arc<Mutex<()>> {
        self.inner.turn_locks.get(id)
    }

    fn session_lock(&self, id: SessionId) -> Arc<Mutex<()>> {
        self.inner.session_locks.get(id)
    }

    fn turn_starts(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, u64>> {
        self.inner
            .turn_starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The end of the session's last finished turn when a turn is in flight (where that turn
    /// began); `None` when none is.
    fn finished_turns_end(&self, id: SessionId) -> Option<u64> {
        self.turn_starts().get(&id).copied()
    }
}

/// Async locks by key (a session, an idempotency key), created on first use and dropped once
/// nobody holds or waits for them, so the map does not grow with every key a process ever saw.
pub(crate) struct LockMap<K> {
    inner: StdMutex<LockMapInner<K>>,
}

struct LockMapInner<K> {
    locks: HashMap<K, Arc<Mutex<()>>>,
    /// The size at which unused locks are next swept out: twice what was left after the last
    /// sweep, so sweeping costs O(1) per call amortized.
    sweep_at: usize,
}

/// The least size worth sweeping at.
const LOCK_SWEEP_MIN: usize = 64;

impl<K> Default for LockMap<K> {
    fn default() -> Self {
        Self {
            inner: StdMutex::new(LockMapInner {
                locks: HashMap::new(),
                sweep_at: LOCK_SWEEP_MIN,
            }),
        }
    }
}

impl<K: std::hash::Hash + Eq> LockMap<K> {
    /// The async lock of `key`, created on first use.
    pub(crate) fn get(&self, key: K) -> Arc<Mutex<()>> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if inner.locks.len() >= inner.sweep_at {
            // A lock only the map holds has no holder and no waiter (both keep a clone): a
            // later caller may as well get a new one.
            inner.locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            inner.sweep_at = (2 * inner.locks.len()).max(LOCK_SWEEP_MIN);
        }
        inner.locks.entry(key).or_default().clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .locks
            .len()
    }
}

/// A duration in whole milliseconds, for `*_ms` fields.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch, for `*_at_ms` fields.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod lock_map_tests {
    use super::*;

    #[tokio::test]
    async fn unused_locks_are_swept_and_held_ones_kept() {
        let map = LockMap::<u32>::default();
        let held = map.get(0);
        let guard = held.lock().await;
        for key in 1..10_000 {
            drop(map.get(key));
        }
        assert!(map.len() <= 2 * LOCK_SWEEP_MIN, "{} locks", map.len());
        // The held lock survived every sweep: the same key still gives the same lock.
        assert!(Arc::ptr_eq(&held, &map.get(0)));
        drop(guard);
        assert!(map.get(0).try_lock().is_ok());
    }
}
