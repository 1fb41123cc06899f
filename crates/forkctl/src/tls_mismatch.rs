//! A connection that fails because the two sides disagree about TLS, turned into what to do.
//!
//! Left alone, these failures read as transport noise with the wrong advice: an `http://` address
//! on forkd's TLS listener gives `INTERNAL: h2 protocol error: http2 error` ("the daemon's log has
//! the details"; it has none), and an untrusted certificate gives `invalid peer certificate:
//! UnknownIssuer` ("is forkd running?"; it is). The fix is always on this side, in `--addr` or
//! `--ca-cert`, so each becomes an invalid-argument failure that names the flag to change.

use std::path::Path;
use std::time::Duration;

use rustls::{CertificateError, InvalidMessage};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tonic::Code;

use crate::client::Addr;
use crate::exit::CliError;

/// What a cleartext gRPC client sends first: the HTTP/2 connection preface. A TLS server cannot
/// parse it as a record and answers with a TLS alert, which is what [`speaks_tls`] looks for.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The probe runs only after a failure; it may not hang the command much longer than that did.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `err` restated as what to do when a TLS mismatch with the daemon at `addr` caused it; `err`
/// itself otherwise. `ca_cert` is the `--ca-cert` in use, if any.
pub async fn explain(err: anyhow::Error, addr: &Addr, ca_cert: Option<&Path>) -> anyhow::Error {
    let advice = match addr {
        Addr::Https(uri) => rustls_error(&err).map(|tls| https_advice(tls, uri, ca_cert)),
        Addr::Http(uri) if is_protocol_failure(&err) && speaks_tls(uri).await => Some(format!(
            "this daemon speaks TLS: use {}",
            with_scheme(uri, "https://")
        )),
        Addr::Http(_) | Addr::Unix(_) => None,
    };
    match advice {
        Some(advice) => {
            CliError::InvalidInput(format!("cannot talk to forkd at {addr}: {advice}")).into()
        }
        None => err,
    }
}

/// The advice for a TLS handshake that rustls refused on an `https://` address.
fn https_advice(tls: &rustls::Error, uri: &str, ca_cert: Option<&Path>) -> String {
    match tls {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => match ca_cert {
            None => "the daemon's certificate is not trusted: pass --ca-cert FILE (the CA that \
                     signed it)"
                .to_owned(),
            Some(path) => format!(
                "the daemon's certificate is not trusted: {} did not sign it; pass --ca-cert \
                 FILE (the CA that signed it)",
                path.display()
            ),
        },
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the daemon's certificate does not name the host in {uri}: use a name or address \
             the certificate lists"
        ),
        // The bytes that came back were not a TLS record: a cleartext listener's HTTP/2 frame.
        rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType) => format!(
            "this daemon does not speak TLS: use {}",
            with_scheme(uri, "http://")
        ),
        other => format!("the TLS handshake failed: {other}"),
    }
}

/// The rustls error in `err`'s chain, if the handshake is what failed.
///
/// tokio-rustls hands rustls' error up inside an `io::Error`, whose `source()` skips the error it
/// wraps (it returns *that* error's source), so each `io::Error` is opened with `get_ref`.
fn rustls_error(err: &anyhow::Error) -> Option<&rustls::Error> {
    err.chain().find_map(|cause| {
        cause.downcast_ref::<rustls::Error>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        })
    })
}

/// True for the failures a protocol mismatch produces. tonic turns an HTTP/2 connection error
/// into a bare status (`INTERNAL`, or `UNKNOWN` when h2 gives no reason) without its source, so
/// the chain cannot tell a mismatch from a daemon's own `INTERNAL`: the probe decides.
fn is_protocol_failure(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<tonic::Status>()
            .is_some_and(|status| matches!(status.code(), Code::Internal | Code::Unknown))
    })
}

/// True when the server at `uri` (an `http://` address) answers a cleartext HTTP/2 greeting with
/// a TLS record. Any failure to tell counts as "no": the original error then stands.
async fn speaks_tls(uri: &str) -> bool {
    let Some(authority) = authority(uri) else {
        return false;
    };
    let probe = async {
        let mut stream = TcpStream::connect(authority.as_str()).await.ok()?;
        stream.write_all(H2_PREFACE).await.ok()?;
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await.ok()?;
        Some(is_tls_record(head))
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(true))
    )
}

/// A TLS record opens with its content type (20 to 24: change_cipher_spec, alert, handshake,
/// application_data, heartbeat) and protocol major version 3. An HTTP/2 server's first frame, a
/// SETTINGS frame, opens with the high byte of a 24-bit length: 0 for any frame it would send.
fn is_tls_record(head: [u8; 2]) -> bool {
    (20..=24).contains(&head[0]) && head[1] == 3
}

/// `host:port` of an `http://` URI, with HTTP's default port when it names none.
fn authority(uri: &str) -> Option<String> {
    let uri: tonic::codegen::http::Uri = uri.parse().ok()?;
    let authority = uri.authority()?;
    Some(match authority.port_u16() {
        Some(_) => authority.as_str().to_owned(),
        None => format!("{}:80", authority.host()),
    })
}

/// `uri` with its scheme replaced by `scheme` (`http://h:1` → `https://h:1`).
fn with_scheme(uri: &str, scheme: &str) -> String {
    let rest = uri
        .strip_prefix("https://")
        .or_else(|| uri.strip_prefix("http://"))
        .unwrap_or(uri);
    format!("{scheme}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrapped(tls: rustls::Error) -> anyhow::Error {
        // As tonic reports it: a transport error around tokio-rustls' `io::Error`.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        anyhow::Error::from(tonic::ConnectError(Box::new(io))).context("cannot connect")
    }

    #[test]
    fn the_rustls_error_is_found_inside_an_io_error() {
        let err = wrapped(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ));
        assert_eq!(
            rustls_error(&err),
            Some(&rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            ))
        );
        assert_eq!(rustls_error(&anyhow::anyhow!("refused")), None);
    }

    #[test]
    fn an_unknown_issuer_asks_for_the_ca() {
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let advice = https_advice(&unknown, "https://h:1", None);
        assert_eq!(
            advice,
            "the daemon's certificate is not trusted: pass --ca-cert FILE (the CA that signed it)"
        );
        let advice = https_advice(&unknown, "https://h:1", Some(Path::new("/x/ca.pem")));
        assert!(advice.contains("/x/ca.pem did not sign it"), "{advice}");
        let cleartext = rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType);
        assert_eq!(
            https_advice(&cleartext, "https://h:1", None),
            "this daemon does not speak TLS: use http://h:1"
        );
    }

    #[test]
    fn tls_records_and_http2_frames_are_told_apart() {
        assert!(is_tls_record([0x15, 0x03]), "an alert");
        assert!(is_tls_record([0x16, 0x03]), "a handshake");
        assert!(!is_tls_record([0x00, 0x00]), "a SETTINGS frame");
        assert!(!is_tls_record([b'H', b'T']), "HTTP/1.1");
    }

    #[test]
    fn addresses_give_their_authority_and_change_scheme() {
        assert_eq!(
            authority("http://127.0.0.1:7070").as_deref(),
            Some("127.0.0.1:7070")
        );
        assert_eq!(
            authority("http://forkd.example").as_deref(),
            Some("forkd.example:80")
        );
        assert_eq!(authority("http://[::1]:7").as_deref(), Some("[::1]:7"));
        assert_eq!(
            with_scheme("http://127.0.0.1:7070", "https://"),
            "https://127.0.0.1:7070"
        );
    }

    #[test]
    fn only_internal_and_unknown_statuses_may_be_a_mismatch() {
        let status = |code| anyhow::Error::from(tonic::Status::new(code, "x"));
        assert!(is_protocol_failure(&status(Code::Internal)));
        assert!(is_protocol_failure(&status(Code::Unknown)));
        assert!(!is_protocol_failure(&status(Code::NotFound)));
        assert!(!is_protocol_failure(&anyhow::anyhow!("x")));
    }
}
