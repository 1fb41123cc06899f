//! The tower layer that authenticates every call but health and reflection (see the rules in
//! [`super`]).

use std::net::SocketAddr;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tower::{Layer, Service};
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing::instrument::Instrumented;

use super::{Credential, Tenant, TokenStore};

/// The services that stay open: health probes and reflection. Every other path, `forkd.v1` and
/// anything unknown alike, is authenticated (deny by default, so no spelling of a path can slip
/// past).
const OPEN_PREFIXES: [&str; 3] = [
    "/grpc.health.v1.",
    "/grpc.reflection.v1.",
    "/grpc.reflection.v1alpha.",
];

const MISSING: &str = "a TCP connection needs a bearer token, on loopback too: send \
                       `authorization: Bearer <token>` (forkctl sends $FORKD_TOKEN; the daemon's \
                       operator creates one with `forkd token create NAME`), or connect over the \
                       daemon's Unix socket ($FORKD_HOME/forkd.sock), where its owner needs none";
const MALFORMED: &str = "malformed authorization header: expected `Bearer <token>`";
const UNKNOWN: &str = "unknown or revoked bearer token";
const STORE_FAILED: &str = "the daemon cannot read its token file; its log has the details";

/// The kind of listener a connection came in on, which decides whether a token is required.
/// The layer also puts it into each authenticated request's extensions, for the calls only the
/// socket's owner may make ([`super::is_socket_owner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// The Unix socket: only its owner can connect (mode 0600).
    Unix,
    /// TCP, on any address: whoever can reach the port can connect, on loopback every process
    /// of every user of the machine (sandboxed commands allowed the network among them).
    Tcp,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Self::Unix => "unix",
            Self::Tcp => "tcp",
        }
    }
}

/// Authenticates the calls of one listener and records each in a span.
#[derive(Clone, Debug)]
pub(crate) struct AuthLayer {
    tokens: Option<TokenStore>,
    transport: Transport,
}

impl AuthLayer {
    /// `tokens: None` means no token exists (every presented token is unknown).
    pub(crate) fn new(tokens: Option<TokenStore>, transport: Transport) -> Self {
        Self { tokens, transport }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            tokens: self.tokens.clone(),
            transport: self.transport,
        }
    }
}

/// The service [`AuthLayer`] wraps around the routes.
#[derive(Clone, Debug)]
pub(crate) struct AuthService<S> {
    inner: S,
    tokens: Option<TokenStore>,
    transport: Transport,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for AuthService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Self::Response, S::Error>>, Instrumented<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let path = request.uri().path();
        if OPEN_PREFIXES.iter().any(|open| path.starts_with(open)) {
            return Either::Right(self.inner.call(request).instrument(tracing::Span::none()));
        }
        let span = tracing::info_span!(
            "rpc",
            rpc = %path,
            otel.name = %path.trim_start_matches('/'),
            otel.kind = "server",
            rpc.system = "grpc",
            transport = self.transport.name(),
            tenant = Empty,
            peer.uid = Empty,
            peer.pid = Empty,
            peer.addr = Empty,
        );
        // A caller's W3C trace context (`traceparent`, as CI systems and `forkctl` send it): the
        // call's span, and the work it starts, join the caller's trace.
        if let Some(parent) = request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
        {
            forkd_engine::trace::adopt(&span, parent);
        }
        Peer::of(request.extensions()).record(&span);
        let header = request.headers().get(http::header::AUTHORIZATION);
        match authorize(self.transport, self.tokens.as_ref(), header) {
            Ok(tenant) => {
                span.record("tenant", tenant.name());
                span.in_scope(|| tracing::debug!("Call"));
                // What a token opened is checked again while it streams.
                let secret = header.and_then(bearer).map(str::to_owned);
                if let (Some(tokens), Some(secret)) = (&self.tokens, secret) {
                    let credential = Credential::new(tokens.clone(), &secret, tenant.clone());
                    request.extensions_mut().insert(credential);
                }
                request.extensions_mut().insert(tenant);
                request.extensions_mut().insert(self.transport);
                Either::Right(self.inner.call(request).instrument(span))
            }
            Err(status) => {
                span.in_scope(|| {
                    tracing::warn!(reason = status.message(), "Refused an unauthenticated call");
                });
                Either::Left(ready(Ok(status.into_http())))
            }
        }
    }
}

/// Who is on the other end of the connection, as far as the transport tells.
#[derive(Debug, Default, PartialEq, Eq)]
struct Peer {
    uid: Option<u32>,
    pid: Option<i32>,
    addr: Option<SocketAddr>,
}

impl Peer {
    fn of(extensions: &http::Extensions) -> Self {
        if let Some(uds) = extensions.get::<UdsConnectInfo>() {
            let cred = uds.peer_cred;
            return Self {
                uid: cred.map(|c| c.uid()),
                pid: cred.and_then(|c| c.pid()),
                addr: None,
            };
        }
        let addr = extensions
            .get::<TcpConnectInfo>()
            .or_else(|| {
                extensions
                    .get::<TlsConnectInfo<TcpConnectInfo>>()
                    .map(|tls| tls.get_ref())
            })
            .and_then(TcpConnectInfo::remote_addr);
        Self {
            addr,
            ..Self::default()
        }
    }

    fn record(&self, span: &tracing::Span) {
        if let Some(uid) = self.uid {
            span.record("peer.uid", uid);
        }
        if let Some(pid) = self.pid {
            span.record("peer.pid", pid);
        }
        if let Some(addr) = self.addr {
            span.record("peer.addr", tracing::field::display(addr));
        }
    }
}

/// The tenant of a call, or why it is refused.
fn authorize(
    transport: Transport,
    tokens: Option<&TokenStore>,
    header: Option<&http::HeaderValue>,
) -> Result<Tenant, tonic::Status> {
    let Some(header) = header else {
        return match transport {
            Transport::Unix => Ok(Tenant::LOCAL),
            Transport::Tcp => Err(tonic::Status::unauthenticated(MISSING)),
        };
    };
    let secret = bearer(header).ok_or_else(|| tonic::Status::unauthenticated(MALFORMED))?;
    let tenant = match tokens {
        Some(tokens) => tokens.authenticate(secret).map_err(store_failed)?,
        None => None,
    };
    tenant.ok_or_else(|| tonic::Status::unauthenticated(UNKNOWN))
}

/// The secret of `Bearer <secret>` (the scheme is case-insensitive, as in RFC 9110).
fn bearer(value: &http::HeaderValue) -> Option<&str> {
    let (scheme, secret) = value.to_str().ok()?.split_once(' ')?;
    let secret = secret.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !secret.is_empty()).then_some(secret)
}

fn store_failed(error: super::TokenError) -> tonic::Status {
    tracing::error!(%error, "Cannot check a bearer token");
    tonic::Status::internal(STORE_FAILED)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::convert::Infallible;

    use tower::ServiceExt as _;

    use super::*;

    /// Answers with the tenant the layer inserted (empty when none), and `@unix` or `@tcp` after
    /// it for the transport it inserted.
    async fn call(
        transport: Transport,
        tokens: Option<&TokenStore>,
        path: &str,
        authorization: Option<&str>,
    ) -> http::Response<String> {
        let echo = tower::service_fn(|req: http::Request<()>| async move {
            let tenant = req.extensions().get::<Tenant>().map(Tenant::to_string);
            let transport = req.extensions().get::<Transport>().map(|t| t.name());
            let body = match (tenant, transport) {
                (Some(tenant), Some(transport)) => format!("{tenant}@{transport}"),
                (tenant, _) => tenant.unwrap_or_default(),
            };
            Ok::<_, Infallible>(http::Response::new(body))
        });
        let service = AuthLayer::new(tokens.cloned(), transport).layer(echo);
        let mut request = http::Request::builder().uri(path);
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        service.oneshot(request.body(()).unwrap()).await.unwrap()
    }

    fn grpc_status(response: &http::Response<String>) -> Option<&str> {
        response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
    }

    const RPC: &str = "/forkd.v1.Forkd/ListSessions";

    #[tokio::test]
    async fn the_unix_socket_is_local_without_a_token_and_checks_one_it_gets() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = TokenStore::in_home(dir.path());
        let secret = tokens.create("ci").unwrap();

        let response = call(Transport::Unix, Some(&tokens), RPC, None).await;
        assert_eq!(response.body(), "local@unix");
        let response = call(Transport::Unix, None, RPC, None).await;
        assert_eq!(response.body(), "local@unix");
        let bearer = format!("Bearer {}", secret.expose());
        let response = call(Transport::Unix, Some(&tokens), RPC, Some(&bearer)).await;
        assert_eq!(response.body(), "ci@unix");
        let response = call(Transport::Unix, Some(&tokens), RPC, Some("Bearer fkd_nope")).await;
        assert_eq!(grpc_status(&response), Some("16"));
        assert_eq!(response.body(), "");
    }

    #[tokio::test]
    async fn tcp_is_never_local_and_needs_a_token_whether_or_not_any_exists() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = TokenStore::in_home(dir.path());

        // No token exists at all (no file, or no store): still refused, never `local`.
        for store in [Some(&tokens), None] {
            let response = call(Transport::Tcp, store, RPC, None).await;
            assert_eq!(grpc_status(&response), Some("16"));
            assert_eq!(response.body(), "");
            let message = response.headers().get("grpc-message").unwrap();
            let message = message.to_str().unwrap();
            assert!(message.contains("forkd%20token%20create"), "{message}");
            assert!(message.contains("Unix%20socket"), "{message}");
        }

        let secret = tokens.create("team-a").unwrap();
        let response = call(Transport::Tcp, Some(&tokens), RPC, None).await;
        assert_eq!(grpc_status(&response), Some("16"));
        let bearer = format!("bearer {}", secret.expose());
        let response = call(Transport::Tcp, Some(&tokens), RPC, Some(&bearer)).await;
        assert_eq!(response.body(), "team-a@tcp");
        tokens.revoke("team-a").unwrap();
        let response = call(Transport::Tcp, Some(&tokens), RPC, None).await;
        assert_eq!(
            grpc_status(&response),
            Some("16"),
            "none left: still refused"
        );
    }

    #[tokio::test]
    async fn malformed_headers_are_refused_and_health_stays_open() {
        for bad in ["Basic dXNlcjpwdw==", "Bearer", "Bearer   ", "fkd_x"] {
            let response = call(Transport::Unix, None, RPC, Some(bad)).await;
            assert_eq!(grpc_status(&response), Some("16"), "{bad}");
        }
        for open in [
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            let response = call(Transport::Tcp, None, open, None).await;
            assert_eq!(grpc_status(&response), None, "{open}");
        }
    }

    #[tokio::test]
    async fn any_other_path_is_authenticated_however_it_is_spelled() {
        for path in [
            "//forkd.v1.Forkd/ListSessions",
            "/forkd%2Ev1.Forkd/X",
            "/other.Svc/M",
        ] {
            let response = call(Transport::Tcp, None, path, None).await;
            assert_eq!(grpc_status(&response), Some("16"), "{path}");
        }
    }

    #[test]
    fn the_peer_comes_from_the_connection_info() {
        let mut extensions = http::Extensions::new();
        assert_eq!(Peer::of(&extensions), Peer::default());
        let tcp = TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(SocketAddr::from(([127, 0, 0, 1], 4242))),
        };
        extensions.insert(tcp);
        assert_eq!(
            Peer::of(&extensions).addr,
            Some(SocketAddr::from(([127, 0, 0, 1], 4242)))
        );
    }
}
