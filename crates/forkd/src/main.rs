//! `forkd`: the daemon. Parses arguments, sets up logging, and runs `serve`, `token`,
//! `sim-server` or `demo`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use forkd::config::{FileConfig, LogFormat, ServeFlags, Settings, with_default};
use forkd::daemon;
use forkd::demo::{self, DemoOptions};
use forkd_server::TokenStore;

#[derive(Parser)]
#[command(
    name = "forkd",
    version,
    about = "Runs LLM agents and forks them with byte-identical, cache-friendly prefixes"
)]
struct Cli {
    #[arg(long, global = true, value_enum, help = with_default(
        "Log format on stderr (`serve`: env FORKD_LOG_FORMAT, or log_format in config.toml)",
        |d| d.log_format,
    ))]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API on $FORKD_HOME/forkd.sock (and TCP with --listen).
    ///
    /// Each setting comes from its flag, else its environment variable, else
    /// $FORKD_HOME/config.toml, else its default.
    Serve {
        /// Home of the database, the socket, config.toml and tokens.json [default: ~/.forkd].
        #[arg(long, env = "FORKD_HOME")]
        home: Option<PathBuf>,
        #[command(flatten)]
        flags: Box<ServeFlags>,
    },
    /// Manage the bearer tokens that clients present (FORKD_TOKEN); a token's name is its
    /// tenant. A running daemon sees changes at its next call.
    Token {
        /// Home of tokens.json [default: ~/.forkd].
        #[arg(long, env = "FORKD_HOME", global = true)]
        home: Option<PathBuf>,
        #[command(subcommand)]
        action: TokenAction,
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
        /// Limit the rate as the API does: `requests=N,input_tokens=N,output_tokens=N,per=1s|1m`
        /// (any of the three; `per` defaults to 1m). Over a limit: 429 with `retry-after`.
        #[arg(long, env = "FORKD_SIM_RATE_LIMIT")]
        rate_limit: Option<forkd_provider::RateLimitSpec>,
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

#[derive(Subcommand)]
enum TokenAction {
    /// Create a token for tenant NAME; prints its secret once, alone on stdout
    /// (`TOKEN=$(forkd token create ci)`). Only its SHA-256 is stored.
    Create {
        /// 1 to 64 ASCII letters, digits, `-`, `_` or `.`.
        name: String,
    },
    /// List tokens: names and creation times, never secrets.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Revoke the token NAME: calls presenting it fail from the next one on.
    Revoke { name: String },
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    init_tracing_with(filter, format);
}

fn init_tracing_with(filter: tracing_subscriber::EnvFilter, format: LogFormat) {
    init_tracing_exported(filter, format, None);
}

/// Logs on stderr under `filter`, and with `telemetry` forkd's spans exported as traces too,
/// under a filter of their own: a quieter log level does not thin the traces out.
fn init_tracing_exported(
    filter: tracing_subscriber::EnvFilter,
    format: LogFormat,
    telemetry: Option<&forkd::telemetry::Telemetry>,
) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(log_colour());
    let logs = match format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs.json().boxed(),
    };
    let traces = telemetry.map(|t| t.layer().with_filter(forkd::telemetry::span_filter()));
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces)
        .init();
}

fn default_home() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME")
        .ok_or_else(|| anyhow::anyhow!("neither FORKD_HOME nor HOME is set; pass --home"))?;
    Ok(PathBuf::from(home).join(".forkd"))
}

#[tokio::main]
async fn main() -> ExitCode {
    // Usage errors exit here with clap's code 2 (and `--help` with 0).
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Not `main() -> anyhow::Result`: its `Debug` form adds a stack backtrace whenever
            // RUST_BACKTRACE is set, which buries the reason (see `forkd::report`).
            eprintln!("forkd: {}", forkd::report::render(&err));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let log_format = cli.log_format.unwrap_or_default();
    match cli.command {
        Command::Serve { home, mut flags } => {
            flags.log_format = cli.log_format;
            serve(home, *flags).await
        }
        Command::Token { home, action } => {
            init_tracing_with(tracing_subscriber::EnvFilter::new("warn"), log_format);
            let home = match home {
                Some(h) => h,
                None => default_home()?,
            };
            token(&home, action)
        }
        Command::SimServer {
            listen,
            sim_speed,
            api_key,
            rate_limit,
        } => {
            init_tracing(log_format);
            let listener = tokio::net::TcpListener::bind(listen).await?;
            tracing::info!(addr = %listener.local_addr()?, ?rate_limit, "forkd sim-server serving the Anthropic Messages API");
            let sim = forkd_provider::SimProvider::new(forkd_provider::SimConfig {
                speed: sim_speed,
                rate_limit,
            });
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
                init_tracing(log_format);
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

/// `forkd serve`: settings resolved, logging set up from them, then the daemon until a signal.
async fn serve(home: Option<PathBuf>, flags: ServeFlags) -> anyhow::Result<()> {
    let home = match home {
        Some(h) => h,
        None => default_home()?,
    };
    let file = FileConfig::load(&home)?;
    let settings = Settings::resolve(&flags, |name| std::env::var(name).ok(), &file, &home)?;
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.log)
        .with_context(|| format!("invalid log filter `{}`", settings.log))?;
    let telemetry = settings
        .tracing
        .as_ref()
        .map(forkd::telemetry::Telemetry::start)
        .transpose()
        .context("cannot start the OTLP trace exporter")?;
    init_tracing_exported(filter, settings.log_format, telemetry.as_ref());
    if let Some(config) = &settings.tracing {
        tracing::info!(endpoint = %config.endpoint, protocol = ?config.protocol, "Exporting traces over OTLP");
    }
    let running = daemon::start(settings.daemon_config(home)?).await?;
    wait_for_signal().await?;
    tracing::info!("Shutting down");
    let stopped = running.shutdown(settings.grace).await;
    // What is buffered goes out before the process does.
    drop(telemetry);
    stopped
}

/// `forkd token …`: only the secret of `create` goes to stdout; everything else people read goes
/// to stderr.
fn token(home: &std::path::Path, action: TokenAction) -> anyhow::Result<()> {
    let tokens = TokenStore::in_home(home);
    let mut stdout = std::io::stdout().lock();
    match action {
        TokenAction::Create { name } => {
            daemon::prepare_home(home)?;
            let secret = tokens.create(&name)?;
            writeln!(stdout, "{}", secret.expose())?;
            stdout.flush()?;
            eprintln!(
                "forkd: created token `{name}` (tenant `{name}`); it is shown only this once. \
                 Clients send it as FORKD_TOKEN."
            );
        }
        TokenAction::List { json } => {
            let list = tokens.list()?;
            if list.is_empty() && !json {
                eprintln!("forkd: no tokens in {}", tokens.path().display());
            }
            let width = list.iter().map(|t| t.name.len()).max().unwrap_or(0);
            for token in list {
                if json {
                    let line =
                        serde_json::json!({"name": token.name, "created_at": token.created_at});
                    writeln!(stdout, "{line}")?;
                } else {
                    writeln!(stdout, "{:width$}  {}", token.name, token.created_at)?;
                }
            }
        }
        TokenAction::Revoke { name } => {
            tokens.revoke(&name)?;
            eprintln!("forkd: revoked token `{name}`");
        }
    }
    Ok(())
}

fn init_tracing_filter(filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(log_colour())
        .init();
}

/// Whether the log gets colour: only on a terminal, and never when `NO_COLOR` is set to
/// anything but the empty string (no-color.org). A log read from a file or a journal holds no
/// escape codes.
fn log_colour() -> bool {
    use std::io::IsTerminal as _;
    colour_allowed(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn colour_allowed(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
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
