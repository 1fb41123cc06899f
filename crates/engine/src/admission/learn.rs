//! What the limiter learns from refusals, for providers whose limits are not the token bucket
//! their headers describe, or that state none (docs/operations.md, "The provider limiter").
//!
//! A 429 is evidence that the key sent faster than the provider admits, whatever the headers
//! said. The limiter then measures the rate the provider *did* admit — the requests that went
//! and were answered, over the last half second, second, two, four … a minute (no further back
//! than the pace's last change, nor than the end of the key's last pause: a window counts the
//! pause as time the key sent nothing), the least of those rates — and from then on paces the
//! key to 95 % of it, one request at a time: a window-counting provider (a sliding or fixed
//! window) never sees the burst a full token bucket would send. The half second counts only
//! the time the key was sending, to see a token bucket's refill once its burst is spent. A
//! refusal lowers a pace only once the provider answered a request sent under it, and at most
//! halves it: requests in flight when it was set, and a provider refusing for other reasons, do
//! not drive it down refusal after refusal; a pace an earlier refusal set, refused again a
//! second after the key last resumed, was measured high (a fixed window's edge in the span)
//! and goes down by [`LOWER_LEAST`] at least. A rate is measured from [`MIN_ANSWERED`] answers
//! at least.
//!
//! A pace lowered once is not lowered for good: while the key keeps requests waiting on the
//! pace and nothing is refused, the pace is raised every [`PROBE_EVERY`], by a step that
//! doubles each time the provider admits the higher pace (5 %, 10 %, 20 % … of it), so a limit
//! that doubled is found in a few steps; a refusal sets the pace from the new measurement and
//! the step back to its least. A raise past the rate the last refusal measured is the one a
//! provider refuses, and each refusal costs its `retry-after` (whole seconds) for every request
//! of the key: that raise waits until the pace held for [`HOLD_FIRST`], twice as long each time
//! such a raise is refused (up to [`HOLD_MAX`]), and raises come every [`PROBE_EVERY`] again
//! once a pace past it held. With headers that describe a real token bucket, no refusal comes
//! and nothing here engages: the buckets pace alone.
//!
//! Until a provider over the network states a limit, its key starts slowly ([`START_RATE`],
//! doubled every [`START_EVERY`] while requests wait): a limit nothing states meets a few
//! requests at first, not a window's worth. The refusal that ends the start measures what was
//! admitted over the last second only: the start's slower steps before it measure the start.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The share of the measured admitted rate the key is paced to: a margin for the provider's
/// own counting (a window's phase, another client's request).
const MARGIN: f64 = 0.95;

/// How long the pace holds before it is raised, while nothing is refused.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(3);

/// How long the pace holds before it is raised past the rate the provider last refused at,
/// after the first refusal: each refusal doubles it, up to [`HOLD_MAX`]. A raise past that
/// rate is the one a provider refuses, and each refusal costs its `retry-after` (whole
/// seconds, usually) for every request of the key.
pub(super) const HOLD_FIRST: Duration = Duration::from_secs(20);
pub(super) const HOLD_MAX: Duration = Duration::from_secs(60);

/// The least and most a raise adds, as a share of the pace.
const STEP_MIN: f64 = 0.05;
const STEP_MAX: f64 = 0.8;

/// A key's first pace while nothing is known of its limits, requests per second; doubled every
/// [`START_EVERY`] while requests wait on it, until a refusal or a stated limit ends the start,
/// or it passes [`START_END`] (the provider limits nothing it would meet).
const START_RATE: f64 = 8.0;
const START_EVERY: Duration = Duration::from_millis(250);
const START_END: f64 = 10_000.0;

/// Refusals closer together than this are one: a window draining what went before the pace
/// was set refuses a few requests in a row, each measuring less than the last.
const DRAIN: Duration = Duration::from_millis(500);

/// The least a refusal lowers a pace that an earlier refusal set, as a share of it.
const LOWER_LEAST: f64 = 0.15;

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
    /// When the key's last pause (a refusal's `retry-after` or backoff) ends: what the
    /// provider admitted while the key sent nothing measures the pause, not the provider.
    resumed: Option<Instant>,
    /// The key's pauses over the last second or so, oldest first: `(from, until)`.
    pauses: VecDeque<(Instant, Instant)>,
    /// How long the pace holds before it is raised past `ceiling` ([`HOLD_FIRST`] …
    /// [`HOLD_MAX`]); `None` before any refusal.
    hold: Option<Duration>,
    /// The rate measured at the last refusal: a pace held above it for [`PROBE_EVERY`] says
    /// the limit rose, and raises come every [`PROBE_EVERY`] again.
    ceiling: Option<f64>,
    /// When `ceiling` was last set.
    ceiling_at: Option<Instant>,
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
    /// Set from a refusal's measurement (not raised).
    lowered: bool,
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
            lowered: false,
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
        // What was sent under an earlier, lower pace measures that pace, not the provider; so
        // does what was sent around a pause.
        let mut from = match self.pace {
            Some(p) => Some(p.set_at.max(self.first?)),
            None => self.first,
        };
        if let (Some(f), Some(resumed)) = (from, self.resumed) {
            from = Some(f.max(resumed.min(now)));
        }
        self.measure_since(from, now, SPAN_START)
    }

    /// A refusal that measured `measured`, at `now`. Raising past the rate refused at waits
    /// [`HOLD_FIRST`], and twice as long each time a raise past it is refused. Refusals that
    /// come close together (a window draining what went before) keep the highest.
    fn ceiling_at(&mut self, measured: f64, now: Instant) {
        let probed = self
            .pace
            .is_some_and(|p| !p.starting && self.ceiling.is_some_and(|c| p.rate > c));
        self.hold = Some(match self.hold {
            Some(h) if probed => (h * 2).min(HOLD_MAX),
            Some(h) => h,
            None => HOLD_FIRST,
        });
        self.ceiling = Some(match (self.ceiling, self.ceiling_at) {
            (Some(c), Some(at)) if now.saturating_duration_since(at) < DRAIN => c.max(measured),
            _ => measured,
        });
        self.ceiling_at = Some(now);
    }

    /// The key pauses from `now` until `until` (the provider asked it to, or it backs off).
    pub(super) fn pause(&mut self, now: Instant, until: Instant) {
        self.resumed = Some(self.resumed.map_or(until, |r| r.max(until)));
        while self
            .pauses
            .front()
            .is_some_and(|(_, end)| now.saturating_duration_since(*end) > Duration::from_secs(1))
        {
            self.pauses.pop_front();
        }
        self.pauses.push_back((now, until));
    }

    /// How long the key was paused between `since` and `now` (pauses may overlap).
    fn paused_within(&self, since: Instant, now: Instant) -> Duration {
        let mut total = Duration::ZERO;
        let mut covered = since;
        for &(start, end) in &self.pauses {
            let (start, end) = (start.max(covered), end.min(now));
            if end > start {
                total += end - start;
                covered = end;
            }
        }
        total
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
        // Spans up to a second count whatever went within them.
        let counted = from.min(now.checked_sub(Duration::from_secs(1)).unwrap_or(from));
        if self.answered.iter().filter(|t| **t >= counted).count() < MIN_ANSWERED {
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
            // A span shorter than a second measures the time the key was sending: a token
            // bucket's refill. (Longer spans begin after the last pause, as a window counts
            // the pause too.)
            let sending = if span_now < second {
                span_now.saturating_sub(self.paused_within(since, now))
            } else {
                span_now
            };
            if sending < SPAN_START / 2 {
                span *= 2;
                continue;
            }
            let rate = admitted as f64 / sending.as_secs_f64();
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
        let hold = self.hold.unwrap_or(HOLD_FIRST);
        let held = now.saturating_duration_since(pace.set_at);
        if !pace.pressed || held < PROBE_EVERY {
            return None;
        }
        match self.ceiling {
            // Held above the rate last refused: the limit rose.
            Some(c) if pace.rate > c => {
                self.ceiling = None;
                self.hold = None;
            }
            // Past the rate last refused only after holding for longer.
            Some(c) if pace.rate * (1.0 + pace.step) > c && held < hold => return None,
            _ => {}
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
            // The start found a limit: the pace is what was admitted over the last second
            // (longer spans hold the start's slower steps, which measure the start). With too
            // few answers to tell, the start just ends (`retry-after` governs).
            let second = now.checked_sub(Duration::from_secs(1));
            let admitted = self
                .answered
                .iter()
                .filter(|t| second.is_none_or(|s| **t >= s))
                .count();
            if admitted < MIN_ANSWERED {
                self.pace = None;
                return Some(Change::Started);
            }
            let measured = admitted as f64;
            let rate = measured * MARGIN;
            let mut pace = Pace::new(rate, now);
            pace.lowered = true;
            pace.level = 0.0;
            self.ceiling_at(measured, now);
            self.pace = Some(pace);
            return Some(Change::Lowered { measured, rate });
        }
        if self.pace.is_some_and(|p| sent < p.set_at || !p.tried) {
            return None;
        }
        let measured = self.measure(now)?;
        // A pace set by a refusal and refused again, not while the provider drained what went
        // before (it was sent at for a second since the key's last pause), was measured too
        // high: a window's edge in the span, a bucket's burst. It goes down by a share at
        // least, and raising it past where it goes waits the hold. And at most halved by one
        // refusal: few answers measure a rate poorly.
        let resumed = self.resumed;
        let mut ceiling = measured;
        let rate = self.pace.map_or(measured * MARGIN, |p| {
            let sent_at =
                now.saturating_duration_since(resumed.map_or(p.set_at, |r| r.max(p.set_at)));
            let mut rate = measured * MARGIN;
            if p.lowered && sent_at >= Duration::from_secs(1) {
                rate = rate.min(p.rate * (1.0 - LOWER_LEAST));
                ceiling = ceiling.min(rate);
            }
            rate.max(p.rate / 2.0)
        });
        self.ceiling_at(ceiling, now);
        let mut pace = Pace::new(rate, now);
        pace.lowered = true;
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

    /// Presses the pace at `now` (two requests ready at once), then asks for a raise.
    fn press(learner: &mut Learner, now: Instant) -> Option<Change> {
        learner.take(now);
        learner.take(now);
        assert!(!learner.wait(now).is_zero(), "held back");
        learner.probe(now)
    }

    #[tokio::test(start_paused = true)]
    async fn the_pace_is_raised_while_it_holds_the_key_back_and_nothing_is_refused() {
        let start = Instant::now();
        let mut learner = Learner::default();
        learner.answered(start, start);
        for i in 1..=10 {
            learner.answered(ms(start, i * 100), ms(start, i * 100));
        }
        let refused = ms(start, 1000);
        learner.refused(refused, refused);
        let base = learner.rate().unwrap_or_default();
        // Not pressed: never raised.
        assert_eq!(learner.probe(refused + PROBE_EVERY), None);
        // Up to the rate refused at, every PROBE_EVERY: 5 %.
        let mut now = refused + PROBE_EVERY;
        let mut rates = vec![base];
        assert!(matches!(
            press(&mut learner, now),
            Some(Change::Raised { .. })
        ));
        rates.push(learner.rate().unwrap_or_default());
        // Past it (10 % more) only once the pace held for HOLD_FIRST.
        let raised = now;
        now += PROBE_EVERY;
        assert_eq!(
            press(&mut learner, now),
            None,
            "past the refused rate too soon"
        );
        now = raised + HOLD_FIRST;
        assert!(matches!(
            press(&mut learner, now),
            Some(Change::Raised { .. })
        ));
        rates.push(learner.rate().unwrap_or_default());
        // Held past it without a refusal: the limit rose, and raises come every PROBE_EVERY.
        for _ in 0..2 {
            now += PROBE_EVERY;
            assert!(matches!(
                press(&mut learner, now),
                Some(Change::Raised { .. })
            ));
            rates.push(learner.rate().unwrap_or_default());
        }
        // 5 %, 10 %, 20 %, 40 %: doubled in four raises.
        let steps: Vec<f64> = rates.windows(2).map(|w| w[1] / w[0] - 1.0).collect();
        for (step, want) in steps.iter().zip([0.05, 0.1, 0.2, 0.4]) {
            assert!((step - want).abs() < 1e-9, "{steps:?}");
        }
        assert!(rates[4] > 2.0 * base * 0.95, "{rates:?}");
        // A refusal resets the step, and past the rate it measured waits HOLD_FIRST again
        // (the rise forgot the old hold); a raise past it refused makes that twice as long.
        let refuse = |learner: &mut Learner, now: Instant| {
            for i in 0..50 {
                learner.answered(now - Duration::from_millis(i * 10), now);
            }
            let now = now + Duration::from_millis(1);
            assert!(matches!(
                learner.refused(now, now),
                Some(Change::Lowered { .. })
            ));
            now
        };
        now = refuse(&mut learner, now);
        assert_eq!(learner.hold, Some(HOLD_FIRST));
        now += PROBE_EVERY;
        assert!(matches!(
            press(&mut learner, now),
            Some(Change::Raised { .. })
        ));
        now += HOLD_FIRST;
        assert!(matches!(
            press(&mut learner, now),
            Some(Change::Raised { .. })
        ));
        refuse(&mut learner, now + Duration::from_secs(1));
        assert_eq!(learner.hold, Some(HOLD_FIRST * 2));
    }

    /// Answers at `rate` a second from `from` for `span`, each answered as it was sent.
    fn answer(learner: &mut Learner, from: Instant, span: Duration, rate: f64) -> Instant {
        let step = Duration::from_secs_f64(1.0 / rate);
        let mut at = from;
        while at < from + span {
            learner.answered(at, at);
            at += step;
        }
        at
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_is_not_measured_as_what_the_provider_admitted() {
        // A window of 20 a second; the key paced to 19 after a refusal, sending for 2 s.
        let start = Instant::now();
        let mut learner = Learner::default();
        let now = answer(&mut learner, start, Duration::from_secs(2), 20.0);
        assert!(matches!(
            learner.refused(now, now),
            Some(Change::Lowered { .. })
        ));
        assert!((learner.rate().unwrap_or_default() - 19.0).abs() < 0.5);
        // A `retry-after` of a whole second, then 1.2 s sent at 19 a second, then a refusal:
        // the provider admitted 18 to 19 a second, not the 10 that counting the pause would say.
        let resumed = now + Duration::from_secs(1);
        learner.pause(now, resumed);
        let now = answer(&mut learner, resumed, Duration::from_millis(1200), 19.0);
        let Some(Change::Lowered { measured, .. }) = learner.refused(now, now) else {
            panic!("a pace is set");
        };
        assert!(measured >= 17.5, "{measured}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_start_is_measured_over_its_last_second() {
        // The start's steps: 8, 16, 32, then 64 a second, against a window of 50 a second.
        let start = Instant::now();
        let mut learner = Learner::default();
        learner.start(start);
        let mut at = start;
        for rate in [8.0, 16.0, 32.0] {
            at = answer(&mut learner, at, START_EVERY, rate);
        }
        let refused = answer(&mut learner, at, Duration::from_millis(550), 64.0);
        let in_last_second = learner
            .answered
            .iter()
            .filter(|t| **t >= refused - Duration::from_secs(1))
            .count() as f64;
        let Some(Change::Lowered { measured, .. }) = learner.refused(refused, refused) else {
            panic!("the start found a limit");
        };
        // Not the 1.3 s since the start, whose first steps measure the start.
        assert!((measured - in_last_second).abs() < 1e-9, "{measured}");
    }
}
