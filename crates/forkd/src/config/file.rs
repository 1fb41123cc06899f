//! `$FORKD_HOME/config.toml` as written: every key optional, unknown keys refused (so a typo is
//! an error that names it), API keys kept out of debug output.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use forkd_core::pricing::{self, ModelSpec, Models};
use serde::Deserialize;

use super::LogFormat;
use super::flags::{humantime_duration, lease_duration};
use crate::daemon::{DatabaseUrl, ProviderKind};

/// The configuration file's name in `FORKD_HOME`.
pub const CONFIG_FILE: &str = "config.toml";

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
    /// Serve the web view on this address.
    pub ui_listen: Option<SocketAddr>,
    /// How long calls in flight may take to finish on shutdown (`10s`, `1m`).
    pub grace: Option<String>,
    /// How long a daemon's claim on a running agent lasts without a heartbeat (`"5s"`); another
    /// daemon on the same PostgreSQL adopts the agent after it expires.
    pub lease: Option<String>,
    /// SQLite `synchronous=FULL`.
    pub fsync_every_commit: Option<bool>,
    /// Below this much free space under the database (`256MiB`, `1%`, `0`: off), new sessions,
    /// messages and batches are refused.
    pub min_free_disk: Option<String>,
    /// Keep state in this PostgreSQL database instead of `forkd.db` (shown without its password).
    pub database_url: Option<DatabaseUrl>,
    /// The log filter, as `RUST_LOG` takes it.
    pub log: Option<String>,
    /// `text` or `json`.
    pub log_format: Option<LogFormat>,
    /// PEM certificate chain for TLS on the TCP listener.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on the TCP listener.
    pub tls_key: Option<PathBuf>,
    /// The key that seals sessions' own MCP server definitions (64 hex digits).
    pub secret_key_file: Option<PathBuf>,
    /// Where tenants' fresh workspaces are made (`FORKD_WORKSPACES_DIR`).
    pub workspaces_dir: Option<PathBuf>,
    /// The most agents running at once (0: no cap); the others wait as `pending`, in order.
    pub max_running_agents: Option<usize>,
    /// The most model requests in flight at once per provider key and model (0: no cap);
    /// the limiter's concurrency window grows up to it.
    pub max_concurrent_requests: Option<usize>,
    /// How long a model request refused for a rate limit or an overload keeps trying
    /// (`"15m"`).
    pub provider_patience: Option<String>,
    /// The same for a provider that cannot be reached at all (`"60s"`).
    pub unreachable_patience: Option<String>,
    /// How many levels below its session an agent may be started (a fork child's typed agent
    /// is at 2).
    pub max_agent_depth: Option<u32>,
    /// Compact a session before a request whose input plus `max_tokens` would pass this share
    /// of its model's window.
    pub compact_threshold: Option<f64>,
    /// Models the price table does not know, or new prices and windows for those it does:
    /// `[models.NAME]`.
    pub models: Option<BTreeMap<String, ModelSection>>,
    /// The sandbox of sessions that ask for none: `workspace-write`, `read-only` or
    /// `full-access`.
    pub sandbox: Option<String>,
    /// Paths no sandboxed command may read (`~` is the daemon user's home); replaces the default
    /// list (`~/.ssh`, `~/.gnupg`, `~/.aws`, `~/.config/gcloud`, `~/.docker`, `~/.kube`,
    /// `~/.netrc`).
    pub sandbox_deny: Option<Vec<String>>,
    /// What stays readable (read-only) of the daemon user's home, which sandboxed commands see
    /// covered (`~` is that home); replaces the default list (toolchains, package caches,
    /// `~/.gitconfig`, and every `PATH` entry under the home).
    pub sandbox_read_allow: Option<Vec<String>>,
    /// Resource limits of each sandboxed command: `[sandbox_limits]`.
    pub sandbox_limits: Option<LimitsSection>,
    /// Isolated children's copies: `[isolation]`.
    pub isolation: Option<IsolationSection>,
    /// Webhooks' deliveries: `[webhooks]`.
    pub webhooks: Option<super::webhooks::WebhooksSection>,
    /// `[tracing]`: OTLP export of traces (the `OTEL_*` variables win).
    pub tracing: Option<TracingSection>,
    /// The daemon's limits on each child's and typed agent's run: `[agent_limits]`.
    pub agent_limits: Option<AgentLimitsSection>,
    /// Per-tenant settings: `[tenants.NAME]`.
    pub tenants: Option<BTreeMap<String, TenantSection>>,
    /// The `anthropic` provider's settings.
    pub anthropic: Option<AnthropicSection>,
    /// The `openai` provider's settings.
    pub openai: Option<OpenAiSection>,
}

/// `[sandbox_limits]` in `config.toml`: each key replaces its default; 0 lifts the limit.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Processes and threads at once (`RLIMIT_NPROC`; default 1024).
    pub processes: Option<u64>,
    /// Open files per process (`RLIMIT_NOFILE`; default 8192).
    pub open_files: Option<u64>,
    /// The largest file a process may write, in bytes (`RLIMIT_FSIZE`; default 16 GiB).
    pub file_size: Option<u64>,
    /// CPU seconds per process of a Bash command (`RLIMIT_CPU`; default 3600; never for MCP
    /// servers).
    pub cpu_seconds: Option<u64>,
    /// Address space per process, in bytes (`RLIMIT_AS`; off by default: it breaks compilers
    /// and node).
    pub address_space: Option<u64>,
    /// A session's processes and threads, all its commands together (`pids.max` of its
    /// cgroup, where the daemon may make one; default 4096).
    pub session_processes: Option<u64>,
    /// A session's memory, in bytes (`memory.max` of its cgroup v2 group; off by default).
    pub session_memory: Option<u64>,
    /// A session's CPU, in percent of one CPU (`cpu.max` of its cgroup v2 group; off by
    /// default).
    pub session_cpu_percent: Option<u64>,
}

/// `[agent_limits]` in `config.toml`, and `[tenants.NAME.agent_limits]`: limits on each fork
/// child's and typed agent's run (docs/contracts.md, "Limits"), below a batch's own. A key left
/// out keeps the layer below's (the daemon's default: `max_turns = 50`, nothing else).
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLimitsSection {
    /// Wall time from an agent's start (`"30m"`).
    pub timeout: Option<String>,
    /// Time without model output and without a tool call starting or finishing (`"5m"`).
    pub idle_timeout: Option<String>,
    /// Model requests at most (also a parent turn's).
    pub max_turns: Option<u32>,
    /// Output tokens at most.
    pub max_output_tokens: Option<u64>,
    /// The timeout leaves out time spent waiting on the provider's limits.
    pub timeout_excludes_throttle: Option<bool>,
}

impl AgentLimitsSection {
    /// The limits it sets; `key` names it in errors (`agent_limits`, `tenants.ci.agent_limits`).
    pub(super) fn limits(&self, key: &str) -> anyhow::Result<forkd_core::Limits> {
        let millis = |name: &str, value: &Option<String>| -> anyhow::Result<Option<u64>> {
            value
                .as_deref()
                .map(|v| {
                    let d = humantime_duration(v).map_err(|e| {
                        anyhow::anyhow!("{CONFIG_FILE}: [{key}] {name} {v:?}: {e} (e.g. \"10m\")")
                    })?;
                    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                })
                .transpose()
        };
        let limits = forkd_core::Limits {
            timeout_ms: millis("timeout", &self.timeout)?,
            idle_timeout_ms: millis("idle_timeout", &self.idle_timeout)?,
            max_turns: self.max_turns,
            max_output_tokens: self.max_output_tokens,
            timeout_excludes_throttle: self.timeout_excludes_throttle,
        };
        limits
            .check()
            .map_err(|e| anyhow::anyhow!("{CONFIG_FILE}: [{key}] {e}"))?;
        Ok(limits)
    }
}

/// `[isolation]` in `config.toml`: isolated children's copies (docs/contracts.md, "Isolation").
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IsolationSection {
    /// The most disk one child's copy may take, in MiB (default 4096; 0: no cap).
    pub disk_cap_mib: Option<u64>,
    /// How long a copy neither applied nor discarded is kept after its child ended (`"7d"`).
    pub retention: Option<String>,
}

/// `[tracing]` in `config.toml`: OpenTelemetry traces over OTLP (docs/operations.md, "Tracing").
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingSection {
    /// The collector's base URL; traces are off without one.
    pub endpoint: Option<String>,
    /// `grpc` (default) or `http/protobuf`.
    pub protocol: Option<String>,
    /// Headers sent with every export (a hosted backend's API key).
    pub headers: Option<BTreeMap<String, String>>,
    /// The `service.name` of forkd's spans (default `forkd`).
    pub service_name: Option<String>,
    /// Put prompt and completion text on model-request spans (default false: it may hold
    /// secrets).
    pub capture_content: Option<bool>,
    /// The web view's link to a trace UI, `{trace_id}` standing for the trace's id.
    pub trace_url_template: Option<String>,
}

/// `[tenants.NAME]` in `config.toml`: a tenant's spending limits.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    /// Once the tenant's agents have spent this many dollars, its agents fail.
    pub budget_usd: Option<f64>,
    /// Once the tenant's agents have used this many tokens (all kinds), its agents fail.
    pub budget_tokens: Option<u64>,
    /// The tenant may create `full-access` (unsandboxed) sessions.
    pub allow_full_access: Option<bool>,
    /// The tenant may create sessions whose commands may use Unix sockets (`--allow-unix-sockets`):
    /// as strong as `full-access`, since any listener of the daemon's user is then reachable.
    pub allow_unix_sockets: Option<bool>,
    /// The tenant may define its own MCP servers (`--mcp-config`), stdio ones included: commands
    /// run on the daemon's host.
    pub allow_mcp_config: Option<bool>,
    /// The directories the tenant's workspaces may lie in (absolute); without any, it may use
    /// only fresh empty workspaces under `workspaces_dir`.
    pub workspace_roots: Option<Vec<PathBuf>>,
    /// The tenant's sessions' commands may use the network (`allow_network`).
    pub allow_network: Option<bool>,
    /// The bytes of uploaded contents the tenant may hold (`"5GiB"`); 10 GiB when not set.
    pub upload_quota: Option<String>,
    /// The tenant's limits on its agents' runs, over the daemon's `[agent_limits]`.
    pub agent_limits: Option<AgentLimitsSection>,
}

/// `[models.NAME]` in `config.toml`: a model's context window and prices (USD per million
/// tokens). For a model the price table knows, each key left out keeps the table's value; a new
/// model needs its `context_window`, and its prices default to 0 (a local model costs nothing).
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub context_window: Option<u64>,
    pub input_per_mtok: Option<f64>,
    pub output_per_mtok: Option<f64>,
    /// A breakpoint's prefix is cacheable only from this many tokens on (default 1024).
    pub min_cache_tokens: Option<u64>,
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

/// The provider variables a config file can set.
pub(super) const PROVIDER_VARS: [&str; 5] = [
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
];

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
    pub(super) fn provider_var(&self, name: &str) -> Option<&String> {
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

    /// `grace`, parsed: TOML has no duration type, so the file holds it as text (`"10s"`).
    pub(super) fn grace(&self) -> anyhow::Result<Option<Duration>> {
        self.grace
            .as_deref()
            .map(|v| {
                humantime_duration(v)
                    .map_err(|e| anyhow::anyhow!("{CONFIG_FILE}: grace = {v:?}: {e}"))
            })
            .transpose()
    }

    /// `[isolation]` over `config`.
    pub(super) fn isolation(
        &self,
        mut config: forkd_engine::IsolationConfig,
    ) -> anyhow::Result<forkd_engine::IsolationConfig> {
        let Some(section) = &self.isolation else {
            return Ok(config);
        };
        if let Some(mib) = section.disk_cap_mib {
            config.disk_cap = (mib > 0).then(|| mib.saturating_mul(1 << 20));
        }
        if let Some(v) = &section.retention {
            config.retention = humantime_duration(v).map_err(|e| {
                anyhow::anyhow!("{CONFIG_FILE}: [isolation] retention = {v:?}: {e}")
            })?;
        }
        Ok(config)
    }

    /// `provider_patience` and `unreachable_patience`, parsed like `grace`.
    pub(super) fn patience(&self) -> anyhow::Result<[Option<Duration>; 2]> {
        let parse = |key: &str, v: &Option<String>| {
            v.as_deref()
                .map(|v| {
                    humantime_duration(v)
                        .map_err(|e| anyhow::anyhow!("{CONFIG_FILE}: {key} = {v:?}: {e}"))
                })
                .transpose()
        };
        Ok([
            parse("provider_patience", &self.provider_patience)?,
            parse("unreachable_patience", &self.unreachable_patience)?,
        ])
    }

    /// `lease`, parsed like `grace`; zero is refused (no daemon could keep a claim).
    pub(super) fn min_free_disk(&self) -> anyhow::Result<Option<forkd_engine::MinFreeDisk>> {
        self.min_free_disk
            .as_deref()
            .map(|v| {
                forkd_engine::MinFreeDisk::parse(v)
                    .map_err(|e| anyhow::anyhow!("{CONFIG_FILE}: {e}"))
            })
            .transpose()
    }

    pub(super) fn lease(&self) -> anyhow::Result<Option<Duration>> {
        self.lease
            .as_deref()
            .map(|v| {
                lease_duration(v).map_err(|e| anyhow::anyhow!("{CONFIG_FILE}: lease = {v:?}: {e}"))
            })
            .transpose()
    }

    /// The price table with the `[models.NAME]` sections applied, each checked: a window must
    /// be positive and a price finite and not negative.
    pub(super) fn models(&self) -> anyhow::Result<Models> {
        let mut models = Models::default();
        for (name, m) in self.models.iter().flatten() {
            let known = pricing::model(name);
            let Some(context_window) = m.context_window.or(known.map(|k| k.context_window)) else {
                bail!(
                    "{CONFIG_FILE}: [models.{name:?}]: context_window is required for a model \
                     the price table does not know ({})",
                    pricing::model_names()
                );
            };
            if context_window == 0 {
                bail!("{CONFIG_FILE}: [models.{name:?}]: context_window must be positive");
            }
            let price = |set: Option<f64>, table: fn(&ModelSpec) -> f64| match set {
                Some(p) if !(p >= 0.0 && p.is_finite()) => bail!(
                    "{CONFIG_FILE}: [models.{name:?}]: prices must be finite and not negative"
                ),
                Some(p) => Ok(p),
                None => Ok(known.map_or(0.0, table)),
            };
            models = models.with(ModelSpec {
                name: name.clone().into(),
                input_per_mtok: price(m.input_per_mtok, |k| k.input_per_mtok)?,
                output_per_mtok: price(m.output_per_mtok, |k| k.output_per_mtok)?,
                min_cache_tokens: m
                    .min_cache_tokens
                    .or(known.map(|k| k.min_cache_tokens))
                    .unwrap_or(1024),
                context_window,
            });
        }
        Ok(models)
    }

    /// The tenants allowed their own MCP server definitions.
    pub(super) fn mcp_config_tenants(&self) -> std::collections::BTreeSet<String> {
        self.tenants
            .iter()
            .flatten()
            .filter(|(_, t)| t.allow_mcp_config == Some(true))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The tenants allowed `full-access` sessions.
    pub(super) fn full_access_tenants(&self) -> std::collections::BTreeSet<String> {
        self.tenants_where(|t| t.allow_full_access)
    }

    /// The tenants whose sessions' commands may use the network.
    pub(super) fn network_tenants(&self) -> std::collections::BTreeSet<String> {
        self.tenants_where(|t| t.allow_network)
    }

    /// Each tenant's `workspace_roots`: absolute, without `..`, resolved where they exist (a
    /// root made later is taken as written).
    pub(super) fn workspace_roots(&self) -> anyhow::Result<BTreeMap<String, Vec<PathBuf>>> {
        let mut roots = BTreeMap::new();
        for (name, t) in self.tenants.iter().flatten() {
            let Some(given) = &t.workspace_roots else {
                continue;
            };
            let mut resolved = Vec::with_capacity(given.len());
            for root in given {
                let plain = root
                    .components()
                    .all(|c| !matches!(c, std::path::Component::ParentDir));
                if !root.is_absolute() || !plain || root.parent().is_none() {
                    bail!(
                        "{CONFIG_FILE}: [tenants.{name}] workspace_roots: {} must be an \
                         absolute directory other than /, without `..`",
                        root.display()
                    );
                }
                resolved.push(std::fs::canonicalize(root).unwrap_or_else(|_| root.clone()));
            }
            roots.insert(name.clone(), resolved);
        }
        Ok(roots)
    }

    /// The tenants allowed the `unix_sockets` grant.
    pub(super) fn unix_socket_tenants(&self) -> std::collections::BTreeSet<String> {
        self.tenants_where(|t| t.allow_unix_sockets)
    }

    fn tenants_where(
        &self,
        allowed: impl Fn(&TenantSection) -> Option<bool>,
    ) -> std::collections::BTreeSet<String> {
        self.tenants
            .iter()
            .flatten()
            .filter(|(_, t)| allowed(t) == Some(true))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// `sandbox_deny`, with `~` expanded to `home`.
    pub(super) fn sandbox_deny(&self, home: Option<&Path>) -> anyhow::Result<Option<Vec<PathBuf>>> {
        home_paths("sandbox_deny", self.sandbox_deny.as_deref(), home)
    }

    /// `sandbox_read_allow`, with `~` expanded to `home`.
    pub(super) fn sandbox_read_allow(
        &self,
        home: Option<&Path>,
    ) -> anyhow::Result<Option<Vec<PathBuf>>> {
        home_paths(
            "sandbox_read_allow",
            self.sandbox_read_allow.as_deref(),
            home,
        )
    }

    /// `[sandbox_limits]` over `limits` (0 lifts a limit).
    pub(super) fn sandbox_limits(
        &self,
        mut limits: forkd_tools::sandbox::ResourceLimits,
    ) -> forkd_tools::sandbox::ResourceLimits {
        let Some(section) = &self.sandbox_limits else {
            return limits;
        };
        let set = |slot: &mut Option<u64>, value: Option<u64>| {
            if let Some(v) = value {
                *slot = (v > 0).then_some(v);
            }
        };
        set(&mut limits.processes, section.processes);
        set(&mut limits.open_files, section.open_files);
        set(&mut limits.file_size, section.file_size);
        set(&mut limits.cpu_seconds, section.cpu_seconds);
        set(&mut limits.address_space, section.address_space);
        set(&mut limits.session_processes, section.session_processes);
        set(&mut limits.session_memory, section.session_memory);
        set(&mut limits.session_cpu_percent, section.session_cpu_percent);
        limits
    }

    /// Each tenant's `upload_quota`, a size (`10GiB`, `500 MB`).
    pub(super) fn upload_quotas(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let mut quotas = BTreeMap::new();
        for (name, t) in self.tenants.iter().flatten() {
            let Some(text) = &t.upload_quota else {
                continue;
            };
            let size = text.trim().parse::<bytesize::ByteSize>().map_err(|e| {
                anyhow::anyhow!(
                    "{CONFIG_FILE}: [tenants.{name}] upload_quota {text:?}: {e} (a size such as \
                     10GiB)"
                )
            })?;
            quotas.insert(name.clone(), size.as_u64());
        }
        Ok(quotas)
    }

    /// `[agent_limits]`, and each tenant's `[tenants.NAME.agent_limits]`.
    pub(super) fn agent_limits(
        &self,
    ) -> anyhow::Result<(forkd_core::Limits, BTreeMap<String, forkd_core::Limits>)> {
        let daemon = match &self.agent_limits {
            Some(section) => section.limits("agent_limits")?,
            None => forkd_core::Limits::default(),
        };
        let mut tenants = BTreeMap::new();
        for (name, t) in self.tenants.iter().flatten() {
            if let Some(section) = &t.agent_limits {
                let key = format!("tenants.{name}.agent_limits");
                tenants.insert(name.clone(), section.limits(&key)?);
            }
        }
        Ok((daemon, tenants))
    }

    /// The `[tenants.NAME]` budgets, each checked to be positive: a zero or negative budget
    /// would fail every agent of the tenant at its first request.
    pub(super) fn tenant_budgets(&self) -> anyhow::Result<BTreeMap<String, forkd_store::Budget>> {
        let mut budgets = BTreeMap::new();
        for (name, t) in self.tenants.iter().flatten() {
            if t.budget_usd.is_some_and(|u| !(u > 0.0 && u.is_finite()))
                || t.budget_tokens == Some(0)
            {
                bail!("{CONFIG_FILE}: [tenants.{name}]: budgets must be positive");
            }
            let budget = forkd_store::Budget {
                usd: t.budget_usd,
                tokens: t.budget_tokens,
            };
            budgets.insert(name.clone(), budget);
        }
        Ok(budgets)
    }
}

/// A list of paths from `key`, each absolute or under `~/` (the daemon user's `home`).
fn home_paths(
    key: &str,
    list: Option<&[String]>,
    home: Option<&Path>,
) -> anyhow::Result<Option<Vec<PathBuf>>> {
    let Some(list) = list else {
        return Ok(None);
    };
    let mut paths = Vec::new();
    for entry in list {
        let path = match (entry.strip_prefix("~/"), home) {
            (Some(rest), Some(home)) => home.join(rest),
            (Some(_), None) => {
                bail!("{CONFIG_FILE}: {key}: {entry:?} starts with ~ but HOME is not set")
            }
            (None, _) => PathBuf::from(entry),
        };
        if !path.is_absolute() {
            bail!("{CONFIG_FILE}: {key}: {entry:?} must be absolute or start with ~/");
        }
        paths.push(path);
    }
    Ok(Some(paths))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn agent_limits_are_read_for_the_daemon_and_each_tenant() {
        let file = FileConfig::parse(
            "[agent_limits]\ntimeout = \"30m\"\nmax_turns = 40\n\
             [tenants.ci.agent_limits]\nidle_timeout = \"2m\"\n",
        )
        .unwrap();
        let (daemon, tenants) = file.agent_limits().unwrap();
        assert_eq!(daemon.timeout_ms, Some(30 * 60_000));
        assert_eq!(daemon.max_turns, Some(40));
        assert_eq!(tenants["ci"].idle_timeout_ms, Some(120_000));
        assert_eq!(tenants["ci"].max_turns, None);
        let bad = FileConfig::parse("[agent_limits]\ntimeout = \"soon\"\n").unwrap();
        let err = bad.agent_limits().unwrap_err().to_string();
        assert!(err.contains("[agent_limits] timeout \"soon\""), "{err}");
        let zero = FileConfig::parse("[tenants.ci.agent_limits]\nmax_turns = 0\n").unwrap();
        let err = zero.agent_limits().unwrap_err().to_string();
        assert!(err.contains("[tenants.ci.agent_limits] max_turns"), "{err}");
    }

    #[test]
    fn upload_quotas_are_sizes_and_a_bad_one_is_named() {
        let file = FileConfig::parse(
            "[tenants.ci]\nupload_quota = \"5GiB\"\n[tenants.web]\nupload_quota = \"500 MB\"\n\
             [tenants.other]\nbudget_usd = 1.0\n",
        )
        .unwrap();
        let quotas = file.upload_quotas().unwrap();
        assert_eq!(quotas.get("ci"), Some(&(5 << 30)));
        assert_eq!(quotas.get("web"), Some(&500_000_000));
        assert_eq!(quotas.get("other"), None);
        let bad = FileConfig::parse("[tenants.ci]\nupload_quota = \"lots\"\n").unwrap();
        let err = bad.upload_quotas().unwrap_err().to_string();
        assert!(err.contains("[tenants.ci] upload_quota \"lots\""), "{err}");
    }
}
