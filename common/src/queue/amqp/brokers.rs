//! Where RabbitMQ is: one URL, or the nodes of a cluster as a comma-separated list of URLs,
//! and the TLS material `amqps://` URLs use (a private CA, a client certificate).
//!
//! lapin connects to one host per URL. [`Brokers::open`] is the stream of its every
//! connection and reconnection: each call takes the next node in turn, starting at a random
//! one, so a node that is down costs one attempt and a fleet's processes spread over the
//! nodes. The URLs of a list are one cluster's: they must name the same user, password,
//! vhost and options, since the AMQP handshake after the stream uses the first's.
//!
//! Nothing here shows a password: a URL is shown as [`redact_url`] gives it, a node as
//! `host:port`. A failed TLS handshake is said as its cause ([`TlsCause`]).

use std::collections::HashSet;
use std::error::Error;
use std::fmt;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use tokio::sync::watch;

use crate::report::redact_url;
use crate::tls::{Tls, TlsCause};

/// The nodes of a broker and how to open a stream to each.
pub(crate) struct Brokers {
    nodes: Vec<AMQPUri>,
    /// The URLs, passwords hidden, for messages.
    shown: String,
    tls: OwnedTLSConfig,
    /// The node the next stream goes to, modulo their number.
    next: AtomicUsize,
    /// The node the latest stream went to (`host:port`), which a failed handshake names.
    latest: Mutex<String>,
    /// The nodes (`host:port`) whose TLS handshake failed since the round of attempts began.
    refusals: Mutex<HashSet<String>>,
    /// How many distinct nodes there are.
    distinct: usize,
    /// Once every node has refused the handshake in a round, the last refusal.
    refused: watch::Sender<Option<TlsFailure>>,
}

/// A list of broker URLs that cannot be used. Shows the URLs with their passwords hidden,
/// and nothing of what failed to parse.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("no RabbitMQ URL in {shown:?}")]
    Empty { shown: String },
    #[error("{url} is not an AMQP URL: {why}")]
    Invalid { url: String, why: String },
    #[error(
        "{url} names another user, password, vhost or options than {first}: the URLs of a list \
         are the nodes of one cluster"
    )]
    Mismatch { url: String, first: String },
}

impl Brokers {
    /// Reads `urls` (`amqp[s]://user:password@host:port/vhost`, several separated by commas;
    /// a comma inside a password is written `%2C`).
    pub(crate) fn parse(urls: &str, tls: &Tls) -> Result<Brokers, UrlError> {
        let shown = redact_url(urls);
        let nodes = urls
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(parse_one)
            .collect::<Result<Vec<_>, _>>()?;
        let Some(first) = nodes.first() else {
            return Err(UrlError::Empty { shown });
        };
        if let Some(other) = nodes.iter().find(|n| !same_login(first, n)) {
            return Err(UrlError::Mismatch {
                url: show(other),
                first: show(first),
            });
        }
        let distinct = nodes.iter().map(node_name).collect::<HashSet<_>>().len();
        Ok(Brokers {
            next: AtomicUsize::new(rand::random::<u16>().into()),
            latest: Mutex::new(node_name(first)),
            refusals: Mutex::default(),
            distinct,
            refused: watch::Sender::new(None),
            nodes,
            shown,
            tls: tls_config(tls),
        })
    }

    /// The URL whose user, password, vhost and options every node's handshake uses.
    pub(crate) fn first(&self) -> &AMQPUri {
        &self.nodes[0]
    }

    /// The vhost of every node.
    pub(crate) fn vhost(&self) -> &str {
        &self.first().vhost
    }

    /// The URLs as a message shows them: passwords hidden.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// The node the next stream goes to; the one after it next time.
    /// Whether the list names more than one node: only then is a node's failure worth a
    /// warning of its own (a single node's is the connection's error, said once).
    pub(crate) fn is_cluster(&self) -> bool {
        self.nodes.len() > 1
    }

    pub(crate) fn next_node(&self) -> &AMQPUri {
        let at = self.next.fetch_add(1, Ordering::Relaxed);
        let node = &self.nodes[at % self.nodes.len()];
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = node_name(node);
        node
    }

    /// Begins a round of connection attempts, no node having refused yet; the receiver
    /// hears when every node has refused the TLS handshake, which no retry mends.
    pub(crate) fn new_round(&self) -> watch::Receiver<Option<TlsFailure>> {
        self.refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.refused.send_replace(None);
        self.refused.subscribe()
    }

    /// Notes that the stream to `node` failed with `error`, and says why: a TLS failure as its
    /// cause (the last node to refuse ends the round), anything else as it is.
    pub(crate) fn note_failure(&self, node: &AMQPUri, error: &lapin::Error) -> String {
        let Some(cause) = TlsCause::of(error, self.tls.identity.is_some()) else {
            return error.to_string();
        };
        let said = cause.to_string();
        let failure = TlsFailure {
            node: node_name(node),
            cause,
        };
        let mut refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        refusals.insert(failure.node.clone());
        if refusals.len() >= self.distinct {
            self.refused.send_replace(Some(failure));
        }
        said
    }

    /// What a failed connection says: a TLS failure as its cause at the node it happened
    /// with, anything else as it is.
    pub(crate) fn failure(&self, error: &lapin::Error) -> Option<TlsFailure> {
        let presented = self.tls.identity.is_some();
        let cause = TlsCause::of(error, presented).or_else(|| {
            // A server that wants a certificate may reset the connection before its alert
            // is read.
            let tls = self.first().scheme == AMQPScheme::AMQPS;
            (tls && !presented && closed(error)).then_some(TlsCause::ClosedWithoutCertificate)
        })?;
        let node = self
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Some(TlsFailure { node, cause })
    }

    /// The TLS configuration of `amqps://` streams.
    pub(crate) fn tls(&self) -> &OwnedTLSConfig {
        &self.tls
    }
}

impl fmt::Debug for Brokers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Brokers")
            .field("urls", &self.shown)
            .finish()
    }
}

/// `host:port` of a node, for messages.
pub(crate) fn node_name(uri: &AMQPUri) -> String {
    let host = &uri.authority.host;
    if host.contains(':') {
        format!("[{host}]:{}", uri.authority.port)
    } else {
        format!("{host}:{}", uri.authority.port)
    }
}

fn show(uri: &AMQPUri) -> String {
    let scheme = match uri.scheme {
        AMQPScheme::AMQP => "amqp",
        AMQPScheme::AMQPS => "amqps",
    };
    format!("{scheme}://{}", node_name(uri))
}

fn parse_one(text: &str) -> Result<AMQPUri, UrlError> {
    let invalid = |why: String| UrlError::Invalid {
        url: redact_url(text),
        why,
    };
    // The url crate's errors never quote the input; amq-protocol's may.
    let url = reqwest::Url::parse(text).map_err(|e| invalid(e.to_string()))?;
    let Some(host) = url.host_str() else {
        return Err(invalid("no host".to_owned()));
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut uri: AMQPUri = text.parse().map_err(|e: String| {
        invalid(if e.starts_with("Invalid AMQP scheme") {
            "the scheme is neither amqp nor amqps".to_owned()
        } else {
            "its vhost or a query parameter does not parse".to_owned()
        })
    })?;
    // amq-protocol takes the host from `Url::domain`, which is empty for an IP address: it
    // would connect to `localhost` instead.
    uri.authority.host = host;
    Ok(uri)
}

/// A private CA is trusted besides the system's store; a client certificate is shown to
/// every node that asks.
fn tls_config(tls: &Tls) -> OwnedTLSConfig {
    OwnedTLSConfig {
        identity: tls.identity().map(|identity| OwnedIdentity::PKCS8 {
            pem: identity.cert_pem.clone(),
            key: identity.key_pem.clone(),
        }),
        cert_chain: tls
            .ca_pem()
            .map(|pem| String::from_utf8_lossy(pem).into_owned()),
    }
}

fn same_login(a: &AMQPUri, b: &AMQPUri) -> bool {
    a.authority.userinfo == b.authority.userinfo && a.vhost == b.vhost && a.query == b.query
}

/// A TLS handshake with the node `node` failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("TLS with RabbitMQ node {node} failed: {cause}")]
pub struct TlsFailure {
    pub node: String,
    pub cause: TlsCause,
}

/// Whether `error` is the peer closing the connection.
fn closed(error: &lapin::Error) -> bool {
    let Some(io) = error.source().and_then(|e| e.downcast_ref::<io::Error>()) else {
        return false;
    };
    matches!(
        io.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(urls: &str) -> Result<Brokers, UrlError> {
        Brokers::parse(urls, &Tls::default())
    }

    #[test]
    fn a_list_is_every_node_in_turn_from_a_random_one() {
        let list = brokers("amqp://u:pw@10.0.0.1:5672/%2f, amqp://u:pw@10.0.0.2:5672/%2f,amqp://u:pw@[::1]:5673/%2f").unwrap();
        let mut seen: Vec<String> = (0..6).map(|_| node_name(list.next_node())).collect();
        assert_eq!(seen[..3], seen[3..], "round robin");
        seen.sort();
        seen.dedup();
        assert_eq!(seen, ["10.0.0.1:5672", "10.0.0.2:5672", "[::1]:5673"]);
        assert_eq!(list.vhost(), "/");
    }

    #[test]
    fn an_ip_address_is_connected_to_not_localhost() {
        let one = brokers("amqps://u:pw@192.0.2.7:5671/vh").unwrap();
        assert_eq!(one.first().authority.host, "192.0.2.7");
        assert_eq!(one.first().scheme, AMQPScheme::AMQPS);
        assert_eq!(one.vhost(), "vh");
    }

    #[test]
    fn messages_show_no_password_of_any_url() {
        let urls = "amqp://u:first-secret@h1:5672/%2f,amqp://u:second-secret@h2:5672/%2f";
        let shown = redact_url(urls);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("h1") && shown.contains("h2"), "{shown}");
        for bad in [
            urls,
            "amqp://u:pw-secret@h1:5672/%2f,amqp://u:pw-secret@h2:notaport/%2f",
            "amqp://u:pw-secret@h1:5672/%2f,http://u:pw-secret@h2/",
            "amqp://u:pw-secret@h1:5672/%2f,amqp://u:pw-secret@h2:5672/%2f?heartbeat=x",
            " , ",
        ] {
            let error = brokers(bad).unwrap_err().to_string();
            assert!(!error.contains("secret"), "{error}");
        }
    }

    #[test]
    fn nodes_with_other_logins_are_refused_naming_both() {
        let error = brokers("amqp://u:a@h1/%2f,amqp://v:a@h2/%2f")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("amqp://h2:5672") && error.contains("amqp://h1:5672"),
            "{error}"
        );
    }

    #[test]
    fn rustls_errors_are_said_as_their_cause() {
        use rustls::{AlertDescription as Alert, CertificateError as Cert};
        let cases = [
            (
                rustls::Error::InvalidCertificate(Cert::UnknownIssuer),
                TlsCause::UnknownCa,
            ),
            (
                rustls::Error::InvalidCertificate(Cert::Expired),
                TlsCause::Expired,
            ),
            (
                rustls::Error::InvalidCertificate(Cert::NotValidForName),
                TlsCause::WrongName,
            ),
            (
                rustls::Error::AlertReceived(Alert::CertificateRequired),
                TlsCause::NoClientCertificate,
            ),
            (
                rustls::Error::AlertReceived(Alert::UnknownCA),
                TlsCause::ClientCertificateRefused,
            ),
        ];
        for (error, cause) in cases {
            // As lapin hands it over: an I/O error in a lapin error.
            let io = io::Error::new(io::ErrorKind::InvalidData, error);
            let lapin = lapin::Error::from(io);
            assert_eq!(TlsCause::of(&lapin, true), Some(cause));
        }
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(TlsCause::of(&refused, true), None);
    }
}
