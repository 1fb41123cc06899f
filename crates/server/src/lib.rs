//! forkd's gRPC front: the `forkd.v1.Forkd` service, health and reflection, on a Unix socket
//! and optionally TCP (with optional TLS).
//!
//! This is the only crate besides the generated `forkd-proto` that knows protobuf: it converts
//! between the wire and the engine and maps engine errors to status codes in one place. Every
//! `forkd.v1` call is authenticated by [`auth`]'s layer, which hands handlers a [`Tenant`].

pub mod auth;
mod convert;
mod schedules;
mod service;
mod status;
mod tls;

use std::time::Duration;

use forkd_engine::Engine;
use forkd_proto::v1::forkd_server::ForkdServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::codegen::http;
use tower::util::MapResponseLayer;

use crate::auth::{AuthLayer, RevocationLayer, Transport};

pub use auth::{SignInCodes, TOKEN_CHECK_EVERY, Tenant, TokenStore, WebView, tenant};
pub use schedules::start_schedules;
pub use service::ForkdService;
pub use status::Meaning;
pub use tls::{TlsConfig, TlsError};

/// Listeners the daemon serves on; the caller binds them, so tests can use ephemeral ones.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The Unix socket (mode 0600): callers without a token are [`Tenant::LOCAL`].
    pub unix: Option<UnixListener>,
    /// TCP: every call needs a token, on loopback too (see [`auth`]).
    pub tcp: Option<TcpListener>,
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The largest message accepted or sent, in bytes (tonic's default only bounds receiving).
    pub max_message_bytes: usize,
    /// The bearer tokens calls are checked against; `None` when no token can exist.
    pub tokens: Option<TokenStore>,
    /// TLS for the TCP listener (the Unix socket never uses it).
    pub tls: Option<TlsConfig>,
    /// The daemon's web view, when it serves one: `CreateSignInLink` mints its codes and links
    /// to it. `None` answers that call with `FAILED_PRECONDITION`.
    pub web_view: Option<WebView>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 16 * 1024 * 1024,
            tokens: None,
            tls: None,
            web_view: None,
        }
    }
}

/// The server could not start or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("no listener to serve on")]
    NoListener,
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("server task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// Serves the API on one stream of connections until `stop` is cancelled: `auth` decides who
/// each call is for, and `tls`, when set, is spoken on every connection.
async fn serve_incoming<I, IO, IE>(
    engine: Engine,
    config: ServerConfig,
    auth: AuthLayer,
    tls: Option<tonic::transport::ServerTlsConfig>,
    incoming: I,
    stop: CancellationToken,
) -> Result<(), ServerError>
where
    I: futures::Stream<Item = Result<IO, IE>>,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let store_health = engine.store_health();
    let service = ForkdService::new(engine).with_web_view(config.web_view.clone());
    let forkd = ForkdServer::new(service)
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    // Serving while the database takes writes (and has room for new work); not serving while
    // it refuses them, back to serving once it takes them again (docs/operations.md, "Disk and
    // database faults"). The first status is set before the server answers anything: a health
    // check sent at once must not find the service unregistered (`NOT_FOUND`).
    let first = serving_status(&store_health.borrow());
    set_health(&health_reporter, first).await;
    tokio::spawn(report_health(store_health, health_reporter, stop.clone()));
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(forkd_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // Both reflection versions: older grpcurl speaks only v1alpha.
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .layer(MapResponseLayer::new(decode_errors_are_invalid_argument))
        .layer(auth)
        .layer(RevocationLayer)
        .add_service(forkd)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await?;
    Ok(())
}

/// Reports the daemon's store health on `grpc.health.v1`, for the whole server ("") and for
/// `forkd.v1.Forkd`, until `stop`.
async fn report_health(
    mut health: tokio::sync::watch::Receiver<forkd_engine::StoreHealth>,
    reporter: tonic_health::server::HealthReporter,
    stop: CancellationToken,
) {
    loop {
        let status = serving_status(&health.borrow_and_update());
        set_health(&reporter, status).await;
        tokio::select! {
            () = stop.cancelled() => return,
            changed = health.changed() => if changed.is_err() { return },
        }
    }
}

fn serving_status(health: &forkd_engine::StoreHealth) -> tonic_health::ServingStatus {
    match health {
        forkd_engine::StoreHealth::Healthy => tonic_health::ServingStatus::Serving,
        _ => tonic_health::ServingStatus::NotServing,
    }
}

/// Sets the status of the whole server (`""`) and of the forkd service.
async fn set_health(
    reporter: &tonic_health::server::HealthReporter,
    status: tonic_health::ServingStatus,
) {
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status(
            <ForkdServer<ForkdService> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}

/// A request that does not decode (a string field that is not UTF-8, a truncated message) is the
/// client's error, but tonic's codec reports it as `INTERNAL`, which clients read as a server
/// fault and retry. This rewrites exactly those responses to `INVALID_ARGUMENT`.
fn decode_errors_are_invalid_argument<B>(mut res: http::Response<B>) -> http::Response<B> {
    let headers = res.headers();
    let internal = headers
        .get("grpc-status")
        .is_some_and(|s| s.as_bytes() == b"13");
    let decode = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| {
            m.replace("%20", " ")
                .starts_with("failed to decode Protobuf message")
        });
    if internal && decode {
        res.headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("3"));
    }
    res
}

/// Serves until `shutdown` is cancelled, then stops accepting and lets open calls finish.
///
/// Every `forkd.v1` call on either listener passes the [`auth`] layer first; TLS, when
/// configured, applies to the TCP listener.
pub async fn serve(
    engine: Engine,
    listeners: Listeners,
    config: ServerConfig,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    if listeners.unix.is_none() && listeners.tcp.is_none() {
        return Err(ServerError::NoListener);
    }
    let mut servers = tokio::task::JoinSet::new();
    if let Some(unix) = listeners.unix {
        let incoming = UnixListenerStream::new(unix);
        let auth = AuthLayer::new(config.tokens.clone(), Transport::Unix);
        servers.spawn(serve_incoming(
            engine.clone(),
            config.clone(),
            auth,
            None,
            incoming,
            shutdown.clone(),
        ));
    }
    if let Some(tcp) = listeners.tcp {
        let auth = AuthLayer::new(config.tokens.clone(), Transport::Tcp);
        let tls = config.tls.as_ref().map(TlsConfig::server_config);
        let incoming = TcpListenerStream::new(tcp);
        servers.spawn(serve_incoming(
            engine.clone(),
            config.clone(),
            auth,
            tls,
            incoming,
            shutdown.clone(),
        ));
    }
    while let Some(done) = servers.join_next().await {
        if let Err(e) = done? {
            // One listener failing stops the others too: a half-served daemon is worse.
            shutdown.cancel();
            return Err(e);
        }
    }
    Ok(())
}
