//! The database's faults, and the daemon's way through them (docs/operations.md, "Disk and
//! database faults").
//!
//! A full disk, or a database server that restarts, is a fault that passes. While it lasts:
//!
//! - the daemon's health says so ([`StoreHealth`], which the server reports on
//!   `grpc.health.v1`);
//! - an agent whose write the database refused stops where it stands, as if its daemon had
//!   crashed there: everything it had stored stays, and it stays `running` in the store
//!   ([`Faults::interrupted`]). Its attached clients hear `interrupted`;
//! - the facade's recovery loop (`recovery.rs`) probes the database until a write succeeds, then
//!   resumes those agents from their transcripts, and their clients hear `resumed`.
//!
//! And before the disk fills: below `min_free_disk` on the filesystem holding the database, new
//! sessions, messages and batches are refused ([`Faults::check_space`]) while running agents go
//! on, and the log warns as the free space nears it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use bytesize::ByteSize;
use forkd_core::AgentId;
use forkd_core::store::{DiskSpace, Store};
use tokio::sync::{Notify, broadcast, watch};

use crate::config::MinFreeDisk;
use crate::error::EngineError;

/// Whether the database takes writes, as the daemon last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreHealth {
    Healthy,
    /// Writes fail for the database's sake: the fault's message. Agents stop; the daemon probes.
    Failing(String),
    /// Free space is below `min_free_disk`: new work is refused, running agents go on.
    LowDisk(String),
}

impl StoreHealth {
    pub fn is_healthy(&self) -> bool {
        matches!(self, StoreHealth::Healthy)
    }
}

/// What an attached client hears of a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pause {
    /// The agent stopped: the database refused its write.
    Interrupted(String),
    /// The database takes writes again, and the agent runs again.
    Resumed,
}

/// The database's health, the agents a fault stopped, and the disk-space check.
pub(crate) struct Faults {
    store: Arc<dyn Store>,
    min_free: MinFreeDisk,
    health: watch::Sender<StoreHealth>,
    /// Agents whose runs a fault stopped, to resume once a write succeeds.
    interrupted: Mutex<BTreeSet<AgentId>>,
    /// Wakes the recovery loop at once when an agent stops.
    nudge: Notify,
    /// Interruptions and resumptions, for attached clients.
    pauses: broadcast::Sender<(AgentId, Pause)>,
    /// Whether the log has warned that free space nears `min_free_disk` (once until it recovers).
    warned_space: Mutex<bool>,
}

impl Faults {
    pub(crate) fn new(store: Arc<dyn Store>, min_free: MinFreeDisk) -> Self {
        Self {
            store,
            min_free,
            health: watch::channel(StoreHealth::Healthy).0,
            interrupted: Mutex::default(),
            nudge: Notify::new(),
            pauses: broadcast::channel(1024).0,
            warned_space: Mutex::new(false),
        }
    }

    pub(crate) fn health(&self) -> watch::Receiver<StoreHealth> {
        self.health.subscribe()
    }

    pub(crate) fn current(&self) -> StoreHealth {
        self.health.borrow().clone()
    }

    pub(crate) fn set_health(&self, health: StoreHealth) {
        self.health.send_if_modified(|now| {
            let changed = *now != health;
            *now = health;
            changed
        });
    }

    pub(crate) fn pauses(&self) -> broadcast::Receiver<(AgentId, Pause)> {
        self.pauses.subscribe()
    }

    /// An agent's run stopped because the database refused its write (`reason`): it resumes
    /// once writes succeed again.
    pub(crate) fn interrupted(&self, id: AgentId, reason: String) {
        tracing::warn!(
            agent.id = %id,
            error = %reason,
            "Agent stopped: the database refused its write; it resumes when the database takes writes again"
        );
        self.interrupted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        let _ = self.pauses.send((id, Pause::Interrupted(reason)));
        self.nudge.notify_one();
    }

    /// Whether any agent waits for the database.
    pub(crate) fn any_interrupted(&self) -> bool {
        !self
            .interrupted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The agents waiting for the database, no longer waiting.
    pub(crate) fn take_interrupted(&self) -> Vec<AgentId> {
        let taken =
            std::mem::take(&mut *self.interrupted.lock().unwrap_or_else(|p| p.into_inner()));
        taken.into_iter().collect()
    }

    /// Tells the agent's clients it runs again.
    pub(crate) fn resumed(&self, id: AgentId) {
        let _ = self.pauses.send((id, Pause::Resumed));
    }

    /// Resolves once the store holds no fault: the recovery loop's probe wrote.
    pub(crate) async fn writable(&self) {
        while self.store.fault().is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Resolves when an agent stops for a fault.
    pub(crate) async fn nudged(&self) {
        self.nudge.notified().await;
    }

    /// Refuses new work (a session, a message, a batch) when the filesystem holding the database
    /// has less free space than `min_free_disk`, or the database refuses writes for lack of it.
    pub(crate) fn check_space(&self) -> Result<(), EngineError> {
        let Some(space) = self.store.disk_space() else {
            return Ok(());
        };
        let min = self.min_free.bytes(space.total);
        if space.available < min {
            return Err(self.low_disk(&space, min));
        }
        Ok(())
    }

    /// The refusal for `space` below `min` bytes.
    fn low_disk(&self, space: &DiskSpace, min: u64) -> EngineError {
        EngineError::LowDisk {
            free: ByteSize(space.available).display().iec().to_string(),
            min: format!("{} = {}", self.min_free, ByteSize(min).display().iec()),
            path: space.path.display().to_string(),
        }
    }

    /// The health the disk's free space gives (the recovery loop calls it while writes work),
    /// warning once as it nears `min_free_disk` (below twice the threshold).
    pub(crate) fn space_health(&self) -> StoreHealth {
        let Some(space) = self.store.disk_space() else {
            return StoreHealth::Healthy;
        };
        let min = self.min_free.bytes(space.total);
        let mut warned = self.warned_space.lock().unwrap_or_else(|p| p.into_inner());
        if space.available < min {
            *warned = true;
            return StoreHealth::LowDisk(self.low_disk(&space, min).to_string());
        }
        let near = space.available < min.saturating_mul(2);
        if near && !*warned {
            *warned = true;
            tracing::warn!(
                free = %ByteSize(space.available).display().iec(),
                min_free_disk = %ByteSize(min).display().iec(),
                path = %space.path.display(),
                "The database's filesystem is nearly full: below min_free_disk, new sessions, messages and batches will be refused"
            );
        } else if !near {
            *warned = false;
        }
        StoreHealth::Healthy
    }
}
