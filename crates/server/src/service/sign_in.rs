//! `CreateSignInLink`: the web view's one-time sign-in link for the daemon's own user.
//!
//! Tenant `local` has no token to sign in with, and a TCP connection never proves it is the
//! local user (see [`crate::auth`]); the Unix socket does. So the link is minted here, for a
//! caller on the socket without a token, and the web view, in the same process, exchanges its
//! code for a sign-in (see [`crate::auth::SignInCodes`]).

use std::time::SystemTime;

use forkd_proto::v1 as pb;
use tonic::Request;

use super::ForkdService;
use crate::auth::{SignInCodes, Tenant, is_socket_owner};
use crate::status::ApiError;

/// Why no link was made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SignInLinkError {
    /// The caller is not the socket's owner: a token's tenant, on either listener.
    #[error(
        "sign-in links are for the daemon's own user: call over its Unix socket \
         ($FORKD_HOME/forkd.sock) without a token (this call came as tenant `{0}`); a tenant \
         with a token signs in on the web view's page with it"
    )]
    NotTheSocketOwner(Tenant),
    #[error(
        "this daemon serves no web view: start it with `forkd serve --ui-listen 127.0.0.1:8080` \
         (or FORKD_UI_LISTEN, or ui_listen in config.toml)"
    )]
    NoWebView,
    /// The operating system's random number generator failed.
    #[error("cannot draw a random sign-in code: {0}")]
    Random(getrandom::Error),
}

impl ForkdService {
    /// A link for `caller`, who must be the socket's owner (`req` tells how it came in).
    pub(super) fn create_sign_in_link_rpc<T>(
        &self,
        caller: Tenant,
        req: &Request<T>,
    ) -> Result<pb::CreateSignInLinkResponse, ApiError> {
        if !is_socket_owner(req) {
            return Err(SignInLinkError::NotTheSocketOwner(caller).into());
        }
        let web_view = self.web_view.as_ref().ok_or(SignInLinkError::NoWebView)?;
        let code = web_view.codes.mint().map_err(SignInLinkError::Random)?;
        tracing::info!("Made a sign-in link to the web view for tenant local");
        Ok(pb::CreateSignInLinkResponse {
            url: web_view.link(&code),
            expires_at: Some((SystemTime::now() + SignInCodes::LIFETIME).into()),
        })
    }
}
