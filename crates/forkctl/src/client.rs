//! The connection to forkd: address parsing, the gRPC channel and the bearer-token interceptor.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use forkd_proto::v1::forkd_client::ForkdClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

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
}

impl Addr {
    /// Parses `unix:/path`, `unix:///path`, `unix:relative/path` or `http://host:port`.
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
        if s.starts_with("https://") {
            return Err(invalid(
                "this forkctl speaks plain http only; terminate TLS in front of it or use a Unix socket",
            ));
        }
        Err(invalid(
            "expected `unix:/path/forkd.sock` or `http://host:port`",
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
            Self::Http(uri) => f.write_str(uri),
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call when a token is configured.
#[derive(Clone, Debug)]
pub struct Auth {
    header: Option<MetadataValue<Ascii>>,
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
        Ok(Self { header })
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
        Ok(request)
    }
}

/// Connects eagerly, so that a daemon that is not running is reported before any work starts.
pub async fn connect(addr: &Addr, auth: Auth) -> anyhow::Result<Client> {
    let endpoint = match addr {
        // tonic 0.14 dials `unix:` endpoints itself (over `tokio::net::UnixStream`).
        Addr::Unix(path) => {
            let path = path.to_str().ok_or_else(|| {
                CliError::InvalidInput(format!("socket path {} is not UTF-8", path.display()))
            })?;
            Endpoint::from_shared(format!("unix:{path}"))
        }
        Addr::Http(uri) => Endpoint::from_shared(uri.clone()),
    }
    .map_err(|e| CliError::InvalidInput(format!("invalid address `{addr}`: {e}")))?
    .connect_timeout(CONNECT_TIMEOUT);
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
    fn bad_addresses_say_what_is_expected() {
        for bad in [
            "unix:",
            "unix://relative.sock",
            "http://",
            "https://h:1",
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
}
