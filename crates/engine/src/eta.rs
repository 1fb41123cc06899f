//! When a batch would start and finish had it been submitted now (a dry run's estimate): from
//! the running slots and the runs served before its children, the wall time of this daemon's
//! latest runs, and the limiter's pace for the session's model. An estimate, said to be one:
//! the runs ahead may end sooner or later than the latest did, and what arrives after the dry
//! run is not counted.

use std::time::Duration;

use crate::admission::KeyCapacity;
use crate::supervisor::{RunTime, Slots};

/// When a batch would start and finish, counted from now.
#[derive(Debug, Clone, PartialEq)]
pub struct Eta {
    /// Until its first child has a slot and may send its first request. `None` when it must
    /// wait for runs to end and none has ended here yet to say how long runs take.
    pub start: Option<Duration>,
    /// Until its last child would end: `None` before any run has ended here.
    pub finish: Option<Duration>,
    /// What the figures were made of, in words.
    pub basis: String,
}

/// What the first requests of a batch ask of its model's limiter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Demand {
    pub requests: f64,
    /// Uncached input: the shared prefix once (child 1 writes it; cache reads do not count
    /// against input limits), every child's directive.
    pub input_tokens: f64,
    /// What the limiter charges up front: `max_tokens` a request.
    pub output_tokens: f64,
}

/// Everything an estimate is made of.
#[derive(Debug, Clone)]
pub(crate) struct Load<'a> {
    pub slots: Slots,
    /// Runs served before the batch's first child and before its last (`None`: no cap on
    /// running agents, so no run waits for a slot).
    pub before_first: Option<usize>,
    pub before_last: Option<usize>,
    pub run_time: Option<RunTime>,
    /// The limiter of the session's model, when a request of it has been sent.
    pub limiter: Option<&'a KeyCapacity>,
    /// The first child's first request, and all the children's first requests.
    pub first: Demand,
    pub all: Demand,
}

/// How long the run with `before` runs served before it waits for a slot: nothing while a
/// slot is free for it; else until enough runs end, `cap` of them every `run` on average.
fn slot_wait(slots: Slots, before: Option<usize>, run: Option<Duration>) -> Option<Duration> {
    let (Some(cap), Some(before)) = (slots.cap, before) else {
        return Some(Duration::ZERO);
    };
    let free = cap.saturating_sub(slots.used);
    let short = (before + 1).saturating_sub(free);
    if short == 0 {
        return Some(Duration::ZERO);
    }
    run.map(|run| run.mul_f64(short as f64 / cap.max(1) as f64))
}

/// How long the limiter holds `demand` back: its pause, and for each limit it paces by, what
/// goes past the burst at the limit's rate (the requests already waiting go first).
fn limiter_wait(key: Option<&KeyCapacity>, demand: Demand) -> Duration {
    let Some(key) = key else {
        return Duration::ZERO;
    };
    let paced = key
        .limits
        .iter()
        .filter(|l| l.per_second > 0.0)
        .map(|l| {
            let asked = match l.name {
                "requests" => demand.requests + key.waiting as f64,
                "input_tokens" => demand.input_tokens,
                "output_tokens" => demand.output_tokens,
                _ => demand.input_tokens + demand.output_tokens,
            };
            (asked - l.burst).max(0.0) / l.per_second
        })
        .fold(0.0, f64::max);
    key.paused_for + Duration::from_secs_f64(paced)
}

/// `1.5 s`, `12 s`, `3.2 min`.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 600.0 {
        format!("{s:.0} s")
    } else {
        format!("{:.1} min", s / 60.0)
    }
}

/// The estimate for `load`.
pub(crate) fn estimate(load: &Load<'_>) -> Eta {
    let run = load.run_time.map(|r| r.median);
    let start = slot_wait(load.slots, load.before_first, run)
        .map(|slot| slot.max(limiter_wait(load.limiter, load.first)));
    let finish = run.and_then(|run| {
        let last = slot_wait(load.slots, load.before_last, Some(run))?;
        Some(last.max(limiter_wait(load.limiter, load.all)) + run)
    });
    let mut basis = Vec::new();
    match (load.slots.cap, load.before_first) {
        (Some(cap), Some(before)) => basis.push(format!(
            "{} of {cap} slots taken, {before} runs served before its first child",
            load.slots.used
        )),
        _ => basis.push("no cap on running agents".to_owned()),
    }
    match load.run_time {
        Some(t) => basis.push(format!(
            "runs here took {} (median of the latest {})",
            seconds(t.median),
            t.runs
        )),
        None => basis.push("no run has ended here yet".to_owned()),
    }
    if let Some(key) = load.limiter {
        if !key.paused_for.is_zero() {
            basis.push(format!(
                "the provider asked to wait {}",
                seconds(key.paused_for)
            ));
        }
        for l in &key.limits {
            basis.push(format!(
                "{} paced at {:.1}/s ({})",
                l.name,
                l.per_second,
                l.source.as_str()
            ));
        }
    }
    Eta {
        start,
        finish,
        basis: basis.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{LimitSource, PacedLimit};

    fn demand(requests: f64) -> Demand {
        Demand {
            requests,
            input_tokens: 0.0,
            output_tokens: 0.0,
        }
    }

    fn load(slots: Slots, before: (usize, usize), run: Option<u64>) -> Load<'static> {
        Load {
            slots,
            before_first: slots.cap.map(|_| before.0),
            before_last: slots.cap.map(|_| before.1),
            run_time: run.map(|s| RunTime {
                median: Duration::from_secs(s),
                runs: 9,
            }),
            limiter: None,
            first: demand(1.0),
            all: demand(1.0),
        }
    }

    fn slots(used: usize, cap: Option<usize>) -> Slots {
        Slots {
            used,
            cap,
            queued: 0,
        }
    }

    #[test]
    fn with_room_a_batch_starts_now_and_takes_one_run() {
        let eta = estimate(&load(slots(2, Some(10)), (0, 4), Some(6)));
        assert_eq!(eta.start, Some(Duration::ZERO));
        assert_eq!(eta.finish, Some(Duration::from_secs(6)));
        let eta = estimate(&load(slots(50, None), (0, 99), Some(6)));
        assert_eq!(eta.start, Some(Duration::ZERO));
        assert_eq!(eta.finish, Some(Duration::from_secs(6)));
        assert!(eta.basis.contains("no cap"), "{}", eta.basis);
    }

    #[test]
    fn a_full_daemon_makes_it_wait_for_runs_to_end() {
        // 4 slots, all taken, 4 runs ahead: its first child waits for 5 runs to end (5/4 of an
        // 8 s run), its 8th (11 ahead of it) for 12 (3 runs' time), then runs for one.
        let eta = estimate(&load(slots(4, Some(4)), (4, 11), Some(8)));
        assert_eq!(eta.start, Some(Duration::from_secs(10)));
        assert_eq!(eta.finish, Some(Duration::from_secs(24 + 8)));
        assert!(
            eta.basis
                .contains("4 of 4 slots taken, 4 runs served before"),
            "{}",
            eta.basis
        );
    }

    #[test]
    fn without_a_finished_run_only_an_immediate_start_is_known() {
        let eta = estimate(&load(slots(4, Some(4)), (0, 3), None));
        assert_eq!((eta.start, eta.finish), (None, None));
        let eta = estimate(&load(slots(0, Some(4)), (0, 3), None));
        assert_eq!((eta.start, eta.finish), (Some(Duration::ZERO), None));
        assert!(eta.basis.contains("no run has ended"), "{}", eta.basis);
    }

    #[test]
    fn the_limiter_paces_the_first_requests() {
        let key = KeyCapacity {
            provider: "anthropic",
            endpoint: String::new(),
            model: "m".into(),
            limits: vec![PacedLimit {
                name: "requests",
                per_second: 2.0,
                burst: 5.0,
                source: LimitSource::Headers,
            }],
            concurrency: 8.0,
            in_flight: 0,
            waiting: 1,
            throttled: 0,
            refusals_last_minute: 0,
            paused_for: Duration::from_secs(3),
        };
        let mut l = load(slots(0, None), (0, 19), Some(4));
        l.limiter = Some(&key);
        l.all = demand(20.0);
        let eta = estimate(&l);
        // The pause holds the first; 21 requests past a burst of 5 at 2/s take 8 s more.
        assert_eq!(eta.start, Some(Duration::from_secs(3)));
        assert_eq!(eta.finish, Some(Duration::from_secs(3 + 8 + 4)));
        assert!(
            eta.basis.contains("requests paced at 2.0/s (headers)"),
            "{}",
            eta.basis
        );
    }
}
