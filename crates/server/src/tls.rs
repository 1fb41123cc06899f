//! TLS for the TCP listener: a PEM certificate chain and its private key, checked when the
//! daemon starts so that a bad file is a clear start-up error rather than a failing handshake.
//!
//! rustls with aws-lc does the work (tonic's `tls-aws-lc`): the same crypto provider reqwest's
//! rustls already brings into the daemon, so the process has exactly one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Identity, ServerTlsConfig};

/// A client that has not finished its TLS handshake after this long is dropped, so that idle
/// connections cannot pile up before authentication.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the TLS certificate {} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`): {why}", path.display())]
    NoCertificate { path: PathBuf, why: String },
    #[error("the TLS key {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {why}", path.display())]
    NoKey { path: PathBuf, why: String },
    #[error("the TLS certificate {} and key {} cannot be used together: {why}", cert.display(), key.display())]
    Unusable {
        cert: PathBuf,
        key: PathBuf,
        why: String,
    },
}

/// The TCP listener's certificate chain and private key, PEM-encoded.
#[derive(Clone)]
pub struct TlsConfig {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl fmt::Debug for TlsConfig {
    // The private key stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl TlsConfig {
    /// Reads and checks the certificate chain (leaf first) and the private key.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read = |what, path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                what,
                path: path.to_owned(),
                source,
            })
        };
        let cert_pem = read("certificate", cert)?;
        let key_pem = read("key", key)?;
        Self::from_pem(cert_pem, key_pem, cert, key)
    }

    /// Checks PEM bytes; `cert_name` and `key_name` name them in errors.
    pub fn from_pem(
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        cert_name: &Path,
        key_name: &Path,
    ) -> Result<Self, TlsError> {
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::NoCertificate {
                path: cert_name.to_owned(),
                why: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert_name.to_owned(),
                why: "the file is empty of certificates".into(),
            });
        }
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::NoKey {
            path: key_name.to_owned(),
            why: e.to_string(),
        })?;
        let config = Self { cert_pem, key_pem };
        // Building the acceptor once checks that rustls takes the pair (key type, matching key).
        tonic::transport::Server::builder()
            .tls_config(config.server_config())
            .map_err(|e| TlsError::Unusable {
                cert: cert_name.to_owned(),
                key: key_name.to_owned(),
                why: error_chain(&e),
            })?;
        Ok(config)
    }

    /// tonic's settings for this certificate.
    pub(crate) fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// An error and its sources, joined with `: ` (tonic's transport error says little by itself).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_without_pem_items_are_named_in_the_error() {
        let err = TlsConfig::from_pem(
            b"not pem".to_vec(),
            b"".to_vec(),
            Path::new("cert.pem"),
            Path::new("key.pem"),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("cert.pem holds no PEM certificate"), "{err}");

        let missing = TlsConfig::from_files(Path::new("/nonexistent/c.pem"), Path::new("k.pem"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            missing.starts_with("cannot read the TLS certificate /nonexistent/c.pem"),
            "{missing}"
        );
    }

    #[test]
    fn a_matching_pair_is_accepted_and_a_foreign_key_is_not()
    -> Result<(), Box<dyn std::error::Error>> {
        let one = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
        let (cert, key) = (Path::new("cert.pem"), Path::new("key.pem"));
        let pem = |c: &rcgen::CertifiedKey<rcgen::KeyPair>| {
            (
                c.cert.pem().into_bytes(),
                c.signing_key.serialize_pem().into_bytes(),
            )
        };
        let (cert_pem, key_pem) = pem(&one);
        let config = TlsConfig::from_pem(cert_pem.clone(), key_pem, cert, key)?;
        assert!(!format!("{config:?}").contains("PRIVATE"));

        let (_, foreign_key) = pem(&other);
        let err = TlsConfig::from_pem(cert_pem, foreign_key, cert, key)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("cannot be used together"), "{err}");
        Ok(())
    }
}
