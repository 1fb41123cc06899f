//! Tenants: who owns a session and everything reachable from it, and what a tenant may spend.

use std::borrow::Cow;
use std::fmt;

use crate::session::LOCAL_TENANT;

/// The owner of a call: sessions, agents and notifications belong to one.
///
/// A bearer token's name is its tenant's name; [`Tenant::LOCAL`] is the owner of the Unix
/// socket calling without a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Cow<'static, str>);

/// The longest tenant name.
pub const MAX_TENANT_NAME: usize = 64;

/// A tenant name that breaks the naming rules, or that is reserved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantNameError {
    #[error(
        "invalid name {0:?}: use 1 to 64 ASCII letters, digits, '-', '_' or '.', \
         starting with a letter or a digit"
    )]
    Invalid(String),
    #[error("the name \"local\" is reserved for callers on the Unix socket")]
    Reserved,
}

impl Tenant {
    /// Unauthenticated callers on the Unix socket (and on a loopback TCP listener while no
    /// tokens exist).
    pub const LOCAL: Tenant = Tenant(Cow::Borrowed(LOCAL_TENANT));

    /// A tenant by name: 1 to 64 ASCII letters, digits, `-`, `_` or `.`, starting with a letter
    /// or a digit. `local` is [`Tenant::LOCAL`].
    pub fn new(name: &str) -> Result<Self, TenantNameError> {
        if name == LOCAL_TENANT {
            return Ok(Self::LOCAL);
        }
        Self::check_name(name)?;
        Ok(Self(Cow::Owned(name.to_owned())))
    }

    /// Checks a name for a new tenant (a token): the naming rules, and not `local`.
    pub fn check_name(name: &str) -> Result<(), TenantNameError> {
        if name == LOCAL_TENANT {
            return Err(TenantNameError::Reserved);
        }
        let first_ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
        let rest_ok = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !first_ok || !rest_ok || name.len() > MAX_TENANT_NAME {
            return Err(TenantNameError::Invalid(name.to_owned()));
        }
        Ok(())
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// True for [`Tenant::LOCAL`].
    pub fn is_local(&self) -> bool {
        self.name() == LOCAL_TENANT
    }

    /// Whether this tenant owns something stored under `owner`'s name.
    pub fn owns(&self, owner: &str) -> bool {
        self.name() == owner
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Optional spending limits; `None` for no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    pub usd: Option<f64>,
    /// All tokens: input, cache writes, cache reads and output.
    pub tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_token_rules() {
        assert_eq!(Tenant::new("local").ok(), Some(Tenant::LOCAL));
        assert!(Tenant::LOCAL.is_local());
        let ci = Tenant::new("ci-runner.1").ok();
        assert_eq!(ci.as_ref().map(Tenant::name), Some("ci-runner.1"));
        for bad in ["", "-x", "a b", "é", &"x".repeat(65)] {
            assert!(Tenant::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Tenant::check_name("local"), Err(TenantNameError::Reserved));
    }
}
