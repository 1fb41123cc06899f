//! `forkd serve`'s command line, as far as it sets settings. Every field is optional so that an
//! absent flag lets the environment or the file decide; the `[default: …]` in each help text is
//! read from `Settings::default`, so the help cannot drift from what the daemon does.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::LogFormat;
use super::settings::Settings;
use crate::daemon::{DatabaseUrl, ProviderKind};

/// The command line of `forkd serve`, as far as it sets settings. Every field is optional so
/// that an absent flag lets the environment or the file decide.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeFlags {
    /// Also serve TCP on this address (env FORKD_LISTEN). Every call needs a token, on loopback
    /// too (`forkd token create NAME`); off loopback, one must exist to start.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Serve Prometheus metrics over plain HTTP on this address, at `/metrics`
    /// (env FORKD_METRICS_LISTEN). Unauthenticated: keep it on loopback or a private network.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web view on this address (env FORKD_UI_LISTEN): sessions, batches and agents,
    /// live. Signed in with the same tokens as gRPC, or as the daemon's own user with the link
    /// `forkctl ui` prints; off loopback, tokens must exist. TLS with --tls-cert and --tls-key.
    #[arg(long, value_name = "ADDR")]
    pub ui_listen: Option<SocketAddr>,
    /// Export traces over OTLP to this collector (env OTEL_EXPORTER_OTLP_ENDPOINT, or
    /// `[tracing] endpoint`): `http://localhost:4317` for gRPC, `http://localhost:4318` for HTTP.
    /// Off without one.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (env OTEL_EXPORTER_OTLP_PROTOCOL; default grpc).
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<String>,
    #[arg(long, value_enum, help = with_default(
        "The model provider (env FORKD_PROVIDER)",
        |d| value_name(&d.provider),
    ))]
    pub provider: Option<ProviderKind>,
    #[arg(long, help = with_default(
        "The simulated model's pace: 0 is instant, 1 is realistic (env FORKD_SIM_SPEED)",
        |d| d.sim_speed,
    ))]
    pub sim_speed: Option<f64>,
    /// Sync every commit to disk (survives power loss) instead of every checkpoint
    /// (env FORKD_FSYNC_EVERY_COMMIT).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub fsync_every_commit: Option<bool>,
    /// Below this much free space on the filesystem holding the database (256MiB, 1%; 0: no
    /// check), new sessions, messages and batches are refused; running agents go on
    /// (env FORKD_MIN_FREE_DISK; default: 256MiB or 1%, whichever is smaller).
    #[arg(long, value_name = "SIZE", value_parser = forkd_engine::MinFreeDisk::parse)]
    pub min_free_disk: Option<forkd_engine::MinFreeDisk>,
    /// Keep state in this PostgreSQL database (postgres://user:password@host:5432/database)
    /// instead of FORKD_HOME/forkd.db (env FORKD_DATABASE_URL). A command line is visible to
    /// other users: give a password in the environment or config.toml instead.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<DatabaseUrl>,
    /// Send every child of a batch at once instead of warming the cache with the first
    /// (env FORKD_WARMUP_GATING=false).
    #[arg(long)]
    pub no_warmup_gating: bool,
    #[arg(long, value_name = "SHARE", help = with_default(
        "Compact a session before a request that would pass this share of its model's window \
         (env FORKD_COMPACT_THRESHOLD)",
        |d| d.compact_threshold,
    ))]
    pub compact_threshold: Option<f64>,
    #[arg(long, value_name = "SECS", help = with_default(
        "Hand an attached client to the background after this many seconds; 0: never \
         (env FORKD_AUTO_BACKGROUND_SECS)",
        |d| d.auto_background_secs,
    ))]
    pub auto_background_secs: Option<u64>,
    #[arg(long, value_parser = humantime_duration, help = with_default(
        "How long running tool calls and requests may take to finish on shutdown \
         (env FORKD_GRACE)",
        |d| humantime::format_duration(d.grace),
    ))]
    pub grace: Option<Duration>,
    #[arg(long, value_parser = humantime_duration, help = with_default(
        "How long a model request the provider refuses for a rate limit or an overload (429, \
         529, 503) keeps trying before its agent fails (env FORKD_PROVIDER_PATIENCE)",
        |d| humantime::format_duration(d.provider_patience),
    ))]
    pub provider_patience: Option<Duration>,
    #[arg(long, value_parser = humantime_duration, help = with_default(
        "How long a model request keeps trying a provider that cannot be reached at all \
         (refused connection, DNS, TLS) (env FORKD_UNREACHABLE_PATIENCE)",
        |d| humantime::format_duration(d.unreachable_patience),
    ))]
    pub unreachable_patience: Option<Duration>,
    #[arg(long, value_parser = lease_duration, help = with_default(
        "How long this daemon's claim on a running agent lasts without a heartbeat; another \
         daemon on the same PostgreSQL adopts the agent once it expires (env FORKD_LEASE)",
        |d| humantime::format_duration(d.lease),
    ))]
    pub lease: Option<Duration>,
    /// PEM certificate chain: serve TLS on the TCP listener (env FORKD_TLS_CERT).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (env FORKD_TLS_KEY).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The key that seals sessions' own MCP server definitions in the database: 64 hex digits
    /// (env FORKD_SECRET_KEY_FILE) [default: $FORKD_HOME/secret.key, created on first start].
    /// Daemons sharing one database need the same key.
    #[arg(long, value_name = "FILE")]
    pub secret_key_file: Option<PathBuf>,
    /// Where a token tenant that names no workspace gets a fresh empty one (env
    /// FORKD_WORKSPACES_DIR) [default: `$FORKD_HOME-workspaces`, beside the home, never in it].
    #[arg(long, value_name = "DIR")]
    pub workspaces_dir: Option<PathBuf>,
    #[arg(long, value_name = "FILTER", help = with_default(
        "Log filter, e.g. `info` or `info,forkd_engine=debug` (env RUST_LOG)",
        |d| d.log.clone(),
    ))]
    pub log: Option<String>,
    /// The global `--log-format`, filled in by `main`.
    #[arg(skip)]
    pub log_format: Option<LogFormat>,
}

/// Parses a duration such as `10s` or `1m 30s`.
/// A lease: a duration of at least 100 ms (a heartbeat renews it three times within it).
pub fn lease_duration(s: &str) -> Result<Duration, String> {
    let d = humantime_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err("a lease must last at least 100ms".into());
    }
    Ok(d)
}

pub fn humantime_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// A flag's help ending as clap would print a default (`… [default: 1]`), the default read from
/// [`Settings::default`]. The flag itself has no clap default: it would always be set and hide
/// the environment and the file.
pub fn with_default<D: fmt::Display>(help: &str, default: impl FnOnce(&Settings) -> D) -> String {
    format!("{help} [default: {}]", default(&Settings::default()))
}

/// A value enum's name as its flag takes it (`sim`).
fn value_name<T: clap::ValueEnum>(value: &T) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}
