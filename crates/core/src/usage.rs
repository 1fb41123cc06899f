//! Token usage of a model request, in the Messages API's four kinds.

use serde::{Deserialize, Serialize};

use crate::pricing::{CacheTtl, ModelSpec};

/// Tokens of one request (or a sum of requests), as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens after the last cache breakpoint (not cached, not written).
    pub input_tokens: u64,
    /// Input tokens written to the cache by this request.
    pub cache_creation_input_tokens: u64,
    /// Input tokens read from the cache.
    pub cache_read_input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    /// All input tokens, however they were billed.
    pub fn total_input(&self) -> u64 {
        self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens
    }

    /// The share of input tokens read from cache (0 when there was no input).
    pub fn cache_read_share(&self) -> f64 {
        match self.total_input() {
            0 => 0.0,
            total => self.cache_read_input_tokens as f64 / total as f64,
        }
    }

    /// Cost in USD under `model`'s prices, with writes at `ttl`'s multiplier.
    pub fn cost_usd(&self, model: &ModelSpec, ttl: CacheTtl) -> f64 {
        self.input_cost_usd(model, ttl) + self.output_tokens as f64 * model.output_per_mtok / 1e6
    }

    /// The input side of [`Usage::cost_usd`]: what the fork calculator predicts.
    pub fn input_cost_usd(&self, model: &ModelSpec, ttl: CacheTtl) -> f64 {
        let b = model.input_per_mtok / 1e6;
        self.input_tokens as f64 * b
            + self.cache_creation_input_tokens as f64 * b * ttl.write_multiplier()
            + self.cache_read_input_tokens as f64 * b * crate::pricing::READ_MULTIPLIER
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;

    fn add(self, rhs: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens + rhs.input_tokens,
            cache_creation_input_tokens: self.cache_creation_input_tokens
                + rhs.cache_creation_input_tokens,
            cache_read_input_tokens: self.cache_read_input_tokens + rhs.cache_read_input_tokens,
            output_tokens: self.output_tokens + rhs.output_tokens,
        }
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, rhs: Usage) {
        *self = *self + rhs;
    }
}

impl std::iter::Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::default(), |a, b| a + b)
    }
}
