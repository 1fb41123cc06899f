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

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use forkd_provider::{AnthropicConfig, OpenAiConfig};
use forkd_store::Durability;
use serde::Deserialize;

use crate::daemon::{DaemonConfig, ProviderKind, TlsFiles};

/// The configuration file's name in `FORKD_HOME`.
pub const CONFIG_FILE: &str = "config.toml";

/// Log format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `$FORKD_HOME/config.toml` as written: every key is optional.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `sim`, `anthropic` or `openai`.
    pub provider: Option<ProviderKind>,
    /// The simulated model's pace: 0 is instant, 1 realistic.
    pub sim_speed: Option<f64>,
    /// Hand an attached client to the background after this many seconds (0: never).
    pub auto_background_secs: Option<u64>,
    /// Fork children start in the background.
    pub fork_always_async: Option<bool>,
    /// Send child 1 of a batch first to warm the cache.
    pub warmup_gating: Option<bool>,
    /// Also serve TCP on this address.
    pub listen: Option<SocketAddr>,
    /// Serve Prometheus metrics over HTTP (`GET /metrics`) on this address.
    pub metrics_listen: Option<SocketAddr>,
    /// How long calls in flight may take to finish on shutdown (`10s`, `1m`).
    pub grace: Option<String>,
    /// SQLite `synchronous=FULL`.
    pub fsync_every_commit: Option<bool>,
    /// The log filter, as `RUST_LOG` takes it.
    pub log: Option<String>,
    /// `text` or `json`.
    pub log_format: Option<LogFormat>,
    /// PEM certificate chain for TLS on the TCP listener.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on the TCP listener.
    pub tls_key: Option<PathBuf>,
    /// The most agents running at once (0: no cap); the others wait as `pending`, in order.
    pub max_running_agents: Option<usize>,
    /// The most model requests in flight at once (0: no cap).
    pub max_concurrent_requests: Option<usize>,
    /// Per-tenant settings: `[tenants.NAME]`.
    pub tenants: Option<BTreeMap<String, TenantSection>>,
    /// The `anthropic` provider's settings.
    pub anthropic: Option<AnthropicSection>,
    /// The `openai` provider's settings.
    pub openai: Option<OpenAiSection>,
}

/// `[tenants.NAME]` in `config.toml`: a tenant's spending limits.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    /// Once the tenant's agents have spent this many dollars, its agents fail.
    pub budget_usd: Option<f64>,
    /// Once the tenant's agents have used this many tokens (all kinds), its agents fail.
    pub budget_tokens: Option<u64>,
}

/// `[anthropic]` in `config.toml`.
#[derive(Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnthropicSection {
    /// `ANTHROPIC_BASE_URL`.
    pub base_url: Option<String>,
    /// `ANTHROPIC_API_KEY`.
    pub api_key: Option<String>,
}

/// `[openai]` in `config.toml`.
#[derive(Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiSection {
    /// `OPENAI_BASE_URL`.
    pub base_url: Option<String>,
    /// `OPENAI_API_KEY`.
    pub api_key: Option<String>,
    /// `OPENAI_MODEL`.
    pub model: Option<String>,
}

// The keys stay out of debug output.
impl fmt::Debug for AnthropicSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicSection")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl fmt::Debug for OpenAiSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiSection")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .finish()
    }
}

impl FileConfig {
    /// Reads `home/config.toml`; a missing file is an empty configuration.
    pub fn load(home: &Path) -> anyhow::Result<Self> {
        let path = home.join(CONFIG_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        Self::parse(&text).with_context(|| format!("invalid {}", path.display()))
    }

    /// Parses the file's text; errors name the key and its line.
    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// The value the file gives a provider variable (`ANTHROPIC_API_KEY` → `[anthropic] api_key`).
    fn provider_var(&self, name: &str) -> Option<&String> {
        let anthropic = self.anthropic.as_ref();
        let openai = self.openai.as_ref();
        match name {
            "ANTHROPIC_BASE_URL" => anthropic?.base_url.as_ref(),
            "ANTHROPIC_API_KEY" => anthropic?.api_key.as_ref(),
            "OPENAI_BASE_URL" => openai?.base_url.as_ref(),
            "OPENAI_API_KEY" => openai?.api_key.as_ref(),
            "OPENAI_MODEL" => openai?.model.as_ref(),
            _ => None,
        }
    }
}

/// The provider variables a config file can set.
const PROVIDER_VARS: [&str; 5] = [
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
];

/// The command line of `forkd serve`, as far as it sets settings. Every field is optional so
/// that an absent flag lets the environment or the file decide.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeFlags {
    /// Also serve TCP on this address (env FORKD_LISTEN). Off loopback, tokens must exist
    /// (`forkd token create NAME`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Serve Prometheus metrics over plain HTTP on this address, at `/metrics`
    /// (env FORKD_METRICS_LISTEN). Unauthenticated: keep it on loopback or a private network.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// The model provider (env FORKD_PROVIDER) [default: sim].
    #[arg(long, value_enum)]
    pub provider: Option<ProviderKind>,
    /// The simulated model's pace: 0 is instant, 1 is realistic (env FORKD_SIM_SPEED) [default: 1].
    #[arg(long)]
    pub sim_speed: Option<f64>,
    /// Sync every commit to disk (survives power loss) instead of every checkpoint
    /// (env FORKD_FSYNC_EVERY_COMMIT).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub fsync_every_commit: Option<bool>,
    /// Send every child of a batch at once instead of warming the cache with the first
    /// (env FORKD_WARMUP_GATING=false).
    #[arg(long)]
    pub no_warmup_gating: bool,
    /// Hand an attached client to the background after this many seconds; 0: never
    /// (env FORKD_AUTO_BACKGROUND_SECS) [default: 120].
    #[arg(long, value_name = "SECS")]
    pub auto_background_secs: Option<u64>,
    /// How long running tool calls and requests may take to finish on shutdown (env FORKD_GRACE)
    /// [default: 10s].
    #[arg(long, value_parser = humantime_duration)]
    pub grace: Option<Duration>,
    /// PEM certificate chain: serve TLS on the TCP listener (env FORKD_TLS_CERT).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (env FORKD_TLS_KEY).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Log filter, e.g. `info` or `info,forkd_engine=debug` (env RUST_LOG) [default: info].
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// The global `--log-format`, filled in by `main`.
    #[arg(skip)]
    pub log_format: Option<LogFormat>,
}

/// Parses a duration such as `10s` or `1m 30s`.
pub fn humantime_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// Every setting of `forkd serve`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub provider: ProviderKind,
    pub sim_speed: f64,
    pub auto_background_secs: u64,
    pub fork_always_async: bool,
    pub warmup_gating: bool,
    pub listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub grace: Duration,
    pub fsync_every_commit: bool,
    /// The log filter.
    pub log: String,
    pub log_format: LogFormat,
    pub tls: Option<TlsFiles>,
    /// `None`: no cap.
    pub max_running_agents: Option<usize>,
    pub max_concurrent_requests: Option<usize>,
    pub tenant_budgets: BTreeMap<String, forkd_store::Budget>,
    /// The provider variables, environment over file.
    provider_vars: ProviderVars,
}

/// Provider variables with their values redacted from debug output.
#[derive(Clone, Default, PartialEq)]
struct ProviderVars(BTreeMap<&'static str, String>);

impl fmt::Debug for ProviderVars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl Settings {
    /// Resolves every setting: `flags`, then `env` (a variable's value, if set), then `file`
    /// (whose relative paths are taken from `home`), then the defaults.
    pub fn resolve(
        flags: &ServeFlags,
        env: impl Fn(&str) -> Option<String>,
        file: &FileConfig,
        home: &Path,
    ) -> anyhow::Result<Self> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let parsed = |name: &'static str| EnvVar {
            name,
            value: env(name),
        };

        let provider = match flags.provider {
            Some(p) => p,
            None => match env("FORKD_PROVIDER") {
                Some(v) => value_enum::<ProviderKind>("FORKD_PROVIDER", &v)?,
                None => file.provider.unwrap_or(ProviderKind::Sim),
            },
        };
        let log_format = match flags.log_format {
            Some(f) => f,
            None => match env("FORKD_LOG_FORMAT") {
                Some(v) => value_enum::<LogFormat>("FORKD_LOG_FORMAT", &v)?,
                None => file.log_format.unwrap_or_default(),
            },
        };
        let grace = match flags.grace {
            Some(g) => g,
            None => match env("FORKD_GRACE") {
                Some(v) => {
                    humantime_duration(&v).map_err(|e| anyhow::anyhow!("FORKD_GRACE={v:?}: {e}"))?
                }
                None => match &file.grace {
                    Some(v) => humantime_duration(v)
                        .map_err(|e| anyhow::anyhow!("{CONFIG_FILE}: grace = {v:?}: {e}"))?,
                    None => Duration::from_secs(10),
                },
            },
        };
        let warmup_gating = if flags.no_warmup_gating {
            false
        } else {
            parsed("FORKD_WARMUP_GATING")
                .bool()?
                .or(file.warmup_gating)
                .unwrap_or(true)
        };
        let file_path = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                home.join(p)
            }
        };
        let tls_cert = flags
            .tls_cert
            .clone()
            .or_else(|| env("FORKD_TLS_CERT").map(PathBuf::from))
            .or_else(|| file.tls_cert.as_ref().map(file_path));
        let tls_key = flags
            .tls_key
            .clone()
            .or_else(|| env("FORKD_TLS_KEY").map(PathBuf::from))
            .or_else(|| file.tls_key.as_ref().map(file_path));
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => bail!(
                "TLS needs a private key too: a certificate is set but no key \
                 (--tls-key, FORKD_TLS_KEY or tls_key in {CONFIG_FILE})"
            ),
            (None, Some(_)) => bail!(
                "TLS needs a certificate too: a key is set but no certificate \
                 (--tls-cert, FORKD_TLS_CERT or tls_cert in {CONFIG_FILE})"
            ),
        };
        let provider_vars = PROVIDER_VARS
            .iter()
            .filter_map(|&name| {
                env(name)
                    .or_else(|| file.provider_var(name).cloned())
                    .map(|v| (name, v))
            })
            .collect();

        let defaults = forkd_engine::EngineConfig::default();
        let cap = |value: Option<usize>, default: Option<usize>| match value {
            Some(0) => None,
            Some(n) => Some(n),
            None => default,
        };
        let max_running_agents = cap(
            parsed("FORKD_MAX_RUNNING_AGENTS")
                .parse()?
                .or(file.max_running_agents),
            defaults.max_running_agents,
        );
        let max_concurrent_requests = cap(
            parsed("FORKD_MAX_CONCURRENT_REQUESTS")
                .parse()?
                .or(file.max_concurrent_requests),
            defaults.max_concurrent_requests,
        );
        let mut tenant_budgets = BTreeMap::new();
        for (name, t) in file.tenants.iter().flatten() {
            if t.budget_usd.is_some_and(|u| !(u > 0.0 && u.is_finite()))
                || t.budget_tokens == Some(0)
            {
                bail!("{CONFIG_FILE}: [tenants.{name}]: budgets must be positive");
            }
            tenant_budgets.insert(
                name.clone(),
                forkd_store::Budget {
                    usd: t.budget_usd,
                    tokens: t.budget_tokens,
                },
            );
        }

        Ok(Self {
            max_running_agents,
            max_concurrent_requests,
            tenant_budgets,
            provider,
            sim_speed: flags
                .sim_speed
                .or(parsed("FORKD_SIM_SPEED").parse()?)
                .or(file.sim_speed)
                .unwrap_or(1.0),
            auto_background_secs: flags
                .auto_background_secs
                .or(parsed("FORKD_AUTO_BACKGROUND_SECS").parse()?)
                .or(file.auto_background_secs)
                .unwrap_or(120),
            fork_always_async: parsed("FORKD_FORK_ALWAYS_ASYNC")
                .bool()?
                .or(file.fork_always_async)
                .unwrap_or(true),
            warmup_gating,
            listen: flags
                .listen
                .or(parsed("FORKD_LISTEN").parse()?)
                .or(file.listen),
            metrics_listen: flags
                .metrics_listen
                .or(parsed("FORKD_METRICS_LISTEN").parse()?)
                .or(file.metrics_listen),
            grace,
            fsync_every_commit: flags
                .fsync_every_commit
                .or(parsed("FORKD_FSYNC_EVERY_COMMIT").bool()?)
                .or(file.fsync_every_commit)
                .unwrap_or(false),
            log: flags
                .log
                .clone()
                .or_else(|| env("RUST_LOG"))
                .or_else(|| file.log.clone())
                .unwrap_or_else(|| "info".to_owned()),
            log_format,
            tls,
            provider_vars: ProviderVars(provider_vars),
        })
    }

    /// The daemon configuration these settings describe, on `home`.
    pub fn daemon_config(&self, home: PathBuf) -> anyhow::Result<DaemonConfig> {
        let mut config = DaemonConfig::new(home);
        config.listen = self.listen;
        config.metrics_listen = self.metrics_listen;
        config.provider = self.provider;
        config.sim_speed = self.sim_speed;
        config.engine.warmup_gating = self.warmup_gating;
        config.engine.auto_background = forkd_engine::auto_background(self.auto_background_secs);
        config.engine.fork_always_async = self.fork_always_async;
        config.engine.max_running_agents = self.max_running_agents;
        config.engine.max_concurrent_requests = self.max_concurrent_requests;
        config.engine.tenant_budgets = self
            .tenant_budgets
            .iter()
            .map(|(name, budget)| (name.clone(), *budget))
            .collect();
        config.tls = self.tls.clone();
        if self.fsync_every_commit {
            config.durability = Durability::Full;
        }
        let var = |name: &str| self.provider_vars.0.get(name).cloned();
        match self.provider {
            ProviderKind::Sim => {}
            ProviderKind::Anthropic => {
                config.anthropic = Some(AnthropicConfig::from_vars(var).context(
                    "the anthropic provider needs ANTHROPIC_API_KEY (or api_key under \
                     [anthropic] in config.toml)",
                )?);
            }
            ProviderKind::Openai => {
                config.openai = Some(OpenAiConfig::from_vars(var).context(
                    "the openai provider's settings (OPENAI_* or [openai] in config.toml)",
                )?);
            }
        }
        Ok(config)
    }
}

/// A variable from the environment, parsed on demand with its name in any error.
struct EnvVar {
    name: &'static str,
    value: Option<String>,
}

impl EnvVar {
    fn parse<T: FromStr>(&self) -> anyhow::Result<Option<T>>
    where
        T::Err: fmt::Display,
    {
        self.value
            .as_deref()
            .map(|v| {
                v.trim()
                    .parse()
                    .map_err(|e| anyhow::anyhow!("{}={v:?}: {e}", self.name))
            })
            .transpose()
    }

    fn bool(&self) -> anyhow::Result<Option<bool>> {
        self.value
            .as_deref()
            .map(|v| match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => bail!("{}={v:?} is not a boolean: use true or false", self.name),
            })
            .transpose()
    }
}

/// Parses a variable's value as one of a clap value enum's names, case-insensitively.
fn value_enum<T: clap::ValueEnum>(name: &str, value: &str) -> anyhow::Result<T> {
    T::from_str(value.trim(), true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_owned()))
            .collect();
        anyhow::anyhow!("{name}={value:?}: expected one of {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn resolve(flags: &ServeFlags, vars: &[(&str, &str)], file: &str) -> anyhow::Result<Settings> {
        let file = FileConfig::parse(file)?;
        Settings::resolve(flags, env(vars), &file, Path::new("/srv/forkd"))
    }

    #[test]
    fn caps_and_tenant_budgets_come_from_the_file_and_the_environment() {
        let file = "max_running_agents = 8\nmax_concurrent_requests = 0\n\
                    [tenants.ci]\nbudget_usd = 2.5\n[tenants.team]\nbudget_tokens = 1000\n";
        let s = resolve(&ServeFlags::default(), &[], file).unwrap();
        assert_eq!(s.max_running_agents, Some(8));
        assert_eq!(s.max_concurrent_requests, None, "0 means no cap");
        assert_eq!(s.tenant_budgets["ci"].usd, Some(2.5));
        assert_eq!(s.tenant_budgets["team"].tokens, Some(1000));
        let s = resolve(
            &ServeFlags::default(),
            &[("FORKD_MAX_RUNNING_AGENTS", "3")],
            file,
        )
        .unwrap();
        assert_eq!(s.max_running_agents, Some(3));
        let engine = s.daemon_config("/srv/forkd".into()).unwrap().engine;
        assert_eq!(engine.max_running_agents, Some(3));
        assert_eq!(engine.tenant_budgets["ci"].usd, Some(2.5));
        let defaults = resolve(&ServeFlags::default(), &[], "").unwrap();
        assert_eq!(defaults.max_running_agents, Some(256));
        let bad = resolve(
            &ServeFlags::default(),
            &[],
            "[tenants.x]\nbudget_usd = -1\n",
        );
        assert!(bad.unwrap_err().to_string().contains("tenants.x"));
        let typo = resolve(&ServeFlags::default(), &[], "[tenants.x]\nbudget = 1\n");
        assert!(typo.is_err());
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let s = resolve(&ServeFlags::default(), &[], "").unwrap();
        assert_eq!(s.provider, ProviderKind::Sim);
        assert_eq!(s.sim_speed, 1.0);
        assert_eq!(s.auto_background_secs, 120);
        assert!(s.fork_always_async);
        assert!(s.warmup_gating);
        assert_eq!(s.listen, None);
        assert_eq!(s.grace, Duration::from_secs(10));
        assert!(!s.fsync_every_commit);
        assert_eq!(s.log, "info");
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.tls, None);
    }

    #[test]
    fn flag_beats_environment_beats_file_beats_default() {
        let file = r#"
            sim_speed = 0.5
            auto_background_secs = 30
            provider = "anthropic"
            log = "debug"
            grace = "3s"
            [anthropic]
            api_key = "from-file"
            base_url = "http://file.example"
        "#;
        // The file alone.
        let s = resolve(&ServeFlags::default(), &[], file).unwrap();
        assert_eq!((s.sim_speed, s.auto_background_secs), (0.5, 30));
        assert_eq!(s.provider, ProviderKind::Anthropic);
        assert_eq!((s.log.as_str(), s.grace), ("debug", Duration::from_secs(3)));

        // The environment over the file, per key; an empty variable is unset.
        let vars = [
            ("FORKD_SIM_SPEED", "0"),
            ("FORKD_PROVIDER", "SIM"),
            ("RUST_LOG", "warn"),
            ("FORKD_AUTO_BACKGROUND_SECS", ""),
            ("ANTHROPIC_API_KEY", "from-env"),
        ];
        let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
        assert_eq!((s.sim_speed, s.auto_background_secs), (0.0, 30));
        assert_eq!(s.provider, ProviderKind::Sim);
        assert_eq!(s.log, "warn");
        assert_eq!(
            s.provider_vars
                .0
                .get("ANTHROPIC_API_KEY")
                .map(String::as_str),
            Some("from-env")
        );
        assert_eq!(
            s.provider_vars
                .0
                .get("ANTHROPIC_BASE_URL")
                .map(String::as_str),
            Some("http://file.example")
        );

        // A flag over both.
        let flags = ServeFlags {
            sim_speed: Some(2.0),
            provider: Some(ProviderKind::Openai),
            log: Some("error".into()),
            grace: Some(Duration::from_secs(1)),
            ..ServeFlags::default()
        };
        let s = resolve(&flags, &vars, file).unwrap();
        assert_eq!(s.sim_speed, 2.0);
        assert_eq!(s.provider, ProviderKind::Openai);
        assert_eq!(s.log, "error");
        assert_eq!(s.grace, Duration::from_secs(1));
    }

    #[test]
    fn booleans_come_from_each_source() {
        let file = "fsync_every_commit = true\nwarmup_gating = false\nfork_always_async = false";
        let s = resolve(&ServeFlags::default(), &[], file).unwrap();
        assert!(s.fsync_every_commit && !s.warmup_gating && !s.fork_always_async);

        let vars = [
            ("FORKD_FSYNC_EVERY_COMMIT", "no"),
            ("FORKD_WARMUP_GATING", "on"),
            ("FORKD_FORK_ALWAYS_ASYNC", "1"),
        ];
        let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
        assert!(!s.fsync_every_commit && s.warmup_gating && s.fork_always_async);

        let flags = ServeFlags {
            fsync_every_commit: Some(true),
            no_warmup_gating: true,
            ..ServeFlags::default()
        };
        let s = resolve(&flags, &vars, file).unwrap();
        assert!(s.fsync_every_commit && !s.warmup_gating);

        let err = resolve(
            &ServeFlags::default(),
            &[("FORKD_FORK_ALWAYS_ASYNC", "maybe")],
            "",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("FORKD_FORK_ALWAYS_ASYNC=\"maybe\" is not a boolean"),
            "{err}"
        );
    }

    #[test]
    fn listen_and_tls_paths_resolve_and_file_paths_are_relative_to_home() {
        let file =
            "listen = \"127.0.0.1:7070\"\ntls_cert = \"tls/cert.pem\"\ntls_key = \"/etc/k.pem\"";
        let s = resolve(&ServeFlags::default(), &[], file).unwrap();
        assert_eq!(s.listen, Some(SocketAddr::from(([127, 0, 0, 1], 7070))));
        assert_eq!(
            s.tls,
            Some(TlsFiles {
                cert: PathBuf::from("/srv/forkd/tls/cert.pem"),
                key: PathBuf::from("/etc/k.pem"),
            })
        );
        let vars = [("FORKD_LISTEN", "127.0.0.1:9"), ("FORKD_TLS_CERT", "c.pem")];
        let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
        assert_eq!(s.listen, Some(SocketAddr::from(([127, 0, 0, 1], 9))));
        assert_eq!(s.tls.map(|t| t.cert), Some(PathBuf::from("c.pem")));

        let err = resolve(&ServeFlags::default(), &[], "tls_cert = \"c.pem\"")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("TLS needs a private key too"), "{err}");
    }

    #[test]
    fn metrics_listen_comes_from_flag_env_or_file() {
        let file = "metrics_listen = \"127.0.0.1:9100\"";
        let s = resolve(&ServeFlags::default(), &[], file).unwrap();
        assert_eq!(
            s.metrics_listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 9100)))
        );
        let vars = [("FORKD_METRICS_LISTEN", "127.0.0.1:9101")];
        let s = resolve(&ServeFlags::default(), &vars, file).unwrap();
        assert_eq!(
            s.metrics_listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 9101)))
        );
        let flags = ServeFlags {
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9102))),
            ..ServeFlags::default()
        };
        let s = resolve(&flags, &vars, file).unwrap();
        let config = s.daemon_config(PathBuf::from("/srv/forkd")).unwrap();
        assert_eq!(
            config.metrics_listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 9102)))
        );
        assert_eq!(
            resolve(&ServeFlags::default(), &[], "")
                .unwrap()
                .metrics_listen,
            None
        );
    }

    #[test]
    fn a_typo_in_the_file_is_an_error_naming_the_key() {
        let err = FileConfig::parse("sim_sped = 0").unwrap_err().to_string();
        assert!(err.contains("unknown field `sim_sped`"), "{err}");
        let err = FileConfig::parse("[anthropic]\napi_kye = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `api_kye`"), "{err}");
        let err = FileConfig::parse("provider = \"gpt\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("provider"), "{err}");
        let err = resolve(&ServeFlags::default(), &[], "grace = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("config.toml: grace = \"soon\""), "{err}");
    }

    #[test]
    fn bad_environment_values_name_the_variable() {
        for (name, value, expected) in [
            ("FORKD_SIM_SPEED", "fast", "FORKD_SIM_SPEED=\"fast\""),
            ("FORKD_LISTEN", "localhost", "FORKD_LISTEN=\"localhost\""),
            (
                "FORKD_PROVIDER",
                "gpt",
                "expected one of sim, anthropic, openai",
            ),
            ("FORKD_GRACE", "soon", "FORKD_GRACE=\"soon\""),
        ] {
            let err = resolve(&ServeFlags::default(), &[(name, value)], "")
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{name}: {err}");
        }
    }

    #[test]
    fn provider_settings_reach_the_daemon_config_with_env_winning() {
        let file = "provider = \"anthropic\"\n[anthropic]\napi_key = \"file-key\"\nbase_url = \"http://127.0.0.1:8787\"";
        let s = resolve(&ServeFlags::default(), &[], file).unwrap();
        let config = s.daemon_config(PathBuf::from("/h")).unwrap();
        let anthropic = config.anthropic.unwrap();
        assert_eq!(anthropic.api_key, "file-key");
        assert_eq!(anthropic.base_url, "http://127.0.0.1:8787");
        assert!(!format!("{s:?}").contains("file-key"));

        let s = resolve(
            &ServeFlags::default(),
            &[("ANTHROPIC_API_KEY", "env-key")],
            file,
        )
        .unwrap();
        assert_eq!(
            s.daemon_config(PathBuf::from("/h"))
                .unwrap()
                .anthropic
                .unwrap()
                .api_key,
            "env-key"
        );

        let err = resolve(&ServeFlags::default(), &[], "provider = \"anthropic\"")
            .unwrap()
            .daemon_config(PathBuf::from("/h"))
            .unwrap_err();
        assert!(format!("{err:#}").contains("ANTHROPIC_API_KEY"), "{err:#}");

        let file = "provider = \"openai\"\n[openai]\nmodel = \"qwen\"\nbase_url = \"http://127.0.0.1:8080/v1\"";
        let s = resolve(&ServeFlags::default(), &[("OPENAI_MODEL", "llama")], file).unwrap();
        let openai = s
            .daemon_config(PathBuf::from("/h"))
            .unwrap()
            .openai
            .unwrap();
        assert_eq!(openai.model.as_deref(), Some("llama"));
        assert_eq!(openai.base_url, "http://127.0.0.1:8080/v1");
    }

    #[test]
    fn the_daemon_config_carries_every_setting() {
        let file = "fsync_every_commit = true\nauto_background_secs = 0\nfork_always_async = false\nwarmup_gating = false\nsim_speed = 0";
        let s = resolve(&ServeFlags::default(), &[], file).unwrap();
        let config = s.daemon_config(PathBuf::from("/h")).unwrap();
        assert_eq!(config.durability, Durability::Full);
        assert_eq!(config.engine.auto_background, None);
        assert!(!config.engine.warmup_gating);
        assert!(!config.engine.fork_always_async);
        assert_eq!(config.sim_speed, 0.0);
    }
}
