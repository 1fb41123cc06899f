//! Fault injection: streamed responses that the server cuts off mid-stream by dropping the
//! connection, as a network failure or a crashed upstream would.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Which streamed responses to cut, and after how many events. Clones share one plan, so a test
/// keeps a clone and arms a cut while the server runs.
///
/// Only successful streamed responses count (not errors, not `"stream": false`). A response is
/// cut after `n` events of the Messages stream (`message_start` is the first; `ping` does not
/// count): `0` cuts it before any event, after the status line and headers.
#[derive(Debug, Clone, Default)]
pub struct StreamCuts(Arc<Mutex<Plan>>);

#[derive(Debug, Default)]
struct Plan {
    /// One-off cuts for the next streams, in order.
    queued: VecDeque<usize>,
    /// Every k-th stream is cut after this many events.
    every: Option<(NonZeroUsize, usize)>,
    /// Streams started so far.
    streams: usize,
}

impl StreamCuts {
    /// Cuts nothing until told to.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cuts the k-th, 2k-th, … streamed response after `after_events` events.
    pub fn every(k: NonZeroUsize, after_events: usize) -> Self {
        let cuts = Self::default();
        cuts.plan().every = Some((k, after_events));
        cuts
    }

    /// Cuts the next streamed response after `after_events` events; each call queues one more.
    pub fn cut_next(&self, after_events: usize) {
        self.plan().queued.push_back(after_events);
    }

    /// How many streamed responses have started.
    pub fn streams(&self) -> usize {
        self.plan().streams
    }

    /// How many queued cuts are still waiting for a stream.
    pub fn pending(&self) -> usize {
        self.plan().queued.len()
    }

    /// For a stream starting now: after how many events to cut it, if at all.
    pub(crate) fn take(&self) -> Option<usize> {
        let mut plan = self.plan();
        plan.streams += 1;
        if let Some(n) = plan.queued.pop_front() {
            return Some(n);
        }
        let streams = plan.streams;
        plan.every
            .and_then(|(k, n)| streams.is_multiple_of(k.get()).then_some(n))
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        // Each update is a single push, pop or increment: a panic elsewhere cannot leave the
        // plan half-changed.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_cuts_come_first_then_every_kth() {
        let cuts = StreamCuts::every(NonZeroUsize::MIN.saturating_add(2), 5);
        cuts.cut_next(0);
        let seen: Vec<Option<usize>> = (0..7).map(|_| cuts.take()).collect();
        assert_eq!(
            seen,
            [Some(0), None, Some(5), None, None, Some(5), None],
            "the queued cut takes stream 1; streams 3 and 6 are every third"
        );
        assert_eq!((cuts.streams(), cuts.pending()), (7, 0));
        assert_eq!(StreamCuts::new().take(), None);
    }
}
