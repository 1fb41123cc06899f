//! Who is calling: bearer tokens, tenants, and the layer that authenticates every call.
//!
//! - [`TokenStore`] keeps `$FORKD_HOME/tokens.json`: one entry per token, holding its name (the
//!   tenant), the SHA-256 of its secret and when it was made. The secret itself is shown once,
//!   by `forkd token create`, and never stored.
//! - The authentication layer (installed by [`crate::serve`] on every listener) reads
//!   `authorization: Bearer <secret>`, finds its tenant, and puts a [`Tenant`] into the request's
//!   extensions; handlers read it with [`tenant`]. Only `grpc.health.v1` and reflection stay
//!   open: every other path (all of `forkd.v1`, and anything unknown) is authenticated.
//! - A call made with a token is checked again while its response streams: revoking the token
//!   ends its streams within a second (`UNAUTHENTICATED`; [`revocation`]).
//! - [`SignInCodes`] are the one-time codes of sign-in links (`CreateSignInLink`, minted for
//!   the Unix socket's owner), which the web view exchanges for a sign-in as [`Tenant::LOCAL`].
//!
//! The rules, per listener:
//!
//! | listener | no token | a known token | an unknown or malformed token |
//! |---|---|---|---|
//! | Unix socket (mode 0600: only its owner connects) | [`Tenant::LOCAL`] | its tenant | `UNAUTHENTICATED` |
//! | TCP, on loopback or not | `UNAUTHENTICATED` | its tenant | `UNAUTHENTICATED` |
//!
//! A TCP connection says nothing about who opened it: on loopback, any process of any user on
//! the machine can — a sandboxed command whose session allows the network included. So over
//! TCP only a token names a tenant, and the local user's tokenless way in is the socket, whose
//! mode and peer credentials do. The daemon refuses to start a TCP listener (or the web view)
//! off loopback while no token exists; on loopback it starts, refusing every call until one does.

mod layer;
mod links;
mod revocation;
mod tokens;

pub(crate) use layer::{AuthLayer, Transport};
pub use links::{SignInCodes, WebView};
pub use revocation::CHECK_EVERY as TOKEN_CHECK_EVERY;
pub(crate) use revocation::{Credential, RevocationLayer};
pub use tokens::{Secret, TOKENS_FILE, TokenError, TokenInfo, TokenStore};

pub use forkd_core::tenant::Tenant;

/// The tenant the authentication layer established for this call.
///
/// Every `forkd.v1` call served by [`crate::serve`] carries one. A request without it did not
/// pass through authentication (a service driven directly, outside `serve`): that is refused
/// with `INTERNAL` rather than guessed, so a wiring mistake can never grant access.
pub fn tenant<T>(request: &tonic::Request<T>) -> Result<Tenant, tonic::Status> {
    request
        .extensions()
        .get::<Tenant>()
        .cloned()
        .ok_or_else(|| {
            tracing::error!("A forkd.v1 call reached its handler without a tenant");
            tonic::Status::internal(
                "the call was not authenticated; the daemon's log has the details",
            )
        })
}

/// Whether this call is the daemon's own user: no token, on the Unix socket (whose mode lets
/// only its owner connect). A token presented there names its own tenant, never `local`.
pub(crate) fn is_socket_owner<T>(request: &tonic::Request<T>) -> bool {
    request.extensions().get::<Transport>() == Some(&Transport::Unix)
        && request.extensions().get::<Tenant>() == Some(&Tenant::LOCAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helper_reads_the_extension_and_refuses_without_one() {
        let mut request = tonic::Request::new(());
        assert_eq!(
            tenant(&request).err().map(|s| s.code()),
            Some(tonic::Code::Internal)
        );
        request.extensions_mut().insert(Tenant::LOCAL);
        assert_eq!(tenant(&request).ok(), Some(Tenant::LOCAL));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_socket_owner_is_local_on_the_unix_socket_only() {
        let mut request = tonic::Request::new(());
        request.extensions_mut().insert(Tenant::LOCAL);
        assert!(!is_socket_owner(&request), "no transport: not proven");
        request.extensions_mut().insert(Transport::Tcp);
        assert!(!is_socket_owner(&request));
        request.extensions_mut().insert(Transport::Unix);
        assert!(is_socket_owner(&request));
        request.extensions_mut().insert(Tenant::new("ci").unwrap());
        assert!(!is_socket_owner(&request), "a token's tenant on the socket");
    }
}
