//! The supervisor of runs: every run in progress (a fork child's, a typed agent's, a parent's
//! turn) registered under its agent id with a child of the shutdown token, so that a kill or a
//! shutdown reaches it; the task tracker they run on; the slots under `max_running_agents`.

mod history;
mod slots;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use forkd_core::AgentId;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use history::RunTime;
use history::RunTimes;
pub(crate) use slots::{RunSlots, Turn};

/// How a run raced against its token ended.
pub(crate) enum Raced<T> {
    /// The run's work ended on its own.
    Done(T),
    /// A client killed it.
    Killed,
    /// The daemon is shutting down: whatever the run was doing resumes at the next start.
    Shutdown,
}

/// The running slots as a caller may see them: totals, and its own queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// Slots taken by runs, whoever's.
    pub used: usize,
    /// `max_running_agents`; `None`: no cap.
    pub cap: Option<usize>,
    /// The caller's own runs waiting for a slot.
    pub queued: usize,
}

/// The runs in progress, their kills, their tasks and their slots.
pub(crate) struct Supervisor {
    /// The token of every run in progress, to kill one.
    runs: Mutex<HashMap<AgentId, CancellationToken>>,
    /// Runs cancelled by a kill rather than by shutdown.
    killed: Mutex<HashSet<AgentId>>,
    tasks: TaskTracker,
    /// Slots for running agents when their number is capped (the cap, the slots), and the runs
    /// waiting for one.
    slots: Option<(usize, Arc<RunSlots>)>,
    /// How long the latest runs took.
    run_times: RunTimes,
    /// Cancelled when shutdown begins: a run waiting for a slot stays pending.
    draining: CancellationToken,
    /// Cancelled when the drain is over: every run's token is a child of it.
    shutdown: CancellationToken,
}

impl Supervisor {
    pub(crate) fn new(
        max_running_agents: Option<usize>,
        draining: CancellationToken,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            runs: Mutex::default(),
            killed: Mutex::default(),
            tasks: TaskTracker::new(),
            slots: max_running_agents.map(|cap| (cap.max(1), RunSlots::new(cap))),
            run_times: RunTimes::default(),
            draining,
            shutdown,
        }
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<AgentId, CancellationToken>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn killed(&self) -> std::sync::MutexGuard<'_, HashSet<AgentId>> {
        self.killed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether shutdown's drain has begun: runs start no new model request or tool call.
    pub(crate) fn draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Cancelled when shutdown's drain begins.
    pub(crate) fn draining_token(&self) -> &CancellationToken {
        &self.draining
    }

    /// Registers a run under its agent id and returns its token: cancelled on shutdown or by a
    /// kill, and what its tool calls (a Bash process group) watch so they stop with it.
    pub(crate) fn register(&self, id: AgentId) -> CancellationToken {
        let token = self.shutdown.child_token();
        self.runs().insert(id, token.clone());
        token
    }

    /// Runs `work` until it ends or the run's token is cancelled, and says which. Only the work
    /// is raced: what the caller records afterwards (an end, a kill) can never be cut in half.
    pub(crate) async fn race<T>(
        &self,
        id: AgentId,
        token: &CancellationToken,
        work: impl Future<Output = T>,
    ) -> Raced<T> {
        let outcome = tokio::select! {
            // Cancellation first: a run released at the same moment must not start writing.
            biased;
            () = token.cancelled() => None,
            outcome = work => Some(outcome),
        };
        match outcome {
            Some(done) => Raced::Done(done),
            None if self.take_killed(id) => Raced::Killed,
            None => Raced::Shutdown,
        }
    }

    /// Forgets a run that has ended (and any kill that came too late to matter).
    pub(crate) fn unregister(&self, id: AgentId) {
        self.take_killed(id);
        self.runs().remove(&id);
    }

    /// Whether a run of the agent is in progress here.
    pub(crate) fn is_running(&self, id: AgentId) -> bool {
        self.runs().contains_key(&id)
    }

    /// How many runs are in progress here.
    pub(crate) fn running(&self) -> usize {
        self.runs().len()
    }

    /// The slots under `max_running_agents`: how many are taken and the cap (`None`: no cap),
    /// and how many of `tenant`'s runs wait for one.
    pub(crate) fn slots(&self, tenant: &str) -> Slots {
        match &self.slots {
            Some((cap, slots)) => Slots {
                used: slots.used(*cap),
                cap: Some(*cap),
                queued: slots.queued(tenant),
            },
            None => Slots {
                used: self.running(),
                cap: None,
                queued: 0,
            },
        }
    }

    /// How many runs would get a slot before the `k`-th of `k` runs `tenant` started now;
    /// `None` without a cap (every run starts at once).
    pub(crate) fn served_before(&self, tenant: &str, k: usize) -> Option<usize> {
        self.slots
            .as_ref()
            .map(|(_, slots)| slots.served_before(tenant, k))
    }

    /// Records that a run ended `took` after it got its slot.
    pub(crate) fn ran_for(&self, took: std::time::Duration) {
        self.run_times.record(took);
    }

    /// The median wall time of the latest runs that ended here.
    pub(crate) fn run_time(&self) -> Option<RunTime> {
        self.run_times.median()
    }

    /// Stops this daemon's run of `id` as killed; false when no run of it is here.
    pub(crate) fn kill_here(&self, id: AgentId) -> bool {
        let run = self.runs().get(&id).cloned();
        let Some(token) = run else {
            return false;
        };
        self.killed().insert(id);
        token.cancel();
        true
    }

    /// Whether the agent's run was cancelled by a kill (and forgets it).
    fn take_killed(&self, id: AgentId) -> bool {
        self.killed().remove(&id)
    }

    /// A place in the queue for a slot, under a cap on running agents: tenants take turns, and
    /// each tenant's runs go in the order they were queued (see [`slots`]).
    pub(crate) fn queue(&self, tenant: &Arc<str>) -> Option<Turn> {
        self.slots
            .as_ref()
            .map(|(_, slots)| slots.queue(tenant, &self.draining))
    }

    /// Runs a task on the tracker that shutdown waits for.
    pub(crate) fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(task)
    }

    /// The tracker of the runs' tasks, for shutdown to close and wait on.
    pub(crate) fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }
}
