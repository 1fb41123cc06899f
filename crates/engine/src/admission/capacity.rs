//! What each key's limiter believes now (`GetCapacity`, `forkctl capacity`): the limits it
//! paces by and where each came from, what is in flight and waiting, the requests throttled,
//! and the refusals of the last minute.

use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, lock};

/// Where a limit the limiter paces by came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    /// The provider's rate headers stated it (capacity, remaining, reset).
    Headers,
    /// Learned from the provider's refusals: the rate it admitted.
    Refusals,
    /// The slow start of a key nothing is known of yet: a guess, doubled while it holds.
    Start,
}

impl LimitSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Headers => "headers",
            Self::Refusals => "refusals",
            Self::Start => "start",
        }
    }
}

/// One limit a key is paced by.
#[derive(Debug, Clone, PartialEq)]
pub struct PacedLimit {
    /// `requests`, `tokens`, `input_tokens` or `output_tokens`.
    pub name: &'static str,
    /// What it refills by, per second.
    pub per_second: f64,
    /// The most it lets go at once.
    pub burst: f64,
    pub source: LimitSource,
}

/// One key's limiter as it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyCapacity {
    pub provider: &'static str,
    /// The provider's base URL (empty for the embedded sim).
    pub endpoint: String,
    pub model: String,
    /// Each limit it paces by; none while the provider has stated and refused nothing.
    pub limits: Vec<PacedLimit>,
    /// The concurrency window (it halves on overload).
    pub concurrency: f64,
    pub in_flight: usize,
    pub waiting: usize,
    /// Requests waiting to go again after a refusal.
    pub throttled: usize,
    /// Refusals for a limit over the last minute.
    pub refusals_last_minute: usize,
    /// How long every request of the key is still held by a `retry-after`.
    pub paused_for: Duration,
}

impl Admission {
    /// Every key this daemon has sent requests through, ordered by provider, endpoint, model.
    pub(crate) fn capacity(&self) -> Vec<KeyCapacity> {
        let keys: Vec<_> = lock(&self.keys).values().cloned().collect();
        let now = Instant::now();
        let mut out: Vec<KeyCapacity> = keys
            .iter()
            .map(|key| {
                let mut s = key.state();
                let mut limits: Vec<PacedLimit> = s
                    .buckets
                    .paced()
                    .into_iter()
                    .map(|(name, per_second, burst)| PacedLimit {
                        name,
                        per_second,
                        burst,
                        source: LimitSource::Headers,
                    })
                    .collect();
                let learned = [
                    (s.learner.rate(), LimitSource::Refusals),
                    (s.learner.starting(), LimitSource::Start),
                ];
                for (rate, source) in learned {
                    if let Some(rate) = rate {
                        limits.push(PacedLimit {
                            name: "requests",
                            per_second: rate,
                            burst: 1.0,
                            source,
                        });
                    }
                }
                KeyCapacity {
                    provider: key.name.credential.provider,
                    endpoint: key.name.credential.endpoint.clone(),
                    model: key.name.model.clone(),
                    limits,
                    concurrency: s.window,
                    in_flight: s.in_flight,
                    waiting: s.queue.len(),
                    throttled: s.throttled,
                    refusals_last_minute: s.learner.recent_refusals(now),
                    paused_for: s
                        .paused_until
                        .map_or(Duration::ZERO, |u| u.saturating_duration_since(now)),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            (a.provider, &a.endpoint, &a.model).cmp(&(b.provider, &b.endpoint, &b.model))
        });
        out
    }
}
