//! A run's progress, for its idle timeout and for a timeout that leaves out the provider's
//! limits (docs/contracts.md, "Limits").
//!
//! The run's task holds its [`Progress`] in a task-local ([`scope`]); the model-call layer and the
//! tools mark what happens on it — an output event, a tool call starting or finishing, a wait on
//! the provider's limits — without the progress being passed down through every call. Outside a
//! run's scope (a parent turn, a compaction of a session) the marks do nothing.

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

tokio::task_local! {
    static CURRENT: Arc<Progress>;
}

/// What a run has done lately.
#[derive(Debug)]
pub(crate) struct Progress {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The last output event, tool call started or finished, or wait that ended.
    last: Instant,
    /// Waits on the provider's limits in progress (the limiter's queue or a refusal's pause):
    /// the run is not idle while one lasts.
    waiting: u32,
    /// Since when the run's request has been refused and is waiting out the provider's limits.
    throttled_since: Option<Instant>,
    /// How long its refused requests have waited, over the refusals that ended in this run.
    throttled: Duration,
}

impl Progress {
    pub(crate) fn new() -> Arc<Progress> {
        Arc::new(Progress {
            state: Mutex::new(State {
                last: Instant::now(),
                waiting: 0,
                throttled_since: None,
                throttled: Duration::ZERO,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Something happened now.
    pub(crate) fn touch(&self) {
        self.state().last = Instant::now();
    }

    /// Since when nothing has happened; `None` while the run waits on the provider's limits.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let state = self.state();
        (state.waiting == 0).then_some(state.last)
    }

    /// How long this run's refused requests have waited out the provider's limits, up to `now`.
    pub(crate) fn throttled(&self, now: Instant) -> Duration {
        let state = self.state();
        state.throttled
            + state
                .throttled_since
                .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }
}

/// Runs `work` with `progress` as its run's progress.
pub(crate) async fn scope<F: Future>(progress: Arc<Progress>, work: F) -> F::Output {
    CURRENT.scope(progress, work).await
}

fn with(f: impl FnOnce(&Progress)) {
    let _ = CURRENT.try_with(|p| f(p));
}

/// Marks progress on the current run, if any.
pub(crate) fn touch() {
    with(Progress::touch);
}

/// Marks the current run as waiting on the provider's limits until the guard is dropped.
pub(crate) fn waiting() -> Waiting {
    with(|p| p.state().waiting += 1);
    Waiting
}

/// A wait on the provider's limits: the run is not idle while it lives.
pub(crate) struct Waiting;

impl Drop for Waiting {
    fn drop(&mut self) {
        with(|p| {
            let mut state = p.state();
            state.waiting = state.waiting.saturating_sub(1);
            state.last = Instant::now();
        });
    }
}

/// The current run's request was refused (`true`) or has gone through or given up (`false`).
pub(crate) fn throttled(now_throttled: bool) {
    with(|p| {
        let mut state = p.state();
        match (now_throttled, state.throttled_since) {
            (true, None) => state.throttled_since = Some(Instant::now()),
            (false, Some(since)) => {
                state.throttled += since.elapsed();
                state.throttled_since = None;
            }
            _ => {}
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_reach_the_run_in_scope_and_nothing_outside_it() {
        // Outside a scope: nothing to mark, nothing fails.
        touch();
        drop(waiting());
        let progress = Progress::new();
        let before = progress.idle_since().unwrap();
        scope(Arc::clone(&progress), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            touch();
        })
        .await;
        assert!(progress.idle_since().unwrap() > before);
    }

    #[tokio::test]
    async fn a_run_waiting_on_the_provider_is_not_idle() {
        let progress = Progress::new();
        scope(Arc::clone(&progress), async {
            let wait = waiting();
            assert_eq!(progress.idle_since(), None);
            drop(wait);
            assert!(progress.idle_since().is_some());
        })
        .await;
    }

    #[tokio::test]
    async fn refused_waits_add_up() {
        let progress = Progress::new();
        scope(Arc::clone(&progress), async {
            throttled(true);
            tokio::time::sleep(Duration::from_millis(20)).await;
            throttled(false);
            throttled(false);
        })
        .await;
        let waited = progress.throttled(Instant::now());
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert!(progress.throttled(Instant::now()) == waited);
    }
}
