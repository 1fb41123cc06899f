//! The embedded simulated model: deterministic answers driven by `@sim` scripts, a faithful
//! prompt-cache model and a latency model (docs/contracts.md, “Prompt-cache rules”). No network.
//!
//! A request is processed when [`Provider::stream`] is called — that is the instant it is "sent":
//! scripted failures are consumed and the cache is looked up then. Its own cache writes become
//! readable only when its stream yields `message_start`, so siblings sent together all miss.
//!
//! With [`SimConfig::rate_limit`] the sim limits as the API does (`limit`): a request over a
//! limit is a 429 with `retry-after` that changes nothing (no script line consumed, no cache
//! entry refreshed), and every admitted response states the limits first
//! ([`StreamEvent::RateLimits`](crate::StreamEvent::RateLimits)).

mod cache;
mod limit;
mod reply;
mod request;
mod schema;
mod script;
mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::{EventStream, ModelRequest, Provider, ProviderError, RateLimits, StreamEvent};
use cache::PromptCache;
pub use limit::{Algorithm, HeaderMode, RateLimitSpec};
use request::BlockMemo;

/// How the sim behaves.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SimConfig {
    /// Scales the latency model: 0 streams instantly (no timers at all), 1 is realistic.
    pub speed: f64,
    /// The rate limits it enforces, as the API does; `None`: none.
    pub rate_limit: Option<RateLimitSpec>,
}

/// State shared by every request to one sim.
#[derive(Debug, Default)]
struct SimState {
    cache: PromptCache,
    /// Scripted failures already served, by (script hash, line index).
    failures: HashMap<([u8; 32], usize), u32>,
    /// The rate limits it enforces ([`SimConfig::rate_limit`], or a later
    /// [`SimProvider::set_rate_limit`]).
    rate_limit: Option<RateLimitSpec>,
    /// The rate limits' meters (made at the first request).
    limiter: Option<limit::Limiter>,
    /// The latest requests answered, oldest first.
    answered: std::collections::VecDeque<Answered>,
}

/// One request the sim answered, as tests and benchmarks check them: when, with what status
/// (200: admitted; 429: over a limit, or scripted; any other: scripted), and the end of its body
/// (where its directive or message is).
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    pub at: Instant,
    pub status: u16,
    pub tail: String,
}

/// How many answered requests the sim remembers.
const ANSWERED_KEPT: usize = 100_000;
/// How much of each request's body it keeps.
const TAIL_BYTES: usize = 512;

impl SimState {
    fn answered(&mut self, at: Instant, status: u16, body: &str) {
        if self.answered.len() == ANSWERED_KEPT {
            self.answered.pop_front();
        }
        let mut start = body.len().saturating_sub(TAIL_BYTES);
        while !body.is_char_boundary(start) {
            start += 1;
        }
        self.answered.push_back(Answered {
            at,
            status,
            tail: body[start..].to_owned(),
        });
    }
}

/// The simulated model. Clones share one cache.
#[derive(Debug, Clone, Default)]
pub struct SimProvider {
    config: SimConfig,
    state: Arc<Mutex<SimState>>,
    /// What was read from each distinct request block, so that the blocks every request repeats
    /// are parsed and counted once.
    memo: Arc<BlockMemo>,
}

fn lock(state: &Mutex<SimState>) -> MutexGuard<'_, SimState> {
    // Every update of the state is a single insert or retain, so a panic elsewhere cannot leave
    // it half-changed.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SimProvider {
    pub fn new(config: SimConfig) -> Self {
        let state = SimState {
            rate_limit: config.rate_limit,
            ..SimState::default()
        };
        Self {
            config,
            state: Arc::new(Mutex::new(state)),
            memo: Arc::default(),
        }
    }

    /// Enforces `spec` from now on, as a provider that changed a key's limit: its meters start
    /// again, full.
    pub fn set_rate_limit(&self, spec: RateLimitSpec) {
        let mut state = lock(&self.state);
        state.rate_limit = Some(spec);
        state.limiter = Some(limit::Limiter::new(&spec, Instant::now()));
    }

    /// How many prompt-cache entries are alive now (for tests and benchmarks).
    pub fn cache_entries(&self) -> usize {
        lock(&self.state).cache.live(Instant::now())
    }

    /// The latest requests it answered (up to 100 000), oldest first.
    pub fn answered(&self) -> Vec<Answered> {
        lock(&self.state).answered.iter().cloned().collect()
    }

    /// The rate limits as they stand now, as the API states them in its headers; `None` when
    /// the sim enforces none.
    pub fn rate_limits(&self) -> Option<RateLimits> {
        let mut state = lock(&self.state);
        let spec = state
            .rate_limit
            .filter(|s| s.headers == limit::HeaderMode::Anthropic)?;
        let now = Instant::now();
        Some(
            state
                .limiter
                .get_or_insert_with(|| limit::Limiter::new(&spec, now))
                .limits(now),
        )
    }

    fn speed(&self) -> f64 {
        let s = self.config.speed;
        if s.is_finite() && s > 0.0 { s } else { 0.0 }
    }

    /// Processes a request up to its first event: the timed events, and the writes to commit
    /// when `message_start` goes out.
    fn prepare(&self, request: &ModelRequest) -> Result<EventStream, ProviderError> {
        let parsed = request::parse_with(&request.body, Some(&self.memo))?;
        let mut reply = reply::reply(&parsed.messages);
        if parsed.thinking && !matches!(reply.blocks.first(), Some(reply::OutBlock::Thinking(_))) {
            // With thinking enabled a model opens every reply with a (signed) thinking block.
            reply.blocks.insert(
                0,
                reply::OutBlock::Thinking(reply::DEFAULT_THOUGHT.to_owned()),
            );
        }
        let now = Instant::now();
        let (lookup, limits) = {
            let mut state = lock(&self.state);
            let lookup = state
                .cache
                .peek(&parsed.blocks, parsed.model.min_cache_tokens, now);
            let cost = limit::Cost {
                input_tokens: lookup.usage.input_tokens + lookup.usage.cache_creation_input_tokens,
                output_tokens: stream::output_tokens(&reply.blocks),
            };
            let spec = state.rate_limit;
            if let Some(spec) = &spec {
                let limiter = state
                    .limiter
                    .get_or_insert_with(|| limit::Limiter::new(spec, now));
                let wait = limiter.wait(cost, now);
                if !wait.is_zero() {
                    state.answered(now, 429, &request.body);
                    return Err(ProviderError::Status {
                        status: 429,
                        message: format!(
                            "sim: rate limit reached (this request needs {} uncached input and \
                             {} output tokens); retry after {} ms",
                            cost.input_tokens,
                            cost.output_tokens,
                            wait.as_millis()
                        ),
                        retry_after: (spec.headers != limit::HeaderMode::None).then_some(wait),
                    });
                }
            }
            for fail in &reply.mods.fails {
                let served = state
                    .failures
                    .entry((reply.script_key, fail.line))
                    .or_insert(0);
                if *served < fail.times {
                    *served += 1;
                    let (served, status) = (*served, fail.status);
                    state.answered(now, status, &request.body);
                    return Err(ProviderError::Status {
                        status: fail.status,
                        message: format!(
                            "sim: scripted failure {} of {} (script line {})",
                            served,
                            fail.times,
                            fail.line + 1
                        ),
                        retry_after: fail.retry_after,
                    });
                }
            }
            state.cache.touch(&lookup, now);
            state.answered(now, 200, &request.body);
            let stated = spec.is_some_and(|s| s.headers == limit::HeaderMode::Anthropic);
            let limits = state.limiter.as_mut().and_then(|limiter| {
                limiter.take(cost, now);
                stated.then(|| limiter.limits(now))
            });
            (lookup, limits)
        };
        let message_id = format!("msg_sim_{}", uuid::Uuid::now_v7().simple());
        let mut events = stream::plan(&reply, message_id, lookup.usage, self.speed());
        if let Some(limits) = limits {
            events.insert(
                0,
                stream::Timed {
                    delay: Duration::ZERO,
                    event: StreamEvent::RateLimits(limits),
                },
            );
        }
        let state = Arc::clone(&self.state);
        let writes = lookup.writes;
        Ok(stream::stream(events, move || {
            lock(&state).cache.commit(&writes, Instant::now());
        }))
    }
}

impl Provider for SimProvider {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        match self.prepare(&request) {
            Ok(events) => events,
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }
}

#[cfg(test)]
mod tests;
