//! Starting and stopping a daemon on a home directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use forkd_core::DaemonId;
use forkd_engine::{Engine, EngineConfig};
use forkd_provider::{
    AnthropicConfig, AnthropicProvider, OpenAiConfig, OpenAiProvider, Provider, SimConfig,
    SimProvider,
};
use forkd_server::{Listeners, ServerConfig, SignInCodes, TlsConfig, TokenStore, WebView};
use forkd_store::{Durability, Holder, PageLimit, PgStore, SqliteStore, Store};
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Which model provider the daemon runs its agents on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The embedded simulated model (no network).
    Sim,
    Anthropic,
    Openai,
}

/// A PostgreSQL database URL (`postgres://user:password@host:5432/database`). It shows itself
/// (`Debug`, `Display`) without its password, so it can be logged.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL itself, password included: for connecting, never for printing.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `postgres://` or `postgresql://`, else an error naming `source` (where the URL was set)
    /// and saying what is accepted.
    pub fn check(&self, source: &str) -> anyhow::Result<()> {
        let scheme = self.0.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some(s)
                if s.eq_ignore_ascii_case("postgres") || s.eq_ignore_ascii_case("postgresql") =>
            {
                Ok(())
            }
            _ => bail!(
                "{source}: {self:?} is not a PostgreSQL URL: use \
                 postgres://user:password@host:5432/database, or set none to keep state in \
                 FORKD_HOME/forkd.db"
            ),
        }
    }
}

impl std::str::FromStr for DatabaseUrl {
    type Err = std::convert::Infallible;

    /// Takes any text: [`DatabaseUrl::check`] judges it, in an error that does not show the
    /// password (a parser's error would quote the value whole).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&forkd_store::redacted_url(&self.0))
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// Everything a daemon needs to start.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Holds the socket, and the SQLite database unless `database_url` is set.
    pub home: PathBuf,
    /// A PostgreSQL database to keep the daemon's state in instead of `home/forkd.db`. Several
    /// daemons may share one: each claims the agents it runs with a lease it renews by heartbeat,
    /// and adopts those of a daemon whose leases expired.
    pub database_url: Option<DatabaseUrl>,
    /// How long this daemon's claims on running agents last without a heartbeat.
    pub lease: Duration,
    /// An extra TCP listener, where every call needs a bearer token (the Unix socket is the
    /// local user's tokenless way in). Off loopback at least one must exist in
    /// `home/tokens.json`, or the daemon refuses to start.
    pub listen: Option<SocketAddr>,
    /// Serve Prometheus metrics (`GET /metrics`, plain HTTP) on this address (port 0 picks a
    /// free one: see [`RunningDaemon::metrics_addr`]). One process has one metrics recorder: a
    /// second daemon in the same process asking for it fails to start.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web view on this address (port 0 picks a free one: see
    /// [`RunningDaemon::ui_addr`]). Callers sign in with a token, or as the local user with a
    /// link minted over the Unix socket (`forkctl ui`). Off loopback it needs tokens, as
    /// `listen` does; it uses `tls` when that is set.
    pub ui_listen: Option<SocketAddr>,
    /// The web view links a batch's or agent's trace id here (`{trace_id}` replaced): a trace
    /// UI such as Jaeger's `http://localhost:16686/trace/{trace_id}`.
    pub trace_url_template: Option<String>,
    /// TLS on the TCP listener and the web view (needs `listen` or `ui_listen`).
    pub tls: Option<TlsFiles>,
    /// The key that seals sessions' own MCP server definitions in the database (32 bytes as
    /// hex). `None`: `home/secret.key`, created on first start. Daemons sharing a database
    /// need the same key to use each other's sessions' own servers.
    pub secret_key_file: Option<PathBuf>,
    /// Where a token tenant that names no workspace gets a fresh empty one; hidden from every
    /// other session. `None`: [`default_workspaces_dir`], beside the home. Never inside the home.
    pub workspaces_dir: Option<PathBuf>,
    /// Sessions made from uploads work in layers over trees kept read-only, seen at
    /// `/forkd/workspaces/SESSION_ID` (made at start when the daemon runs as root; where it is
    /// missing, each such session gets a copy of its tree). `false`: always copies.
    pub layered_uploads: bool,
    pub provider: ProviderKind,
    /// The `anthropic` provider's settings; read from `ANTHROPIC_*` when unset.
    pub anthropic: Option<AnthropicConfig>,
    /// The `openai` provider's settings; read from `OPENAI_*` when unset.
    pub openai: Option<OpenAiConfig>,
    /// The sim's speed factor: 0 is instant, 1 is a realistic pace.
    pub sim_speed: f64,
    pub durability: Durability,
    pub engine: EngineConfig,
    pub server: ServerConfig,
}

impl DaemonConfig {
    pub fn new(home: PathBuf) -> Self {
        Self {
            home,
            database_url: None,
            lease: forkd_store::Holder::DEFAULT_LEASE,
            listen: None,
            metrics_listen: None,
            ui_listen: None,
            trace_url_template: None,
            tls: None,
            secret_key_file: None,
            workspaces_dir: None,
            layered_uploads: true,
            provider: ProviderKind::Sim,
            anthropic: None,
            openai: None,
            sim_speed: 0.0,
            durability: Durability::Normal,
            engine: EngineConfig::default(),
            server: ServerConfig::default(),
        }
    }

    pub fn socket_path(&self) -> PathBuf {
        self.home.join("forkd.sock")
    }
}

/// The PEM files of the TCP listener's TLS certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The certificate's private key.
    pub key: PathBuf,
}

/// A started daemon.
pub struct RunningDaemon {
    pub socket_path: PathBuf,
    /// The TCP address actually bound (an ephemeral port resolved).
    pub tcp_addr: Option<SocketAddr>,
    /// The metrics listener's address actually bound (port 0 resolved).
    pub metrics_addr: Option<SocketAddr>,
    /// The web view's address actually bound (port 0 resolved).
    pub ui_addr: Option<SocketAddr>,
    pub engine: Engine,
    /// On SQLite, the cap on the database's size that fault-injection tests set to fill it
    /// (see [`PageLimit`]); unset, it costs nothing.
    pub page_limit: Option<PageLimit>,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), forkd_server::ServerError>>,
}

impl RunningDaemon {
    /// The address clients use: `unix:///…/forkd.sock`.
    pub fn addr(&self) -> String {
        format!("unix://{}", self.socket_path.display())
    }

    /// Stops accepting, lets open calls and agent runs finish within `grace`, and returns.
    pub async fn shutdown(self, grace: Duration) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.engine.shutdown(grace).await;
        let served = tokio::time::timeout(grace, self.server).await;
        let _ = std::fs::remove_file(&self.socket_path);
        match served {
            Ok(joined) => joined
                .context("server task panicked")?
                .context("server failed"),
            Err(_) => {
                tracing::warn!("Open calls did not finish within the grace period");
                Ok(())
            }
        }
    }
}

/// Where tenants' fresh workspaces go when the configuration names no place: beside the home,
/// named after it (`~/.forkd` → `~/.forkd-workspaces`), so that two homes never share one and
/// it is never inside a home.
pub fn default_workspaces_dir(home: &Path) -> PathBuf {
    let mut name = home
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_else(|| "forkd".into());
    name.push("-workspaces");
    home.with_file_name(name)
}

/// The directory of tenants' fresh workspaces, resolved as far as it exists (the engine makes
/// it, mode 0700, with the first fresh workspace), refusing one inside the home or holding it.
fn prepare_workspaces_dir(config: &DaemonConfig, home: &Path) -> anyhow::Result<PathBuf> {
    let dir = config
        .workspaces_dir
        .clone()
        .unwrap_or_else(|| default_workspaces_dir(home));
    let dir = std::path::absolute(&dir)
        .with_context(|| format!("cannot resolve workspaces_dir {}", dir.display()))?;
    // Its deepest existing ancestor resolved, the rest as written.
    let dir = dir
        .ancestors()
        .find_map(|a| {
            let canonical = std::fs::canonicalize(a).ok()?;
            Some(canonical.join(dir.strip_prefix(a).ok()?))
        })
        .unwrap_or(dir);
    if dir.starts_with(home) || home.starts_with(&dir) {
        anyhow::bail!(
            "workspaces_dir {} must lie outside FORKD_HOME {} (and not hold it): a tenant's \
             workspace is never inside the daemon's home",
            dir.display(),
            home.display()
        );
    }
    Ok(dir)
}

/// `/forkd/workspaces`, where sessions made from uploads are seen, when it is a directory here
/// that no one else may change: made now when the daemon runs as root. Where it is missing or
/// open to others, such sessions get copies.
fn view_root() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let root = Path::new(forkd_tools::sandbox::layer::VIEW_ROOT);
    if std::fs::symlink_metadata(root).is_err()
        && nix::unistd::geteuid().is_root()
        && let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(root)
    {
        tracing::warn!(path = %root.display(), error = %e, "Cannot make the directory sessions made from uploads are seen in");
    }
    // Each of `/forkd` and `/forkd/workspaces`: a real directory (no link), the daemon's user's
    // or root's, that nobody else may write in.
    let uid = nix::unistd::geteuid().as_raw();
    let unsafe_reason = root.ancestors().take(2).find_map(|dir| {
        let why = match std::fs::symlink_metadata(dir) {
            Err(e) => e.to_string(),
            Ok(m) if !m.file_type().is_dir() => "not a directory".into(),
            Ok(m) if m.uid() != 0 && m.uid() != uid => format!("owned by uid {}", m.uid()),
            Ok(m) if m.mode() & 0o022 != 0 => "writable by others".into(),
            Ok(_) => return None,
        };
        Some(format!("{}: {why}", dir.display()))
    });
    match unsafe_reason {
        None => {
            tracing::info!(path = %root.display(), "Sessions made from uploads work in layers over trees kept read-only");
            Some(root.to_path_buf())
        }
        Some(why) => {
            tracing::info!(path = %root.display(), reason = %why, "Sessions made from uploads get a copy of their tree each: make this directory (root's, 0755) to share trees read-only");
            None
        }
    }
}

/// Creates the home (mode 0700) if it is missing; warns when an existing one is open to others.
pub fn prepare_home(home: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if home.is_dir() {
        // An existing directory is the operator's: warn about loose permissions, change nothing.
        let mode = std::fs::metadata(home)?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(home = %home.display(), mode = format!("{:o}", mode & 0o777), "FORKD_HOME is readable by others; transcripts are stored there");
        }
        return Ok(());
    }
    // The home holds every client's transcripts: only its owner may enter it.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
        .with_context(|| format!("cannot create FORKD_HOME {}", home.display()))?;
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot restrict {}", home.display()))?;
    Ok(())
}

/// Binds the socket, replacing a stale one but never a live daemon's.
async fn bind_socket(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            bail!(
                "another forkd is already serving on {}; stop it first or use another FORKD_HOME",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", path.display()))?;
    Ok(listener)
}

/// The configured model provider. Real providers read their keys and base URLs from the
/// environment (`ANTHROPIC_*`, `OPENAI_*`).
fn provider(config: &DaemonConfig) -> anyhow::Result<Arc<dyn Provider>> {
    Ok(match config.provider {
        ProviderKind::Sim => Arc::new(SimProvider::new(SimConfig {
            speed: config.sim_speed,
            ..SimConfig::default()
        })),
        ProviderKind::Anthropic => {
            let settings = match &config.anthropic {
                Some(settings) => settings.clone(),
                None => AnthropicConfig::from_env().context("FORKD_PROVIDER=anthropic")?,
            };
            Arc::new(AnthropicProvider::new(settings)?)
        }
        ProviderKind::Openai => {
            let settings = match &config.openai {
                Some(settings) => settings.clone(),
                None => OpenAiConfig::from_env().context("FORKD_PROVIDER=openai")?,
            };
            Arc::new(OpenAiProvider::new(settings)?)
        }
    })
}

/// Raises the soft limit on open files to the hard one (often 1024 against 524288): each client,
/// stream, database connection, sandbox view and tool command holds descriptors. The sandbox's
/// cache of views is sized from what it gets.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
    let soft = match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(e) => {
            tracing::warn!(soft, hard, error = %e, "Cannot raise the limit on open files");
            soft
        }
    };
    let views = forkd_tools::sandbox::size_view_cache(soft);
    tracing::debug!(open_files = soft, views, "Open files limit");
}

/// Says at start what the sandbox found: whether sandboxed Bash commands can run here, and if
/// not, why (they then fail with that reason; nothing runs unconfined).
async fn log_sandbox(sandbox: &forkd_engine::SandboxConfig) {
    if let Err(e) = forkd_tools::sandbox::private_root(&sandbox.tmp_root) {
        tracing::error!(error = %e, "Sandboxed commands cannot run: they fail with this reason");
        return;
    }
    let scratch = sandbox.tmp_root.join("probe");
    if let Err(e) = std::fs::create_dir_all(&scratch) {
        tracing::warn!(dir = %scratch.display(), error = %e, "Cannot create the sandbox's temporary directory");
        return;
    }
    let probe = forkd_tools::sandbox::probe(&scratch).await;
    let layers = forkd_tools::sandbox::layers(
        forkd_core::session::Sandbox {
            mode: forkd_core::session::SandboxMode::WorkspaceWrite,
            allow_network: false,
            unix_sockets: false,
        },
        &sandbox.limits,
    );
    let no_cgroup = forkd_tools::sandbox::cgroup::hierarchy().err();
    match probe.failure {
        None => tracing::info!(
            landlock_abi = probe.landlock_abi,
            default = sandbox.default_mode.as_str(),
            %layers,
            no_cgroup,
            "Sandbox ready"
        ),
        Some(why) => tracing::warn!(
            landlock_abi = probe.landlock_abi,
            default = sandbox.default_mode.as_str(),
            %why,
            "Sandboxed Bash commands cannot run on this machine; they will fail saying so \
             (sessions created with --sandbox full-access run unconfined)"
        ),
    }
}

/// The store: PostgreSQL at `database_url` when it is set, else SQLite in the home (with its
/// fault-injection cap); it claims agents for `holder`.
async fn open_store(
    config: &DaemonConfig,
    holder: Holder,
) -> anyhow::Result<(Arc<dyn Store>, Option<PageLimit>)> {
    let Some(url) = &config.database_url else {
        let db = config.home.join("forkd.db");
        let store = SqliteStore::open(&db, config.durability)
            .await
            .with_context(|| format!("cannot open the database {}", db.display()))?;
        let limit = store.page_limit().clone();
        return Ok((Arc::new(store.with_holder(holder)), Some(limit)));
    };
    url.check("database_url")?;
    if config.durability == Durability::Full {
        tracing::warn!(
            "fsync_every_commit applies to SQLite only; PostgreSQL's own settings (synchronous_commit) decide when its commits reach the disk"
        );
    }
    let store = PgStore::connect(url.as_str())
        .await
        .with_context(|| format!("cannot open the PostgreSQL database {url}"))?;
    tracing::info!(database = %url, "Keeping state in PostgreSQL");
    Ok((Arc::new(store.with_holder(holder)), None))
}

/// The daemon's secret key: from `secret_key_file`, or from `home/secret.key`, written with a
/// new random key (readable by the daemon's user only) when it does not exist yet.
fn secret_key(config: &DaemonConfig) -> anyhow::Result<forkd_engine::sealed::SecretKey> {
    use forkd_engine::sealed::SecretKey;
    let (path, create) = match &config.secret_key_file {
        Some(path) => (path.clone(), false),
        None => (config.home.join("secret.key"), true),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let text = SecretKey::generate_hex()?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            file.write_all(format!("{text}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .with_context(|| format!("cannot write {}", path.display()))?;
            tracing::info!(file = %path.display(), "Created the secret key that seals sessions' own MCP server definitions");
            text
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot read the secret key {}", path.display()));
        }
    };
    SecretKey::from_hex(&text).with_context(|| format!("{} is not a secret key", path.display()))
}

/// The operator's MCP servers, from `home/mcp.json` (none when it is missing), with `${VAR}`
/// expanded from the daemon's environment. A broken file stops the start, naming what is wrong.
fn operator_mcp_servers(
    home: &Path,
) -> anyhow::Result<std::collections::HashMap<String, forkd_mcp::ServerSpec>> {
    let path = home.join("mcp.json");
    let Some(text) = operator_file(&path)? else {
        return Ok(Default::default());
    };
    let servers = forkd_engine::McpConfig::from_file(&text, &|name| std::env::var(name).ok())
        .with_context(|| format!("{} is not usable", path.display()))?;
    if !servers.is_empty() {
        let mut names: Vec<&str> = servers.keys().map(String::as_str).collect();
        names.sort_unstable();
        tracing::info!(servers = %names.join(", "), "MCP servers defined");
    }
    Ok(servers)
}

/// An operator's file in the home, `None` when it is missing.
fn operator_file(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The operator's hooks, from `home/hooks.json` (none when it is missing). A broken file stops
/// the start, naming what is wrong.
fn operator_hooks(home: &Path) -> anyhow::Result<forkd_engine::HooksConfig> {
    let path = home.join("hooks.json");
    let Some(text) = operator_file(&path)? else {
        return Ok(Default::default());
    };
    let hooks = forkd_engine::HooksConfig::from_file(&text)
        .map_err(|e| anyhow::anyhow!("{} is not usable: {e}", path.display()))?;
    tracing::info!(tenants = hooks.tenants.len(), "Hooks defined");
    Ok(hooks)
}

/// Starts a daemon: opens the store, builds the engine, binds the listeners and serves.
pub async fn start(config: DaemonConfig) -> anyhow::Result<RunningDaemon> {
    // Read (and so validated) now: a broken token file is a start-up error, not a surprise at
    // the first call. The server re-reads it when it changes.
    let tokens = TokenStore::in_home(&config.home);
    let has_tokens = tokens.has_tokens()?;
    // Over TCP only a token names a caller, on loopback too (`forkd_server::auth`), so a TCP
    // listener without any token serves no one. On loopback that is a daemon whose operator has
    // not made one yet: it starts and says so. Off loopback it is a mistake worth stopping for:
    // the network was meant to reach this daemon, and the operator should make the token (and
    // choose TLS) before it does.
    if let Some(addr) = config.listen
        && !addr.ip().is_loopback()
    {
        if !has_tokens {
            bail!(
                "refusing to listen on {addr} without bearer tokens: every TCP call needs one, so \
                 the network would reach a listener that serves no one. Create one with `forkd \
                 token create NAME` (clients send it as FORKD_TOKEN), or listen on 127.0.0.1"
            );
        }
        if config.tls.is_none() {
            tracing::warn!(%addr, "Serving TCP off loopback without TLS: bearer tokens cross the network in clear text; set --tls-cert and --tls-key");
        }
    }
    if let Some(addr) = config.ui_listen
        && !addr.ip().is_loopback()
    {
        if !has_tokens {
            bail!(
                "refusing to serve the web view on {addr} without bearer tokens: off loopback it \
                 is for others, who sign in with one. Create one with `forkd token create NAME`, \
                 or serve it on 127.0.0.1 (and sign in with the link `forkctl ui` prints)"
            );
        }
        if config.tls.is_none() {
            tracing::warn!(%addr, "Serving the web view off loopback without TLS: tokens and transcripts cross the network in clear text; set --tls-cert and --tls-key");
        }
    }
    if !has_tokens && let Some(addr) = config.listen {
        tracing::info!(%addr, "No bearer token exists yet: the TCP listener refuses every call until one is made with `forkd token create NAME`; the Unix socket needs none");
    }
    let tls = match &config.tls {
        Some(_) if config.listen.is_none() && config.ui_listen.is_none() => bail!(
            "TLS applies to the TCP listener and the web view, and there is neither: set \
             --listen or --ui-listen (or FORKD_LISTEN / FORKD_UI_LISTEN, or listen / ui_listen \
             in config.toml) too"
        ),
        Some(files) => Some(TlsConfig::from_files(&files.cert, &files.key)?),
        None => None,
    };
    // A fresh id each start: it names this daemon in leases, logs, `forkctl ps` and metrics.
    let holder = Holder {
        daemon: DaemonId::new(),
        lease: config.lease,
    };
    tracing::info!(daemon.id = %holder.daemon, lease = ?holder.lease, "forkd daemon starting");
    let metrics = match config.metrics_listen {
        Some(addr) => Some(crate::metrics::Endpoint::bind(addr, holder.daemon).await?),
        None => None,
    };
    let ui = match config.ui_listen {
        Some(addr) => {
            let paths = config.tls.as_ref().map(|f| forkd_web::TlsPaths {
                cert: &f.cert,
                key: &f.key,
            });
            Some(forkd_web::WebEndpoint::bind(addr, paths).await?)
        }
        None => None,
    };
    prepare_home(&config.home)?;
    let (store, page_limit) = open_store(&config, holder).await?;
    let provider = provider(&config)?;
    let mut engine_config = config.engine.clone();
    engine_config.agent_dirs.push(config.home.join("agents"));
    // The daemon's home (database, socket, tokens) is hidden from every sandboxed command.
    let home = std::fs::canonicalize(&config.home).unwrap_or_else(|_| config.home.clone());
    // Isolated batches' snapshots and copies live in the home, hidden with it.
    engine_config.isolation.root = home.join("isolation");
    engine_config.sandbox.hidden.push(home.clone());
    let workspaces_dir = prepare_workspaces_dir(&config, &home)?;
    // Tenants' fresh workspaces: each session sees its own, no other.
    engine_config.sandbox.hidden.push(workspaces_dir.clone());
    engine_config.workspaces.home = Some(home);
    engine_config.workspaces.dir = Some(workspaces_dir);
    engine_config.workspaces.view_root = config.layered_uploads.then(view_root).flatten();
    engine_config.mcp.servers = operator_mcp_servers(&config.home)?;
    engine_config.hooks = operator_hooks(&config.home)?;
    engine_config.mcp.secret_key = Some(Arc::new(secret_key(&config)?));
    log_sandbox(&engine_config.sandbox).await;
    raise_open_files();
    tokio::spawn(async {
        // Idle views go on time, their descriptors with them, whether or not commands come.
        let mut every = tokio::time::interval(std::time::Duration::from_secs(30));
        loop {
            every.tick().await;
            forkd_tools::sandbox::evict_idle_views();
        }
    });
    let engine = Engine::new(store, provider, engine_config);

    let socket_path = config.socket_path();
    // Binding the socket is what proves no other daemon serves this home, and so (on SQLite)
    // this database. Only then does this daemon resume the agents no daemon holds: on SQLite
    // every live one (a predecessor on this home is gone); on PostgreSQL those whose holder's
    // lease has expired. The heartbeat then renews this daemon's leases and adopts those that
    // expire later.
    let unix = bind_socket(&socket_path).await?;
    // Before anything runs, so that every notification reaches this daemon's subscribers.
    engine.start_notification_feed().await?;
    let resumed = engine.resume_interrupted().await?;
    if resumed > 0 {
        tracing::info!(resumed, "Resumed agents no live daemon holds");
    }
    engine.start_heartbeat();
    engine.start_webhooks();
    forkd_server::start_schedules(engine.clone(), tokens.clone(), engine.drain_token());
    engine.start_recovery();

    let (tcp, tcp_addr) = match config.listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            let bound = listener.local_addr()?;
            (Some(listener), Some(bound))
        }
        None => (None, None),
    };
    let shutdown = CancellationToken::new();
    let metrics_addr = match metrics {
        Some(endpoint) => {
            let addr = endpoint.local_addr()?;
            endpoint.serve(engine.clone(), shutdown.clone());
            tracing::info!(%addr, "Serving Prometheus metrics at /metrics");
            Some(addr)
        }
        None => None,
    };
    // The web view redeems the codes of sign-in links that the gRPC server mints, in memory:
    // a code never leaves this process but in the link its minter asked for.
    let (ui_addr, web_view) = match ui {
        Some(endpoint) => {
            let addr = endpoint.local_addr();
            let https = endpoint.tls();
            let scheme = if https { "https" } else { "http" };
            let codes = SignInCodes::default();
            let web = forkd_web::WebConfig {
                tokens: tokens.clone(),
                codes: codes.clone(),
                trace_url_template: config.trace_url_template.clone(),
            };
            endpoint.serve(engine.clone(), web, shutdown.clone());
            tracing::info!(ui = %addr, "Serving the web view at {scheme}://{addr}/");
            tracing::info!(ui = %addr, "Sign in to the web view with a token, or as this daemon's own user with the one-time link `forkctl ui` prints");
            (Some(addr), Some(WebView::new(addr, https, codes)))
        }
        None => (None, None),
    };
    let mut server_config = config.server.clone();
    server_config.tokens = Some(tokens);
    server_config.tls = tls;
    server_config.web_view = web_view;
    let tls_on = server_config.tls.is_some();
    let server = tokio::spawn(forkd_server::serve(
        engine.clone(),
        Listeners {
            unix: Some(unix),
            tcp,
        },
        server_config,
        shutdown.clone(),
    ));
    tracing::info!(socket = %socket_path.display(), tcp = ?tcp_addr, tls = tls_on, "forkd serving");
    Ok(RunningDaemon {
        socket_path,
        tcp_addr,
        metrics_addr,
        ui_addr,
        engine,
        page_limit,
        shutdown,
        server,
    })
}
