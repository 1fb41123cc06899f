//! The web view (`forkd serve --ui-listen ADDR`): sessions, batches and agents in a browser, live.
//!
//! The page is a handful of static files embedded in the binary ([`assets`]); everything it shows
//! comes from a small JSON API ([`api`]) and server-sent event streams ([`live`]) over the same
//! tenant-scoped engine the gRPC handlers use (`engine.for_tenant(t)`), so a tenant sees only its
//! own sessions and another tenant's id is "not found". Callers sign in with a bearer token from
//! the same `tokens.json`, or as the daemon's own user with a one-time link minted over the Unix
//! socket (`forkctl ui`) ([`auth`]); actions (background, kill, answer a permission prompt) are
//! protected against cross-site requests.

mod api;
mod assets;
mod auth;
mod automations;
mod error;
mod live;
mod summaries;
mod views;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use axum_server::tls_rustls::RustlsConfig;
use forkd_engine::Engine;
use forkd_server::{SignInCodes, TokenStore};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use error::WebError;

/// How long open connections (live streams end at once) may take to close on shutdown.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What the web view needs besides the engine.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// The daemon's tokens: sign-in checks a token here, and every call re-checks it, so a
    /// revoked token stops working at its next call, as over gRPC.
    pub tokens: TokenStore,
    /// The codes of sign-in links, shared with the gRPC server that mints them
    /// (`CreateSignInLink`, for the Unix socket's owner): `GET /signin?code=…` spends one for a
    /// sign-in as tenant `local`.
    pub codes: SignInCodes,
    /// A trace UI's URL for a trace, `{trace_id}` standing for its id
    /// (`http://localhost:16686/trace/{trace_id}` for Jaeger): batch and agent pages link there.
    pub trace_url_template: Option<String>,
}

/// The view's listener, bound (so a taken port fails the daemon's start) but not serving yet.
pub struct WebEndpoint {
    listener: std::net::TcpListener,
    tls: Option<RustlsConfig>,
    addr: SocketAddr,
}

/// The certificate and key files of the view's TLS (the TCP listener's own).
#[derive(Debug, Clone, Copy)]
pub struct TlsPaths<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
}

impl WebEndpoint {
    /// Binds `addr`, with TLS from `tls` when given. Off loopback, the caller must have checked
    /// that tokens exist (the daemon does, as for `--listen`).
    pub async fn bind(addr: SocketAddr, tls: Option<TlsPaths<'_>>) -> Result<Self, WebError> {
        let tls = match tls {
            Some(paths) => Some(rustls_config(paths)?),
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| WebError::Bind(addr, e))?;
        let addr = listener.local_addr().map_err(|e| WebError::Bind(addr, e))?;
        let listener = listener.into_std().map_err(|e| WebError::Bind(addr, e))?;
        Ok(Self {
            listener,
            tls,
            addr,
        })
    }

    /// The address actually bound (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the view is served over TLS (its cookie is then `Secure`).
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Serves the view until `shutdown`; live streams end when it fires.
    pub fn serve(
        self,
        engine: Engine,
        config: WebConfig,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let state = AppState {
            engine,
            auth: Arc::new(auth::Auth::new(
                config.tokens,
                config.codes,
                self.tls.is_some(),
            )),
            shutdown: shutdown.clone(),
            trace_url_template: config.trace_url_template.map(Arc::from),
        };
        let app = router(state);
        let handle = axum_server::Handle::new();
        let closer = handle.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            closer.graceful_shutdown(Some(CLOSE_GRACE));
        });
        let Self {
            listener,
            tls,
            addr,
        } = self;
        tokio::spawn(async move {
            let make = app.into_make_service();
            let served = match tls {
                Some(tls) => match axum_server::from_tcp_rustls(listener, tls) {
                    Ok(server) => server.handle(handle).serve(make).await,
                    Err(e) => Err(e),
                },
                None => match axum_server::from_tcp(listener) {
                    Ok(server) => server.handle(handle).serve(make).await,
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = served {
                tracing::error!(%addr, error = %e, "The web view's listener stopped");
            }
        })
    }
}

/// rustls on aws-lc (the provider the rest of the daemon uses) with the given PEM files,
/// speaking HTTP/1.1 (the view's server speaks nothing else).
fn rustls_config(paths: TlsPaths<'_>) -> Result<RustlsConfig, WebError> {
    let tls_error = |why: String| WebError::Tls(why);
    let certs = CertificateDer::pem_file_iter(paths.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| tls_error(format!("{}: {e}", paths.cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(paths.key)
        .map_err(|e| tls_error(format!("{}: {e}", paths.key.display())))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls_error(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(RustlsConfig::from_config(Arc::new(config)))
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub engine: Engine,
    pub auth: Arc<auth::Auth>,
    /// Fires when the daemon stops: live streams end with it.
    pub shutdown: CancellationToken,
    /// See [`WebConfig::trace_url_template`].
    pub trace_url_template: Option<Arc<str>>,
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/app.js", get(assets::script))
        .route("/ui.js", get(assets::ui))
        .route("/automations.js", get(assets::automations))
        .route("/style.css", get(assets::style))
        .route("/signin", get(auth::sign_in_link))
        .route("/api/me", get(auth::me))
        .route("/api/signin", post(auth::sign_in))
        .route("/api/signout", post(auth::sign_out))
        .route("/api/sessions", get(api::sessions))
        .route("/api/sessions/{id}", get(api::session))
        .route("/api/batches/{id}", get(api::batch))
        .route("/api/agents/{id}", get(api::agent))
        .route("/api/explain", get(api::explain))
        .route("/api/automations", get(automations::automations))
        .route("/api/agents/{id}/kill", post(api::kill))
        .route("/api/agents/{id}/background", post(api::background))
        .route("/api/prompts/{id}", post(api::answer_prompt))
        .route("/api/live/sessions", get(live::sessions))
        .route("/api/live/sessions/{id}", get(live::session))
        .route("/api/live/batches/{id}", get(live::batch))
        .route("/api/live/agents/{id}", get(live::agent))
        .layer(axum::middleware::from_fn(assets::security_headers))
        .with_state(state)
}
