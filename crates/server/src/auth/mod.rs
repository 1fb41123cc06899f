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

use std::borrow::Cow;
use std::fmt;

pub(crate) use layer::{AuthLayer, Transport};
pub use tokens::{Secret, TOKENS_FILE, TokenError, TokenInfo, TokenStore};

/// The tenant name of clients on the Unix socket that present no token.
pub const LOCAL_TENANT: &str = "local";

/// The owner of a call: sessions, agents and notifications will belong to one.
///
/// A token's name is its tenant's name; [`Tenant::LOCAL`] is the owner of the Unix socket
/// calling without a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Cow<'static, str>);

impl Tenant {
    /// Unauthenticated callers on the Unix socket (and on a loopback TCP listener while no tokens
    /// exist).
    pub const LOCAL: Tenant = Tenant(Cow::Borrowed(LOCAL_TENANT));

    /// A tenant by name; the name follows the rules of token names (1 to 64 ASCII letters,
    /// digits, `-`, `_` or `.`, starting with a letter or a digit). `local` is
    /// [`Tenant::LOCAL`].
    pub fn new(name: &str) -> Result<Self, TokenError> {
        if name == LOCAL_TENANT {
            return Ok(Self::LOCAL);
        }
        tokens::validate_name(name)?;
        Ok(Self(Cow::Owned(name.to_owned())))
    }

    /// A name already validated (read from the token file).
    pub(crate) fn from_valid_name(name: String) -> Self {
        Self(Cow::Owned(name))
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// True for [`Tenant::LOCAL`].
    pub fn is_local(&self) -> bool {
        self.name() == LOCAL_TENANT
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    fn tenants_are_validated_and_local_is_the_constant() {
        assert_eq!(Tenant::new("local").ok(), Some(Tenant::LOCAL));
        assert!(Tenant::LOCAL.is_local());
        let ci = Tenant::new("ci-runner.1").ok();
        assert_eq!(ci.as_ref().map(Tenant::name), Some("ci-runner.1"));
        assert_eq!(ci.map(|t| t.to_string()).as_deref(), Some("ci-runner.1"));
        for bad in ["", "-x", "a b", "é", &"x".repeat(65)] {
            assert!(Tenant::new(bad).is_err(), "{bad:?}");
        }
    }

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
