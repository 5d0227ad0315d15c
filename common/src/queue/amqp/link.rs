//! The process's connection to RabbitMQ, kept ([`Link`]): made to the nodes in turn,
//! recovered by lapin when it is lost, and given up and made again when lapin's recovery
//! does not complete.
//!
//! lapin's recovery can wait for good: its new connection can land on a node that takes it
//! and never answers (a hung broker, a half-dead load balancer), and a recovery that fails
//! never wakes those waiting for it (`Channel::wait_for_recovery`). So every wait for a
//! recovery here is bounded by [`RECOVERY_PATIENCE`]; past it the link gives its connection
//! up, the next channel comes from a new one, and channels of the old one are not waited on
//! (see [`Link::alive`]). A connection given up is closed if it ever comes back, so that
//! nothing it replays (a consumer) holds messages nobody reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::ExponentialBuilder;
use futures::StreamExt;
use lapin::tcp::AMQPUriTcpExt;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::backend;
use super::brokers::{Brokers, node_name};
use crate::queue::QueueError;

/// How long lapin may take to recover a lost connection before the link gives it up and
/// connects again itself: longer than a broker's restart, or a node of a cluster lost.
pub(super) const RECOVERY_PATIENCE: Duration = Duration::from_secs(30);

/// How long a connection may take, TCP retries and AMQP handshake together: a broker can
/// take the TCP connection and never answer the handshake.
const CONNECT_PATIENCE: Duration = Duration::from_secs(60);
/// How long one node may take to accept a TCP connection and finish the TLS handshake: a
/// node whose host is gone drops the packets, and the next node should get its turn.
const NODE_PATIENCE: Duration = Duration::from_secs(10);

/// How often a connection given up is looked at, to close it if it came back.
const RETIRED_CHECK: Duration = Duration::from_secs(1);

/// The broker's reason while it blocks a connection (`connection.blocked`: a memory or disk
/// alarm on the broker); publishes wait until it lifts.
type Blocked = Arc<Mutex<Option<String>>>;

/// The process's connection to the broker, and what it knows of its health.
pub(super) struct Link {
    brokers: Arc<Brokers>,
    /// The connection name the broker shows.
    name: String,
    blocked: Blocked,
    /// Replaced when the connection is lost for good, or its recovery was given up.
    connection: tokio::sync::Mutex<Connection>,
    /// Counts the connections made: a channel of an earlier one is not used again.
    generation: AtomicU64,
    /// Since when a channel of the current connection was seen not connected.
    down_since: Mutex<Option<Instant>>,
    /// A wait for lapin's recovery ran out: the next channel comes from a new connection.
    given_up: AtomicBool,
}

/// A channel, and which of the link's connections it is on.
#[derive(Clone)]
pub(super) struct Opened {
    pub channel: Channel,
    generation: u64,
}

impl Link {
    /// Connects to the first node that answers (see [`connect`]).
    pub(super) async fn connect(brokers: Arc<Brokers>, name: String) -> Result<Link, QueueError> {
        let blocked = Blocked::default();
        let connection = connect(&brokers, &name, &blocked).await?;
        Ok(Link {
            brokers,
            name,
            blocked,
            connection: tokio::sync::Mutex::new(connection),
            generation: AtomicU64::new(0),
            down_since: Mutex::new(None),
            given_up: AtomicBool::new(false),
        })
    }

    /// The connection name the broker shows.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Why the broker blocks this connection's publishes, while it does.
    pub(super) fn blocked(&self) -> Option<String> {
        self.blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Opens a channel, connecting again first when the connection is gone for good, or
    /// its recovery was given up.
    pub(super) async fn open(&self) -> lapin::Result<Opened> {
        let mut connection = self.connection.lock().await;
        let status = connection.status();
        let given_up = self.given_up.swap(false, Ordering::Relaxed);
        if status.closed() || status.errored() || given_up {
            if given_up {
                warn!(
                    patience_s = RECOVERY_PATIENCE.as_secs(),
                    "RabbitMQ connection not recovered in time; connecting again."
                );
            } else {
                warn!("RabbitMQ connection lost; reconnecting.");
            }
            let fresh = connect(&self.brokers, &self.name, &self.blocked)
                .await
                .map_err(|e| lapin::Error::from(std::io::Error::other(e)))?;
            let old = std::mem::replace(&mut *connection, fresh);
            self.generation.fetch_add(1, Ordering::Relaxed);
            self.down_since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            tokio::spawn(retire(old));
        }
        let channel = connection.create_channel().await?;
        Ok(Opened {
            channel,
            generation: self.generation.load(Ordering::Relaxed),
        })
    }

    /// Whether `opened` is worth using or waiting on: it is on the current connection, and
    /// that connection has not been down longer than [`RECOVERY_PATIENCE`] (past which it
    /// is given up: the next channel comes from a new connection).
    pub(super) fn alive(&self, opened: &Opened) -> bool {
        if opened.generation != self.generation.load(Ordering::Relaxed) {
            return false;
        }
        let status = opened.channel.status();
        let mut down = self.down_since.lock().unwrap_or_else(|p| p.into_inner());
        if status.connected() {
            *down = None;
            return true;
        }
        if !status.reconnecting() {
            return false;
        }
        if down.get_or_insert_with(Instant::now).elapsed() < RECOVERY_PATIENCE {
            return true;
        }
        self.given_up.store(true, Ordering::Relaxed);
        false
    }

    /// Waits for lapin to recover the connection `channel` is on, after `error`, at most
    /// [`RECOVERY_PATIENCE`]; past it, the connection is given up and `error` returned.
    pub(super) async fn recovered(
        &self,
        channel: &Channel,
        error: lapin::Error,
    ) -> lapin::Result<()> {
        match tokio::time::timeout(RECOVERY_PATIENCE, channel.wait_for_recovery(error.clone()))
            .await
        {
            Ok(recovered) => recovered,
            Err(_) => {
                self.given_up.store(true, Ordering::Relaxed);
                Err(error)
            }
        }
    }
}

/// Watches a connection given up: closes it if lapin's recovery ever completes, ends when
/// it closes or fails.
async fn retire(connection: Connection) {
    loop {
        let status = connection.status();
        if status.connected() {
            debug!("A RabbitMQ connection given up recovered late; closing it.");
            let _ = connection.close(0, "given up".into()).await;
            return;
        }
        if status.closed() || status.errored() {
            return;
        }
        tokio::time::sleep(RETIRED_CHECK).await;
    }
}

/// A connection to one of the nodes, and on every reconnection of lapin's to the next one in
/// turn (see `brokers`).
async fn connect(
    brokers: &Arc<Brokers>,
    name: &str,
    blocked: &Blocked,
) -> Result<Connection, QueueError> {
    // lapin retries each TCP connection with this backoff, the first one included; its
    // default (1 s to 60 s, 16 times) would make a down broker hang a caller ~11 min. This
    // gives up after ~30 s; a later call reconnects again (`Shared::open_channel`).
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(10)
        .with_jitter();
    let properties = ConnectionProperties::default()
        .with_connection_name(name.into())
        .enable_auto_recover()
        .with_backoff(backoff);
    let runtime = lapin::runtime::default_runtime().map_err(backend("start lapin"))?;
    let mut refused = brokers.new_round();
    let nodes = brokers.clone();
    let opening = Connection::connector(
        brokers.first().clone(),
        runtime,
        async move |_first, runtime| {
            let node = nodes.next_node();
            let stream = node.connect_with_config_async(nodes.tls().as_ref(), &runtime);
            let stream = tokio::time::timeout(NODE_PATIENCE, stream)
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
            stream.map_err(|e| {
                let error = lapin::Error::from(e);
                let said = nodes.note_failure(node, &error);
                if nodes.is_cluster() {
                    warn!(node = %node_name(node), error = %said, "RabbitMQ node unreachable; the next attempt goes to the next node.");
                } else {
                    debug!(node = %node_name(node), error = %said, "RabbitMQ unreachable.");
                }
                error
            })
        },
        properties,
    );
    // lapin retries a refused handshake as it does a refused connection; a certificate
    // every node refuses ends the attempt at once.
    let refusal = async move {
        match refused.wait_for(Option::is_some).await {
            Ok(failure) => failure.clone(),
            Err(_) => None,
        }
    };
    let attempt = async {
        tokio::select! {
            connection = opening => connection.map_err(|e| match brokers.failure(&e) {
                Some(failure) => QueueError::Tls(failure),
                None => backend("connect to RabbitMQ")(e),
            }),
            Some(failure) = refusal => Err(QueueError::Tls(failure)),
        }
    };
    let connection = tokio::time::timeout(CONNECT_PATIENCE, attempt)
        .await
        .map_err(|_| QueueError::ConnectTimeout {
            brokers: brokers.shown().to_string(),
            secs: CONNECT_PATIENCE.as_secs(),
        })??;
    tokio::spawn(watch_blocked(connection.events_listener(), blocked.clone()));
    Ok(connection)
}

/// Follows the broker blocking and unblocking a connection, saying so: a publish that waits
/// on a broker's resource alarm would otherwise wait without a word. Ends with the connection.
async fn watch_blocked(
    mut events: impl futures::Stream<Item = lapin::Event> + Unpin,
    blocked: Blocked,
) {
    while let Some(event) = events.next().await {
        let now = match event {
            lapin::Event::ConnectionBlocked(reason) => {
                warn!(reason = %reason, "RabbitMQ blocks publishing until its resource alarm clears (free disk or memory on the broker); publishes wait.");
                Some(reason)
            }
            lapin::Event::ConnectionUnblocked => {
                info!("RabbitMQ publishes again: its resource alarm cleared.");
                None
            }
            _ => continue,
        };
        *blocked.lock().unwrap_or_else(|p| p.into_inner()) = now;
    }
}
