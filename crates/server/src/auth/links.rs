//! Sign-in links: one-time codes that let the daemon's own user into the web view.
//!
//! A TCP connection without a token is never the local user (any local process, a sandboxed
//! command included, can open one), so the web view cannot serve tenant `local` by its address.
//! Instead the local user proves who they are where the daemon can tell — on the Unix socket
//! (mode 0600, peer credentials) — and gets a code there (`CreateSignInLink`, `forkctl ui`);
//! the web view, in the same process, exchanges it for a sign-in. A code is 256 random bits,
//! valid for [`SignInCodes::LIFETIME`] and for one use, so one that leaks (a browser's history,
//! a terminal's scrollback) is worthless by the time anyone could read it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

/// The codes minted and not yet used or expired, shared by the gRPC server (which mints them)
/// and the web view (which redeems them). Cloning shares the same codes.
///
/// Codes are kept by their SHA-256, so that looking one up takes no time that depends on how
/// much of a guess matches a real code.
#[derive(Clone, Default)]
pub struct SignInCodes {
    codes: Arc<Mutex<HashMap<[u8; 32], Instant>>>,
}

impl SignInCodes {
    /// How long a code stays valid: long enough to open a printed link, short enough that a
    /// code seen later is spent.
    pub const LIFETIME: Duration = Duration::from_secs(60);
    /// Codes outstanding at once: beyond it the oldest is dropped, so a script that mints in a
    /// loop cannot fill memory (only the local user can mint, but the bound costs nothing).
    const MAX_OUTSTANDING: usize = 1000;

    /// A new code (64 hex digits), valid for [`Self::LIFETIME`] and one use.
    pub fn mint(&self) -> Result<String, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        let code = hex::encode(bytes);
        let now = Instant::now();
        let mut codes = self.codes();
        codes.retain(|_, minted| now.duration_since(*minted) < Self::LIFETIME);
        if codes.len() >= Self::MAX_OUTSTANDING
            && let Some(oldest) = codes
                .iter()
                .min_by_key(|(_, minted)| **minted)
                .map(|(digest, _)| *digest)
        {
            codes.remove(&oldest);
        }
        codes.insert(digest(&code), now);
        Ok(code)
    }

    /// Spends `code`: true when it was minted here less than [`Self::LIFETIME`] ago and not
    /// spent yet. Whatever the answer, the code is gone afterwards.
    pub fn redeem(&self, code: &str) -> bool {
        self.redeem_at(code, Instant::now())
    }

    fn redeem_at(&self, code: &str, now: Instant) -> bool {
        self.codes()
            .remove(&digest(code))
            .is_some_and(|minted| now.saturating_duration_since(minted) < Self::LIFETIME)
    }

    fn codes(&self) -> MutexGuard<'_, HashMap<[u8; 32], Instant>> {
        // A panic elsewhere cannot leave the map half-changed: every change is one call.
        self.codes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for SignInCodes {
    /// Shows how many codes are outstanding, never the codes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignInCodes")
            .field("outstanding", &self.codes().len())
            .finish()
    }
}

fn digest(code: &str) -> [u8; 32] {
    Sha256::digest(code.as_bytes()).into()
}

/// The daemon's web view as `CreateSignInLink` needs it: where it serves, and the codes it
/// accepts.
#[derive(Clone, Debug)]
pub struct WebView {
    /// `http://ADDR` or `https://ADDR`, without a trailing slash.
    pub base_url: String,
    pub codes: SignInCodes,
}

impl WebView {
    /// The view served on `addr` (with TLS when `tls`). A view bound to every address
    /// (`0.0.0.0`, `::`) is linked on loopback: a sign-in link is for the daemon's own user, who
    /// is on this machine.
    pub fn new(addr: SocketAddr, tls: bool, codes: SignInCodes) -> Self {
        let mut addr = addr;
        if addr.ip().is_unspecified() {
            let loopback = match addr {
                SocketAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                SocketAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            };
            addr.set_ip(loopback);
        }
        let scheme = if tls { "https" } else { "http" };
        Self {
            base_url: format!("{scheme}://{addr}"),
            codes,
        }
    }

    /// A link that signs its opener in once: `BASE/signin?code=CODE`.
    pub fn link(&self, code: &str) -> String {
        format!("{}/signin?code={code}", self.base_url)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_code_is_long_random_and_works_once() {
        let codes = SignInCodes::default();
        let code = codes.mint().unwrap();
        assert_eq!(code.len(), 64, "{code}");
        assert!(code.bytes().all(|b| b.is_ascii_hexdigit()), "{code}");
        assert_ne!(code, codes.mint().unwrap());
        let shared = codes.clone();
        assert!(shared.redeem(&code), "a clone shares the codes");
        assert!(!codes.redeem(&code), "a code works once");
        assert!(!codes.redeem("0".repeat(64).as_str()), "never minted");
        assert!(!codes.redeem(""));
    }

    #[test]
    fn a_code_expires_after_its_lifetime_and_is_spent_by_the_attempt() {
        let codes = SignInCodes::default();
        let code = codes.mint().unwrap();
        let late = Instant::now() + SignInCodes::LIFETIME;
        assert!(!codes.redeem_at(&code, late));
        assert!(!codes.redeem(&code), "the late attempt spent it");
        let fresh = codes.mint().unwrap();
        let in_time = Instant::now() + SignInCodes::LIFETIME - Duration::from_secs(5);
        assert!(codes.redeem_at(&fresh, in_time));
    }

    #[test]
    fn outstanding_codes_are_bounded_and_debug_shows_none() {
        let codes = SignInCodes::default();
        let first = codes.mint().unwrap();
        // Strictly older than every later code, however coarse the clock.
        std::thread::sleep(Duration::from_millis(2));
        for _ in 0..SignInCodes::MAX_OUTSTANDING {
            codes.mint().unwrap();
        }
        assert_eq!(codes.codes().len(), SignInCodes::MAX_OUTSTANDING);
        assert!(!codes.redeem(&first), "the oldest made room");
        let shown = format!("{codes:?}");
        assert!(shown.contains("outstanding"), "{shown}");
    }

    #[test]
    fn links_name_the_view_and_a_wildcard_address_becomes_loopback() {
        let codes = SignInCodes::default();
        let plain = WebView::new("127.0.0.1:8080".parse().unwrap(), false, codes.clone());
        assert_eq!(plain.link("ab"), "http://127.0.0.1:8080/signin?code=ab");
        let any = WebView::new("0.0.0.0:8443".parse().unwrap(), true, codes.clone());
        assert_eq!(any.base_url, "https://127.0.0.1:8443");
        let v6 = WebView::new("[::]:8080".parse().unwrap(), false, codes);
        assert_eq!(v6.base_url, "http://[::1]:8080");
    }
}
