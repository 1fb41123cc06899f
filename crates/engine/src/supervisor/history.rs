//! How long this daemon's recent runs took, from their slot to their end: what a dry run's
//! estimate of a batch's finish is made of.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// How many of the latest runs are kept.
const KEPT: usize = 64;

/// The wall times of the latest runs that ended here.
#[derive(Debug, Default)]
pub(crate) struct RunTimes {
    recent: Mutex<VecDeque<Duration>>,
}

/// The runs' median wall time, and how many runs it was taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTime {
    pub median: Duration,
    pub runs: usize,
}

impl RunTimes {
    /// Records a run that ended after `took`.
    pub(crate) fn record(&self, took: Duration) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back(took);
    }

    /// The median of the kept runs; `None` before any run ended.
    pub(crate) fn median(&self) -> Option<RunTime> {
        let mut times: Vec<Duration> = self
            .recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        if times.is_empty() {
            return None;
        }
        times.sort_unstable();
        Some(RunTime {
            median: times[times.len() / 2],
            runs: times.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_the_latest_runs() {
        let times = RunTimes::default();
        assert_eq!(times.median(), None);
        for s in [5, 1, 3] {
            times.record(Duration::from_secs(s));
        }
        assert_eq!(
            times.median(),
            Some(RunTime {
                median: Duration::from_secs(3),
                runs: 3
            })
        );
        // Only the latest are kept: 64 fast runs push the slow ones out.
        for _ in 0..KEPT {
            times.record(Duration::from_millis(10));
        }
        assert_eq!(
            times.median(),
            Some(RunTime {
                median: Duration::from_millis(10),
                runs: KEPT
            })
        );
    }
}
