//! Every setting of `forkd serve`, resolved: each from its layers (see [`super::layers`]) over
//! its default, and then turned into the [`DaemonConfig`] that `daemon::start` takes.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use forkd_provider::{AnthropicConfig, OpenAiConfig};
use forkd_store::Durability;

use super::LogFormat;
use super::file::{CONFIG_FILE, FileConfig, PROVIDER_VARS};
use super::flags::ServeFlags;
use super::layers::{
    Layers, boolean, duration, from_str, lease, min_free_disk, path, text, value_enum,
};
use crate::daemon::{DaemonConfig, DatabaseUrl, ProviderKind, TlsFiles};

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
    /// The web view's address.
    pub ui_listen: Option<SocketAddr>,
    pub grace: Duration,
    /// How long this daemon's claims on running agents last without a heartbeat.
    pub lease: Duration,
    pub fsync_every_commit: bool,
    /// New work is refused below this much free space under the database.
    pub min_free_disk: forkd_engine::MinFreeDisk,
    /// PostgreSQL instead of SQLite; `None`: `forkd.db` in the home.
    pub database_url: Option<DatabaseUrl>,
    /// The log filter.
    pub log: String,
    pub log_format: LogFormat,
    pub tls: Option<TlsFiles>,
    /// `None`: `secret.key` in the home, created on first start.
    pub secret_key_file: Option<PathBuf>,
    /// Where tenants' fresh workspaces go; `None`: beside the home (`HOME-workspaces`).
    pub workspaces_dir: Option<PathBuf>,
    /// Each token tenant's `workspace_roots`.
    pub workspace_roots: BTreeMap<String, Vec<PathBuf>>,
    /// `None`: no cap.
    pub max_running_agents: Option<usize>,
    pub max_concurrent_requests: Option<usize>,
    /// How long a refused model request keeps trying, and the same for an unreachable
    /// provider.
    pub provider_patience: Duration,
    pub unreachable_patience: Duration,
    pub max_agent_depth: u32,
    pub compact_threshold: f64,
    pub tenant_budgets: BTreeMap<String, forkd_store::Budget>,
    /// The daemon's limits on agents' runs (`[agent_limits]`), over the built-in defaults.
    pub agent_limits: forkd_core::Limits,
    /// Each tenant's limits (`[tenants.NAME.agent_limits]`).
    pub tenant_limits: BTreeMap<String, forkd_core::Limits>,
    /// Each token tenant's `upload_quota`, in bytes.
    pub upload_quotas: BTreeMap<String, u64>,
    /// The sandbox of sessions' Bash commands.
    pub sandbox: forkd_engine::SandboxConfig,
    /// Isolated children's copies (their root is set in the home by the daemon).
    pub isolation: forkd_engine::IsolationConfig,
    /// Webhooks' deliveries (`[webhooks]`).
    pub webhooks: forkd_engine::WebhookConfig,
    /// The tenants that may define their own MCP servers (the servers are read from
    /// `$FORKD_HOME/mcp.json` when the daemon starts).
    pub mcp_config_tenants: std::collections::BTreeSet<String>,
    /// The price table with `[models]` applied.
    pub models: forkd_core::pricing::Models,
    /// OTLP trace export; `None`: off.
    pub tracing: Option<crate::telemetry::TracingConfig>,
    /// The web view's link to a trace UI (`[tracing] trace_url_template`,
    /// `FORKD_TRACE_URL_TEMPLATE`).
    pub trace_url_template: Option<String>,
    /// The provider variables, environment over file.
    pub(super) provider_vars: ProviderVars,
}

/// Provider variables with their values redacted from debug output.
#[derive(Clone, Default, PartialEq)]
pub(super) struct ProviderVars(pub(super) BTreeMap<&'static str, String>);

impl fmt::Debug for ProviderVars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl Default for Settings {
    /// What `forkd serve` does when no flag, variable or key says otherwise: the one place each
    /// default is written. What the engine and the daemon library already default is taken from
    /// them, so `forkd serve` and an embedded daemon agree; the rest is `serve`'s own.
    fn default() -> Self {
        let daemon = DaemonConfig::new(PathBuf::new());
        let engine = daemon.engine;
        Self {
            provider: daemon.provider,
            // The library's daemon answers instantly (tests, the demo); people get a real pace.
            sim_speed: 1.0,
            auto_background_secs: engine.auto_background.map_or(0, |d| d.as_secs()),
            fork_always_async: engine.fork_always_async,
            warmup_gating: engine.warmup_gating,
            listen: daemon.listen,
            metrics_listen: daemon.metrics_listen,
            ui_listen: daemon.ui_listen,
            grace: Duration::from_secs(10),
            lease: daemon.lease,
            fsync_every_commit: daemon.durability == Durability::Full,
            min_free_disk: engine.min_free_disk,
            database_url: daemon.database_url,
            log: "info".to_owned(),
            log_format: LogFormat::default(),
            tls: daemon.tls,
            secret_key_file: daemon.secret_key_file,
            workspaces_dir: daemon.workspaces_dir,
            workspace_roots: BTreeMap::new(),
            max_running_agents: engine.max_running_agents,
            max_concurrent_requests: Some(engine.admission.max_concurrency),
            provider_patience: engine.admission.patience,
            unreachable_patience: engine.admission.unreachable_patience,
            max_agent_depth: engine.max_agent_depth,
            compact_threshold: engine.compact_threshold,
            tenant_budgets: BTreeMap::new(),
            agent_limits: engine.agent_limits,
            tenant_limits: BTreeMap::new(),
            upload_quotas: BTreeMap::new(),
            sandbox: engine.sandbox,
            isolation: engine.isolation,
            webhooks: engine.webhooks,
            mcp_config_tenants: Default::default(),
            models: engine.models,
            tracing: None,
            trace_url_template: None,
            provider_vars: ProviderVars::default(),
        }
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
        let layers = Layers::new(env);
        let mut settings = Self::default();
        settings.resolve_model(flags, &layers, file)?;
        settings.resolve_agents(flags, &layers, file)?;
        settings.resolve_listeners(flags, &layers, file, home)?;
        settings.resolve_process(flags, &layers, file)?;
        settings.tracing = resolve_tracing(flags, &layers, file)?;
        let template = file
            .tracing
            .as_ref()
            .and_then(|t| t.trace_url_template.clone());
        settings.trace_url_template =
            layers.pick(None, "FORKD_TRACE_URL_TEMPLATE", text, template)?;
        Ok(settings)
    }

    /// The model: which provider, the sim's pace, and the providers' own variables.
    fn resolve_model<E: Fn(&str) -> Option<String>>(
        &mut self,
        flags: &ServeFlags,
        layers: &Layers<E>,
        file: &FileConfig,
    ) -> anyhow::Result<()> {
        let provider = layers.pick(flags.provider, "FORKD_PROVIDER", value_enum, file.provider)?;
        self.provider = provider.unwrap_or(self.provider);
        let sim_speed =
            layers.pick(flags.sim_speed, "FORKD_SIM_SPEED", from_str, file.sim_speed)?;
        self.sim_speed = sim_speed.unwrap_or(self.sim_speed);
        for name in PROVIDER_VARS {
            let value = layers.pick(None, name, text, file.provider_var(name).cloned())?;
            if let Some(value) = value {
                self.provider_vars.0.insert(name, value);
            }
        }
        Ok(())
    }

    /// How agents run: backgrounding, gating, the caps on running agents and requests, budgets.
    fn resolve_agents<E: Fn(&str) -> Option<String>>(
        &mut self,
        flags: &ServeFlags,
        layers: &Layers<E>,
        file: &FileConfig,
    ) -> anyhow::Result<()> {
        let secs = flags.auto_background_secs;
        let secs = layers.pick(
            secs,
            "FORKD_AUTO_BACKGROUND_SECS",
            from_str,
            file.auto_background_secs,
        )?;
        self.auto_background_secs = secs.unwrap_or(self.auto_background_secs);
        let fork_async = layers.pick(
            None,
            "FORKD_FORK_ALWAYS_ASYNC",
            boolean,
            file.fork_always_async,
        )?;
        self.fork_always_async = fork_async.unwrap_or(self.fork_always_async);
        // The flag can only turn gating off.
        let gating = flags.no_warmup_gating.then_some(false);
        let gating = layers.pick(gating, "FORKD_WARMUP_GATING", boolean, file.warmup_gating)?;
        self.warmup_gating = gating.unwrap_or(self.warmup_gating);
        // A cap of 0 is written for "no cap", which the engine spells `None`.
        let cap = |value: Option<usize>, default| value.map_or(default, |n| (n > 0).then_some(n));
        let running = layers.pick(
            None,
            "FORKD_MAX_RUNNING_AGENTS",
            from_str,
            file.max_running_agents,
        )?;
        self.max_running_agents = cap(running, self.max_running_agents);
        let requests = file.max_concurrent_requests;
        let requests = layers.pick(None, "FORKD_MAX_CONCURRENT_REQUESTS", from_str, requests)?;
        self.max_concurrent_requests = cap(requests, self.max_concurrent_requests);
        let [patience, unreachable] = file.patience()?;
        let patience = layers.pick(
            flags.provider_patience,
            "FORKD_PROVIDER_PATIENCE",
            duration,
            patience,
        )?;
        self.provider_patience = patience.unwrap_or(self.provider_patience);
        let unreachable = layers.pick(
            flags.unreachable_patience,
            "FORKD_UNREACHABLE_PATIENCE",
            duration,
            unreachable,
        )?;
        self.unreachable_patience = unreachable.unwrap_or(self.unreachable_patience);
        let depth = file.max_agent_depth;
        let depth = layers.pick(None, "FORKD_MAX_AGENT_DEPTH", from_str, depth)?;
        self.max_agent_depth = depth.unwrap_or(self.max_agent_depth);
        let threshold = layers.pick(
            flags.compact_threshold,
            "FORKD_COMPACT_THRESHOLD",
            from_str,
            file.compact_threshold,
        )?;
        if let Some(t) = threshold {
            if !(0.1..=1.0).contains(&t) {
                anyhow::bail!("compact_threshold = {t}: a share of the window between 0.1 and 1.0");
            }
            self.compact_threshold = t;
        }
        self.tenant_budgets = file.tenant_budgets()?;
        let (agent_limits, tenant_limits) = file.agent_limits()?;
        self.agent_limits = agent_limits.over(self.agent_limits);
        self.tenant_limits = tenant_limits;
        self.upload_quotas = file.upload_quotas()?;
        let file_mode = file.sandbox.as_deref();
        let file_mode = file_mode.map(|v| sandbox_mode("sandbox", v)).transpose()?;
        let mode = layers.pick(None, "FORKD_SANDBOX", sandbox_mode, file_mode)?;
        self.sandbox.default_mode = mode.unwrap_or(self.sandbox.default_mode);
        let home = layers.var("HOME").map(PathBuf::from);
        if let Some(deny) = file.sandbox_deny(home.as_deref())? {
            self.sandbox.hidden = deny;
        }
        if let Some(home) = &home {
            let allow = match file.sandbox_read_allow(Some(home))? {
                Some(allow) => allow,
                None => forkd_tools::sandbox::default_read_allow(
                    home,
                    layers.var("PATH").map(std::ffi::OsString::from).as_deref(),
                ),
            };
            self.sandbox.home = Some(forkd_tools::sandbox::HomeView {
                dir: home.clone(),
                allow,
            });
        }
        self.sandbox.limits = file.sandbox_limits(self.sandbox.limits);
        self.isolation = file.isolation(self.isolation.clone())?;
        if let Some(section) = &file.webhooks {
            self.webhooks = section.apply(self.webhooks.clone())?;
        }
        self.sandbox.full_access_tenants = file.full_access_tenants().into_iter().collect();
        self.sandbox.unix_socket_tenants = file.unix_socket_tenants().into_iter().collect();
        self.sandbox.network_tenants = file.network_tenants().into_iter().collect();
        self.workspace_roots = file.workspace_roots()?;
        self.mcp_config_tenants = file.mcp_config_tenants();
        self.models = file.models()?;
        Ok(())
    }

    /// The TCP and metrics listeners, and the TCP listener's TLS files.
    fn resolve_listeners<E: Fn(&str) -> Option<String>>(
        &mut self,
        flags: &ServeFlags,
        layers: &Layers<E>,
        file: &FileConfig,
        home: &Path,
    ) -> anyhow::Result<()> {
        let listen = layers.pick(flags.listen, "FORKD_LISTEN", from_str, file.listen)?;
        self.listen = listen.or(self.listen);
        let metrics = flags.metrics_listen;
        let metrics = layers.pick(
            metrics,
            "FORKD_METRICS_LISTEN",
            from_str,
            file.metrics_listen,
        )?;
        self.metrics_listen = metrics.or(self.metrics_listen);
        let ui = layers.pick(flags.ui_listen, "FORKD_UI_LISTEN", from_str, file.ui_listen)?;
        self.ui_listen = ui.or(self.ui_listen);
        // The file's relative paths are the home's: the file lives there, whatever the cwd.
        let in_home = |p: &PathBuf| home.join(p);
        let cert = file.tls_cert.as_ref().map(in_home);
        let cert = layers.pick(flags.tls_cert.clone(), "FORKD_TLS_CERT", path, cert)?;
        let key = file.tls_key.as_ref().map(in_home);
        let key = layers.pick(flags.tls_key.clone(), "FORKD_TLS_KEY", path, key)?;
        let secret = file.secret_key_file.as_ref().map(in_home);
        let secret = layers.pick(
            flags.secret_key_file.clone(),
            "FORKD_SECRET_KEY_FILE",
            path,
            secret,
        )?;
        self.secret_key_file = secret.or(self.secret_key_file.take());
        let workspaces = file.workspaces_dir.as_ref().map(in_home);
        let workspaces = layers.pick(
            flags.workspaces_dir.clone(),
            "FORKD_WORKSPACES_DIR",
            path,
            workspaces,
        )?;
        self.workspaces_dir = workspaces.or(self.workspaces_dir.take());
        self.tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => self.tls.take(),
            (Some(_), None) => bail!(
                "TLS needs a private key too: a certificate is set but no key \
                 (--tls-key, FORKD_TLS_KEY or tls_key in {CONFIG_FILE})"
            ),
            (None, Some(_)) => bail!(
                "TLS needs a certificate too: a key is set but no certificate \
                 (--tls-cert, FORKD_TLS_CERT or tls_cert in {CONFIG_FILE})"
            ),
        };
        Ok(())
    }

    /// The process: shutdown grace, the database, durability and logging.
    fn resolve_process<E: Fn(&str) -> Option<String>>(
        &mut self,
        flags: &ServeFlags,
        layers: &Layers<E>,
        file: &FileConfig,
    ) -> anyhow::Result<()> {
        let grace = layers.pick(flags.grace, "FORKD_GRACE", duration, file.grace()?)?;
        self.grace = grace.unwrap_or(self.grace);
        let lease = layers.pick(flags.lease, "FORKD_LEASE", lease, file.lease()?)?;
        self.lease = lease.unwrap_or(self.lease);
        let fsync = flags.fsync_every_commit;
        let fsync = layers.pick(
            fsync,
            "FORKD_FSYNC_EVERY_COMMIT",
            boolean,
            file.fsync_every_commit,
        )?;
        self.fsync_every_commit = fsync.unwrap_or(self.fsync_every_commit);
        let min_free = layers.pick(
            flags.min_free_disk,
            "FORKD_MIN_FREE_DISK",
            min_free_disk,
            file.min_free_disk()?,
        )?;
        self.min_free_disk = min_free.unwrap_or(self.min_free_disk);
        // Checked here, whichever layer gives it, so that the error names where it came from
        // (and shows the URL without its password).
        let flag = flags.database_url.clone();
        check_database_url(flag.as_ref(), "--database-url")?;
        let file_url = file.database_url.clone();
        check_database_url(file_url.as_ref(), &format!("{CONFIG_FILE}: database_url"))?;
        let url = layers.pick(flag, "FORKD_DATABASE_URL", database_url, file_url)?;
        self.database_url = url.or(self.database_url.take());
        let log = layers.pick(flags.log.clone(), "RUST_LOG", text, file.log.clone())?;
        self.log = log.unwrap_or_else(|| std::mem::take(&mut self.log));
        let format = flags.log_format;
        let format = layers.pick(format, "FORKD_LOG_FORMAT", value_enum, file.log_format)?;
        self.log_format = format.unwrap_or(self.log_format);
        Ok(())
    }

    /// The daemon configuration these settings describe, on `home`.
    pub fn daemon_config(&self, home: PathBuf) -> anyhow::Result<DaemonConfig> {
        let mut config = DaemonConfig::new(home);
        config.listen = self.listen;
        config.metrics_listen = self.metrics_listen;
        config.ui_listen = self.ui_listen;
        config.trace_url_template = self.trace_url_template.clone();
        config.provider = self.provider;
        config.sim_speed = self.sim_speed;
        config.engine.warmup_gating = self.warmup_gating;
        config.engine.trace_content = self.tracing.as_ref().is_some_and(|t| t.capture_content);
        config.engine.auto_background = forkd_engine::auto_background(self.auto_background_secs);
        config.engine.fork_always_async = self.fork_always_async;
        config.engine.max_running_agents = self.max_running_agents;
        config.engine.min_free_disk = self.min_free_disk;
        // No cap: as many as any server would take at once.
        config.engine.admission.max_concurrency = self.max_concurrent_requests.unwrap_or(4096);
        config.engine.admission.initial_concurrency = config
            .engine
            .admission
            .initial_concurrency
            .min(config.engine.admission.max_concurrency);
        config.engine.admission.patience = self.provider_patience;
        config.engine.admission.unreachable_patience = self.unreachable_patience;
        config.engine.max_agent_depth = self.max_agent_depth;
        config.engine.compact_threshold = self.compact_threshold;
        config.engine.tenant_budgets = self
            .tenant_budgets
            .iter()
            .map(|(name, budget)| (name.clone(), *budget))
            .collect();
        config.engine.uploads.quotas = self.upload_quotas.clone();
        config.engine.agent_limits = self.agent_limits;
        config.engine.tenant_limits = self
            .tenant_limits
            .iter()
            .map(|(name, limits)| (name.clone(), *limits))
            .collect();
        config.engine.models = self.models.clone();
        config.engine.sandbox = self.sandbox.clone();
        config.engine.isolation = self.isolation.clone();
        config.engine.webhooks = self.webhooks.clone();
        // Uploads are kept as long as isolated copies (`[isolation] retention`).
        config.engine.uploads.retention = self.isolation.retention;
        config.engine.mcp.config_tenants = self.mcp_config_tenants.iter().cloned().collect();
        config.tls = self.tls.clone();
        config.secret_key_file = self.secret_key_file.clone();
        config.workspaces_dir = self.workspaces_dir.clone();
        config.engine.workspaces.roots = self
            .workspace_roots
            .iter()
            .map(|(name, roots)| (name.clone(), roots.clone()))
            .collect();
        config.database_url = self.database_url.clone();
        config.lease = self.lease;
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

/// `FORKD_DATABASE_URL`'s value, checked to be a PostgreSQL URL.
fn database_url(name: &str, value: &str) -> anyhow::Result<DatabaseUrl> {
    let url = DatabaseUrl::new(value.trim());
    url.check(name)?;
    Ok(url)
}

/// Checks a database URL that a flag or the file gave.
fn check_database_url(url: Option<&DatabaseUrl>, source: &str) -> anyhow::Result<()> {
    url.map_or(Ok(()), |url| url.check(source))
}

/// A sandbox mode's name.
fn sandbox_mode(name: &str, value: &str) -> anyhow::Result<forkd_core::session::SandboxMode> {
    forkd_core::session::SandboxMode::parse(value.trim()).ok_or_else(|| {
        anyhow::anyhow!(
            "{name} = {value:?}: use {}",
            forkd_core::session::SandboxMode::choices()
        )
    })
}

/// Trace export: the flag, else the OpenTelemetry variables (the traces-specific one first),
/// else `[tracing]`; off without an endpoint, and with `OTEL_SDK_DISABLED=true`.
fn resolve_tracing<E: Fn(&str) -> Option<String>>(
    flags: &ServeFlags,
    layers: &Layers<E>,
    file: &FileConfig,
) -> anyhow::Result<Option<crate::telemetry::TracingConfig>> {
    use crate::telemetry::{OtlpProtocol, TracingConfig};
    let section = file.tracing.clone().unwrap_or_default();
    if layers
        .var("OTEL_SDK_DISABLED")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    {
        return Ok(None);
    }
    let protocol = flags
        .otlp_protocol
        .clone()
        .or_else(|| layers.var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
        .or_else(|| layers.var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .or(section.protocol);
    let protocol = match protocol {
        Some(p) => OtlpProtocol::parse(&p)?,
        None => OtlpProtocol::default(),
    };
    // The traces-specific variable is the whole URL; the others are the collector's base.
    let endpoint = match (
        flags.otlp_endpoint.clone(),
        layers.var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ) {
        (Some(base), _) => Some(protocol.traces_url(&base)),
        (None, Some(whole)) => Some(whole.trim().to_owned()),
        (None, None) => layers
            .var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .or(section.endpoint)
            .map(|base| protocol.traces_url(&base)),
    };
    let Some(endpoint) = endpoint else {
        return Ok(None);
    };
    let headers = match layers
        .var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
        .or_else(|| layers.var("OTEL_EXPORTER_OTLP_HEADERS"))
    {
        Some(list) => crate::telemetry::parse_headers(&list)?,
        None => section.headers.unwrap_or_default().into_iter().collect(),
    };
    Ok(Some(TracingConfig {
        endpoint,
        protocol,
        headers,
        service_name: layers
            .var("OTEL_SERVICE_NAME")
            .or(section.service_name)
            .unwrap_or_else(|| "forkd".to_owned()),
        capture_content: section.capture_content.unwrap_or(false),
    }))
}
