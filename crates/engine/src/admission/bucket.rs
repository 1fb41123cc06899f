//! What the limiter knows of a provider's limits: one token bucket per limit the provider's
//! headers stated, kept in step with what it says.
//!
//! A bucket holds what the limit still admits. It is charged when a request is admitted, with
//! the request's estimated cost, and corrected when the usage comes back. Each response's
//! headers bring it down to what the provider says remains (never up: the provider counted
//! only the requests it had seen, and another daemon on the same key spends from the same
//! limit), and teach its capacity and refill rate.
//!
//! The rate: a bucket that is missing `limit − remaining` and full again after `reset` refills
//! at `(limit − remaining) / reset`. `remaining` is rounded down, so each response gives a lower
//! bound `(limit − remaining − 1) / reset` and an upper bound `(limit − remaining) / reset`; the
//! bucket takes the smallest upper bound seen (a bucket that is not pressed gives lower bounds
//! near zero, while upper bounds close in on the rate from above), never under the largest
//! lower bound, and never less than the limit per minute (every provider here states limits
//! that refill within a minute; Anthropic's limits are per minute). A limit that changes
//! starts the bounds again.

use std::time::Duration;

use forkd_provider::{Quota, RateLimits};
use tokio::time::Instant;

/// What one request costs: one request, its uncached input tokens, its output tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Cost {
    pub input_tokens: f64,
    pub output_tokens: f64,
}

/// One limit as the limiter keeps it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Learned {
    capacity: f64,
    level: f64,
    at: Instant,
    /// Refill per second, and the bounds it was chosen from.
    rate: f64,
    lower: f64,
    upper: f64,
}

impl Learned {
    fn new(q: &Quota, now: Instant) -> Self {
        let mut b = Self {
            capacity: q.limit as f64,
            level: q.remaining as f64,
            at: now,
            rate: 0.0,
            lower: 0.0,
            upper: f64::INFINITY,
        };
        b.learn_rate(q);
        b
    }

    fn learn_rate(&mut self, q: &Quota) {
        let reset = q.reset.as_secs_f64();
        let missing = q.limit.saturating_sub(q.remaining) as f64;
        if reset > 0.0 && missing > 0.0 {
            self.lower = self.lower.max((missing - 1.0) / reset);
            self.upper = self.upper.min(missing / reset);
        }
        let per_minute = self.capacity / 60.0;
        // The tightest upper bound: a bucket near full (a limit not yet pressed) gives a lower
        // bound near zero, while the smallest of many upper bounds closes in on the rate.
        let rate = if self.upper.is_finite() {
            self.upper.max(self.lower)
        } else {
            self.lower
        };
        self.rate = rate.max(per_minute).max(f64::MIN_POSITIVE);
    }

    fn level(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.level + elapsed * self.rate).min(self.capacity)
    }

    fn observe(&mut self, q: &Quota, now: Instant) {
        if q.limit as f64 != self.capacity {
            *self = Self::new(q, now);
            return;
        }
        self.level = self.level(now).min(q.remaining as f64);
        self.at = now;
        self.learn_rate(q);
    }

    /// How long until the bucket holds `n` (at most its capacity, so that a request bigger
    /// than the whole limit still goes, once it is full).
    fn wait(&self, n: f64, now: Instant) -> Duration {
        let need = n.min(self.capacity);
        let missing = need - self.level(now);
        if missing <= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(missing / self.rate).unwrap_or(Duration::MAX)
        }
    }

    /// Takes `n` (gives back, when negative).
    fn take(&mut self, n: f64, now: Instant) {
        self.level = (self.level(now) - n).min(self.capacity);
        self.at = now;
    }
}

/// Every limit learned for one key.
#[derive(Debug, Default)]
pub(super) struct Buckets {
    requests: Option<Learned>,
    tokens: Option<Learned>,
    input_tokens: Option<Learned>,
    output_tokens: Option<Learned>,
}

impl Buckets {
    /// Whether any limit is known.
    pub(super) fn known(&self) -> bool {
        self.requests.is_some()
            || self.tokens.is_some()
            || self.input_tokens.is_some()
            || self.output_tokens.is_some()
    }

    pub(super) fn observe(&mut self, limits: &RateLimits, now: Instant) {
        let pairs = [
            (&mut self.requests, limits.requests),
            (&mut self.tokens, limits.tokens),
            (&mut self.input_tokens, limits.input_tokens),
            (&mut self.output_tokens, limits.output_tokens),
        ];
        for (bucket, quota) in pairs {
            let Some(q) = quota else { continue };
            match bucket {
                Some(b) => b.observe(&q, now),
                None => *bucket = Some(Learned::new(&q, now)),
            }
        }
    }

    fn each(&mut self, cost: Cost, requests: f64) -> [(Option<&mut Learned>, f64); 4] {
        [
            (self.requests.as_mut(), requests),
            (self.tokens.as_mut(), cost.input_tokens + cost.output_tokens),
            (self.input_tokens.as_mut(), cost.input_tokens),
            (self.output_tokens.as_mut(), cost.output_tokens),
        ]
    }

    /// How long until every bucket holds what a request of `cost` takes.
    pub(super) fn wait(&mut self, cost: Cost, now: Instant) -> Duration {
        self.each(cost, 1.0)
            .into_iter()
            .filter_map(|(b, n)| Some(b?.wait(n, now)))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    pub(super) fn take(&mut self, cost: Cost, now: Instant) {
        for (bucket, n) in self.each(cost, 1.0) {
            if let Some(b) = bucket {
                b.take(n, now);
            }
        }
    }

    /// Corrects a charge: `delta` more tokens than were charged (fewer when negative); no
    /// request is added.
    pub(super) fn correct(&mut self, delta: Cost, now: Instant) {
        for (bucket, n) in self.each(delta, 0.0) {
            if let Some(b) = bucket
                && n != 0.0
            {
                b.take(n, now);
            }
        }
    }

    /// Gives a request's whole charge back (it was never sent).
    pub(super) fn refund(&mut self, cost: Cost, now: Instant) {
        for (bucket, n) in self.each(cost, 1.0) {
            if let Some(b) = bucket {
                b.take(-n, now);
            }
        }
    }

    /// The refill rates per second, by limit, for the metrics.
    pub(super) fn rates(&self) -> [(&'static str, Option<f64>); 4] {
        [
            ("requests", self.requests.map(|b| b.rate)),
            ("tokens", self.tokens.map(|b| b.rate)),
            ("input_tokens", self.input_tokens.map(|b| b.rate)),
            ("output_tokens", self.output_tokens.map(|b| b.rate)),
        ]
    }

    /// Each known limit: its name, its refill per second and its capacity.
    pub(super) fn paced(&self) -> Vec<(&'static str, f64, f64)> {
        [
            ("requests", self.requests),
            ("tokens", self.tokens),
            ("input_tokens", self.input_tokens),
            ("output_tokens", self.output_tokens),
        ]
        .into_iter()
        .filter_map(|(name, b)| b.map(|b| (name, b.rate, b.capacity)))
        .collect()
    }

    /// What the limits are, for messages: `requests 50/s, input_tokens 400000/s`.
    pub(super) fn describe(&self) -> String {
        let parts: Vec<String> = [
            ("requests", self.requests),
            ("tokens", self.tokens),
            ("input tokens", self.input_tokens),
            ("output tokens", self.output_tokens),
        ]
        .into_iter()
        .filter_map(|(name, b)| {
            let b = b?;
            Some(format!(
                "{name} {} (about {:.0} a minute)",
                b.capacity,
                b.rate * 60.0
            ))
        })
        .collect();
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limit: u64, remaining: u64, reset_ms: u64) -> Quota {
        Quota {
            limit,
            remaining,
            reset: Duration::from_millis(reset_ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_learns_its_rate_and_follows_the_provider_down_only() {
        let now = Instant::now();
        let mut b = Learned::new(&quota(50, 49, 20), now);
        // 1 missing, back in 20 ms: at most 50/s.
        assert!((b.rate - 50.0).abs() < 1e-9, "{}", b.rate);
        b.observe(&quota(50, 10, 820), now);
        // 40 missing in 0.82 s: between 39/0.82 and 40/0.82 a second.
        let rate = 40.0 / 0.82;
        assert!((b.rate - rate).abs() < 1e-9, "{}", b.rate);
        assert_eq!(b.level(now), 10.0);
        // The provider says more remains than we think: we keep ours.
        b.take(5.0, now);
        b.observe(&quota(50, 10, 800), now);
        assert_eq!(b.level(now), 5.0);
        // Waiting for 10: 5 missing.
        let wait = b.wait(10.0, now).as_secs_f64();
        assert!((wait - 5.0 / rate).abs() < 1e-6, "{wait}");
        // More than the whole bucket waits for a full one only.
        let full = b.wait(500.0, now).as_secs_f64();
        assert!((full - 45.0 / rate).abs() < 1e-6, "{full}");
        // Bounds that cross (a reset rounded the other way) keep the lower one.
        b.observe(&quota(50, 20, 700), now);
        assert!((b.rate - 39.0 / 0.8).abs() < 1e-9, "{}", b.rate);
        // Nothing pressed, nothing stated: the limit per minute.
        let idle = Learned::new(&quota(60, 60, 0), now);
        assert!((idle.rate - 1.0).abs() < 1e-9, "{}", idle.rate);
        // A new limit starts again.
        b.observe(&quota(100, 100, 0), now);
        assert_eq!((b.capacity, b.level(now)), (100.0, 100.0));
    }

    #[tokio::test(start_paused = true)]
    async fn buckets_charge_correct_and_refund() {
        let now = Instant::now();
        let mut buckets = Buckets::default();
        assert!(!buckets.known());
        let cost = Cost {
            input_tokens: 100.0,
            output_tokens: 1000.0,
        };
        assert_eq!(buckets.wait(cost, now), Duration::ZERO, "nothing known");
        buckets.observe(
            &RateLimits {
                requests: Some(quota(10, 10, 0)),
                input_tokens: Some(quota(600, 600, 0)),
                ..RateLimits::default()
            },
            now,
        );
        assert!(buckets.known());
        for _ in 0..6 {
            assert_eq!(buckets.wait(cost, now), Duration::ZERO);
            buckets.take(cost, now);
        }
        // 600 input tokens spent: the next waits for 100 at 10 a second.
        assert_eq!(buckets.wait(cost, now), Duration::from_secs(10));
        // The usage said each read 80 from cache: 480 come back.
        buckets.correct(
            Cost {
                input_tokens: -480.0,
                output_tokens: 0.0,
            },
            now,
        );
        assert_eq!(buckets.wait(cost, now), Duration::ZERO);
        buckets.refund(cost, now);
        let requests = buckets.requests.map(|b| b.level(now));
        assert_eq!(requests, Some(5.0));
    }
}
