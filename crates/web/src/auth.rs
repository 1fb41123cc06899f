//! Who is calling: a sign-in, kept as an opaque session id in an HttpOnly, SameSite=Strict
//! cookie (Secure under TLS), and the checks on actions.
//!
//! The rules are gRPC's over TCP (`forkd_server::auth`): a request without a sign-in is no one,
//! on loopback or not — any process on the machine can open a TCP connection, a sandboxed
//! command allowed the network included, so the address proves nothing. Nothing but the page's
//! static files and the sign-ins answers without one. There are two ways to sign in:
//!
//! - with a bearer token (`POST /api/signin`): its tenant. The secret stays in the daemon's
//!   memory, never in the page, the cookie or a response: the cookie holds a random id, and each
//!   call re-checks the token behind it, so a revoked token stops working at its next call;
//! - with a sign-in link (`GET /signin?code=…`, from `forkctl ui`): tenant `local`. Its
//!   one-time code was minted for the Unix socket's owner ([`SignInCodes`]), the one caller
//!   who proves being the local user.
//!
//! Actions (POST) must carry the page's CSRF token in `x-forkd-csrf` — a header another site
//! cannot set without a CORS preflight this server never grants — and, when the browser says
//! where the request comes from (`Origin`), come from this very host.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::header::{COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use cookie::{Cookie, SameSite};
use forkd_core::Tenant;
use forkd_server::{SignInCodes, TokenStore};
use serde::Deserialize;
use subtle::ConstantTimeEq as _;

use crate::AppState;
use crate::error::WebError;

const COOKIE_NAME: &str = "forkd_ui";
const CSRF_HEADER: &str = "x-forkd-csrf";
/// A sign-in lasts this long; then the page asks for the token again.
const SIGN_IN_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// Sign-ins kept at once: beyond it the oldest is dropped, so that sign-ins cannot fill memory.
const MAX_SIGN_INS: usize = 10_000;

pub(crate) struct Auth {
    tokens: TokenStore,
    /// The codes of sign-in links, minted by the gRPC server for the socket's owner.
    codes: SignInCodes,
    /// TLS is on: the cookie is `Secure`.
    secure: bool,
    sign_ins: Mutex<HashMap<String, SignIn>>,
}

struct SignIn {
    by: SignedInWith,
    csrf: String,
    at: Instant,
}

/// What a sign-in rests on, checked again at every call where it can change.
#[derive(Clone)]
enum SignedInWith {
    /// A bearer token's secret: re-checked at each call, so that revoking it ends the sign-in.
    Token(String),
    /// A sign-in link's code, spent: tenant `local`, for the sign-in's lifetime (the local user
    /// has no token to revoke; signing out or restarting the daemon ends it).
    Link,
}

/// A caller whose tenant is established.
pub(crate) struct Caller {
    pub tenant: Tenant,
    csrf: String,
    /// The token the sign-in rests on, checked again while a live stream runs; `None` for a
    /// sign-in link's (tenant `local`: nothing to revoke).
    pub lease: Option<Lease>,
}

/// A sign-in's token, to check again for as long as a live stream it opened runs.
#[derive(Clone)]
pub(crate) struct Lease {
    tokens: TokenStore,
    secret: String,
    tenant: Tenant,
}

impl Lease {
    /// Resolves once the token is revoked or deleted (checked every half second; a token file
    /// that cannot be read is not a revocation).
    pub(crate) async fn revoked(self) {
        let mut every = tokio::time::interval(forkd_server::TOKEN_CHECK_EVERY);
        loop {
            every.tick().await;
            if let Ok(found) = self.tokens.authenticate(&self.secret)
                && found.as_ref() != Some(&self.tenant)
            {
                return;
            }
        }
    }
}

/// A caller allowed to act: signed in, with the page's CSRF token, from this site.
pub(crate) struct Actor(pub Tenant);

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    // The operating system's generator; without one nothing here is safe, so fail loudly.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    hex::encode(bytes)
}

impl Auth {
    pub(crate) fn new(tokens: TokenStore, codes: SignInCodes, secure: bool) -> Self {
        Self {
            tokens,
            codes,
            secure,
            sign_ins: Mutex::default(),
        }
    }

    fn sign_ins(&self) -> std::sync::MutexGuard<'_, HashMap<String, SignIn>> {
        self.sign_ins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The caller of a request, from its cookie's sign-in; without one, no one.
    fn caller(&self, headers: &HeaderMap) -> Result<Caller, WebError> {
        let id = session_cookie(headers).ok_or(WebError::Unauthenticated)?;
        let (by, csrf) = {
            let mut sign_ins = self.sign_ins();
            match sign_ins.get(&id) {
                Some(s) if s.at.elapsed() < SIGN_IN_LIFETIME => (s.by.clone(), s.csrf.clone()),
                Some(_) => {
                    sign_ins.remove(&id);
                    return Err(WebError::Unauthenticated);
                }
                None => return Err(WebError::Unauthenticated),
            }
        };
        match by {
            SignedInWith::Link => Ok(Caller {
                tenant: Tenant::LOCAL,
                csrf,
                lease: None,
            }),
            SignedInWith::Token(secret) => match self.tokens.authenticate(&secret)? {
                Some(tenant) => Ok(Caller {
                    lease: Some(Lease {
                        tokens: self.tokens.clone(),
                        secret,
                        tenant: tenant.clone(),
                    }),
                    tenant,
                    csrf,
                }),
                None => {
                    // Revoked since: the sign-in ends with it.
                    self.sign_ins().remove(&id);
                    Err(WebError::Unauthenticated)
                }
            },
        }
    }

    /// Signs in with a token: its tenant, the new sign-in's id and CSRF token.
    fn sign_in(&self, secret: String) -> Result<(Tenant, String, String), WebError> {
        let tenant = self
            .tokens
            .authenticate(&secret)?
            .ok_or(WebError::WrongToken)?;
        let (id, csrf) = self.start(SignedInWith::Token(secret));
        Ok((tenant, id, csrf))
    }

    /// Signs in as tenant `local` with a sign-in link's code, which is spent whatever the
    /// outcome: the new sign-in's id.
    fn sign_in_with_code(&self, code: &str) -> Result<String, WebError> {
        if !self.codes.redeem(code) {
            return Err(WebError::BadSignInLink);
        }
        Ok(self.start(SignedInWith::Link).0)
    }

    /// Records a sign-in: its id (the cookie's value) and its CSRF token.
    fn start(&self, by: SignedInWith) -> (String, String) {
        let (id, csrf) = (random_hex(), random_hex());
        let mut sign_ins = self.sign_ins();
        sign_ins.retain(|_, s| s.at.elapsed() < SIGN_IN_LIFETIME);
        if sign_ins.len() >= MAX_SIGN_INS
            && let Some(oldest) = sign_ins
                .iter()
                .min_by_key(|(_, s)| s.at)
                .map(|(k, _)| k.clone())
        {
            sign_ins.remove(&oldest);
        }
        sign_ins.insert(
            id.clone(),
            SignIn {
                by,
                csrf: csrf.clone(),
                at: Instant::now(),
            },
        );
        (id, csrf)
    }

    fn cookie(&self, value: String, max_age: Duration) -> HeaderValue {
        let cookie = Cookie::build((COOKIE_NAME, value))
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(self.secure)
            .path("/")
            .max_age(cookie::time::Duration::seconds(
                i64::try_from(max_age.as_secs()).unwrap_or(0),
            ))
            .build();
        HeaderValue::from_str(&cookie.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE_NAME)
        .map(|c| c.value().to_owned())
}

/// Refuses a request whose `Origin` names another host than the one it was sent to.
fn same_origin(headers: &HeaderMap) -> Result<(), WebError> {
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
    if host.is_empty() || origin_host != host {
        return Err(WebError::CrossSite(
            "refused: the request came from another site",
        ));
    }
    Ok(())
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = WebError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, WebError> {
        state.auth.caller(&parts.headers)
    }
}

impl FromRequestParts<AppState> for Actor {
    type Rejection = WebError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, WebError> {
        same_origin(&parts.headers)?;
        let caller = state.auth.caller(&parts.headers)?;
        let sent = parts
            .headers
            .get(CSRF_HEADER)
            .map(HeaderValue::as_bytes)
            .unwrap_or_default();
        if !bool::from(sent.ct_eq(caller.csrf.as_bytes())) {
            return Err(WebError::CrossSite(
                "refused: the request lacks the page's CSRF token; reload the page",
            ));
        }
        Ok(Actor(caller.tenant))
    }
}

/// `GET /api/me`: the caller's tenant and the page's CSRF token (401 until signed in).
/// `signed_in` is always true now that every caller signs in; it stays for pages that read it.
pub(crate) async fn me(caller: Caller) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "tenant": caller.tenant.name(),
        "csrf": caller.csrf,
        "signed_in": true,
    }))
}

#[derive(Deserialize)]
pub(crate) struct SignInBody {
    token: String,
}

/// `POST /api/signin` with `{"token": "fkd_…"}` (JSON only: a cross-site form cannot send it).
pub(crate) async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(body): Json<SignInBody>,
) -> Result<Response, WebError> {
    same_origin(&headers)?;
    let secret = body.token.trim().to_owned();
    let (tenant, id, csrf) = match state.auth.sign_in(secret) {
        Ok(found) => found,
        Err(e) => {
            tracing::info!("A web view sign-in with an unknown token was refused");
            return Err(e);
        }
    };
    tracing::info!(tenant = %tenant, "Signed in to the web view");
    let cookie = state.auth.cookie(id, SIGN_IN_LIFETIME);
    let body = Json(serde_json::json!({
        "tenant": tenant.name(),
        "csrf": csrf,
        "signed_in": true,
    }));
    Ok(([(SET_COOKIE, cookie)], body).into_response())
}

#[derive(Deserialize)]
pub(crate) struct LinkQuery {
    /// Missing is refused as an unknown code, with the same message.
    #[serde(default)]
    code: String,
}

/// `GET /signin?code=…`, the link `forkctl ui` prints: spends the code, signs the browser in as
/// tenant `local` and sends it to the page (303). A used, expired or unknown code is 401.
///
/// A GET, so that the link opens with a click from a terminal. It cannot be turned against
/// anyone: only the local user can mint a code, so a forged link signs its victim in as the
/// forger only if the forger is the local user. The page's `Referrer-Policy: no-referrer` keeps
/// the code out of any other site's logs, and it is spent before anyone could replay it.
pub(crate) async fn sign_in_link(
    State(state): State<AppState>,
    Query(query): Query<LinkQuery>,
) -> Result<Response, WebError> {
    let id = match state.auth.sign_in_with_code(&query.code) {
        Ok(id) => id,
        Err(e) => {
            tracing::info!("A web view sign-in link that is used, expired or unknown was refused");
            return Err(e);
        }
    };
    tracing::info!(tenant = %Tenant::LOCAL, "Signed in to the web view with a sign-in link");
    let cookie = state.auth.cookie(id, SIGN_IN_LIFETIME);
    Ok(([(SET_COOKIE, cookie)], Redirect::to("/")).into_response())
}

/// `POST /api/signout`: forgets the sign-in and clears the cookie.
pub(crate) async fn sign_out(
    State(state): State<AppState>,
    _actor: Actor,
    headers: HeaderMap,
) -> Response {
    if let Some(id) = session_cookie(&headers) {
        state.auth.sign_ins().remove(&id);
    }
    let cookie = state.auth.cookie(String::new(), Duration::ZERO);
    ([(SET_COOKIE, cookie)], Json(serde_json::json!({}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                *k,
                HeaderValue::from_str(v).unwrap_or_else(|_| HeaderValue::from_static("")),
            );
        }
        h
    }

    #[test]
    fn origins_of_other_sites_are_refused() {
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
        assert!(
            same_origin(&headers(&[
                ("host", "127.0.0.1:8080"),
                ("origin", "http://127.0.0.1:8080")
            ]))
            .is_ok()
        );
        assert!(
            same_origin(&headers(&[
                ("host", "127.0.0.1:8080"),
                ("origin", "https://evil.example")
            ]))
            .is_err()
        );
        assert!(same_origin(&headers(&[("origin", "http://127.0.0.1:8080")])).is_err());
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_under_tls() {
        let dir = std::env::temp_dir().join("forkd-web-cookie-test-none");
        let auth = Auth::new(TokenStore::in_home(&dir), SignInCodes::default(), true);
        let c = auth.cookie("abc".into(), SIGN_IN_LIFETIME);
        let c = c.to_str().unwrap_or_default();
        assert!(c.contains("HttpOnly"), "{c}");
        assert!(c.contains("SameSite=Strict"), "{c}");
        assert!(c.contains("Secure"), "{c}");
        let plain = Auth::new(TokenStore::in_home(&dir), SignInCodes::default(), false);
        let c = plain.cookie("abc".into(), SIGN_IN_LIFETIME);
        assert!(!c.to_str().unwrap_or_default().contains("Secure"));
    }

    #[test]
    fn no_cookie_is_no_one_and_a_code_signs_in_as_local_once() {
        let dir = std::env::temp_dir().join("forkd-web-code-test-none");
        let codes = SignInCodes::default();
        let auth = Auth::new(TokenStore::in_home(&dir), codes.clone(), false);
        assert!(matches!(
            auth.caller(&HeaderMap::new()),
            Err(WebError::Unauthenticated)
        ));
        let Ok(code) = codes.mint() else {
            panic!("no random code");
        };
        let Ok(id) = auth.sign_in_with_code(&code) else {
            panic!("a fresh code signs in");
        };
        let cookie = format!("{COOKIE_NAME}={id}");
        let caller = auth.caller(&headers(&[("cookie", &cookie)]));
        assert!(matches!(caller, Ok(Caller { tenant, .. }) if tenant == Tenant::LOCAL));
        assert!(matches!(
            auth.sign_in_with_code(&code),
            Err(WebError::BadSignInLink)
        ));
        assert!(matches!(
            auth.caller(&headers(&[("cookie", "forkd_ui=forged")])),
            Err(WebError::Unauthenticated)
        ));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; forkd_ui=xyz; b=2")]);
        assert_eq!(session_cookie(&h).as_deref(), Some("xyz"));
        assert_eq!(session_cookie(&HeaderMap::new()), None);
    }
}
