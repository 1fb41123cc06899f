//! The web view's errors, and the one mapping from them to HTTP statuses.

use std::net::SocketAddr;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use forkd_engine::EngineError;
use forkd_server::Meaning;

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("cannot serve the web view on {0}: {1}")]
    Bind(SocketAddr, #[source] std::io::Error),
    #[error("the web view's TLS certificate or key cannot be used: {0}")]
    Tls(String),
    /// No sign-in, an expired one, or a token revoked since.
    #[error("sign in with a token")]
    Unauthenticated,
    /// A token no tenant has.
    #[error("that token is not valid")]
    WrongToken,
    /// A sign-in link whose code was used already, has expired or was never made.
    #[error(
        "this sign-in link is not valid: it was used already, it expired (a link lasts {secs} \
         seconds) or it was never made; run `forkctl ui` for a new one",
        secs = forkd_server::SignInCodes::LIFETIME.as_secs()
    )]
    BadSignInLink,
    /// An action without the page's CSRF token, or from another site.
    #[error("{0}")]
    CrossSite(&'static str),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the token file cannot be read: {0}")]
    Tokens(#[from] forkd_server::auth::TokenError),
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::Unauthenticated | Self::WrongToken | Self::BadSignInLink => {
                StatusCode::UNAUTHORIZED
            }
            Self::CrossSite(_) => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            // The meaning table gRPC answers from too.
            Self::Engine(e) => StatusCode::from_u16(Meaning::of(e).http())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Self::Bind(..) | Self::Tls(_) | Self::Tokens(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        // Internal failures are logged in full and answered in general terms, as over gRPC.
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, "A web view call failed");
            "internal error; the daemon's log has the details".to_owned()
        } else {
            self.to_string()
        };
        (status, Json(serde_json::json!({ "error": message }))).into_response()
    }
}
