//! The connection to forkd: address parsing, the gRPC channel (TLS for `https://`) and the
//! bearer-token interceptor.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use forkd_proto::v1::forkd_client::ForkdClient;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::exit::CliError;

/// The client every command receives.
pub type Client = ForkdClient<InterceptedService<Channel, Auth>>;

/// Transcripts and replays can be large; tonic's default decoding limit (4 MiB) would cut them off,
/// and sends are unbounded unless set, so both directions get the same explicit bound.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A TCP daemon that does not answer within this long is reported as unavailable rather than
/// leaving the user staring at a silent terminal.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A Unix socket path.
    Unix(PathBuf),
    /// An `http://host:port` URI.
    Http(String),
    /// An `https://host:port` URI: TLS, verified against the system's roots or `--ca-cert`.
    Https(String),
}

impl Addr {
    /// Parses `unix:/path`, `unix:///path`, `unix:relative/path`, `http://host:port` or
    /// `https://host:port`.
    pub fn parse(s: &str) -> Result<Self, CliError> {
        let invalid = |why: &str| CliError::InvalidInput(format!("invalid address `{s}`: {why}"));
        if let Some(rest) = s.strip_prefix("unix:") {
            // `unix://` is the URI form and must be followed by an absolute path (`unix:///x`);
            // `unix:` alone may carry a relative path, as in gRPC's own naming rules.
            let path = match rest.strip_prefix("//") {
                Some(abs) if abs.starts_with('/') => abs,
                Some(_) => {
                    return Err(invalid(
                        "`unix://` needs an absolute path, as in `unix:///path`",
                    ));
                }
                None => rest,
            };
            if path.is_empty() {
                return Err(invalid("the socket path is empty"));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if let Some(authority) = s.strip_prefix("http://") {
            if authority.is_empty() {
                return Err(invalid("the host is missing"));
            }
            return Ok(Self::Http(s.to_owned()));
        }
        if let Some(authority) = s.strip_prefix("https://") {
            if authority.is_empty() {
                return Err(invalid("the host is missing"));
            }
            return Ok(Self::Https(s.to_owned()));
        }
        Err(invalid(
            "expected `unix:/path/forkd.sock`, `http://host:port` or `https://host:port`",
        ))
    }

    /// The default address: the socket in `FORKD_HOME`, which defaults to `$HOME/.forkd`.
    /// The variables are passed in so tests never touch the process environment.
    pub fn default_from(
        forkd_home: Option<OsString>,
        home: Option<OsString>,
    ) -> Result<Self, CliError> {
        let forkd_home = match forkd_home.filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => match home.filter(|v| !v.is_empty()) {
                Some(home) => Path::new(&home).join(".forkd"),
                None => {
                    return Err(CliError::InvalidInput(
                        "neither FORKD_HOME nor HOME is set; pass --addr or set FORKD_ADDR".into(),
                    ));
                }
            },
        };
        Ok(Self::Unix(forkd_home.join("forkd.sock")))
    }

    /// The address from `--addr`/`FORKD_ADDR`, or the default.
    pub fn resolve(given: Option<&str>) -> Result<Self, CliError> {
        match given.filter(|s| !s.is_empty()) {
            Some(s) => Self::parse(s),
            None => Self::default_from(std::env::var_os("FORKD_HOME"), std::env::var_os("HOME")),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Http(uri) | Self::Https(uri) => f.write_str(uri),
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call when a token is configured, and the
/// caller's W3C trace context (`TRACEPARENT`, as CI systems and `otel-cli` set it) as
/// `traceparent`, so that the daemon's spans join the caller's trace.
#[derive(Clone, Debug)]
pub struct Auth {
    header: Option<MetadataValue<Ascii>>,
    traceparent: Option<MetadataValue<Ascii>>,
}

impl Auth {
    /// Builds the interceptor from `FORKD_TOKEN`'s value; an empty token counts as none.
    pub fn new(token: Option<&str>) -> Result<Self, CliError> {
        let header = match token.filter(|t| !t.is_empty()) {
            None => None,
            Some(token) => {
                let mut value: MetadataValue<Ascii> =
                    format!("Bearer {token}").parse().map_err(|_| {
                        CliError::InvalidInput(
                            "FORKD_TOKEN holds characters that cannot travel in a header".into(),
                        )
                    })?;
                // Keeps the token out of any debug output of the request.
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Self {
            header,
            traceparent: None,
        })
    }

    /// Sends `traceparent` (the `TRACEPARENT` variable's value) with every call. A value that
    /// cannot travel in a header is not a trace context: it is left out, not an error.
    pub fn with_traceparent(mut self, traceparent: Option<&str>) -> Self {
        self.traceparent = traceparent
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .and_then(|t| t.parse().ok());
        self
    }
}

impl Interceptor for Auth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        if let Some(traceparent) = &self.traceparent {
            request
                .metadata_mut()
                .insert("traceparent", traceparent.clone());
        }
        Ok(request)
    }
}

/// TLS settings for an `https://` address: only `ca_cert` is trusted when given (a private CA),
/// else the system's roots.
fn tls_config(ca_cert: Option<&Path>) -> Result<ClientTlsConfig, CliError> {
    let Some(path) = ca_cert else {
        return Ok(ClientTlsConfig::new().with_native_roots());
    };
    let pem = std::fs::read(path).map_err(|e| {
        CliError::InvalidInput(format!(
            "cannot read the CA certificate {}: {e}",
            path.display()
        ))
    })?;
    let no_certificate = |why: String| {
        CliError::InvalidInput(format!(
            "the CA certificate {} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`){why}",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| no_certificate(format!(": {e}")))?;
    if certs.is_empty() {
        return Err(no_certificate(String::new()));
    }
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
}

/// An error and its sources joined with `: ` (tonic's own text only says "transport error").
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Connects eagerly, so that a daemon that is not running is reported before any work starts.
/// `ca_cert` is used for `https://` addresses only.
pub async fn connect(addr: &Addr, auth: Auth, ca_cert: Option<&Path>) -> anyhow::Result<Client> {
    let endpoint = match addr {
        // tonic 0.14 dials `unix:` endpoints itself (over `tokio::net::UnixStream`).
        Addr::Unix(path) => {
            let path = path.to_str().ok_or_else(|| {
                CliError::InvalidInput(format!("socket path {} is not UTF-8", path.display()))
            })?;
            Endpoint::from_shared(format!("unix:{path}"))
        }
        Addr::Http(uri) | Addr::Https(uri) => Endpoint::from_shared(uri.clone()),
    }
    .map_err(|e| CliError::InvalidInput(format!("invalid address `{addr}`: {e}")))?
    .connect_timeout(CONNECT_TIMEOUT);
    let endpoint = match addr {
        Addr::Https(_) => endpoint.tls_config(tls_config(ca_cert)?).map_err(|e| {
            CliError::InvalidInput(format!(
                "cannot set up TLS for {addr}: {}; pass --ca-cert (or FORKD_CA_CERT) to trust \
                 the daemon's CA",
                chain(&e)
            ))
        })?,
        Addr::Unix(_) | Addr::Http(_) => endpoint,
    };
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("cannot connect to forkd at {addr}"))?;
    Ok(ForkdClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(p: &str) -> Addr {
        Addr::Unix(PathBuf::from(p))
    }

    #[test]
    fn unix_addresses_in_every_spelling() -> Result<(), CliError> {
        assert_eq!(
            Addr::parse("unix:/run/forkd.sock")?,
            unix("/run/forkd.sock")
        );
        assert_eq!(
            Addr::parse("unix:///run/forkd.sock")?,
            unix("/run/forkd.sock")
        );
        assert_eq!(Addr::parse("unix:forkd.sock")?, unix("forkd.sock"));
        Ok(())
    }

    #[test]
    fn http_addresses_are_kept_whole() -> Result<(), CliError> {
        let addr = Addr::parse("http://127.0.0.1:7070")?;
        assert_eq!(addr, Addr::Http("http://127.0.0.1:7070".into()));
        assert_eq!(addr.to_string(), "http://127.0.0.1:7070");
        Ok(())
    }

    #[test]
    fn https_addresses_are_kept_whole() -> Result<(), CliError> {
        let addr = Addr::parse("https://forkd.example:7070")?;
        assert_eq!(addr, Addr::Https("https://forkd.example:7070".into()));
        assert_eq!(addr.to_string(), "https://forkd.example:7070");
        Ok(())
    }

    #[test]
    fn a_ca_certificate_must_hold_a_pem_certificate() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let missing = dir.path().join("missing.pem");
        let err = tls_config(Some(&missing)).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("cannot read the CA certificate")),
            "{err:?}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate")?;
        let err = tls_config(Some(&junk)).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("junk.pem holds no PEM certificate")),
            "{err:?}"
        );
        Ok(())
    }

    #[test]
    fn bad_addresses_say_what_is_expected() {
        for bad in [
            "unix:",
            "unix://relative.sock",
            "http://",
            "https://",
            "localhost:7070",
        ] {
            let err = Addr::parse(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.starts_with(&format!("invalid address `{bad}`")),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn default_address_prefers_forkd_home_then_home() -> Result<(), CliError> {
        let addr = Addr::default_from(Some("/srv/forkd".into()), Some("/home/u".into()))?;
        assert_eq!(addr, unix("/srv/forkd/forkd.sock"));
        assert_eq!(addr.to_string(), "unix:/srv/forkd/forkd.sock");
        let addr = Addr::default_from(None, Some("/home/u".into()))?;
        assert_eq!(addr, unix("/home/u/.forkd/forkd.sock"));
        let addr = Addr::default_from(Some("".into()), Some("/home/u".into()))?;
        assert_eq!(addr, unix("/home/u/.forkd/forkd.sock"));
        assert!(Addr::default_from(None, None).is_err());
        Ok(())
    }

    #[test]
    fn the_token_travels_as_a_bearer_header() -> Result<(), Box<dyn std::error::Error>> {
        let mut auth = Auth::new(Some("s3cret"))?;
        let request = auth.call(tonic::Request::new(()))?;
        let header = request.metadata().get("authorization");
        assert_eq!(header.and_then(|v| v.to_str().ok()), Some("Bearer s3cret"));

        let mut none = Auth::new(Some(""))?;
        let request = none.call(tonic::Request::new(()))?;
        assert!(request.metadata().get("authorization").is_none());
        assert!(Auth::new(Some("bad\ntoken")).is_err());
        Ok(())
    }

    #[test]
    fn a_trace_context_travels_as_traceparent() -> Result<(), Box<dyn std::error::Error>> {
        let value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut auth = Auth::new(None)?.with_traceparent(Some(value));
        let request = auth.call(tonic::Request::new(()))?;
        let header = request.metadata().get("traceparent");
        assert_eq!(header.and_then(|v| v.to_str().ok()), Some(value));
        for absent in [None, Some(""), Some("bad\nvalue")] {
            let mut auth = Auth::new(None)?.with_traceparent(absent);
            let request = auth.call(tonic::Request::new(()))?;
            assert!(
                request.metadata().get("traceparent").is_none(),
                "{absent:?}"
            );
        }
        Ok(())
    }
}
