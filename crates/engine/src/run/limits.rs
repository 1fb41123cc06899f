//! A run's limits (docs/contracts.md, "Limits"): the watchdog that ends a run past its wall
//! time or idle for too long, and the checks between requests of its turns and output tokens.
//!
//! The wall-time clock counts from the agent's stored start (its first claim), so a run resumed
//! after a restart or on another daemon has what is left, not a new timeout. The idle clock
//! starts again with each run: what happened before a restart is not known here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkd_core::{Agent, Limit, Limits};

use crate::clock::now_ms;
use crate::progress::Progress;

/// How often a run waiting on the provider's limits is looked at again for its idle timeout.
const WAITING_RECHECK: Duration = Duration::from_secs(1);

/// What ends a run past its wall time or idle timeout.
pub(crate) struct Watchdog {
    limits: Limits,
    /// The agent's start on this daemon's monotonic clock.
    started: Instant,
    /// Refused requests' waits before this run (stored), left out of the timeout when asked.
    throttled_before: Duration,
    progress: Arc<Progress>,
}

impl Watchdog {
    /// The watchdog of a run of `agent` (read after its claim, which stored its start).
    pub(crate) fn new(agent: &Agent, limits: Limits, progress: Arc<Progress>) -> Watchdog {
        let now = Instant::now();
        let ran_ms = agent
            .started_at_ms
            .map_or(0, |started| now_ms().saturating_sub(started).max(0));
        let ran = Duration::from_millis(u64::try_from(ran_ms).unwrap_or(0));
        Watchdog {
            limits,
            started: now.checked_sub(ran).unwrap_or(now),
            throttled_before: Duration::from_millis(agent.throttled_ms)
                + agent.throttled_since_ms.map_or(Duration::ZERO, |since| {
                    Duration::from_millis(u64::try_from(now_ms() - since).unwrap_or(0))
                }),
            progress,
        }
    }

    /// Whether the run has nothing to watch (no timeout, no idle timeout).
    pub(crate) fn is_idle(&self) -> bool {
        self.limits.timeout().is_none() && self.limits.idle_timeout().is_none()
    }

    /// Resolves with the limit the run passed, once it has passed one; never without one.
    pub(crate) async fn expired(&self) -> Limit {
        loop {
            let now = Instant::now();
            match self.check(now) {
                Ok(next) => tokio::time::sleep_until(next.into()).await,
                Err(limit) => return limit,
            }
        }
    }

    /// The limit passed at `now`, or when to look again.
    fn check(&self, now: Instant) -> Result<Instant, Limit> {
        // Far enough to mean "never", near enough not to overflow an `Instant`.
        let mut next = now + Duration::from_secs(3600);
        if let Some(timeout) = self.limits.timeout() {
            let left_out = if self.limits.excludes_throttle() {
                self.throttled_before + self.progress.throttled(now)
            } else {
                Duration::ZERO
            };
            let deadline = self.started + timeout + left_out;
            if now >= deadline {
                return Err(Limit::Timeout(timeout));
            }
            next = next.min(deadline);
        }
        if let Some(idle) = self.limits.idle_timeout() {
            match self.progress.idle_since() {
                Some(since) => {
                    let deadline = since + idle;
                    if now >= deadline {
                        return Err(Limit::IdleTimeout(idle));
                    }
                    next = next.min(deadline);
                }
                None => next = next.min(now + WAITING_RECHECK),
            }
        }
        Ok(next)
    }
}

/// The limit a run passed before its next request, having made `turns` requests and written
/// `output_tokens` output tokens so far.
pub(crate) fn before_request(limits: &Limits, turns: u32, output_tokens: u64) -> Option<Limit> {
    if let Some(max) = limits.max_turns
        && turns >= max
    {
        return Some(Limit::MaxTurns(max));
    }
    match limits.max_output_tokens {
        Some(max) if output_tokens >= max => Some(Limit::MaxOutputTokens(max)),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use forkd_core::{AgentId, AgentKind, AgentState, SessionId};

    fn agent(started_ms_ago: Option<i64>, throttled_ms: u64) -> Agent {
        let now = now_ms();
        Agent {
            started_at_ms: started_ms_ago.map(|ago| now - ago),
            throttled_ms,
            ..Agent::new(
                AgentId::new(),
                SessionId::new(),
                AgentKind::Fork,
                AgentState::Running,
                now,
            )
        }
    }

    fn limits(timeout_ms: Option<u64>, idle_ms: Option<u64>, excludes: bool) -> Limits {
        Limits {
            timeout_ms,
            idle_timeout_ms: idle_ms,
            timeout_excludes_throttle: Some(excludes),
            ..Limits::default()
        }
    }

    #[test]
    fn the_timeout_counts_from_the_stored_start() {
        // Started 9 s ago (before a restart) with a 10 s timeout: 1 s is left.
        let dog = Watchdog::new(
            &agent(Some(9_000), 0),
            limits(Some(10_000), None, false),
            Progress::new(),
        );
        let now = Instant::now();
        let next = dog.check(now).unwrap();
        assert!(
            next - now <= Duration::from_millis(1_050),
            "{:?}",
            next - now
        );
        assert_eq!(
            dog.check(now + Duration::from_secs(2)),
            Err(Limit::Timeout(Duration::from_secs(10)))
        );
    }

    #[test]
    fn throttled_time_is_left_out_only_when_asked() {
        let left_out = Watchdog::new(
            &agent(Some(9_000), 5_000),
            limits(Some(10_000), None, true),
            Progress::new(),
        );
        let counted = Watchdog::new(
            &agent(Some(9_000), 5_000),
            limits(Some(10_000), None, false),
            Progress::new(),
        );
        let later = Instant::now() + Duration::from_secs(2);
        assert!(left_out.check(later).is_ok());
        assert!(counted.check(later).is_err());
    }

    #[tokio::test]
    async fn idle_time_runs_from_the_last_progress_and_not_while_waiting() {
        let progress = Progress::new();
        let dog = Watchdog::new(
            &agent(Some(0), 0),
            limits(None, Some(1_000), false),
            Arc::clone(&progress),
        );
        let later = Instant::now() + Duration::from_secs(2);
        assert_eq!(
            dog.check(later),
            Err(Limit::IdleTimeout(Duration::from_secs(1)))
        );
        crate::progress::scope(Arc::clone(&progress), async {
            let _waiting = crate::progress::waiting();
            assert!(
                dog.check(later).is_ok(),
                "a run waiting on the provider is not idle"
            );
        })
        .await;
        // The wait's end is progress.
        assert!(
            dog.check(Instant::now() + Duration::from_millis(500))
                .is_ok()
        );
    }

    #[test]
    fn turns_and_output_tokens_are_checked_before_each_request() {
        let limits = Limits {
            max_turns: Some(3),
            max_output_tokens: Some(100),
            ..Limits::default()
        };
        assert_eq!(before_request(&limits, 2, 99), None);
        assert_eq!(before_request(&limits, 3, 0), Some(Limit::MaxTurns(3)));
        assert_eq!(
            before_request(&limits, 1, 100),
            Some(Limit::MaxOutputTokens(100))
        );
        assert_eq!(before_request(&Limits::default(), 1_000, u64::MAX), None);
    }
}
