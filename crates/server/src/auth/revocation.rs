//! Revoking a token ends what it opened: a call made with a bearer token keeps being checked
//! while its response streams (`SubscribeNotifications`, `AttachAgent`, a parent turn's
//! `SendMessage`, …), and once the token is revoked or deleted the stream ends within
//! [`CHECK_EVERY`] with `UNAUTHENTICATED` — never a notification more.
//!
//! One layer for every call: the authentication layer puts the call's [`Credential`] into the
//! request; [`RevocationLayer`], inside it, wraps the response's body in a [`Revocable`] that
//! checks the credential on a timer between frames and, once it no longer names its tenant,
//! ends the body with the status's trailers instead of the next frame. A call without a token
//! (the Unix socket's owner) has nothing to revoke and is left as it is. The token file is read
//! again only when it changed ([`TokenStore`]'s cache), so a check is one `stat`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::Frame;
use tonic::codegen::http;
use tower::{Layer, Service};

use super::{Tenant, TokenStore};

/// How often an open stream's token is checked (the web view's live streams too).
pub const CHECK_EVERY: Duration = Duration::from_millis(500);

const REVOKED: &str = "the bearer token of this call was revoked or deleted; its streams end \
                       with it (ask the daemon's operator for a new one: forkd token create)";

/// The bearer token a call was authenticated with, to check again while it runs.
#[derive(Clone)]
pub(crate) struct Credential {
    tokens: TokenStore,
    secret: String,
    tenant: Tenant,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl Credential {
    pub(crate) fn new(tokens: TokenStore, secret: &str, tenant: Tenant) -> Self {
        Self {
            tokens,
            secret: secret.to_owned(),
            tenant,
        }
    }

    /// Whether the token no longer names the tenant it named. A token file that cannot be read
    /// is not a revocation (the next check sees it again); the failure is logged.
    fn revoked(&self) -> bool {
        match self.tokens.authenticate(&self.secret) {
            Ok(found) => found.as_ref() != Some(&self.tenant),
            Err(error) => {
                tracing::warn!(%error, "Cannot check an open stream's bearer token");
                false
            }
        }
    }
}

/// Wraps each response of a token's call in a [`Revocable`] body.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RevocationLayer;

impl<S> Layer<S> for RevocationLayer {
    type Service = Revocation<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Revocation { inner }
    }
}

/// The service [`RevocationLayer`] wraps around the routes.
#[derive(Clone, Debug)]
pub(crate) struct Revocation<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Revocation<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<Revocable<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let credential = request.extensions().get::<Credential>().cloned();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Revocable::new(body, credential)))
        })
    }
}

/// A response body that ends with `UNAUTHENTICATED` once its call's token is revoked.
pub(crate) struct Revocable<B> {
    inner: Pin<Box<B>>,
    /// The credential and the timer of its checks; `None`: nothing to revoke.
    watch: Option<(Credential, tokio::time::Interval)>,
    ended: bool,
}

impl<B> Revocable<B> {
    fn new(inner: B, credential: Option<Credential>) -> Self {
        let watch = credential.map(|credential| {
            let first = tokio::time::Instant::now() + CHECK_EVERY;
            let mut timer = tokio::time::interval_at(first, CHECK_EVERY);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            (credential, timer)
        });
        Self {
            inner: Box::pin(inner),
            watch,
            ended: false,
        }
    }
}

/// An empty body with nothing to revoke: what the authentication layer answers a refused call
/// with.
impl<B: Default> Default for Revocable<B> {
    fn default() -> Self {
        Self::new(B::default(), None)
    }
}

impl<B: http_body::Body> http_body::Body for Revocable<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some((credential, timer)) = &mut this.watch {
            while timer.poll_tick(cx).is_ready() {
                if credential.revoked() {
                    this.ended = true;
                    tracing::info!(tenant = %credential.tenant, "Ended a stream whose token was revoked");
                    let mut trailers = http::HeaderMap::new();
                    // A fixed message always encodes; were it not to, the stream still ends.
                    let _ = tonic::Status::unauthenticated(REVOKED).add_header(&mut trailers);
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
            }
        }
        this.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
