//! The sim's rate limits, as the API's limiter keeps them (docs/contracts.md, "The sim's rate
//! limits"): one token bucket per limit, holding at most N and refilling continuously over
//! `per`. A request is admitted when every bucket holds what it costs — one request, its
//! uncached input tokens (cache reads do not count), its output tokens — and takes it then; a
//! refused request takes nothing and is told when the buckets will hold enough.
//!
//! The sim knows its reply when it admits a request, so it charges the output it will produce;
//! the API charges `max_tokens` and corrects at the end. A request that costs more than a
//! bucket's whole capacity is admitted once that bucket is full (it then owes the difference),
//! so that no request waits forever.

use std::str::FromStr;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Quota, RateLimits};

/// The limits a sim enforces: `requests=N,input_tokens=N,output_tokens=N,per=1s|1m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitSpec {
    pub requests: Option<u64>,
    /// Uncached input tokens: `input_tokens` plus `cache_creation_input_tokens`.
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The time over which an empty bucket fills again.
    pub per: Duration,
}

impl FromStr for RateLimitSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut spec = Self {
            requests: None,
            input_tokens: None,
            output_tokens: None,
            per: Duration::from_secs(60),
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
                other => {
                    return Err(format!(
                        "unknown limit {other:?} (requests, input_tokens, output_tokens, per)"
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

/// One limit's bucket.
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

/// The buckets of one sim.
#[derive(Debug)]
pub(crate) struct Limiter {
    requests: Option<Bucket>,
    input_tokens: Option<Bucket>,
    output_tokens: Option<Bucket>,
}

impl Limiter {
    pub(crate) fn new(spec: &RateLimitSpec, now: Instant) -> Self {
        let bucket = |n: Option<u64>| n.map(|n| Bucket::full(n, spec.per, now));
        Self {
            requests: bucket(spec.requests),
            input_tokens: bucket(spec.input_tokens),
            output_tokens: bucket(spec.output_tokens),
        }
    }

    fn buckets(&mut self, cost: Cost) -> [(Option<&mut Bucket>, u64); 3] {
        [
            (self.requests.as_mut(), 1),
            (self.input_tokens.as_mut(), cost.input_tokens),
            (self.output_tokens.as_mut(), cost.output_tokens),
        ]
    }

    /// How long until a request of this cost would be admitted: zero when it is now.
    pub(crate) fn wait(&mut self, cost: Cost, now: Instant) -> Duration {
        self.buckets(cost)
            .into_iter()
            .filter_map(|(b, n)| Some(b?.wait(n, now)))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Takes an admitted request's cost.
    pub(crate) fn take(&mut self, cost: Cost, now: Instant) {
        for (bucket, n) in self.buckets(cost) {
            if let Some(b) = bucket {
                b.take(n, now);
            }
        }
    }

    /// The limits as the API states them in its headers.
    pub(crate) fn limits(&self, now: Instant) -> RateLimits {
        RateLimits {
            requests: self.requests.map(|b| b.quota(now)),
            tokens: None,
            input_tokens: self.input_tokens.map(|b| b.quota(now)),
            output_tokens: self.output_tokens.map(|b| b.quota(now)),
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
}
