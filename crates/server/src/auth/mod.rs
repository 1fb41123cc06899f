//! Who is calling: bearer tokens, tenants, and the layer that authenticates every call.
//!
//! - [`TokenStore`] keeps `$FORKD_HOME/tokens.json`: one entry per token, holding its name (the
//!   tenant), the SHA-256 of its secret and when it was made. The secret itself is shown once,
//!   by `forkd token create`, and never stored.
//! - The authentication layer (installed by [`crate::serve`] on every listener) reads
//!   `authorization: Bearer <secret>`, finds its tenant, and puts a [`Tenant`] into the request's
//!   extensions; handlers read it with [`tenant`]. Only `grpc.health.v1` and reflection stay
//!   open: every other path (all of `forkd.v1`, and anything unknown) is authenticated.
//!
//! The rules, per listener:
//!
//! | listener | no token | a known token | an unknown or malformed token |
//! |---|---|---|---|
//! | Unix socket (mode 0600: only its owner connects) | [`Tenant::LOCAL`] | its tenant | `UNAUTHENTICATED` |
//! | TCP on loopback, no tokens exist | [`Tenant::LOCAL`] | — | `UNAUTHENTICATED` |
//! | TCP on loopback, tokens exist | `UNAUTHENTICATED` | its tenant | `UNAUTHENTICATED` |
//! | TCP off loopback | `UNAUTHENTICATED` | its tenant | `UNAUTHENTICATED` |
//!
//! Off loopback a token is always required, even if every token has since been revoked (the
//! daemon also refuses to start there without one).

mod layer;
mod tokens;

pub(crate) use layer::{AuthLayer, Transport};
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
}
