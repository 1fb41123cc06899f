//! The embedded simulated model: deterministic answers driven by `@sim` scripts, a faithful
//! prompt-cache model and a latency model (docs/contracts.md, “Prompt-cache rules”). No network.
//!
//! A request is processed when [`Provider::stream`] is called — that is the instant it is "sent":
//! scripted failures are consumed and the cache is looked up then. Its own cache writes become
//! readable only when its stream yields `message_start`, so siblings sent together all miss.

mod cache;
mod reply;
mod request;
mod script;
mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::{EventStream, ModelRequest, Provider, ProviderError};
use cache::PromptCache;
use request::BlockMemo;

/// How the sim behaves.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SimConfig {
    /// Scales the latency model: 0 streams instantly (no timers at all), 1 is realistic.
    pub speed: f64,
}

/// State shared by every request to one sim.
#[derive(Debug, Default)]
struct SimState {
    cache: PromptCache,
    /// Scripted failures already served, by (script hash, line index).
    failures: HashMap<([u8; 32], usize), u32>,
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
        Self {
            config,
            state: Arc::default(),
            memo: Arc::default(),
        }
    }

    /// How many prompt-cache entries are alive now (for tests and benchmarks).
    pub fn cache_entries(&self) -> usize {
        lock(&self.state).cache.live(Instant::now())
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
        let lookup = {
            let mut state = lock(&self.state);
            for fail in &reply.mods.fails {
                let served = state
                    .failures
                    .entry((reply.script_key, fail.line))
                    .or_insert(0);
                if *served < fail.times {
                    *served += 1;
                    return Err(ProviderError::Status {
                        status: fail.status,
                        message: format!(
                            "sim: scripted failure {} of {} (script line {})",
                            *served,
                            fail.times,
                            fail.line + 1
                        ),
                        retry_after: (fail.status == 429).then_some(Duration::from_secs(1)),
                    });
                }
            }
            state
                .cache
                .lookup(&parsed.blocks, parsed.model.min_cache_tokens, now)
        };
        let message_id = format!("msg_sim_{}", uuid::Uuid::now_v7().simple());
        let events = stream::plan(&reply, message_id, lookup.usage, self.speed());
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
