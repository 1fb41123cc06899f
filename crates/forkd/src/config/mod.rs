//! `forkd serve`'s settings, from four sources in this order of precedence:
//!
//! 1. the command line (`--sim-speed 0`),
//! 2. the environment (`FORKD_SIM_SPEED=0`; an empty variable counts as unset),
//! 3. `$FORKD_HOME/config.toml` (`sim_speed = 0`),
//! 4. the defaults.
//!
//! Each setting is resolved on its own, so a flag overrides only its own key. The file is plain
//! TOML; an unknown key is an error that names it, so a typo never goes unnoticed. Provider
//! settings (`[anthropic]`, `[openai]`) follow the same rule per variable: `ANTHROPIC_API_KEY`
//! in the environment wins over `api_key` under `[anthropic]`. Relative paths in the file are
//! relative to `FORKD_HOME`. The README's "Configuration" section lists every key.
//!
//! The parts: [`file`] is `config.toml` as written, [`flags`] the command line, [`layers`] the
//! one rule that picks a setting's value from them and the environment, and [`settings`] every
//! setting resolved, with every default in its `Default` impl.

mod file;
mod flags;
mod layers;
mod settings;
#[cfg(test)]
mod tests;
mod webhooks;

pub use file::{AnthropicSection, CONFIG_FILE, FileConfig, OpenAiSection, TenantSection};
pub use flags::{ServeFlags, humantime_duration, with_default};
pub use settings::Settings;

/// Log format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

// As the flag spells it (clap's name for the variant), so that a help text can show the default
// (`[default: text]`).
impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = clap::ValueEnum::to_possible_value(self);
        f.write_str(value.as_ref().map_or("", |v| v.get_name()))
    }
}
