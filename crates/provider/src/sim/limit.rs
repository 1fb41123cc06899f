//! The sim's rate limits (docs/contracts.md, "The sim's rate limits"): one meter per limit, as
//! providers and the gateways in front of them keep them, so that the daemon's limiter can be
//! tried against each without a network:
//!
//! - `token-bucket` (the default, as Anthropic documents its limits): holds at most N and refills
//!   continuously over `per`;
//! - `sliding-window`: at most N within any span of `per` (what was admitted more than `per`
//!   ago no longer counts), as many gateways and proxies count;
//! - `fixed-window`: at most N within each window of `per`, counted from the first request and
//!   starting from nothing at each window's start (nginx-style counters, per-minute quotas).
//!
//! A request is admitted when every meter has room for what it costs — one request, its
//! uncached input tokens (cache reads do not count), its output tokens — and takes it then; a
//! refused request takes nothing and is told when there will be room. What the sim tells is
//! the `headers` mode: `anthropic` states every limit on each response (and on a refusal) and
//! gives `retry-after`; `retry-after-only` gives only `retry-after` on a refusal; `none` gives
//! neither.
//!
//! The sim knows its reply when it admits a request, so it charges the output it will produce;
//! the API charges `max_tokens` and corrects at the end. A request that costs more than a
//! limit's whole capacity is admitted once that meter is empty of others (it then owes the
//! difference), so that no request waits forever.

use std::collections::VecDeque;
use std::str::FromStr;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Quota, RateLimits};

/// How a sim counts what it admitted against a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    #[default]
    TokenBucket,
    SlidingWindow,
    FixedWindow,
}

/// What a sim tells a client of its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderMode {
    /// Anthropic's `anthropic-ratelimit-*` on every response, and `retry-after` on a 429.
    #[default]
    Anthropic,
    /// Only `retry-after`, on a 429.
    RetryAfterOnly,
    /// Nothing: a bare 429.
    None,
}

/// The limits a sim enforces:
/// `requests=N,input_tokens=N,output_tokens=N,per=1s|1m,algorithm=A,headers=H`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitSpec {
    pub requests: Option<u64>,
    /// Uncached input tokens: `input_tokens` plus `cache_creation_input_tokens`.
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The time over which an empty bucket fills again, or a window's length.
    pub per: Duration,
    pub algorithm: Algorithm,
    pub headers: HeaderMode,
}

impl FromStr for RateLimitSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut spec = Self {
            requests: None,
            input_tokens: None,
            output_tokens: None,
            per: Duration::from_secs(60),
            algorithm: Algorithm::default(),
            headers: HeaderMode::default(),
        };
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not KEY=VALUE"))?;
            let count = || match value.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => Err(format!("{key}: {value:?} is not a positive whole number")),
            };
            match key.trim() {
                "requests" => spec.requests = count()?,
                "input_tokens" => spec.input_tokens = count()?,
                "output_tokens" => spec.output_tokens = count()?,
                "per" => {
                    spec.per = match value.trim() {
                        "1s" => Duration::from_secs(1),
                        "1m" => Duration::from_secs(60),
                        other => return Err(format!("per: {other:?} is not 1s or 1m")),
                    }
                }
                "algorithm" => {
                    spec.algorithm = match value.trim() {
                        "token-bucket" => Algorithm::TokenBucket,
                        "sliding-window" => Algorithm::SlidingWindow,
                        "fixed-window" => Algorithm::FixedWindow,
                        other => {
                            return Err(format!(
                                "algorithm: {other:?} is not token-bucket, sliding-window or \
                                 fixed-window"
                            ));
                        }
                    }
                }
                "headers" => {
                    spec.headers = match value.trim() {
                        "anthropic" => HeaderMode::Anthropic,
                        "retry-after-only" => HeaderMode::RetryAfterOnly,
                        "none" => HeaderMode::None,
                        other => {
                            return Err(format!(
                                "headers: {other:?} is not anthropic, retry-after-only or none"
                            ));
                        }
                    }
                }
                other => {
                    return Err(format!(
                        "unknown setting {other:?} (requests, input_tokens, output_tokens, per, \
                         algorithm, headers)"
                    ));
                }
            }
        }
        if spec.requests.is_none() && spec.input_tokens.is_none() && spec.output_tokens.is_none() {
            return Err("no limit given (requests=N, input_tokens=N or output_tokens=N)".into());
        }
        Ok(spec)
    }
}

/// What one request costs against each limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cost {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One limit's token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    capacity: f64,
    /// What it held at `at` (negative while a request bigger than the bucket is paid off).
    level: f64,
    at: Instant,
    per: Duration,
}

impl Bucket {
    fn full(capacity: u64, per: Duration, now: Instant) -> Self {
        Self {
            capacity: capacity as f64,
            level: capacity as f64,
            at: now,
            per,
        }
    }

    fn rate(&self) -> f64 {
        self.capacity / self.per.as_secs_f64()
    }

    fn level(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.level + elapsed * self.rate()).min(self.capacity)
    }

    /// How long until the bucket holds `n` (at most its capacity).
    fn wait(&self, n: u64, now: Instant) -> Duration {
        let need = (n as f64).min(self.capacity);
        let missing = need - self.level(now);
        if missing <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(missing / self.rate())
        }
    }

    fn take(&mut self, n: u64, now: Instant) {
        self.level = self.level(now) - n as f64;
        self.at = now;
    }

    fn quota(&self, now: Instant) -> Quota {
        let level = self.level(now);
        Quota {
            limit: self.capacity as u64,
            remaining: level.max(0.0).floor() as u64,
            reset: Duration::from_secs_f64(((self.capacity - level) / self.rate()).max(0.0)),
        }
    }
}

/// One limit counted over the last `per`: what was admitted, when.
#[derive(Debug, Clone)]
struct Sliding {
    capacity: u64,
    per: Duration,
    admitted: VecDeque<(Instant, u64)>,
    /// The sum of `admitted`.
    used: u64,
}

impl Sliding {
    /// Forgets what was admitted `per` ago or more.
    fn prune(&mut self, now: Instant) {
        while let Some(&(at, n)) = self.admitted.front() {
            if at + self.per > now {
                break;
            }
            self.used -= n;
            self.admitted.pop_front();
        }
    }

    fn wait(&mut self, n: u64, now: Instant) -> Duration {
        self.prune(now);
        let need = n.min(self.capacity);
        let mut used = self.used;
        for &(at, taken) in &self.admitted {
            if used + need <= self.capacity {
                break;
            }
            used -= taken;
            if used + need <= self.capacity {
                return (at + self.per).saturating_duration_since(now);
            }
        }
        Duration::ZERO
    }

    fn take(&mut self, n: u64, now: Instant) {
        self.prune(now);
        self.admitted.push_back((now, n));
        self.used += n;
    }

    fn quota(&mut self, now: Instant) -> Quota {
        self.prune(now);
        Quota {
            limit: self.capacity,
            remaining: self.capacity.saturating_sub(self.used),
            // When all of it is free again: the newest admission leaves the window.
            reset: self.admitted.back().map_or(Duration::ZERO, |&(at, _)| {
                (at + self.per).saturating_duration_since(now)
            }),
        }
    }
}

/// One limit counted per window of `per`, the first starting at `origin`.
#[derive(Debug, Clone, Copy)]
struct Fixed {
    capacity: u64,
    per: Duration,
    origin: Instant,
    window: u128,
    used: u64,
}

impl Fixed {
    /// Moves to the window `now` is in, which starts from nothing.
    fn roll(&mut self, now: Instant) {
        let window = now.saturating_duration_since(self.origin).as_nanos() / self.per.as_nanos();
        if window != self.window {
            self.window = window;
            self.used = 0;
        }
    }

    fn next_window(&self, now: Instant) -> Duration {
        let ends = self.per.as_nanos() * (self.window + 1);
        let ends = Duration::from_nanos(u64::try_from(ends).unwrap_or(u64::MAX));
        (self.origin + ends).saturating_duration_since(now)
    }

    fn wait(&mut self, n: u64, now: Instant) -> Duration {
        self.roll(now);
        let need = n.min(self.capacity);
        if self.used + need <= self.capacity {
            Duration::ZERO
        } else {
            self.next_window(now)
        }
    }

    fn take(&mut self, n: u64, now: Instant) {
        self.roll(now);
        self.used += n;
    }

    fn quota(&mut self, now: Instant) -> Quota {
        self.roll(now);
        Quota {
            limit: self.capacity,
            remaining: self.capacity.saturating_sub(self.used),
            reset: self.next_window(now),
        }
    }
}

/// One limit, counted as its algorithm says.
#[derive(Debug, Clone)]
enum Meter {
    Bucket(Bucket),
    Sliding(Sliding),
    Fixed(Fixed),
}

impl Meter {
    fn new(algorithm: Algorithm, capacity: u64, per: Duration, now: Instant) -> Self {
        match algorithm {
            Algorithm::TokenBucket => Self::Bucket(Bucket::full(capacity, per, now)),
            Algorithm::SlidingWindow => Self::Sliding(Sliding {
                capacity,
                per,
                admitted: VecDeque::new(),
                used: 0,
            }),
            Algorithm::FixedWindow => Self::Fixed(Fixed {
                capacity,
                per,
                origin: now,
                window: 0,
                used: 0,
            }),
        }
    }

    fn wait(&mut self, n: u64, now: Instant) -> Duration {
        match self {
            Self::Bucket(b) => b.wait(n, now),
            Self::Sliding(s) => s.wait(n, now),
            Self::Fixed(f) => f.wait(n, now),
        }
    }

    fn take(&mut self, n: u64, now: Instant) {
        match self {
            Self::Bucket(b) => b.take(n, now),
            Self::Sliding(s) => s.take(n, now),
            Self::Fixed(f) => f.take(n, now),
        }
    }

    fn quota(&mut self, now: Instant) -> Quota {
        match self {
            Self::Bucket(b) => b.quota(now),
            Self::Sliding(s) => s.quota(now),
            Self::Fixed(f) => f.quota(now),
        }
    }
}

/// The meters of one sim.
#[derive(Debug)]
pub(crate) struct Limiter {
    requests: Option<Meter>,
    input_tokens: Option<Meter>,
    output_tokens: Option<Meter>,
}

impl Limiter {
    pub(crate) fn new(spec: &RateLimitSpec, now: Instant) -> Self {
        let meter = |n: Option<u64>| n.map(|n| Meter::new(spec.algorithm, n, spec.per, now));
        Self {
            requests: meter(spec.requests),
            input_tokens: meter(spec.input_tokens),
            output_tokens: meter(spec.output_tokens),
        }
    }

    fn meters(&mut self, cost: Cost) -> [(Option<&mut Meter>, u64); 3] {
        [
            (self.requests.as_mut(), 1),
            (self.input_tokens.as_mut(), cost.input_tokens),
            (self.output_tokens.as_mut(), cost.output_tokens),
        ]
    }

    /// How long until a request of this cost would be admitted: zero when it is now.
    pub(crate) fn wait(&mut self, cost: Cost, now: Instant) -> Duration {
        self.meters(cost)
            .into_iter()
            .filter_map(|(m, n)| Some(m?.wait(n, now)))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Takes an admitted request's cost.
    pub(crate) fn take(&mut self, cost: Cost, now: Instant) {
        for (meter, n) in self.meters(cost) {
            if let Some(m) = meter {
                m.take(n, now);
            }
        }
    }

    /// The limits as the API states them in its headers.
    pub(crate) fn limits(&mut self, now: Instant) -> RateLimits {
        RateLimits {
            requests: self.requests.as_mut().map(|m| m.quota(now)),
            tokens: None,
            input_tokens: self.input_tokens.as_mut().map(|m| m.quota(now)),
            output_tokens: self.output_tokens.as_mut().map(|m| m.quota(now)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn specs_parse_and_refuse_what_they_cannot_mean() {
        let spec: RateLimitSpec = "requests=20, input_tokens=400000,per=1s".parse().unwrap();
        assert_eq!(
            spec,
            RateLimitSpec {
                requests: Some(20),
                input_tokens: Some(400_000),
                output_tokens: None,
                per: Duration::from_secs(1),
                algorithm: Algorithm::TokenBucket,
                headers: HeaderMode::Anthropic,
            }
        );
        assert_eq!(
            "output_tokens=8000".parse::<RateLimitSpec>().map(|s| s.per),
            Ok(Duration::from_secs(60)),
            "per defaults to a minute, as the API's limits are"
        );
        for bad in [
            "",
            "per=1s",
            "requests=0",
            "requests=-1",
            "requests",
            "rpm=5",
            "requests=5,per=2h",
            "requests=5,algorithm=leaky",
            "requests=5,headers=openai",
        ] {
            assert!(bad.parse::<RateLimitSpec>().is_err(), "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn buckets_refill_continuously_and_refusals_take_nothing() {
        let spec: RateLimitSpec = "requests=2,input_tokens=100,per=1s".parse().unwrap();
        let start = Instant::now();
        let mut limiter = Limiter::new(&spec, start);
        let cost = Cost {
            input_tokens: 40,
            output_tokens: 7,
        };
        for _ in 0..2 {
            assert_eq!(limiter.wait(cost, start), Duration::ZERO);
            limiter.take(cost, start);
        }
        // Both requests spent; 20 tokens left.
        assert_eq!(limiter.wait(cost, start), Duration::from_millis(500));
        let limits = limiter.limits(start);
        assert_eq!(
            limits.requests,
            Some(Quota {
                limit: 2,
                remaining: 0,
                reset: Duration::from_secs(1)
            })
        );
        assert_eq!(limits.input_tokens.map(|q| q.remaining), Some(20));
        assert_eq!(limits.output_tokens, None);
        // Asking again took nothing.
        assert_eq!(limiter.wait(cost, start), Duration::from_millis(500));
        let later = start + Duration::from_millis(500);
        assert_eq!(limiter.wait(cost, later), Duration::ZERO);
        // A request over the whole bucket waits for a full bucket, then owes the rest.
        let huge = Cost {
            input_tokens: 250,
            output_tokens: 0,
        };
        let full = start + Duration::from_secs(1);
        assert_eq!(limiter.wait(huge, full), Duration::ZERO);
        limiter.take(huge, full);
        assert_eq!(
            limiter.limits(full).input_tokens.map(|q| q.remaining),
            Some(0)
        );
        let owed = limiter.wait(cost, full).as_secs_f64();
        assert!(
            (owed - 1.9).abs() < 1e-6,
            "190 tokens at 100 a second: {owed}"
        );
    }

    #[test]
    fn algorithms_and_header_modes_parse() {
        let spec: RateLimitSpec = "requests=20,per=1s,algorithm=sliding-window,headers=none"
            .parse()
            .unwrap();
        assert_eq!(spec.algorithm, Algorithm::SlidingWindow);
        assert_eq!(spec.headers, HeaderMode::None);
        let spec: RateLimitSpec = "requests=20,algorithm=fixed-window,headers=retry-after-only"
            .parse()
            .unwrap();
        assert_eq!(
            (spec.algorithm, spec.headers),
            (Algorithm::FixedWindow, HeaderMode::RetryAfterOnly)
        );
    }

    fn requests(text: &str, start: Instant) -> Limiter {
        Limiter::new(&text.parse().unwrap(), start)
    }

    const ONE: Cost = Cost {
        input_tokens: 0,
        output_tokens: 0,
    };

    /// Takes `n` requests at `at`, each admitted.
    fn admit(limiter: &mut Limiter, n: usize, at: Instant) {
        for _ in 0..n {
            assert_eq!(limiter.wait(ONE, at), Duration::ZERO);
            limiter.take(ONE, at);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sliding_window_counts_the_last_period_whatever_its_phase() {
        let start = Instant::now();
        let ms = |n: u64| start + Duration::from_millis(n);
        let mut limiter = requests("requests=4,per=1s,algorithm=sliding-window", start);
        admit(&mut limiter, 2, start);
        admit(&mut limiter, 2, ms(600));
        // Full: the first two leave the window at 1000 ms.
        assert_eq!(limiter.wait(ONE, ms(700)), Duration::from_millis(300));
        let stated = limiter.limits(ms(700)).requests.unwrap();
        assert_eq!(
            (stated.remaining, stated.reset),
            (0, Duration::from_millis(900))
        );
        // A token bucket would have refilled 2.8 requests by now; the window has room for 2.
        admit(&mut limiter, 2, ms(1000));
        assert_eq!(limiter.wait(ONE, ms(1000)), Duration::from_millis(600));
        // At 1600 ms the two of 600 ms leave.
        admit(&mut limiter, 2, ms(1600));
        assert_eq!(limiter.wait(ONE, ms(1600)), Duration::from_millis(400));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_window_starts_from_nothing_at_each_window() {
        let start = Instant::now();
        let ms = |n: u64| start + Duration::from_millis(n);
        let mut limiter = requests("requests=3,per=1s,algorithm=fixed-window", start);
        admit(&mut limiter, 3, ms(900));
        assert_eq!(limiter.wait(ONE, ms(950)), Duration::from_millis(50));
        let stated = limiter.limits(ms(950)).requests.unwrap();
        assert_eq!(
            (stated.remaining, stated.reset),
            (0, Duration::from_millis(50))
        );
        // A new window: three more at once, six within 200 ms (the burst windows allow).
        admit(&mut limiter, 3, ms(1000));
        assert_eq!(limiter.wait(ONE, ms(1999)), Duration::from_millis(1));
        admit(&mut limiter, 3, ms(2500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_bigger_than_a_window_goes_once_the_window_is_empty() {
        let start = Instant::now();
        let mut limiter = Limiter::new(
            &"input_tokens=100,per=1s,algorithm=sliding-window"
                .parse()
                .unwrap(),
            start,
        );
        let small = Cost {
            input_tokens: 10,
            output_tokens: 0,
        };
        let huge = Cost {
            input_tokens: 250,
            output_tokens: 0,
        };
        limiter.take(small, start);
        assert_eq!(limiter.wait(huge, start), Duration::from_secs(1));
        let later = start + Duration::from_secs(1);
        assert_eq!(limiter.wait(huge, later), Duration::ZERO);
        limiter.take(huge, later);
        assert_eq!(limiter.wait(small, later), Duration::from_secs(1));
    }
}
