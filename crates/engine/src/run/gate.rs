//! Warm-up gating: a batch's first child goes alone, and its siblings start when its response
//! has started, so they find the shared prefix already cached.

use super::Runs;
use super::load::SharedBatch;
use std::sync::Arc;

use forkd_core::store::Store;
use forkd_core::{AgentId, BatchId};
use tokio::sync::watch;

/// Opens when the first child's response has started (or when the first child ends without
/// one), releasing its siblings. Dropping the sender opens it too, so no sibling waits forever.
/// Opening it is also recorded in the store, where other daemons sharing the database see it
/// before they take any of the batch's pending children.
pub(crate) struct WarmupGate {
    tx: Option<watch::Sender<bool>>,
    store: Arc<dyn Store>,
    batch: BatchId,
}

/// How a run starts with its siblings; a run started alone (resumed, or not a batch's child) has
/// none of it.
#[derive(Default)]
pub(crate) struct Launch {
    /// Held by a batch's first child: opens when its response starts.
    pub gate: Option<WarmupGate>,
    /// Held by its siblings: they wait for that gate to open.
    pub wait: Option<watch::Receiver<bool>>,
    /// The batch's context, held by every child started with the batch: it is loaded once, and
    /// lives until the last of them ends, so a sibling that starts after child 1 ended (one
    /// running agent at a time) still finds the batch's first request there.
    pub batch: Option<Arc<SharedBatch>>,
}

impl WarmupGate {
    pub(crate) fn open(&mut self) {
        if let Some(tx) = self.tx.take() {
            tx.send_replace(true);
            record_open_gate(&self.store, self.batch);
        }
    }
}

/// Records in the store that `batch`'s gate is open, without holding up the caller (a child's
/// stream): a write that fails only keeps other daemons waiting until the gate's timeout.
fn record_open_gate(store: &Arc<dyn Store>, batch: BatchId) {
    let store = Arc::clone(store);
    tokio::spawn(async move {
        if let Err(e) = store.open_gate(batch).await {
            tracing::warn!(batch.id = %batch, error = %e, "Cannot record that the batch's gate opened");
        }
    });
}

impl Runs {
    /// Starts a batch's children. Under gating the first child goes alone; the others wait for
    /// its response to start, so they find the shared prefix already cached.
    pub(crate) fn start_batch(
        self: &Arc<Self>,
        batch: BatchId,
        tenant: &Arc<str>,
        agent_ids: &[AgentId],
        gating: bool,
    ) {
        let open = !gating || agent_ids.len() < 2;
        if open {
            record_open_gate(&self.store, batch);
        }
        let (tx, rx) = watch::channel(open);
        let mut gate = Some(WarmupGate {
            tx: (!open).then_some(tx),
            store: Arc::clone(&self.store),
            batch,
        });
        let shared = Arc::new(SharedBatch::default());
        for (i, id) in agent_ids.iter().enumerate() {
            let launch = Launch {
                gate: if i == 0 { gate.take() } else { None },
                wait: (i > 0).then(|| rx.clone()),
                batch: Some(Arc::clone(&shared)),
            };
            self.spawn_agent(*id, tenant, launch);
        }
    }
}
