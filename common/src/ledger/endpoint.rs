//! How a Redis URL becomes a connection:
//!
//! - `redis://[user:password@]host:port[/db]`, plain; `rediss://…` over TLS with the fleet's
//!   CA and client certificate ([`crate::tls`]);
//! - `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[/db]` (or
//!   `rediss+sentinel://`): the sentinels are asked where the primary named `MASTER_NAME` is,
//!   and asked again every [`FOLLOW`]: when a failover moved it, new calls go to the new
//!   primary (calls on the old one fail, and are retried, as on any lost connection). The
//!   user and password are the primary's; the sentinels are asked without them.

use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ClientTlsConfig, ErrorKind, RedisError, RedisResult, TlsCertificates};
use tracing::{info, warn};

use crate::tls::Tls;

/// How often the sentinels are asked where the primary is.
const FOLLOW: Duration = Duration::from_millis(500);
/// How long one sentinel may take to answer.
const SENTINEL_PATIENCE: Duration = Duration::from_secs(2);

/// A client for the Redis at `url` (not a Sentinel URL); over TLS (`rediss://`) it trusts
/// `tls`' CA (else the system's store) and shows `tls`' client certificate, if any.
pub(crate) fn client(url: &str, tls: &Tls) -> RedisResult<Client> {
    if !url.starts_with("rediss://") {
        return Client::open(url);
    }
    crate::tls::install_crypto_provider();
    let certificates = TlsCertificates {
        client_tls: tls.identity().map(|id| ClientTlsConfig {
            client_cert: id.cert_pem.clone(),
            client_key: id.key_pem.clone(),
        }),
        root_cert: tls.ca_pem().map(<[u8]>::to_vec),
    };
    Client::build_with_tls(url, certificates)
}

/// Why connecting to the Redis at `url` failed: the TLS cause, said as an operator fixes
/// it, when the handshake failed; else `other`.
pub(crate) fn connect_error(
    url: &str,
    tls: &Tls,
    error: RedisError,
    other: impl FnOnce(RedisError) -> super::LedgerError,
) -> super::LedgerError {
    match crate::tls::TlsCause::of(&error, tls.identity().is_some()) {
        Some(cause) => super::LedgerError::Tls {
            redis: crate::report::redact_url(url),
            cause,
        },
        None => other(error),
    }
}

/// A connection to the primary a URL names, which follows it when Sentinel moves it.
#[derive(Clone)]
pub(crate) struct Connection {
    current: Arc<RwLock<Primary>>,
}

struct Primary {
    /// `host:port`, as the sentinels name it (empty for a direct URL).
    address: String,
    manager: ConnectionManager,
}

/// Where the primary is found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    Direct(String),
    Sentinel(Sentinel),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sentinel {
    sentinels: Vec<String>,
    master: String,
    /// `user:password@`, or empty.
    credentials: String,
    db: String,
    tls: bool,
}

impl Connection {
    /// Connects to the primary `url` names (see the module's URL forms).
    pub(crate) async fn open(
        url: &str,
        tls: &Tls,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Connection> {
        let sentinel = match parse(url)? {
            Endpoint::Direct(url) => {
                let manager = client(&url, tls)?
                    .get_connection_manager_with_config(config)
                    .await?;
                let primary = Primary {
                    address: String::new(),
                    manager,
                };
                return Ok(Connection {
                    current: Arc::new(RwLock::new(primary)),
                });
            }
            Endpoint::Sentinel(sentinel) => sentinel,
        };
        let address = sentinel.ask(tls).await?;
        let manager = sentinel.connect(&address, tls, config.clone()).await?;
        let current = Arc::new(RwLock::new(Primary { address, manager }));
        tokio::spawn(follow(
            sentinel,
            tls.clone(),
            config,
            Arc::downgrade(&current),
        ));
        Ok(Connection { current })
    }

    /// The connection to the primary as last known.
    pub(crate) fn get(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .manager
            .clone()
    }
}

/// Asks the sentinels where the primary is, every [`FOLLOW`], and moves `current` there
/// when it moved; ends when the connection is dropped.
async fn follow(
    sentinel: Sentinel,
    tls: Tls,
    config: ConnectionManagerConfig,
    current: Weak<RwLock<Primary>>,
) {
    let mut ticks = tokio::time::interval(FOLLOW);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(current) = current.upgrade() else {
            return;
        };
        let known = current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .address
            .clone();
        let address = match sentinel.ask(&tls).await {
            Ok(address) if address != known => address,
            Ok(_) => continue,
            Err(e) => {
                warn!(master = %sentinel.master, error = %e, "No sentinel answered where the Redis primary is; asking again.");
                continue;
            }
        };
        match sentinel.connect(&address, &tls, config.clone()).await {
            Ok(manager) => {
                info!(master = %sentinel.master, from = %known, to = %address, "The Redis primary moved; following it.");
                *current.write().unwrap_or_else(|p| p.into_inner()) = Primary { address, manager };
            }
            Err(e) => {
                warn!(master = %sentinel.master, to = %address, error = %e, "The new Redis primary does not answer yet; asking again.");
            }
        }
    }
}

impl Sentinel {
    /// The primary's `host:port`, from the first sentinel that knows it.
    async fn ask(&self, tls: &Tls) -> RedisResult<String> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let mut last = None;
        for sentinel in &self.sentinels {
            let asked = async {
                let mut conn = client(&format!("{scheme}://{sentinel}/"), tls)?
                    .get_multiplexed_async_connection()
                    .await?;
                let found: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, RedisError>(found)
            };
            match tokio::time::timeout(SENTINEL_PATIENCE, asked).await {
                Ok(Ok(Some((host, port)))) => return Ok(format!("{host}:{port}")),
                Ok(Ok(None)) => {
                    last = Some(RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "a sentinel does not know the master",
                        format!("{sentinel} knows no {:?}", self.master),
                    )));
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("sentinel {sentinel} did not answer"),
                    )));
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((ErrorKind::EmptySentinelList, "no sentinel in the URL"))
        }))
    }

    async fn connect(
        &self,
        address: &str,
        tls: &Tls,
        config: ConnectionManagerConfig,
    ) -> RedisResult<ConnectionManager> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let url = format!("{scheme}://{}{address}/{}", self.credentials, self.db);
        client(&url, tls)?
            .get_connection_manager_with_config(config)
            .await
    }
}

/// Reads a Redis URL; a Sentinel URL is refused, saying its form, when it names no
/// sentinel or no master.
fn parse(url: &str) -> RedisResult<Endpoint> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
        (true, rest)
    } else {
        return Ok(Endpoint::Direct(url.to_owned()));
    };
    let form = "redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[/db]";
    let bad = |what: &'static str| {
        RedisError::from((ErrorKind::InvalidClientConfig, what, form.to_owned()))
    };
    let (authority, path) = rest
        .split_once('/')
        .ok_or(bad("a Sentinel URL names its master"))?;
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), authority),
    };
    let sentinels: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if sentinels.is_empty() {
        return Err(bad("a Sentinel URL names at least one sentinel"));
    }
    let (master, db) = match path.split_once('/') {
        Some((master, db)) => (master, db),
        None => (path, ""),
    };
    if master.is_empty() {
        return Err(bad("a Sentinel URL names its master"));
    }
    Ok(Endpoint::Sentinel(Sentinel {
        sentinels,
        master: master.to_owned(),
        credentials,
        db: db.to_owned(),
        tls,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_url_is_used_as_it_is() {
        let url = "rediss://u:p@host:6380/2";
        assert_eq!(parse(url).unwrap(), Endpoint::Direct(url.to_owned()));
    }

    #[test]
    fn a_sentinel_url_names_its_sentinels_master_credentials_and_db() {
        let parsed = parse("rediss+sentinel://app:pw@s1:26379,s2:26380/mymaster/3").unwrap();
        assert_eq!(
            parsed,
            Endpoint::Sentinel(Sentinel {
                sentinels: vec!["s1:26379".into(), "s2:26380".into()],
                master: "mymaster".into(),
                credentials: "app:pw@".into(),
                db: "3".into(),
                tls: true,
            })
        );
        let Endpoint::Sentinel(plain) = parse("redis+sentinel://s1:26379/m").unwrap() else {
            panic!("not a Sentinel endpoint");
        };
        assert_eq!(
            (plain.credentials.as_str(), plain.db.as_str(), plain.tls),
            ("", "", false)
        );
    }

    #[test]
    fn a_sentinel_url_without_master_or_sentinel_is_refused_saying_its_form() {
        for url in [
            "redis+sentinel://s1:26379",
            "redis+sentinel://s1:26379/",
            "redis+sentinel:///m",
        ] {
            let error = parse(url).unwrap_err().to_string();
            assert!(error.contains("MASTER_NAME"), "{url}: {error}");
        }
    }
}
