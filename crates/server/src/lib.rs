//! forkd's gRPC front: the `forkd.v1.Forkd` service, health and reflection, on a Unix socket
//! and optionally TCP.
//!
//! This is the only crate besides the generated `forkd-proto` that knows protobuf: it converts
//! between the wire and the engine and maps engine errors to status codes in one place.

mod convert;
mod service;
mod status;

use std::time::Duration;

use forkd_engine::Engine;
use forkd_proto::v1::forkd_server::ForkdServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;

pub use service::ForkdService;

/// Listeners the daemon serves on; the caller binds them, so tests can use ephemeral ones.
#[derive(Debug, Default)]
pub struct Listeners {
    pub unix: Option<UnixListener>,
    pub tcp: Option<TcpListener>,
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The largest message accepted or sent, in bytes (tonic's default only bounds receiving).
    pub max_message_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 16 * 1024 * 1024,
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

fn router(
    engine: &Engine,
    config: &ServerConfig,
) -> Result<tonic::transport::server::Router, ServerError> {
    let forkd = ForkdServer::new(ForkdService::new(engine.clone()))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    // Nothing else sets it: the service serves as long as the process does.
    tokio::spawn(async move {
        health_reporter
            .set_serving::<ForkdServer<ForkdService>>()
            .await;
    });
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(forkd_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // Both reflection versions: older grpcurl speaks only v1alpha.
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    Ok(tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(forkd)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha))
}

/// Serves until `shutdown` is cancelled, then stops accepting and lets open calls finish.
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
        let router = router(&engine, &config)?;
        let stop = shutdown.clone();
        servers.spawn(async move {
            router
                .serve_with_incoming_shutdown(UnixListenerStream::new(unix), stop.cancelled_owned())
                .await
        });
    }
    if let Some(tcp) = listeners.tcp {
        let router = router(&engine, &config)?;
        let stop = shutdown.clone();
        servers.spawn(async move {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(tcp), stop.cancelled_owned())
                .await
        });
    }
    while let Some(done) = servers.join_next().await {
        if let Err(e) = done? {
            // One listener failing stops the others too: a half-served daemon is worse.
            shutdown.cancel();
            return Err(e.into());
        }
    }
    Ok(())
}
