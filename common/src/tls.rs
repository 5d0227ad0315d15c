//! The TLS material every connection of the fleet presents: a private CA to trust and a
//! client certificate to show, for RabbitMQ (`amqps://`) and Redis (`rediss://`) alike.
//!
//! Read once, from the files an operator names (`FLEETRUN_TLS_CA_FILE`,
//! `FLEETRUN_TLS_CERT_FILE`, `FLEETRUN_TLS_KEY_FILE`), before anything connects; each
//! connection then builds its library's own configuration from the PEM bytes held here. With
//! no CA file, the system's trust store decides; with no client certificate, none is shown.
//! A plain `amqp://` or `redis://` URL ignores all of it.

use std::error::Error;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the TLS material is: the settings, as flags, environment or the fleet's config file
/// give them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates of the CAs to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate (chain) this client presents.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

/// The TLS material, read: cheap to clone, shared by every connection of a process.
#[derive(Clone, Default)]
pub struct Tls {
    ca_pem: Option<Arc<[u8]>>,
    identity: Option<Arc<ClientIdentity>>,
}

/// A client certificate and its key, both PEM.
pub struct ClientIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// Why the TLS material could not be read: names the file and the setting, never the
/// content.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {setting} {}", path.display())]
    Read {
        setting: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{setting} {} holds no PEM {what}", path.display())]
    NotPem {
        setting: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    #[error(
        "{given} is set but {missing} is not: a client certificate needs its key, and a key its certificate"
    )]
    HalfIdentity {
        given: &'static str,
        missing: &'static str,
    },
}

const CA: &str = "FLEETRUN_TLS_CA_FILE";
const CERT: &str = "FLEETRUN_TLS_CERT_FILE";
const KEY: &str = "FLEETRUN_TLS_KEY_FILE";

impl TlsFiles {
    /// Reads the files named: a CA file must hold a certificate, a certificate and a key come
    /// together.
    pub fn load(&self) -> Result<Tls, TlsError> {
        let ca_pem = match &self.ca_file {
            Some(path) => Some(read_pem(CA, path, "CERTIFICATE")?.into()),
            None => None,
        };
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(Arc::new(ClientIdentity {
                cert_pem: read_pem(CERT, cert, "CERTIFICATE")?,
                key_pem: read_pem(KEY, key, "PRIVATE KEY")?,
            })),
            (Some(_), None) => {
                return Err(TlsError::HalfIdentity {
                    given: CERT,
                    missing: KEY,
                });
            }
            (None, Some(_)) => {
                return Err(TlsError::HalfIdentity {
                    given: KEY,
                    missing: CERT,
                });
            }
            (None, None) => None,
        };
        Ok(Tls { ca_pem, identity })
    }
}

/// The file's bytes, refused unless they hold a PEM block whose label ends with `label`
/// (`PRIVATE KEY` takes `RSA PRIVATE KEY` and `EC PRIVATE KEY` too).
fn read_pem(setting: &'static str, path: &Path, label: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        setting,
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let holds = text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|name| name.ends_with(label))
    });
    if !holds {
        return Err(TlsError::NotPem {
            setting,
            path: path.to_owned(),
            what: if label == "CERTIFICATE" {
                "certificate"
            } else {
                "private key"
            },
        });
    }
    Ok(bytes)
}

/// Picks rustls's cryptography for the process: aws-lc-rs, which lapin uses. Both of rustls's
/// providers are built in (reqwest brings ring), so rustls cannot pick one by itself and the
/// first TLS connection that leaves it the choice (Redis's) would panic. Call once at start,
/// before anything connects; a later call does nothing.
pub fn install_crypto_provider() {
    // An error: a provider is installed already, which is what is wanted.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

impl Tls {
    /// The CA certificates to trust, PEM; `None`: the system's trust store.
    pub fn ca_pem(&self) -> Option<&[u8]> {
        self.ca_pem.as_deref()
    }

    /// The client certificate and key to present, if any.
    pub fn identity(&self) -> Option<&ClientIdentity> {
        self.identity.as_deref()
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

/// Why a TLS handshake with a server (RabbitMQ, Redis) failed, as an operator fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsCause {
    /// The server's certificate is not signed by a CA the client trusts.
    UnknownCa,
    /// The server's certificate has expired (or is not valid yet).
    Expired,
    /// The server's certificate does not name the host connected to.
    WrongName,
    /// The server asked for a client certificate and none was presented.
    NoClientCertificate,
    /// The server refused the client certificate presented.
    ClientCertificateRefused,
    /// The server closed the connection after the handshake, none having been presented.
    ClosedWithoutCertificate,
    /// Anything else rustls said.
    Other(String),
}

impl fmt::Display for TlsCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsCause::UnknownCa => {
                "its certificate is signed by an unknown CA (set FLEETRUN_TLS_CA_FILE to the CA \
                 that signs it)"
            }
            TlsCause::Expired => "its certificate has expired or is not valid yet",
            TlsCause::WrongName => "its certificate does not name the host in the URL",
            TlsCause::NoClientCertificate => {
                "it requires a client certificate and none was presented (set \
                 FLEETRUN_TLS_CERT_FILE and FLEETRUN_TLS_KEY_FILE)"
            }
            TlsCause::ClosedWithoutCertificate => {
                "it closed the connection after the handshake, and no client certificate was \
                 presented: it likely requires one (set FLEETRUN_TLS_CERT_FILE and \
                 FLEETRUN_TLS_KEY_FILE)"
            }
            TlsCause::ClientCertificateRefused => {
                "it refused the client certificate (not signed by a CA it trusts, or expired)"
            }
            TlsCause::Other(what) => return write!(f, "{what}"),
        })
    }
}

impl TlsCause {
    /// The TLS cause of `error` or one of its sources, if it is a TLS failure.
    /// `presented`: whether a client certificate was presented.
    pub fn of(error: &(dyn Error + 'static), presented: bool) -> Option<TlsCause> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(rustls) = e.downcast_ref::<rustls::Error>() {
                return Some(TlsCause::from_rustls(rustls, presented));
            }
            // `io::Error::source` skips the error it wraps: look at it.
            if let Some(inner) = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref)
                && let Some(cause) = TlsCause::of(inner, presented)
            {
                return Some(cause);
            }
            // Redis keeps its cause as an `Arc`, whose `source` skips it too.
            if let Some(shared) = e.downcast_ref::<Arc<dyn Error + Send + Sync>>()
                && let Some(cause) = TlsCause::of(&**shared, presented)
            {
                return Some(cause);
            }
            next = e.source();
        }
        None
    }

    fn from_rustls(error: &rustls::Error, presented: bool) -> TlsCause {
        use rustls::{AlertDescription as Alert, CertificateError as Cert};
        match error {
            rustls::Error::InvalidCertificate(cert) => match cert {
                Cert::UnknownIssuer | Cert::BadSignature => TlsCause::UnknownCa,
                Cert::Expired
                | Cert::ExpiredContext { .. }
                | Cert::NotValidYet
                | Cert::NotValidYetContext { .. } => TlsCause::Expired,
                Cert::NotValidForName | Cert::NotValidForNameContext { .. } => TlsCause::WrongName,
                other => TlsCause::Other(format!("invalid server certificate: {other:?}")),
            },
            rustls::Error::AlertReceived(Alert::CertificateRequired) => {
                TlsCause::NoClientCertificate
            }
            rustls::Error::AlertReceived(Alert::HandshakeFailure) if !presented => {
                TlsCause::NoClientCertificate
            }
            rustls::Error::AlertReceived(
                Alert::BadCertificate
                | Alert::UnknownCA
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::CertificateRevoked
                | Alert::DecryptError
                | Alert::HandshakeFailure,
            ) => TlsCause::ClientCertificateRefused,
            other => TlsCause::Other(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn nothing_named_is_the_system_trust_store_and_no_identity() {
        let tls = TlsFiles::default().load().unwrap();
        assert!(tls.ca_pem().is_none());
        assert!(tls.identity().is_none());
    }

    #[test]
    fn a_ca_and_an_identity_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            ca_file: Some(file(dir.path(), "ca.pem", CERT_PEM)),
            cert_file: Some(file(dir.path(), "c.pem", CERT_PEM)),
            key_file: Some(file(dir.path(), "c.key", KEY_PEM)),
        };
        let tls = files.load().unwrap();
        assert_eq!(tls.ca_pem(), Some(CERT_PEM.as_bytes()));
        assert_eq!(tls.identity().unwrap().key_pem, KEY_PEM.as_bytes());
        assert!(!format!("{tls:?}").contains("MIIE"));
    }

    #[test]
    fn a_certificate_without_its_key_is_refused_naming_both_settings() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert_file: Some(file(dir.path(), "c.pem", CERT_PEM)),
            ..TlsFiles::default()
        };
        let error = files.load().unwrap_err().to_string();
        assert!(error.contains(CERT) && error.contains(KEY), "{error}");
    }

    #[test]
    fn a_file_that_is_not_pem_is_refused_naming_the_setting_not_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert_file: Some(file(dir.path(), "c.pem", CERT_PEM)),
            key_file: Some(file(dir.path(), "c.key", "secret-not-a-key")),
            ..TlsFiles::default()
        };
        let error = files.load().unwrap_err().to_string();
        assert!(error.contains(KEY), "{error}");
        assert!(!error.contains("secret"), "{error}");
    }

    #[test]
    fn a_missing_file_names_it() {
        let files = TlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let error = files.load().unwrap_err().to_string();
        assert!(
            error.contains("/nonexistent/ca.pem") && error.contains(CA),
            "{error}"
        );
    }
}
