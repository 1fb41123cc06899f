//! Starting and stopping a daemon on a home directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use forkd_engine::{Engine, EngineConfig};
use forkd_provider::{
    AnthropicConfig, AnthropicProvider, OpenAiConfig, OpenAiProvider, Provider, SimConfig,
    SimProvider,
};
use forkd_server::{Listeners, ServerConfig};
use forkd_store::{Durability, SqliteStore};
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Which model provider the daemon runs its agents on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderKind {
    /// The embedded simulated model (no network).
    Sim,
    Anthropic,
    Openai,
}

/// Everything a daemon needs to start.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Holds the database and the socket.
    pub home: PathBuf,
    /// An extra TCP listener.
    pub listen: Option<SocketAddr>,
    pub provider: ProviderKind,
    /// The `anthropic` provider's settings; read from `ANTHROPIC_*` when unset.
    pub anthropic: Option<AnthropicConfig>,
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
            listen: None,
            provider: ProviderKind::Sim,
            anthropic: None,
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

/// A started daemon.
pub struct RunningDaemon {
    pub socket_path: PathBuf,
    /// The TCP address actually bound (an ephemeral port resolved).
    pub tcp_addr: Option<SocketAddr>,
    pub engine: Engine,
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

fn prepare_home(home: &Path) -> anyhow::Result<()> {
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
        })),
        ProviderKind::Anthropic => {
            let settings = match &config.anthropic {
                Some(settings) => settings.clone(),
                None => AnthropicConfig::from_env().context("FORKD_PROVIDER=anthropic")?,
            };
            Arc::new(AnthropicProvider::new(settings)?)
        }
        ProviderKind::Openai => Arc::new(OpenAiProvider::new(
            OpenAiConfig::from_env().context("FORKD_PROVIDER=openai")?,
        )?),
    })
}

/// Starts a daemon: opens the store, builds the engine, binds the listeners and serves.
pub async fn start(config: DaemonConfig) -> anyhow::Result<RunningDaemon> {
    if let Some(addr) = config.listen
        && !addr.ip().is_loopback()
    {
        bail!(
            "refusing to listen on {addr}: TCP off loopback needs bearer tokens, which this build \
             does not support yet; listen on 127.0.0.1 or use the Unix socket"
        );
    }
    prepare_home(&config.home)?;
    let db = config.home.join("forkd.db");
    let store = SqliteStore::open(&db, config.durability)
        .await
        .with_context(|| format!("cannot open the database {}", db.display()))?;
    let provider = provider(&config)?;
    let mut engine_config = config.engine.clone();
    engine_config.agent_dirs.push(config.home.join("agents"));
    let engine = Engine::new(Arc::new(store), provider, engine_config);

    let socket_path = config.socket_path();
    // Binding the socket is what proves no other daemon serves this home: only then may this
    // one resume the agents it finds running.
    let unix = bind_socket(&socket_path).await?;
    let resumed = engine.resume_interrupted().await?;
    if resumed > 0 {
        tracing::info!(resumed, "Resumed agents a previous daemon left running");
    }

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
    let server = tokio::spawn(forkd_server::serve(
        engine.clone(),
        Listeners {
            unix: Some(unix),
            tcp,
        },
        config.server.clone(),
        shutdown.clone(),
    ));
    tracing::info!(socket = %socket_path.display(), tcp = ?tcp_addr, "forkd serving");
    Ok(RunningDaemon {
        socket_path,
        tcp_addr,
        engine,
        shutdown,
        server,
    })
}
