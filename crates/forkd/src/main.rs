//! `forkd`: the daemon. Parses arguments, sets up logging, and runs `serve` or `demo`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use forkd::daemon::{self, DaemonConfig, ProviderKind};
use forkd::demo::{self, DemoOptions};
use forkd_store::Durability;

#[derive(Parser)]
#[command(
    name = "forkd",
    version,
    about = "Runs LLM agents and forks them with byte-identical, cache-friendly prefixes"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API on $FORKD_HOME/forkd.sock (and TCP with --listen).
    Serve {
        /// Home of the database and the socket [default: ~/.forkd].
        #[arg(long, env = "FORKD_HOME")]
        home: Option<PathBuf>,
        /// Also listen on TCP (loopback only in this build).
        #[arg(long)]
        listen: Option<SocketAddr>,
        #[arg(long, env = "FORKD_PROVIDER", value_enum, default_value = "sim")]
        provider: ProviderKind,
        /// The simulated model's pace: 0 is instant, 1 is realistic.
        #[arg(long, env = "FORKD_SIM_SPEED", default_value_t = 1.0)]
        sim_speed: f64,
        /// Sync every commit to disk (survives power loss) instead of every checkpoint.
        #[arg(long)]
        fsync_every_commit: bool,
        /// Send every child of a batch at once instead of warming the cache with the first.
        #[arg(long)]
        no_warmup_gating: bool,
        /// Hand an attached client to the background after this many seconds (0: never).
        #[arg(long, env = "FORKD_AUTO_BACKGROUND_SECS", default_value_t = 120)]
        auto_background_secs: u64,
        /// How long running tool calls and requests may take to finish on shutdown.
        #[arg(long, default_value = "10s", value_parser = humantime_duration)]
        grace: Duration,
    },
    /// Serve the simulated model over HTTP, speaking the Anthropic Messages API (so the
    /// `anthropic` provider and any Anthropic SDK can talk to it).
    SimServer {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
        #[arg(long, env = "FORKD_SIM_SPEED", default_value_t = 1.0)]
        sim_speed: f64,
        /// Require this API key (as x-api-key or Authorization: Bearer); any key when unset.
        #[arg(long, env = "FORKD_SIM_API_KEY")]
        api_key: Option<String>,
    },
    /// Fork 5 directives from a ~48.5k-token context on a temporary daemon and print the savings.
    Demo {
        /// One JSON object on stdout instead of tables.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 0.0)]
        sim_speed: f64,
        #[arg(long)]
        no_warmup_gating: bool,
    },
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn default_home() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME")
        .ok_or_else(|| anyhow::anyhow!("neither FORKD_HOME nor HOME is set; pass --home"))?;
    Ok(PathBuf::from(home).join(".forkd"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            home,
            listen,
            provider,
            sim_speed,
            fsync_every_commit,
            no_warmup_gating,
            auto_background_secs,
            grace,
        } => {
            init_tracing(cli.log_format);
            let mut config = DaemonConfig::new(match home {
                Some(h) => h,
                None => default_home()?,
            });
            config.listen = listen;
            config.provider = provider;
            config.sim_speed = sim_speed;
            config.engine.warmup_gating = !no_warmup_gating;
            config.engine.auto_background = forkd_engine::auto_background(auto_background_secs);
            if fsync_every_commit {
                config.durability = Durability::Full;
            }
            let running = daemon::start(config).await?;
            wait_for_signal().await?;
            tracing::info!("Shutting down");
            running.shutdown(grace).await
        }
        Command::SimServer {
            listen,
            sim_speed,
            api_key,
        } => {
            init_tracing(cli.log_format);
            let listener = tokio::net::TcpListener::bind(listen).await?;
            tracing::info!(addr = %listener.local_addr()?, "forkd sim-server serving the Anthropic Messages API");
            let sim =
                forkd_provider::SimProvider::new(forkd_provider::SimConfig { speed: sim_speed });
            let config = forkd_sim_server::SimServerConfig {
                api_key,
                ..Default::default()
            };
            let shutdown = async {
                if let Err(e) = wait_for_signal().await {
                    tracing::error!(error = %e, "Cannot wait for signals");
                }
            };
            forkd_sim_server::serve(listener, sim, config, shutdown).await?;
            Ok(())
        }
        Command::Demo {
            json,
            sim_speed,
            no_warmup_gating,
        } => {
            // The demo's own output is the point: keep the daemon's logs to warnings.
            if std::env::var_os("RUST_LOG").is_none() {
                init_tracing_filter("warn");
            } else {
                init_tracing(cli.log_format);
            }
            demo::run(DemoOptions {
                json,
                sim_speed,
                warmup_gating: !no_warmup_gating,
            })
            .await
        }
    }
}

fn init_tracing_filter(filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
