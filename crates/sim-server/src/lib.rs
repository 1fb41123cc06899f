//! forkd's simulated model served over HTTP, speaking the Anthropic Messages wire protocol, so
//! that the real `anthropic` provider (or any Anthropic SDK) can be run end to end against it
//! with no network beyond loopback.
//!
//! Routes: `POST /v1/messages` (an SSE stream when the body says `"stream": true`, one JSON
//! message otherwise) and `POST /v1/messages/count_tokens`. Errors have the API's statuses and
//! bodies; the `@sim fail` script lines choose them. [`StreamCuts`] cuts chosen responses off
//! mid-stream, for tests of what a client does with a dropped connection.
//!
//! The caller binds the listener and owns the shutdown future, so `forkd sim-server` and the
//! tests start the same server.

mod count;
mod error;
mod faults;
mod messages;
mod wire;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::response::IntoResponse;
use axum::routing::post;
use forkd_provider::SimProvider;

pub use faults::StreamCuts;

use error::ApiError;

/// The largest request body accepted: the Messages API's own limit. axum's default (2 MiB) is
/// smaller than a long session's request.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// How the server behaves besides the model.
#[derive(Debug, Clone, Default)]
pub struct SimServerConfig {
    /// The key every request must carry (as `x-api-key` or `Authorization: Bearer`). `None`
    /// accepts any non-empty key, as a local stand-in for the API should.
    pub api_key: Option<String>,
    /// Streamed responses to cut off mid-stream (fault injection).
    pub cuts: StreamCuts,
}

/// What every handler shares.
#[derive(Clone)]
struct AppState {
    sim: SimProvider,
    config: Arc<SimServerConfig>,
}

/// The server's routes, for callers that mount them in their own server.
pub fn router(sim: SimProvider, config: SimServerConfig) -> Router {
    let state = AppState {
        sim,
        config: Arc::new(config),
    };
    Router::new()
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(count::count_tokens))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves the sim on `listener` until `shutdown` completes, then lets open responses finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    sim: SimProvider,
    config: SimServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(sim, config))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn not_found() -> axum::response::Response {
    ApiError::new(404, "Not found").into_response()
}

/// Checks the request's key: `x-api-key`, or a bearer token as current SDKs send.
fn authorize(headers: &HeaderMap, config: &SimServerConfig) -> Result<(), ApiError> {
    let header = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let key = header("x-api-key")
        .or_else(|| header(AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer ")))
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let Some(key) = key else {
        return Err(ApiError::new(401, "x-api-key header is required"));
    };
    match &config.api_key {
        Some(required) if required != key => Err(ApiError::new(401, "invalid x-api-key")),
        _ => Ok(()),
    }
}
