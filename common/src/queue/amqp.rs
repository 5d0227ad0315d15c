//! The queue on RabbitMQ (a durable quorum queue per job of a worker pool, via lapin).
//!
//! # Topology
//!
//! For a pool `p`, [`AmqpQueue::connect`] declares (idempotently):
//! - `fleetrun.p.dlx`: a durable fanout exchange;
//! - `fleetrun.p.dead`: the dead-letter queue bound to it, a durable quorum queue, no limit,
//!   which nobody consumes: operators count, browse, replay and purge it;
//! - `fleetrun.p.dead.inbox`: the recorders' copy of every dead letter, bound to the same
//!   exchange, consumed by the workers ([`Queue::consume_dead`]);
//!
//! and the first publish or consume of a lane (a job) declares its queue:
//! - `fleetrun.p.job.<job>`: the job's mini-batches, a durable quorum queue with
//!   `x-delivery-limit` (when [`QueueOptions::delivery_limit`] is set) and dead-lettering
//!   `at-least-once` to the pool's exchange. [`Queue::close_lane`] deletes it when the job
//!   has ended.
//!
//! and each process following the job events ([`Events::follow`]: a worker, to share its
//! slots out as soon as a job starts or ends) declares:
//! - `fleetrun.p.events.<random>`: its own exclusive classic queue bound to `job.#` on the
//!   events exchange, deleted with its connection.
//!
//! Redeclaring a queue with other arguments (another delivery limit) fails with
//! `PRECONDITION_FAILED`; delete the pool's queues to change them.
//!
//! # Delivery semantics on RabbitMQ 3.10
//!
//! - [`Delivery::attempt`] is `x-delivery-count + 1`; the header is absent on a first delivery.
//!   Every return counts: a requeue, a closed channel, a lost connection, a consumer timeout.
//! - With `x-delivery-limit = L` a message is delivered at most `L + 1` times, then
//!   dead-lettered with reason `delivery_limit`; a [`Disposition::DeadLetter`] gives `rejected`.
//!   [`Delivery::dead_reason`] reads `x-first-death-reason` (or the first `x-death` entry).
//! - A dead letter's [`Delivery::attempt`] counts deliveries from the dead-letter queue only:
//!   RabbitMQ does not carry the mini-batch queue's `x-delivery-count` over.
//! - Each consumer has its own channel and one subscription, opened by the first
//!   [`Consumer::next`]; the broker pushes up to `prefetch` unsettled messages to it whether or
//!   not `next` is called. [`Consumer::pause`] cancels the subscription (`basic.cancel`) and
//!   gives back untried what was pushed and not handed out, so a paused consumer holds
//!   nothing; the next `next` subscribes again. A consumer dropped unpaused costs what it
//!   held one attempt. The channel closes once the consumer and its deliveries are gone.
//! - The connection recovers by itself (`enable_auto_recover`): consumers, QoS and confirm
//!   mode are replayed and unsettled messages come back with one more attempt, while the old
//!   deliveries' settlements return `Ok(false)`. A channel the broker closes (a consumer
//!   timeout) is not recovered by lapin: the consumer reports one error and reopens on the next
//!   call. A recovery that has not completed in 30 s is given up: the next channel comes
//!   from a new connection, and a consumer waiting on the old one reports one error (see
//!   `link`).
//! - [`Disposition::Return`] publishes a copy carrying the attempts spent
//!   (`x-fleetrun-attempts-spent`, added to the attempt) and acknowledges the delivery, since
//!   a requeue would count one more delivery.
//! - A publish the queue nacks (no leader for a moment, or over an operator's length limit:
//!   the queue's overflow is `reject-publish`) is published again with backoff; only a message
//!   the broker returns (no such queue) is refused at once.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use bytes::Bytes;
use futures::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use super::{
    Acker, Consumer, DeadLetter, DeadLetterHold, Delivery, Depth, Disposition, Queue, QueueError,
    QueueOptions,
};
use crate::events::{Events, JobEvent};
use crate::tls::Tls;

mod brokers;
mod follow;
mod link;

pub use crate::tls::TlsCause;
use brokers::Brokers;
pub use brokers::{TlsFailure, UrlError};
use link::{Link, Opened};

/// Every name the backend gives the broker, in one place.
mod names {
    pub const PREFIX: &str = "fleetrun";

    /// The queue of one job (a lane) of a pool.
    pub fn lane(pool: &str, lane: &str) -> String {
        format!("{PREFIX}.{pool}.job.{lane}")
    }

    /// The dead-letter exchange of a pool.
    pub fn dlx(pool: &str) -> String {
        format!("{PREFIX}.{pool}.dlx")
    }

    /// The dead-letter queue of a pool.
    pub fn dead(pool: &str) -> String {
        format!("{PREFIX}.{pool}.dead")
    }

    /// The recorders' inbox of a pool's dead letters.
    pub fn inbox(pool: &str) -> String {
        format!("{PREFIX}.{pool}.dead.inbox")
    }

    /// A process's own queue of every job event (see `follow`).
    pub fn follower(pool: &str, id: u64) -> String {
        format!("{PREFIX}.{pool}.events.{id:016x}")
    }

    /// The topic exchange of job events, shared by every pool.
    pub const EVENTS: &str = crate::events::EXCHANGE;

    /// Message headers the broker sets.
    pub const DELIVERY_COUNT: &str = "x-delivery-count";
    /// Attempts a message had before it was given back untried and published again.
    pub const ATTEMPTS_SPENT: &str = "x-fleetrun-attempts-spent";
    pub const FIRST_DEATH_REASON: &str = "x-first-death-reason";
    pub const DEATH: &str = "x-death";

    /// Queue arguments.
    pub const QUEUE_TYPE: &str = "x-queue-type";
    pub const DELIVERY_LIMIT: &str = "x-delivery-limit";
    pub const DEAD_LETTER_EXCHANGE: &str = "x-dead-letter-exchange";
    pub const DEAD_LETTER_STRATEGY: &str = "x-dead-letter-strategy";
    pub const OVERFLOW: &str = "x-overflow";
    pub const MAX_LENGTH: &str = "x-max-length";
}

/// AMQP 0-9-1 `delivery_mode` for messages written to disk.
const PERSISTENT: u8 = 2;
/// How long a management API request may take.
const MANAGEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Times an operation waits for a recovered connection before giving up.
const MAX_RECOVERIES: u32 = 3;

/// Retries of an operation against the broker: about 16 s in all, longer than lapin's own
/// reconnection usually takes.
fn retry_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(8)
        .with_jitter()
        .build()
}

/// Pauses between a consumer's attempts to reopen: growing to 10 s, never giving up (the
/// caller decides when to stop calling).
fn reopen_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(10))
        .without_max_times()
        .with_jitter()
        .build()
}

/// The mini-batch queue of one pool on RabbitMQ. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct AmqpQueue {
    shared: Arc<Shared>,
}

struct Shared {
    pool: String,
    options: QueueOptions,
    dead: String,
    inbox: String,
    /// The lanes this process has declared (or found declared), by queue name.
    lanes: Mutex<std::collections::HashSet<String>>,
    /// The connection, kept.
    link: Link,
    /// The publishing channel, in confirm mode.
    publisher: Slot,
    /// A channel for passive declares (depth).
    admin: Slot,
    management: Option<Management>,
    /// Numbers consumer tags.
    consumers: AtomicU64,
    /// Publishes the broker refused (nacked), each published again.
    refused: AtomicU64,
}

/// A long-lived channel, reopened when it dies.
struct Slot {
    confirms: bool,
    channel: Mutex<Option<Opened>>,
}

impl Slot {
    fn new(confirms: bool) -> Self {
        Slot {
            confirms,
            channel: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Opened>> {
        self.channel.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets `channel` (if still current) so the next use opens another.
    fn discard(&self, channel: &Channel) {
        let mut current = self.lock();
        if current
            .as_ref()
            .is_some_and(|c| c.channel.id() == channel.id())
        {
            *current = None;
        }
    }
}

impl AmqpQueue {
    /// Connects to the broker at `url` (`amqp://user:pass@host:port/vhost`, or the nodes of a
    /// cluster as a comma-separated list of such URLs, tried in turn), declares the pool's
    /// queues and opens the publishing channel.
    ///
    /// `management_url` (`http://user:pass@host:15672`) lets [`Queue::depth`] count unacked
    /// messages from the management API, whose figures lag by up to ~5 s; without it,
    /// `unacked` is always 0.
    ///
    /// `tls`: the CA to trust and the client certificate to show, for `amqps://` nodes and an
    /// `https://` management API (add `?auth_mechanism=external` to a URL to log in by the
    /// certificate alone).
    pub async fn connect(
        url: &str,
        pool: &str,
        options: QueueOptions,
        management_url: Option<&str>,
        tls: &Tls,
    ) -> Result<AmqpQueue, QueueError> {
        let brokers = Arc::new(Brokers::parse(url, tls)?);
        let management = management_url
            .map(|base| Management::new(base, brokers.vhost(), tls))
            .transpose()?;
        let connection_name = format!("fleetrun {pool} pid {}", std::process::id());
        let link = Link::connect(brokers, connection_name).await?;
        let shared = Shared {
            pool: pool.to_owned(),
            options,
            dead: names::dead(pool),
            inbox: names::inbox(pool),
            lanes: Mutex::default(),
            link,
            publisher: Slot::new(true),
            admin: Slot::new(false),
            management,
            consumers: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        };
        shared.declare().await?;
        shared
            .slot_channel(&shared.publisher)
            .await
            .map_err(backend("open the publisher"))?;
        Ok(AmqpQueue {
            shared: Arc::new(shared),
        })
    }

    /// The connection name the broker shows (management UI, `rabbitmqctl list_connections`).
    pub fn connection_name(&self) -> &str {
        self.shared.link.name()
    }

    /// How many publishes the broker has refused so far; each was published again.
    pub fn refused_publishes(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// The queue name of a lane (a job's mini-batches).
    pub fn lane_name(&self, lane: &str) -> String {
        names::lane(&self.shared.pool, lane)
    }

    /// Every lane of the pool the broker holds, from the management API (an error without
    /// it): for operators' tools and tests, which may not know the pool's jobs.
    pub async fn lanes(&self) -> Result<Vec<String>, QueueError> {
        let management = self
            .shared
            .management
            .as_ref()
            .ok_or_else(|| QueueError::NoManagement)?;
        let prefix = names::lane(&self.shared.pool, "");
        let names = management.queue_names().await?;
        Ok(names
            .iter()
            .filter_map(|name| name.strip_prefix(&prefix))
            .map(str::to_owned)
            .collect())
    }

    /// Why the broker blocks this connection's publishes (a memory or disk alarm on the
    /// broker), while it does: a publish waits until the alarm clears.
    pub fn blocked(&self) -> Option<String> {
        self.shared.link.blocked()
    }

    /// The dead-letter queue's name.
    pub fn dead_queue_name(&self) -> &str {
        &self.shared.dead
    }

    /// The recorders' inbox's name.
    pub fn inbox_queue_name(&self) -> &str {
        &self.shared.inbox
    }

    /// Deletes the pool's dead-letter queue and exchange and its lanes (every one the broker
    /// holds, with the management API; else those this handle knows), with whatever they
    /// hold: for retiring a pool (and for tests, which each use a pool of their own).
    pub async fn delete(&self) -> Result<(), QueueError> {
        let channel = self
            .shared
            .open_channel()
            .await
            .map_err(backend("open a channel"))?;
        let mut queues: BTreeSet<String> = self.shared.known_lanes().into_iter().collect();
        if self.shared.management.is_some() {
            queues.extend(self.lanes().await?.iter().map(|lane| self.lane_name(lane)));
        }
        queues.extend([self.shared.dead.clone(), self.shared.inbox.clone()]);
        for queue in &queues {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(backend("delete a queue"))?;
        }
        channel
            .exchange_delete(
                names::dlx(&self.shared.pool).as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await
            .map_err(backend("delete the dead-letter exchange"))?;
        Ok(())
    }

    async fn consumer(
        &self,
        queue: String,
        prefetch: u16,
        dead_letters: bool,
    ) -> Result<Box<dyn Consumer>, QueueError> {
        let channel = self
            .shared
            .retrying_on("open a consumer channel", None, |opened| async move {
                consumer_qos(&opened.channel, prefetch).await?;
                Ok(opened)
            })
            .await?;
        Ok(Box::new(AmqpConsumer {
            shared: self.shared.clone(),
            queue,
            dead_letters,
            prefetch,
            permits: Arc::new(Semaphore::new(usize::from(prefetch.max(1)))),
            channel: Some(channel),
            subscription: None,
            opening: None,
            received: None,
            reopen: None,
        }))
    }
}

/// How often a waiting consumer looks at its connection's health (see [`Link::alive`]).
pub(super) const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// How long a pausing consumer waits for the end of its cancelled subscription (the broker's
/// cancel-ok has already arrived behind the last message; this bounds a broken connection).
const GIVE_BACK_PATIENCE: Duration = Duration::from_secs(5);

/// The broker pushes at most `prefetch` unsettled messages to a consumer.
async fn consumer_qos(channel: &Channel, prefetch: u16) -> lapin::Result<()> {
    // Per consumer: quorum queues refuse a global QoS.
    channel
        .basic_qos(prefetch.max(1), BasicQosOptions { global: false })
        .await
}

fn backend(what: &'static str) -> impl Fn(lapin::Error) -> QueueError {
    move |source| QueueError::Amqp {
        what: what.to_owned(),
        source: Box::new(source),
    }
}

/// Whether a try of the same call may pass later: anything but the broker refusing the
/// request itself (a channel-level error, such as a queue declared with other arguments).
/// [`Shared::retrying`] retries by this, and [`QueueError::is_transient`] answers it.
pub(super) fn is_transient(e: &lapin::Error) -> bool {
    !e.is_amqp_soft_error()
}

impl Shared {
    /// Publishes with a confirm. A nack without a returned message means the queue could not
    /// take it just then (a quorum queue without a leader for a moment, or one over a length
    /// limit an operator set): the publish is retried with backoff, as transient as a lost
    /// connection. A nacked message may still have been enqueued; a second copy of a
    /// mini-batch costs a run, never an output row, because the ledger counts the first.
    /// `spent`: attempts the message had before (set on a copy of one given back untried).
    async fn publish(&self, queue: &str, body: &[u8], spent: u32) -> Result<(), QueueError> {
        let shared = self;
        let mut delays = retry_backoff();
        loop {
            let confirmation = shared
                .retrying("publish", Some(&shared.publisher), |channel| async move {
                    let options = BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    };
                    let mut properties = BasicProperties::default().with_delivery_mode(PERSISTENT);
                    if spent > 0 {
                        let mut headers = FieldTable::default();
                        headers.insert(names::ATTEMPTS_SPENT.into(), AMQPValue::LongUInt(spent));
                        properties = properties.with_headers(headers);
                    }
                    channel
                        .basic_publish("".into(), queue.into(), options, body, properties)
                        .await?
                        .await
                })
                .await?;
            match confirmation {
                Confirmation::Ack(None) => return Ok(()),
                Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                    return Err(QueueError::Returned(format!(
                        "returned by the broker: {} {}",
                        returned.reply_code, returned.reply_text
                    )));
                }
                Confirmation::Nack(None) => {
                    shared.refused.fetch_add(1, Ordering::Relaxed);
                    let Some(delay) = delays.next() else {
                        return Err(QueueError::Refused(format!(
                            "{queue} kept refusing the message (full, or no quorum)"
                        )));
                    };
                    warn!(pool = %shared.pool, ?delay, "RabbitMQ refused a message; publishing it again.");
                    tokio::time::sleep(delay).await;
                }
                Confirmation::NotRequested => {
                    return Err(QueueError::ConfirmsOff);
                }
            }
        }
    }

    /// Publishes a job event on the events exchange, with a confirm. No queue bound to its
    /// key is no error: nobody listens.
    async fn announce(&self, event: &JobEvent) -> Result<(), QueueError> {
        let (key, body) = (event.routing_key(), event.to_json());
        let confirmation = self
            .retrying("publish an event", Some(&self.publisher), |channel| {
                let (key, body) = (&key, &body);
                async move {
                    let properties = BasicProperties::default()
                        .with_delivery_mode(PERSISTENT)
                        .with_content_type("application/json".into());
                    channel
                        .basic_publish(
                            names::EVENTS.into(),
                            key.as_str().into(),
                            BasicPublishOptions::default(),
                            body,
                            properties,
                        )
                        .await?
                        .await
                }
            })
            .await?;
        match confirmation {
            Confirmation::Nack(_) => Err(QueueError::Refused(format!(
                "{} refused the event {key}",
                names::EVENTS
            ))),
            _ => Ok(()),
        }
    }

    /// Declares the pool's exchange and queues; idempotent.
    async fn declare(&self) -> Result<(), QueueError> {
        let channel = self
            .open_channel()
            .await
            .map_err(backend("open a channel"))?;
        let dlx = names::dlx(&self.pool);
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                dlx.as_str().into(),
                lapin::ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(backend("declare the dead-letter exchange"))?;

        channel
            .exchange_declare(
                names::EVENTS.into(),
                lapin::ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(backend("declare the events exchange"))?;

        let mut quorum = FieldTable::default();
        quorum.insert(names::QUEUE_TYPE.into(), long_string("quorum"));
        for queue in [&self.dead, &self.inbox] {
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions::durable(),
                    quorum.clone(),
                )
                .await
                .map_err(backend("declare a dead-letter queue"))?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    dlx.as_str().into(),
                    "".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(backend("bind a dead-letter queue"))?;
        }

        Ok(())
    }

    /// The arguments of a lane's queue: the pool's delivery limit and dead-lettering.
    fn lane_arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        arguments.insert(names::QUEUE_TYPE.into(), long_string("quorum"));
        if let Some(limit) = self.options.delivery_limit {
            let limit = i32::try_from(limit).unwrap_or(i32::MAX);
            arguments.insert(names::DELIVERY_LIMIT.into(), AMQPValue::LongInt(limit));
        }
        arguments.insert(
            names::DEAD_LETTER_EXCHANGE.into(),
            long_string(&names::dlx(&self.pool)),
        );
        arguments.insert(
            names::DEAD_LETTER_STRATEGY.into(),
            long_string("at-least-once"),
        );
        arguments.insert(names::OVERFLOW.into(), long_string("reject-publish"));
        arguments
    }

    /// The lane's queue, declared once per process (idempotent on the broker).
    async fn lane(&self, lane: &str) -> Result<String, QueueError> {
        let queue = names::lane(&self.pool, lane);
        if self.lock_lanes().contains(&queue) {
            return Ok(queue);
        }
        let arguments = self.lane_arguments();
        self.retrying("declare a job's queue", Some(&self.admin), |channel| {
            let (queue, arguments) = (&queue, arguments.clone());
            async move {
                channel
                    .queue_declare(
                        queue.as_str().into(),
                        QueueDeclareOptions::durable(),
                        arguments,
                    )
                    .await
            }
        })
        .await?;
        self.lock_lanes().insert(queue.clone());
        Ok(queue)
    }

    fn lock_lanes(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn known_lanes(&self) -> Vec<String> {
        self.lock_lanes().iter().cloned().collect()
    }

    /// Opens a channel (see [`Link::open`]).
    async fn open_channel(&self) -> lapin::Result<Channel> {
        self.link.open().await.map(|opened| opened.channel)
    }

    /// The slot's channel, opened (and put in confirm mode) when missing, dead, or on a
    /// connection given up.
    async fn slot_channel(&self, slot: &Slot) -> lapin::Result<Opened> {
        if let Some(opened) = slot.lock().clone()
            && self.link.alive(&opened)
        {
            return Ok(opened);
        }
        let opened = self.link.open().await?;
        if slot.confirms {
            opened
                .channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
        }
        *slot.lock() = Some(opened.clone());
        Ok(opened)
    }

    /// Runs `op` on the slot's channel (or a fresh one), waiting out a connection recovery
    /// and retrying with backoff. A channel-level error (the broker refused the request) is
    /// not retried.
    async fn retrying<T, F, Fut>(
        &self,
        what: &'static str,
        slot: Option<&Slot>,
        mut op: F,
    ) -> Result<T, QueueError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = lapin::Result<T>>,
    {
        self.retrying_on(what, slot, |opened| op(opened.channel))
            .await
    }

    /// [`Shared::retrying`], for an `op` that keeps the channel and which connection it is
    /// on.
    async fn retrying_on<T, F, Fut>(
        &self,
        what: &'static str,
        slot: Option<&Slot>,
        mut op: F,
    ) -> Result<T, QueueError>
    where
        F: FnMut(Opened) -> Fut,
        Fut: Future<Output = lapin::Result<T>>,
    {
        let mut delays = retry_backoff();
        let mut recoveries = 0;
        loop {
            let opened = match slot {
                Some(slot) => self.slot_channel(slot).await,
                None => self.link.open().await,
            };
            let error = match opened {
                Ok(opened) => match op(opened.clone()).await {
                    Ok(value) => return Ok(value),
                    Err(error) if !is_transient(&error) => {
                        if let Some(slot) = slot {
                            slot.discard(&opened.channel);
                        }
                        return Err(backend(what)(error));
                    }
                    Err(error) => match self.link.recovered(&opened.channel, error).await {
                        Ok(()) if recoveries < MAX_RECOVERIES => {
                            recoveries += 1;
                            debug!(pool = %self.pool, what, "Connection recovered; retrying.");
                            continue;
                        }
                        Ok(()) => lapin::Error::from(std::io::Error::other("recovered again")),
                        Err(error) => {
                            if let Some(slot) = slot {
                                slot.discard(&opened.channel);
                            }
                            error
                        }
                    },
                },
                Err(error) => error,
            };
            let Some(delay) = delays.next() else {
                return Err(backend(what)(error));
            };
            warn!(pool = %self.pool, what, error = %error, ?delay, "RabbitMQ operation failed; retrying.");
            tokio::time::sleep(delay).await;
        }
    }

    /// Messages ready in `queue`, exactly, from a passive declare; `None` when the queue
    /// does not exist.
    async fn ready(&self, queue: &str) -> Result<Option<u64>, QueueError> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = self
            .retrying("count messages", Some(&self.admin), |channel| async move {
                match channel
                    .queue_declare(queue.into(), passive, FieldTable::default())
                    .await
                {
                    Ok(declared) => Ok(Some(declared)),
                    // NOT_FOUND closes the channel: the next use opens another.
                    Err(e) if not_found(&e) => {
                        self.admin.discard(&channel);
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        Ok(declared.map(|d| u64::from(d.message_count())))
    }
}

/// The broker's 404: no such queue.
fn not_found(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(e)
            if matches!(e.kind(), lapin::protocol::AMQPErrorKind::Soft(lapin::protocol::AMQPSoftError::NOTFOUND))
    )
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(s.into())
}

#[async_trait]
impl Events for AmqpQueue {
    async fn publish(&self, event: &JobEvent) -> Result<(), QueueError> {
        self.shared.announce(event).await
    }

    async fn follow(&self) -> Result<tokio::sync::broadcast::Receiver<JobEvent>, QueueError> {
        follow::follow(self.shared.clone()).await
    }
}

#[async_trait]
impl Queue for AmqpQueue {
    async fn open_lane(&self, lane: &str) -> Result<(), QueueError> {
        self.shared.lane(lane).await.map(drop)
    }

    async fn publish(&self, lane: &str, body: Vec<u8>) -> Result<(), QueueError> {
        let queue = self.shared.lane(lane).await?;
        match self.shared.publish(&queue, &body, 0).await {
            // Deleted since this process declared it (its job ended, and was resumed):
            // declare it again, once.
            Err(QueueError::Returned(_)) => {
                self.shared.lock_lanes().remove(&queue);
                let queue = self.shared.lane(lane).await?;
                self.shared.publish(&queue, &body, 0).await
            }
            published => published,
        }
    }

    async fn consume(&self, lane: &str, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        let queue = self.shared.lane(lane).await?;
        self.consumer(queue, prefetch, false).await
    }

    async fn consume_dead(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        self.consumer(self.shared.inbox.clone(), prefetch, true)
            .await
    }

    async fn ready(&self, lane: &str) -> Result<u64, QueueError> {
        let queue = names::lane(&self.shared.pool, lane);
        Ok(self.shared.ready(&queue).await?.unwrap_or(0))
    }

    async fn depth(&self, lanes: &[String]) -> Result<Depth, QueueError> {
        let shared = &self.shared;
        let (mut ready, mut unacked) = (0, shared.management.as_ref().map(|_| 0));
        for lane in lanes {
            let queue = names::lane(&shared.pool, lane);
            let Some(waiting) = shared.ready(&queue).await? else {
                continue;
            };
            ready += waiting;
            if let (Some(management), Some(sum)) = (&shared.management, unacked.as_mut()) {
                *sum += management.unacked(&queue).await?;
            }
        }
        let dead_held = match &shared.management {
            Some(management) => management.unacked(&shared.dead).await?,
            None => 0,
        };
        let dead = shared.ready(&shared.dead).await?.unwrap_or(0) + dead_held;
        Ok(Depth {
            ready,
            unacked,
            dead,
        })
    }

    async fn close_lane(&self, lane: &str) -> Result<(), QueueError> {
        let queue = names::lane(&self.shared.pool, lane);
        self.shared
            .retrying(
                "delete a job's queue",
                Some(&self.shared.admin),
                |channel| {
                    let queue = &queue;
                    async move {
                        channel
                            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                            .await
                    }
                },
            )
            .await?;
        self.shared.lock_lanes().remove(&queue);
        Ok(())
    }

    async fn hold_dead(&self, limit: usize) -> Result<Box<dyn DeadLetterHold>, QueueError> {
        let shared = &self.shared;
        let channel = shared
            .open_channel()
            .await
            .map_err(backend("open a channel"))?;
        let mut held = Vec::new();
        let mut letters = Vec::new();
        while held.len() < limit {
            let got = channel
                .basic_get(
                    shared.dead.as_str().into(),
                    BasicGetOptions { no_ack: false },
                )
                .await
                .map_err(backend("take a dead letter"))?;
            let Some(got) = got else { break };
            letters.push(shared.dead_letter(&got.delivery));
            held.push(got.delivery.acker);
        }
        Ok(Box::new(AmqpDeadHold {
            channel,
            removed: vec![false; held.len()],
            held,
            letters,
        }))
    }
}

impl Shared {
    /// What a message of the dead-letter queue says of itself.
    fn dead_letter(&self, delivery: &AmqpDelivery) -> DeadLetter {
        let headers = delivery.properties.headers().as_ref();
        let reason = headers.and_then(dead_reason);
        // Dead-lettered at the limit: delivered once more than it allows. (The broker
        // carries no delivery count over to the dead-letter queue.)
        let deliveries = match (reason.as_deref(), self.options.delivery_limit) {
            (Some("delivery_limit"), Some(limit)) => Some(limit.saturating_add(1)),
            _ => None,
        };
        DeadLetter {
            body: Bytes::from(delivery.data.clone()),
            reason,
            deliveries,
            dead_at: headers.and_then(death_time),
        }
    }
}

/// Dead letters taken with `basic.get` on a channel of their own: each removed is acked; the
/// rest go back as a whole, in order, when the hold is released (or the channel closes).
struct AmqpDeadHold {
    channel: Channel,
    held: Vec<lapin::Acker>,
    letters: Vec<DeadLetter>,
    removed: Vec<bool>,
}

#[async_trait]
impl DeadLetterHold for AmqpDeadHold {
    fn letters(&self) -> &[DeadLetter] {
        &self.letters
    }

    async fn remove(&mut self, i: usize) -> Result<(), QueueError> {
        let Some(acker) = self.held.get(i) else {
            return Ok(());
        };
        acker
            .ack(BasicAckOptions { multiple: false })
            .await
            .map_err(backend("remove a dead letter"))?;
        self.removed[i] = true;
        Ok(())
    }

    async fn release(self: Box<Self>) -> Result<(), QueueError> {
        let requeue = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        for (acker, removed) in self.held.iter().zip(&self.removed) {
            if !removed {
                acker
                    .nack(requeue)
                    .await
                    .map_err(backend("put a dead letter back"))?;
            }
        }
        self.channel
            .close(200, "done".into())
            .await
            .map_err(backend("close a channel"))
    }
}

/// The management HTTP API, for the counts AMQP does not give.
struct Management {
    client: reqwest::Client,
    /// `http://user:pass@host:port/api/queues/<vhost>/`; reqwest sends the user info as basic
    /// auth and keeps it out of its errors.
    queues: String,
}

#[derive(serde::Deserialize)]
struct QueueStats {
    /// Absent until the broker first emits the queue's statistics.
    #[serde(default)]
    messages_unacknowledged: u64,
}

impl Management {
    fn new(base: &str, vhost: &str, tls: &Tls) -> Result<Self, QueueError> {
        let failed = |source| QueueError::Management {
            what: "management API client".to_owned(),
            source,
        };
        let mut client = reqwest::Client::builder().timeout(MANAGEMENT_TIMEOUT);
        if let Some(ca) = tls.ca_pem() {
            client =
                client.add_root_certificate(reqwest::Certificate::from_pem(ca).map_err(failed)?);
        }
        if let Some(identity) = tls.identity() {
            let pem = [identity.cert_pem.as_slice(), identity.key_pem.as_slice()].join(&b'\n');
            client = client.identity(reqwest::Identity::from_pem(&pem).map_err(failed)?);
        }
        let client = client.build().map_err(failed)?;
        let queues = format!(
            "{}/api/queues/{}/",
            base.trim_end_matches('/'),
            percent_encode(vhost)
        );
        Ok(Management { client, queues })
    }

    /// The names of the vhost's queues.
    async fn queue_names(&self) -> Result<Vec<String>, QueueError> {
        #[derive(serde::Deserialize)]
        struct Named {
            name: String,
        }
        let failed = |source| QueueError::Management {
            what: "management API, queues".to_owned(),
            source,
        };
        let queues: Vec<Named> = self
            .client
            .get(format!(
                "{}?columns=name",
                self.queues.trim_end_matches('/')
            ))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?
            .json()
            .await
            .map_err(failed)?;
        Ok(queues.into_iter().map(|q| q.name).collect())
    }

    async fn unacked(&self, queue: &str) -> Result<u64, QueueError> {
        let url = format!("{}{}", self.queues, percent_encode(queue));
        let failed = |source| QueueError::Management {
            what: format!("management API, queue {queue}"),
            source,
        };
        let response = self.client.get(url).send().await.map_err(failed)?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            // Deleted since it was counted (a lane whose job was retired): it holds nothing.
            return Ok(0);
        }
        let stats: QueueStats = response
            .error_for_status()
            .map_err(failed)?
            .json()
            .await
            .map_err(failed)?;
        Ok(stats.messages_unacknowledged)
    }
}

/// Encodes a path segment (a vhost `/` is `%2F`).
fn percent_encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A consumer on its own channel; reopens after the channel dies.
///
/// One long-lived subscription (`basic.consume`) on its own channel, with the broker's
/// prefetch set to the consumer's: the broker pushes up to `prefetch` unsettled messages,
/// and the same bound holds here with a semaphore (each delivery holds a permit until it is
/// settled). A message pushed but not yet taken by `next` is still unacknowledged: if the
/// consumer goes away it returns to the queue and costs an attempt, as with any broker.
struct AmqpConsumer {
    shared: Arc<Shared>,
    queue: String,
    dead_letters: bool,
    prefetch: u16,
    /// One per unsettled delivery allowed; held by each delivery's acker.
    permits: Arc<Semaphore>,
    /// `None` after a failure, until the next call reopens it.
    channel: Option<Opened>,
    /// The subscription a waiting (or abandoned) `next` opened.
    subscription: Option<lapin::Consumer>,
    /// A subscription being opened (see `subscribe`).
    opening: Option<tokio::task::JoinHandle<lapin::Result<lapin::Consumer>>>,
    /// A message received but not yet handed out.
    received: Option<AmqpDelivery>,
    /// Pauses between failed reopenings; reset by a delivery.
    reopen: Option<ExponentialBackoff>,
}

impl AmqpConsumer {
    /// The consumer's channel, reopened (after a pause, when the last try failed) if it died.
    async fn channel(&mut self) -> Result<Channel, QueueError> {
        if let Some(opened) = &self.channel {
            if self.shared.link.alive(opened) {
                return Ok(opened.channel.clone());
            }
            // Closed by the broker (a consumer timeout) or with its connection, or on a
            // connection given up.
            self.failed();
        }
        if let Some(delay) = self.reopen.as_mut().and_then(Iterator::next) {
            tokio::time::sleep(delay).await;
        }
        let opened = match self.shared.link.open().await {
            Ok(opened) => consumer_qos(&opened.channel, self.prefetch)
                .await
                .map(|()| opened),
            Err(e) => Err(e),
        };
        match opened {
            Ok(opened) => {
                debug!(queue = %self.queue, "Consumer channel reopened.");
                let channel = opened.channel.clone();
                self.channel = Some(opened);
                Ok(channel)
            }
            Err(e) => {
                self.failed();
                Err(QueueError::Amqp {
                    what: format!("reopen a channel to consume from {}", self.queue),
                    source: Box::new(e),
                })
            }
        }
    }

    /// Forgets the channel (and its subscription); the next call reopens it, after a pause.
    fn failed(&mut self) {
        self.channel = None;
        self.subscription = None;
        // A subscription still opening on the old channel is dropped once it opens, which
        // cancels it.
        self.opening = None;
        self.reopen.get_or_insert_with(reopen_backoff);
    }

    /// Opens the subscription. The `basic.consume` runs in a task of its own, kept across
    /// calls: a `next` dropped while it waits (its caller chose another branch of a
    /// `select!`) leaves no subscription that nobody reads, as the next call takes up the
    /// same task's result.
    async fn subscribe(&mut self, channel: &Channel) -> Result<(), QueueError> {
        let opening = match &mut self.opening {
            Some(opening) => opening,
            None => {
                let n = self.shared.consumers.fetch_add(1, Ordering::Relaxed);
                let tag = format!("{} #{n}", self.shared.link.name());
                let (channel, queue) = (channel.clone(), self.queue.clone());
                let shared = self.shared.clone();
                self.opening.insert(tokio::spawn(async move {
                    let options = BasicConsumeOptions {
                        no_ack: false,
                        ..Default::default()
                    };
                    let subscribe = || {
                        channel.basic_consume(
                            queue.as_str().into(),
                            tag.as_str().into(),
                            options,
                            FieldTable::default(),
                        )
                    };
                    match subscribe().await {
                        // The connection is being recovered: wait for it, then try once more.
                        Err(e) => match shared.link.recovered(&channel, e).await {
                            Ok(()) => subscribe().await,
                            Err(e) => Err(e),
                        },
                        subscribed => subscribed,
                    }
                }))
            }
        };
        let subscribed = opening.await;
        self.opening = None;
        let subscribed = match subscribed {
            Ok(subscribed) => subscribed,
            Err(e) => {
                self.failed();
                return Err(QueueError::Task {
                    what: format!("consume from {}", self.queue),
                    source: e,
                });
            }
        };
        match subscribed {
            Ok(subscription) => {
                self.subscription = Some(subscription);
                Ok(())
            }
            Err(e) => {
                self.failed();
                Err(QueueError::Amqp {
                    what: format!("consume from {}", self.queue),
                    source: Box::new(e),
                })
            }
        }
    }

    fn delivery(
        &self,
        channel: Channel,
        delivery: AmqpDelivery,
        permit: OwnedSemaphorePermit,
    ) -> Delivery {
        let attempt = attempt(&delivery);
        let headers = delivery.properties.headers().as_ref();
        let dead_reason = if self.dead_letters {
            headers.and_then(dead_reason)
        } else {
            None
        };
        let body = Bytes::from(delivery.data);
        let acker = AmqpAcker {
            acker: delivery.acker,
            shared: self.shared.clone(),
            queue: self.queue.as_str().into(),
            body: body.clone(),
            attempt,
            dead_letter: self.dead_letters,
            settled: false,
            _channel: channel,
            _permit: permit,
        };
        Delivery::new(body, attempt, dead_reason, Box::new(acker))
    }
}

/// The delivery's attempt: its `x-delivery-count` plus one, plus the attempts it carries.
fn attempt(delivery: &AmqpDelivery) -> u32 {
    let headers = delivery.properties.headers().as_ref();
    let count = |name| headers.and_then(|h| h.inner().get(name)).and_then(as_count);
    count(names::DELIVERY_COUNT)
        .unwrap_or(0)
        .saturating_add(1)
        .saturating_add(count(names::ATTEMPTS_SPENT).unwrap_or(0))
}

/// Gives a message back untried: a copy carrying the attempts spent is published, then the
/// delivery is acknowledged, since a requeue would count one more delivery. Should the ack be
/// lost, the broker returns the original too; the ledger counts whichever copy finishes
/// first. A dead letter (which counts toward no limit) is simply put back.
async fn give_back(
    shared: &Shared,
    queue: &str,
    acker: &lapin::Acker,
    body: &[u8],
    attempt: u32,
    dead_letter: bool,
) -> lapin::Result<bool> {
    let requeue = BasicNackOptions {
        requeue: true,
        multiple: false,
    };
    if dead_letter {
        return acker.nack(requeue).await;
    }
    match shared.publish(queue, body, attempt - 1).await {
        Ok(()) => acker.ack(BasicAckOptions { multiple: false }).await,
        Err(e) => {
            warn!(error = %e, "Cannot give a message back untried; requeueing it.");
            acker.nack(requeue).await
        }
    }
}

/// `x-delivery-count`; RabbitMQ 3.10 sends a long-long int, other integer kinds are accepted.
fn as_count(value: &AMQPValue) -> Option<u32> {
    let count = match value {
        AMQPValue::ShortShortInt(n) => i64::from(*n),
        AMQPValue::ShortShortUInt(n) => i64::from(*n),
        AMQPValue::ShortInt(n) => i64::from(*n),
        AMQPValue::ShortUInt(n) => i64::from(*n),
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    };
    Some(u32::try_from(count.max(0)).unwrap_or(u32::MAX))
}

/// Why a message was dead-lettered: `x-first-death-reason`, else the first `x-death` entry.
fn dead_reason(headers: &FieldTable) -> Option<String> {
    let headers = headers.inner();
    if let Some(reason) = headers.get(names::FIRST_DEATH_REASON).and_then(as_text) {
        return Some(reason);
    }
    let AMQPValue::FieldArray(deaths) = headers.get(names::DEATH)? else {
        return None;
    };
    deaths.as_slice().iter().find_map(|death| match death {
        AMQPValue::FieldTable(death) => death.inner().get("reason").and_then(as_text),
        _ => None,
    })
}

/// When the message was first dead-lettered: the first `x-death` entry's `time`.
fn death_time(headers: &FieldTable) -> Option<f64> {
    let AMQPValue::FieldArray(deaths) = headers.inner().get(names::DEATH)? else {
        return None;
    };
    deaths.as_slice().iter().find_map(|death| match death {
        AMQPValue::FieldTable(death) => match death.inner().get("time") {
            Some(AMQPValue::Timestamp(seconds)) => Some(*seconds as f64),
            _ => None,
        },
        _ => None,
    })
}

fn as_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

#[async_trait]
impl Consumer for AmqpConsumer {
    async fn next(&mut self) -> Result<Delivery, QueueError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| QueueError::Closed)?;
        loop {
            if let Some(delivery) = self.received.take() {
                // Its channel died since it arrived: the broker has taken it back.
                let Some(channel) = self
                    .channel
                    .as_ref()
                    .filter(|_| delivery.acker.usable())
                    .map(|opened| opened.channel.clone())
                else {
                    continue;
                };
                return Ok(self.delivery(channel, delivery, permit));
            }
            let channel = self.channel().await?;
            if self.subscription.is_none() {
                self.subscribe(&channel).await?;
            }
            let Some(subscription) = &mut self.subscription else {
                continue;
            };
            // lapin's subscription waits for good on a connection whose recovery never
            // completes: its health is looked at meanwhile.
            let next = loop {
                tokio::select! {
                    next = subscription.next() => break next,
                    _ = tokio::time::sleep(HEALTH_CHECK) => {
                        if !self.channel.as_ref().is_some_and(|o| self.shared.link.alive(o)) {
                            break Some(Err(lapin::Error::from(std::io::Error::other(
                                "the connection did not recover in time",
                            ))));
                        }
                    }
                }
            };
            let error = match next {
                Some(Ok(delivery)) => {
                    self.reopen = None;
                    self.received = Some(delivery);
                    continue;
                }
                Some(Err(e)) => QueueError::Amqp {
                    what: format!("consume from {}", self.queue),
                    source: Box::new(e),
                },
                None => QueueError::Cancelled {
                    queue: self.queue.clone(),
                },
            };
            warn!(queue = %self.queue, error = %error, "Consumer lost its channel; it reopens on the next call.");
            self.failed();
            return Err(error);
        }
    }

    async fn pause(&mut self) -> Result<(), QueueError> {
        if self.opening.is_some()
            && let Some(channel) = self.channel.as_ref().map(|o| o.channel.clone())
        {
            // A subscription an abandoned `next` was opening: take it up, to cancel it.
            self.subscribe(&channel).await?;
        }
        let Some(mut subscription) = self.subscription.take() else {
            return Ok(());
        };
        let mut pushed: Vec<AmqpDelivery> = self.received.take().into_iter().collect();
        let Some(channel) = self.channel.as_ref().map(|o| o.channel.clone()) else {
            return Ok(());
        };
        let tag = subscription.tag();
        let cancel = || channel.basic_cancel(tag.clone(), BasicCancelOptions::default());
        let cancelled = match cancel().await {
            // The connection is being recovered, and the subscription with it: cancel it
            // once it is back, or it would go on receiving on a channel nobody reads.
            Err(e) => match self.shared.link.recovered(&channel, e).await {
                Ok(()) => cancel().await,
                Err(e) => Err(e),
            },
            cancelled => cancelled,
        };
        if let Err(e) = cancelled {
            // The channel is gone: what it holds returns to the queue as it closes.
            self.failed();
            return Err(QueueError::Amqp {
                what: format!("stop consuming from {}", self.queue),
                source: Box::new(e),
            });
        }
        // The broker's cancel-ok follows every message it pushed, and the subscription ends
        // behind them: what it yields now is all this consumer holds.
        while let Ok(Some(Ok(delivery))) =
            tokio::time::timeout(GIVE_BACK_PATIENCE, subscription.next()).await
        {
            pushed.push(delivery);
        }
        let given = pushed.len();
        let mut failure = None;
        for delivery in pushed.into_iter().filter(|d| d.acker.usable()) {
            let attempt = attempt(&delivery);
            let back = give_back(
                &self.shared,
                &self.queue,
                &delivery.acker,
                &delivery.data,
                attempt,
                self.dead_letters,
            )
            .await;
            if let Err(e) = back {
                // The channel failed: the rest return to the queue as it closes.
                failure.get_or_insert(e);
            }
        }
        if let Some(e) = failure {
            self.failed();
            return Err(backend("give back a message untried")(e));
        }
        if given > 0 {
            debug!(queue = %self.queue, messages = given, "Consumer paused; what it held went back untried.");
        }
        Ok(())
    }
}

/// Settles one delivery on its consumer's channel, which it keeps open until then.
struct AmqpAcker {
    acker: lapin::Acker,
    /// To give the message back untried: published again to its queue, carrying its
    /// attempts.
    shared: Arc<Shared>,
    queue: Arc<str>,
    body: Bytes,
    attempt: u32,
    /// A delivery from the dead-letter queue: only an ack removes it, anything else puts it
    /// back (the dead-letter queue has nowhere further to send it).
    dead_letter: bool,
    settled: bool,
    /// Keeps the channel open until this delivery is settled or dropped.
    _channel: Channel,
    _permit: OwnedSemaphorePermit,
}

#[async_trait]
impl Acker for AmqpAcker {
    async fn settle(&mut self, disposition: Disposition) -> Result<bool, QueueError> {
        self.settled = true;
        let acker = &self.acker;
        let requeue = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        let sent = match (disposition, self.dead_letter) {
            (Disposition::Ack, _) => acker.ack(BasicAckOptions { multiple: false }).await,
            (Disposition::Return, dead_letter) => {
                give_back(
                    &self.shared,
                    &self.queue,
                    acker,
                    &self.body,
                    self.attempt,
                    dead_letter,
                )
                .await
            }
            // The dead-letter queue counts toward no limit: anything but an ack puts it back.
            (Disposition::Requeue, _) | (Disposition::DeadLetter, true) => {
                acker.nack(requeue).await
            }
            (Disposition::DeadLetter, false) => {
                acker.reject(BasicRejectOptions { requeue: false }).await
            }
        };
        sent.map_err(backend("settle a delivery"))
    }
}

impl Drop for AmqpAcker {
    fn drop(&mut self) {
        // Dropped unsettled: it stays with its channel, which closes once the consumer and
        // its other deliveries are gone, and the broker then returns it at the cost of one
        // attempt, exactly as for a consumer that died. (Requeueing it here instead would
        // let the broker push it straight back to the still-open subscription, and the
        // channel's closing would cost it a second attempt.)
        if !self.settled && self.acker.usable() {
            debug!("A delivery was dropped unsettled; it returns when its channel closes.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broker that takes the TCP connection and never answers the handshake (RabbitMQ out
    /// of file handles does so) fails the connect with a reason, instead of holding it.
    #[test]
    fn a_broker_that_never_answers_the_handshake_fails_the_connect() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("amqp://guest:secret@{}/%2f", listener.local_addr().unwrap());
        let (sent, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            let result = runtime.block_on(AmqpQueue::connect(
                &url,
                "pool",
                QueueOptions::default(),
                None,
                &Tls::default(),
            ));
            let _ = sent.send(result.err().map(|e| e.to_string()));
        });
        let error = outcome
            .recv_timeout(Duration::from_secs(60))
            .expect("connect returned")
            .expect("connect failed");
        assert!(
            error.contains("did not complete a connection within 60s"),
            "{error}"
        );
        assert!(!error.contains("secret"), "{error}");
        drop(listener);
    }
}
