//! The cap on running agents (`max_running_agents`). Runs wait for a slot in a queue that
//! serves tenants in turn and each tenant's runs in the order they were started, so one
//! tenant's 1000-child batch does not hold another tenant's agents back until it has run.
//!
//! Within a tenant the order stays first come, first served: a batch's first child (which holds
//! the warm-up gate) always gets its slot before the siblings waiting for that gate.

use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use crate::fair_queue::{Class, FairQueue};

/// A run's place in the queue: it resolves to the run's slot when its turn comes.
pub(crate) type Turn = oneshot::Receiver<OwnedSemaphorePermit>;

/// Slots for running agents, and the runs waiting for one.
#[derive(Debug)]
pub(crate) struct RunSlots {
    slots: Arc<Semaphore>,
    waiting: Mutex<FairQueue<oneshot::Sender<OwnedSemaphorePermit>>>,
    queued: Notify,
    /// The dispatcher starts with the first queued run (it needs the runtime).
    dispatcher: OnceLock<()>,
}

impl RunSlots {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(cap.max(1))),
            waiting: Mutex::new(FairQueue::default()),
            queued: Notify::new(),
            dispatcher: OnceLock::new(),
        })
    }

    /// Queues a run of `tenant`'s. Until `draining` is cancelled, the dispatcher hands the
    /// run its slot when its turn comes; a run that ended before (a kill) is skipped.
    pub(crate) fn queue(self: &Arc<Self>, tenant: &Arc<str>, draining: &CancellationToken) -> Turn {
        self.dispatcher.get_or_init(|| {
            tokio::spawn(Arc::clone(self).dispatch(draining.clone()));
        });
        let (tx, rx) = oneshot::channel();
        self.waiting().push(Class::Batch, tenant, tx, false);
        self.queued.notify_one();
        rx
    }

    /// Slots taken and the cap.
    pub(crate) fn used(&self, cap: usize) -> usize {
        cap.saturating_sub(self.slots.available_permits())
    }

    /// How many of `tenant`'s runs wait for a slot (a run killed while it waits is counted
    /// until its turn comes and it is skipped).
    pub(crate) fn queued(&self, tenant: &str) -> usize {
        self.waiting().len_of(tenant)
    }

    /// How many runs would get a slot before the `k`-th of `k` runs `tenant` queued now.
    pub(crate) fn served_before(&self, tenant: &str, k: usize) -> usize {
        self.waiting().served_before(tenant, k)
    }

    fn waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, FairQueue<oneshot::Sender<OwnedSemaphorePermit>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands each free slot to the run served next. A slot is taken only once a run waits for
    /// one: an idle dispatcher holds none, so the slots in use are the runs' alone.
    async fn dispatch(self: Arc<Self>, draining: CancellationToken) {
        loop {
            while self.waiting().len() == 0 {
                tokio::select! {
                    () = self.queued.notified() => {}
                    () = draining.cancelled() => return,
                }
            }
            let mut slot = tokio::select! {
                slot = Arc::clone(&self.slots).acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => return,
                },
                () = draining.cancelled() => return,
            };
            loop {
                let next = self.waiting().pop();
                let Some(run) = next else {
                    // Every run that waited ended meanwhile: the slot is free again.
                    break;
                };
                match run.send(slot) {
                    Ok(()) => break,
                    // That run ended while it waited: the slot goes to the next one.
                    Err(back) => slot = back,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    async fn served(turn: &mut Turn) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(Duration::from_millis(50), turn)
            .await
            .ok()
            .and_then(Result::ok)
    }

    #[tokio::test]
    async fn tenants_take_turns_and_each_keeps_its_order() {
        let slots = RunSlots::new(1);
        let draining = CancellationToken::new();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut turns: Vec<(String, Turn)> = (0..3)
            .map(|i| (format!("a{i}"), slots.queue(&a, &draining)))
            .collect();
        turns.push(("b0".into(), slots.queue(&b, &draining)));
        turns.push(("b1".into(), slots.queue(&b, &draining)));

        let mut order = Vec::new();
        while order.len() < turns.len() {
            let mut progressed = false;
            for (name, turn) in &mut turns {
                if order.contains(name) {
                    continue;
                }
                if let Some(slot) = served(turn).await {
                    order.push(name.clone());
                    drop(slot);
                    progressed = true;
                    break;
                }
            }
            assert!(progressed, "a slot was freed but nobody got it: {order:?}");
        }
        assert_eq!(order, ["a0", "b0", "a1", "b1", "a2"]);
    }

    #[tokio::test]
    async fn slots_are_in_use_only_while_runs_hold_them() {
        let slots = RunSlots::new(2);
        let draining = CancellationToken::new();
        let tenant: Arc<str> = "a".into();
        let mut turn = slots.queue(&tenant, &draining);
        let held = served(&mut turn).await.expect("a free slot is handed over");
        assert_eq!(slots.used(2), 1);
        drop(held);
        // The dispatcher, idle now, holds no slot of its own.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(slots.used(2), 0);
        // And a run queued later still gets one.
        let mut next = slots.queue(&tenant, &draining);
        assert!(served(&mut next).await.is_some());
    }

    #[tokio::test]
    async fn a_run_that_stopped_waiting_passes_its_slot_on() {
        let slots = RunSlots::new(1);
        let draining = CancellationToken::new();
        let tenant: Arc<str> = "a".into();
        let mut first = slots.queue(&tenant, &draining);
        let gone = slots.queue(&tenant, &draining);
        let mut third = slots.queue(&tenant, &draining);
        let held = served(&mut first)
            .await
            .expect("the first run has the slot");
        drop(gone);
        drop(held);
        assert!(served(&mut third).await.is_some());
    }
}
