//! What the limiter learns from refusals, for providers whose limits are not the token bucket
//! their headers describe, or that state none (docs/operations.md, "The provider limiter").
//!
//! A 429 is evidence that the key sent faster than the provider admits, whatever the headers
//! said. The limiter then measures the rate the provider *did* admit — the requests that went
//! and were answered, over the last half second, second, two, four … a minute (no further back
//! than the pace's last change), the least of those rates — and from then on paces the key to
//! 95 % of it, one request at a time: a window-counting provider (a sliding or fixed window)
//! never sees the burst a full token bucket would send. A refusal lowers a pace only once the
//! provider answered a request sent under it, and at most halves it: requests in flight when it
//! was set, and a provider refusing for other reasons, do not drive it down refusal after
//! refusal. A rate is measured from [`MIN_ANSWERED`] answers at least.
//!
//! A pace lowered once is not lowered for good: while the key keeps requests waiting on the
//! pace and nothing is refused, the pace is raised every [`PROBE_EVERY`], by a step that
//! doubles each time the provider admits the higher pace (5 %, 10 %, 20 % … of it), so a limit
//! that doubled is found in a few steps; a refusal sets the pace from the new measurement and
//! the step back to its least. With headers that
//! describe a real token bucket, no refusal comes and nothing here engages: the buckets pace
//! alone.
//!
//! Until a provider over the network states a limit, its key starts slowly ([`START_RATE`],
//! doubled every [`START_EVERY`] while requests wait): a limit nothing states meets a few
//! requests at first, not a window's worth.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The share of the measured admitted rate the key is paced to: a margin for the provider's
/// own counting (a window's phase, another client's request).
const MARGIN: f64 = 0.95;

/// How long the pace holds before it is raised, while nothing is refused.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(3);

/// The least and most a raise adds, as a share of the pace.
const STEP_MIN: f64 = 0.05;
const STEP_MAX: f64 = 0.8;

/// A key's first pace while nothing is known of its limits, requests per second; doubled every
/// [`START_EVERY`] while requests wait on it, until a refusal or a stated limit ends the start,
/// or it passes [`START_END`] (the provider limits nothing it would meet).
const START_RATE: f64 = 8.0;
const START_EVERY: Duration = Duration::from_millis(250);
const START_END: f64 = 10_000.0;

/// The fewest answered requests a rate is measured from.
const MIN_ANSWERED: usize = 8;

/// The shortest span the admitted rate is measured over: short enough to see a token bucket's
/// refill once its burst is spent, long enough to hold a few answers.
const SPAN_START: Duration = Duration::from_millis(500);

/// How far back the admitted rate is measured, at most.
const SPAN_MAX: Duration = Duration::from_secs(60);

/// The pace learned for one key, and what it is learned from.
#[derive(Debug, Default)]
pub(super) struct Learner {
    /// When each request the provider answered was sent, oldest first, over [`SPAN_MAX`].
    answered: VecDeque<Instant>,
    /// When the key first sent a request that was answered (the measurement's span starts
    /// there while it is younger than [`SPAN_MAX`]).
    first: Option<Instant>,
    pace: Option<Pace>,
    /// When the provider refused a request for a limit, over the last minute.
    refusals: VecDeque<Instant>,
    /// Whether the key has begun its slow start (it begins once).
    started: bool,
}

/// A rate the key is held to, with a small burst.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Requests per second.
    rate: f64,
    level: f64,
    at: Instant,
    /// When the rate was last set or raised: requests sent before then are not evidence
    /// against it.
    set_at: Instant,
    /// The next raise, as a share of the rate.
    step: f64,
    /// Whether a request waited on the pace since it was last set or raised.
    pressed: bool,
    /// Whether a request sent since the pace was set was answered: until one is, a refusal
    /// says nothing of this pace (the provider may be refusing for another reason), so the
    /// pace is not lowered again.
    tried: bool,
    /// A slow start's guess, not learned from anything.
    starting: bool,
}

impl Pace {
    fn new(rate: f64, now: Instant) -> Self {
        let mut pace = Self {
            rate,
            level: 0.0,
            at: now,
            set_at: now,
            step: STEP_MIN,
            pressed: false,
            tried: false,
            starting: false,
        };
        pace.level = pace.burst();
        pace
    }

    /// One request: a window counting over any span (a sliding one) sees the pace's rate
    /// and nothing more.
    fn burst(&self) -> f64 {
        1.0
    }

    fn level(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.level + elapsed * self.rate).min(self.burst())
    }
}

/// Why the pace changed, for the log and the capacity report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Change {
    /// The slow start ended: the provider took everything it sent, or refused before enough
    /// was answered to measure a rate.
    Started,
    /// Set from a refusal: the admitted rate measured, and the pace now.
    Lowered { measured: f64, rate: f64 },
    /// Raised after a span without refusals.
    Raised { rate: f64 },
}

impl Learner {
    /// The pace, requests per second, if one was learned (not a slow start's guess).
    pub(super) fn rate(&self) -> Option<f64> {
        self.pace.filter(|p| !p.starting).map(|p| p.rate)
    }

    /// The slow start's pace, while the key is starting.
    pub(super) fn starting(&self) -> Option<f64> {
        self.pace.filter(|p| p.starting).map(|p| p.rate)
    }

    /// Begins the key's slow start, once: a key nothing is known of yet.
    pub(super) fn start(&mut self, now: Instant) {
        if self.started || self.pace.is_some() {
            return;
        }
        self.started = true;
        let mut pace = Pace::new(START_RATE, now);
        pace.starting = true;
        self.pace = Some(pace);
    }

    /// The provider stated its limits: the buckets pace, and a slow start ends.
    pub(super) fn stated(&mut self) {
        self.started = true;
        if self.pace.is_some_and(|p| p.starting) {
            self.pace = None;
        }
    }

    /// Refusals for a limit over the last minute.
    pub(super) fn recent_refusals(&mut self, now: Instant) -> usize {
        self.forget(now);
        self.refusals.len()
    }

    fn forget(&mut self, now: Instant) {
        let old = |at: &Instant| now.saturating_duration_since(*at) >= SPAN_MAX;
        while self.answered.front().is_some_and(old) {
            self.answered.pop_front();
        }
        while self.refusals.front().is_some_and(old) {
            self.refusals.pop_front();
        }
    }

    /// How long until the pace lets one more request go (zero without a pace). Waiting on it
    /// is what allows the pace to be raised.
    pub(super) fn wait(&mut self, now: Instant) -> Duration {
        let Some(pace) = &mut self.pace else {
            return Duration::ZERO;
        };
        let missing = 1.0 - pace.level(now);
        if missing <= 0.0 {
            return Duration::ZERO;
        }
        pace.pressed = true;
        Duration::try_from_secs_f64(missing / pace.rate).unwrap_or(Duration::MAX)
    }

    /// A request goes now.
    pub(super) fn take(&mut self, now: Instant) {
        if let Some(pace) = &mut self.pace {
            pace.level = pace.level(now) - 1.0;
            pace.at = now;
        }
    }

    /// The request sent at `sent` was answered.
    pub(super) fn answered(&mut self, sent: Instant, now: Instant) {
        self.forget(now);
        self.first.get_or_insert(sent);
        if let Some(pace) = &mut self.pace
            && sent >= pace.set_at
        {
            pace.tried = true;
        }
        // Kept in order: answers come back out of order, a little.
        let at = self.answered.partition_point(|t| *t <= sent);
        self.answered.insert(at, sent);
    }

    /// The rate the provider admitted: the least of the rates over the last 0.5, 1, 2, 4 … 60
    /// seconds, those past a second no longer than the time since the pace was last set or
    /// raised (or the key's history). The shortest span sees a limit that just fell;
    /// the longer ones a limit counted over a longer window than a burst. `None` while nothing
    /// was answered, or fewer than [`MIN_ANSWERED`] since then.
    fn measure(&self, now: Instant) -> Option<f64> {
        // What was sent under an earlier, lower pace measures that pace, not the provider.
        let from = match self.pace {
            Some(p) => Some(p.set_at.max(self.first?)),
            None => self.first,
        };
        self.measure_since(from, now, SPAN_START)
    }

    /// [`Learner::measure`] over what was answered since `from`, the shortest span `shortest`.
    fn measure_since(
        &self,
        from: Option<Instant>,
        now: Instant,
        shortest: Duration,
    ) -> Option<f64> {
        let from = from?;
        let history = now.saturating_duration_since(from);
        // Too few answers say little of a rate (a provider refusing most requests for another
        // reason): the provider's `retry-after` alone governs then.
        if self.answered.iter().filter(|t| **t >= from).count() < MIN_ANSWERED {
            return None;
        }
        let second = Duration::from_secs(1);
        let mut least: Option<f64> = None;
        let mut span = shortest;
        loop {
            // Up to a second, a span is what it says (what went before the key's history
            // counts as nothing sent); past it, no longer than the history.
            let span_now = if span <= second {
                span
            } else {
                span.min(history).max(second)
            };
            let since = now.checked_sub(span_now)?;
            let admitted = self.answered.iter().filter(|t| **t >= since).count();
            let rate = admitted as f64 / span_now.as_secs_f64();
            least = Some(least.map_or(rate, |l| l.min(rate)));
            if span >= SPAN_MAX || (span >= second && span >= history) {
                break;
            }
            span = (span * 2).min(SPAN_MAX);
        }
        least.filter(|r| *r > 0.0)
    }

    /// Raises the pace when it held the key back for [`PROBE_EVERY`] without a refusal.
    pub(super) fn probe(&mut self, now: Instant) -> Option<Change> {
        let pace = self.pace.as_mut()?;
        if pace.starting {
            if !pace.pressed || now.saturating_duration_since(pace.set_at) < START_EVERY {
                return None;
            }
            if pace.rate * 2.0 > START_END {
                self.pace = None;
                return Some(Change::Started);
            }
            let level = pace.level(now);
            pace.rate *= 2.0;
            pace.level = level;
            pace.at = now;
            pace.set_at = now;
            pace.pressed = false;
            return None;
        }
        if !pace.pressed || now.saturating_duration_since(pace.set_at) < PROBE_EVERY {
            return None;
        }
        let level = pace.level(now);
        pace.rate *= 1.0 + pace.step;
        pace.step = (pace.step * 2.0).min(STEP_MAX);
        pace.level = level;
        pace.at = now;
        pace.set_at = now;
        pace.pressed = false;
        pace.tried = false;
        Some(Change::Raised { rate: pace.rate })
    }

    /// The provider refused the request sent at `sent`: the pace is set from what it admitted,
    /// unless the request went before the pace was last set (it is no news then). `None` when
    /// nothing was learned: the request was no news, or nothing was answered yet to measure.
    pub(super) fn refused(&mut self, sent: Instant, now: Instant) -> Option<Change> {
        self.forget(now);
        self.refusals.push_back(now);
        if self.pace.is_some_and(|p| p.starting) {
            // The start found a limit: the pace is what was admitted. With too few answers to
            // tell, the start just ends (`retry-after` governs).
            let Some(measured) = self.measure_since(self.first, now, SPAN_START) else {
                self.pace = None;
                return Some(Change::Started);
            };
            let rate = measured * MARGIN;
            let mut pace = Pace::new(rate, now);
            pace.level = 0.0;
            self.pace = Some(pace);
            return Some(Change::Lowered { measured, rate });
        }
        if self.pace.is_some_and(|p| sent < p.set_at || !p.tried) {
            return None;
        }
        let measured = self.measure(now)?;
        // At most halved by one refusal: few answers measure a rate poorly.
        let rate = self
            .pace
            .map_or(measured * MARGIN, |p| (measured * MARGIN).max(p.rate / 2.0));
        let mut pace = Pace::new(rate, now);
        // What was already sent within the burst counts against it.
        pace.level = 0.0;
        self.pace = Some(pace);
        Some(Change::Lowered { measured, rate })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(start: Instant, n: u64) -> Instant {
        start + Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_sets_the_pace_from_what_was_admitted() {
        let start = Instant::now();
        let mut learner = Learner::default();
        assert_eq!(learner.wait(start), Duration::ZERO, "no pace yet");
        // Nothing answered yet, then too little: nothing to measure.
        assert_eq!(learner.refused(start, start), None);
        for i in 0..7 {
            learner.answered(ms(start, i * 5), ms(start, 50));
        }
        assert_eq!(learner.refused(ms(start, 40), ms(start, 50)), None);
        // 20 answered in the first 100 ms, then a refusal at 200 ms: 20 in (at least) a second.
        for i in 7..20 {
            learner.answered(ms(start, i * 5), ms(start, 100));
        }
        let Some(Change::Lowered { measured, rate }) =
            learner.refused(ms(start, 150), ms(start, 200))
        else {
            panic!("a pace is set");
        };
        assert!((measured - 20.0).abs() < 1e-9, "{measured}");
        assert!((rate - 19.0).abs() < 1e-9, "{rate}");
        // A request sent before the pace was set is no news.
        assert_eq!(learner.refused(ms(start, 150), ms(start, 210)), None);
        assert_eq!(learner.recent_refusals(ms(start, 210)), 4);
        assert_eq!(learner.recent_refusals(ms(start, 60_300)), 0);
        // The pace starts empty: one request per 1/19 s.
        let wait = learner.wait(ms(start, 200)).as_secs_f64();
        assert!((wait - 1.0 / 19.0).abs() < 1e-6, "{wait}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_pace_is_raised_while_it_holds_the_key_back_and_nothing_is_refused() {
        let start = Instant::now();
        let mut learner = Learner::default();
        learner.answered(start, start);
        for i in 1..=10 {
            learner.answered(ms(start, i * 100), ms(start, i * 100));
        }
        learner.refused(ms(start, 1000), ms(start, 1000));
        let base = learner.rate().unwrap_or_default();
        // Not pressed: never raised.
        assert_eq!(learner.probe(ms(start, 1000) + PROBE_EVERY), None);
        let mut now = ms(start, 1000) + PROBE_EVERY;
        let mut rates = vec![base];
        for _ in 0..4 {
            learner.take(now);
            learner.take(now);
            assert!(!learner.wait(now).is_zero(), "held back");
            assert!(matches!(learner.probe(now), Some(Change::Raised { .. })));
            rates.push(learner.rate().unwrap_or_default());
            now += PROBE_EVERY;
        }
        // 5 %, 10 %, 20 %, 40 %: doubled in four raises.
        let steps: Vec<f64> = rates.windows(2).map(|w| w[1] / w[0] - 1.0).collect();
        for (step, want) in steps.iter().zip([0.05, 0.1, 0.2, 0.4]) {
            assert!((step - want).abs() < 1e-9, "{steps:?}");
        }
        assert!(rates[4] > 2.0 * base * 0.95, "{rates:?}");
        // A refusal resets the step.
        for i in 0..50 {
            learner.answered(now - Duration::from_millis(i * 10), now);
        }
        assert!(matches!(
            learner.refused(now, now + Duration::from_millis(1)),
            Some(Change::Lowered { .. })
        ));
    }
}
