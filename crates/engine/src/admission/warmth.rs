//! What the limiter knows is warm in the provider's cache (see [`super::Ticket::prefix`]).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// What the limiter knows is in the provider's cache: prefixes by fingerprint (a batch's
/// shared part, once a sibling's response started), and each agent's last request (its next
/// request starts with it). Entries live as long as a cache entry: 5 minutes.
#[derive(Debug, Default)]
pub(super) struct Warmth {
    prefixes: HashMap<String, Instant>,
    agents: HashMap<u128, (u64, Instant)>,
}

/// How long a cache entry lives unread.
pub(super) const CACHE_TTL: Duration = Duration::from_secs(300);

impl Warmth {
    pub(super) fn prefix(&self, fingerprint: &str, now: Instant) -> bool {
        self.prefixes
            .get(fingerprint)
            .is_some_and(|&at| now.saturating_duration_since(at) < CACHE_TTL)
    }

    /// Whether the prefix was warm once and is no longer: its entry outlived the cache.
    pub(super) fn went_cold(&self, fingerprint: &str, now: Instant) -> bool {
        self.prefixes
            .get(fingerprint)
            .is_some_and(|&at| now.saturating_duration_since(at) >= CACHE_TTL)
    }

    pub(super) fn agent(&self, agent: u128, now: Instant) -> Option<u64> {
        self.agents
            .get(&agent)
            .filter(|(_, at)| now.saturating_duration_since(*at) < CACHE_TTL)
            .map(|(tokens, _)| *tokens)
    }

    pub(super) fn warmed_prefix(&mut self, fingerprint: &str, now: Instant) {
        if self.prefixes.len() >= 4096 {
            self.prefixes
                .retain(|_, at| now.saturating_duration_since(*at) < CACHE_TTL);
        }
        self.prefixes.insert(fingerprint.to_owned(), now);
    }

    pub(super) fn warmed_agent(&mut self, agent: u128, tokens: u64, now: Instant) {
        if self.agents.len() >= 65_536 {
            self.agents
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < CACHE_TTL);
        }
        self.agents.insert(agent, (tokens, now));
    }
}
