//! The price and cache table: one place for every model forkd knows.
//!
//! Prices are USD per million tokens. The simulated provider, the cost of every stored request and
//! the fork calculator all read this table, so a figure can only disagree with another if the
//! token counts do.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// Cache reads cost this fraction of the base input price.
pub const READ_MULTIPLIER: f64 = 0.1;

/// How long a cache entry lives; decides the write multiplier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheTtl {
    #[default]
    FiveMinutes,
    OneHour,
}

impl CacheTtl {
    pub fn write_multiplier(self) -> f64 {
        match self {
            CacheTtl::FiveMinutes => 1.25,
            CacheTtl::OneHour => 2.0,
        }
    }

    pub fn seconds(self) -> u64 {
        match self {
            CacheTtl::FiveMinutes => 300,
            CacheTtl::OneHour => 3600,
        }
    }
}

/// One model's prices and cache rules.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    pub name: Cow<'static, str>,
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// A breakpoint's prefix is cacheable only from this many tokens on.
    pub min_cache_tokens: u64,
    /// The context window: a request's input tokens plus its `max_tokens` must fit in it.
    pub context_window: u64,
}

/// The model used when a session names none.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";

const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: Cow::Borrowed("claude-opus-4-1"),
        input_per_mtok: 15.0,
        output_per_mtok: 75.0,
        min_cache_tokens: 1024,
        context_window: 200_000,
    },
    ModelSpec {
        name: Cow::Borrowed("claude-sonnet-4-5"),
        input_per_mtok: 3.0,
        output_per_mtok: 15.0,
        min_cache_tokens: 1024,
        context_window: 200_000,
    },
    ModelSpec {
        name: Cow::Borrowed("claude-haiku-4-5"),
        input_per_mtok: 1.0,
        output_per_mtok: 5.0,
        min_cache_tokens: 4096,
        context_window: 200_000,
    },
    ModelSpec {
        name: Cow::Borrowed("claude-3-5-haiku"),
        input_per_mtok: 0.8,
        output_per_mtok: 4.0,
        min_cache_tokens: 2048,
        context_window: 200_000,
    },
];

/// Looks a model up by name in the built-in table.
pub fn model(name: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.name == name)
}

/// The models a daemon knows: the built-in table and those its configuration adds or
/// overrides (`[models.NAME]` in `config.toml`: a local model's window, a newer price).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Models {
    configured: Vec<ModelSpec>,
}

impl Models {
    /// Adds a model, or replaces the one of the same name (built-in or configured).
    pub fn with(mut self, spec: ModelSpec) -> Self {
        self.configured.retain(|m| m.name != spec.name);
        self.configured.push(spec);
        self
    }

    /// Looks a model up: a configured one first, then the built-in table.
    pub fn get(&self, name: &str) -> Option<&ModelSpec> {
        self.configured
            .iter()
            .find(|m| m.name == name)
            .or_else(|| model(name))
    }

    /// The names of every known model, for error messages.
    pub fn names(&self) -> String {
        let mut names: Vec<&str> = MODELS
            .iter()
            .chain(&self.configured)
            .map(|m| m.name.as_ref())
            .collect();
        names.sort_unstable();
        names.dedup();
        names.join(", ")
    }
}

/// Every model in the table.
pub fn models() -> &'static [ModelSpec] {
    MODELS
}

/// The names of the known models, for error messages.
pub fn model_names() -> String {
    Models::default().names()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn default_model_is_in_the_table() {
        assert!(model(DEFAULT_MODEL).is_some());
        assert!(model("gpt-2").is_none());
    }

    #[test]
    fn configured_models_add_to_and_override_the_table() {
        let local = ModelSpec {
            name: "local-llama".into(),
            input_per_mtok: 0.0,
            output_per_mtok: 0.0,
            min_cache_tokens: 0,
            context_window: 32_768,
        };
        let bigger = ModelSpec {
            context_window: 1_000_000,
            ..model(DEFAULT_MODEL).unwrap().clone()
        };
        let models = Models::default().with(local.clone()).with(bigger);
        assert_eq!(models.get("local-llama"), Some(&local));
        assert_eq!(models.get(DEFAULT_MODEL).unwrap().context_window, 1_000_000);
        assert_eq!(models.get("claude-opus-4-1"), model("claude-opus-4-1"));
        assert!(models.get("gpt-2").is_none());
        let names = models.names();
        assert_eq!(names.matches(DEFAULT_MODEL).count(), 1, "{names}");
        assert!(names.contains("local-llama"), "{names}");
    }
}
