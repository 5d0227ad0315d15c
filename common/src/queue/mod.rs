//! The mini-batch queue: at-least-once delivery with a delivery count.
//!
//! A pool's mini-batches travel in lanes, one per job (the lane is the job's id), so that the
//! pool's nodes can share their slots among its jobs instead of serving them first in, first
//! out. The dead-letter queue is the pool's, one for all its lanes.
//!
//! Semantics every implementation keeps (and [`crate::testing::queue`] checks), per lane:
//! - a message is delivered to one consumer at a time; a consumer holds at most `prefetch`
//!   unsettled deliveries, and none it has not handed out once it is paused;
//! - [`Delivery::attempt`] is 1 on the first delivery and grows by one on every return,
//!   including a delivery dropped unsettled (a consumer that died);
//! - with a delivery limit `L`, a message is delivered at most `L + 1` times; the next return
//!   dead-letters it (reason `delivery_limit`), as RabbitMQ's quorum queues do;
//! - [`Disposition::DeadLetter`] moves a message to the dead-letter queue at once (reason
//!   `rejected`);
//! - every dead letter goes to two places: the recorders' inbox, which the workers consume
//!   ([`Queue::consume_dead`]) to count a dead-lettered mini-batch against its job, and the
//!   dead-letter queue itself, which nobody consumes: operators count it ([`Depth::dead`]),
//!   browse it ([`Queue::dead_letters`]) and take from it ([`Queue::hold_dead`]) to replay or
//!   purge.

pub mod amqp;
mod memory;

use async_trait::async_trait;
use bytes::Bytes;

pub use memory::MemoryQueue;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("the queue is closed")]
    Closed,
    #[error("the broker refused the message: {0}")]
    Refused(String),
    /// The broker had no queue to route the message to.
    #[error("the broker returned the message: {0}")]
    Returned(String),
    /// A RabbitMQ operation failed; `what` says which.
    #[error("queue backend: {what}: {source}")]
    Amqp {
        what: String,
        #[source]
        source: Box<lapin::Error>,
    },
    /// A call to RabbitMQ's management API failed; `what` says which. (reqwest keeps the
    /// URL's user info out of its errors.)
    #[error("queue backend: {what}: {source}")]
    Management {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    /// A task of the queue's own ended without an answer (it panicked).
    #[error("queue backend: {what}: {source}")]
    Task {
        what: String,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("queue backend: listing queues needs the management API")]
    NoManagement,
    #[error("queue backend: publisher confirms are off on the publishing channel")]
    ConfirmsOff,
    /// The broker ended a consumer's subscription.
    #[error("queue backend: consume from {queue}: the broker cancelled the subscription")]
    Cancelled { queue: String },
    /// No broker node completed a connection in time; `brokers` is redacted.
    #[error(
        "queue backend: RabbitMQ at {brokers} did not complete a connection within {secs}s: it \
         is unreachable, or it takes connections without answering them, as a broker out of \
         file handles does (see its file descriptors in `rabbitmq-diagnostics status`)"
    )]
    ConnectTimeout { brokers: String, secs: u64 },
    /// The broker URL (or one of a list) cannot be used.
    #[error(transparent)]
    Url(#[from] amqp::UrlError),
    /// The TLS handshake with a broker node failed: no retry mends it.
    #[error(transparent)]
    Tls(#[from] amqp::TlsFailure),
}

impl QueueError {
    /// Whether a later try of the same call may pass: the connection dropped or timed out,
    /// the broker refused a message for a moment (no quorum, full) or ended a subscription.
    /// The broker refusing the request itself (a channel-level error), a returned message, a
    /// bad URL or a failed TLS handshake are not.
    pub fn is_transient(&self) -> bool {
        match self {
            QueueError::Amqp { source, .. } => amqp::is_transient(source),
            QueueError::Management { source, .. } => {
                source.is_timeout()
                    || source.is_connect()
                    || source.status().is_some_and(|s| s.is_server_error())
            }
            QueueError::Refused(_) | QueueError::Cancelled { .. } => true,
            QueueError::ConnectTimeout { .. } => true,
            QueueError::Closed
            | QueueError::Returned(_)
            | QueueError::Task { .. }
            | QueueError::NoManagement
            | QueueError::ConfirmsOff
            | QueueError::Url(_)
            | QueueError::Tls(_) => false,
        }
    }
}

/// How a queue is declared.
#[derive(Debug, Clone, Default)]
pub struct QueueOptions {
    /// Returns tolerated before a message is dead-lettered; `None` = unlimited.
    pub delivery_limit: Option<u32>,
}

/// Messages by where they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Mini-batches waiting for a consumer.
    pub ready: u64,
    /// Mini-batches delivered and not yet settled; `None` where the backend cannot count
    /// them (RabbitMQ without its management API).
    pub unacked: Option<u64>,
    /// Messages in the dead-letter queue, including any an operator's tool holds.
    pub dead: u64,
}

/// One message of the dead-letter queue, as operators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub body: Bytes,
    /// Why it was dead-lettered: `delivery_limit` or `rejected` (as RabbitMQ says).
    pub reason: Option<String>,
    /// How many times it was delivered before it was dead-lettered, when the queue knows.
    pub deliveries: Option<u32>,
    /// When it was dead-lettered, in seconds since the Unix epoch, when the queue knows.
    pub dead_at: Option<f64>,
}

/// Dead letters taken from the dead-letter queue and held, oldest first: each is removed
/// ([`DeadLetterHold::remove`]) or, at [`DeadLetterHold::release`] (or when the hold is
/// dropped), put back where it was, ahead of anything dead-lettered since.
#[async_trait]
pub trait DeadLetterHold: Send {
    /// The dead letters held, oldest first.
    fn letters(&self) -> &[DeadLetter];
    /// Removes the `i`th held dead letter from the queue for good.
    async fn remove(&mut self, i: usize) -> Result<(), QueueError>;
    /// Puts back every held dead letter not removed, in their order.
    async fn release(self: Box<Self>) -> Result<(), QueueError>;
}

#[async_trait]
pub trait Queue: Send + Sync {
    /// Makes `lane` if it does not exist (idempotent). A publisher opens its lane before it
    /// publishes: a lane a publish must make first does not keep the order of publishes in
    /// flight together.
    async fn open_lane(&self, lane: &str) -> Result<(), QueueError>;
    /// Publishes one message to `lane` (made if it does not exist); returns once the queue
    /// holds it (confirmed, durable).
    async fn publish(&self, lane: &str, body: Vec<u8>) -> Result<(), QueueError>;
    /// Opens a consumer on `lane` (made if it does not exist).
    async fn consume(&self, lane: &str, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError>;
    /// Opens a consumer on the recorders' inbox of dead letters (a copy of each, see the
    /// module's notes): only an ack removes one from it, anything else puts it back.
    async fn consume_dead(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError>;
    /// Messages of `lane` waiting for a consumer (0 for a lane that does not exist). Cheap:
    /// each node reads it for the jobs of its pool every second to share its slots.
    async fn ready(&self, lane: &str) -> Result<u64, QueueError>;
    /// Counts the messages of `lanes` ready and delivered-but-unsettled, and the pool's
    /// dead-lettered ones.
    async fn depth(&self, lanes: &[String]) -> Result<Depth, QueueError>;
    /// Removes `lane` with whatever it still holds (its job has ended). A later publish or
    /// consume makes it again.
    async fn close_lane(&self, lane: &str) -> Result<(), QueueError>;
    /// Takes up to `limit` dead letters from the dead-letter queue, oldest first, and holds
    /// them until each is removed or put back. One holder at a time: what one holds, another
    /// does not see.
    async fn hold_dead(&self, limit: usize) -> Result<Box<dyn DeadLetterHold>, QueueError>;
    /// Up to `limit` dead letters, oldest first, left in the dead-letter queue as they were.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let hold = self.hold_dead(limit).await?;
        let letters = hold.letters().to_vec();
        hold.release().await?;
        Ok(letters)
    }
}

#[async_trait]
pub trait Consumer: Send {
    /// Waits for the next delivery.
    async fn next(&mut self) -> Result<Delivery, QueueError>;
    /// Stops taking messages until the next call to [`Consumer::next`]: whatever the queue
    /// pushed to this consumer that `next` has not handed out goes back untried, as a
    /// [`Disposition::Return`] does (no attempt spent). Deliveries already handed out are
    /// unaffected and are settled as usual. A consumer that will not run work for a while
    /// pauses, so that it holds nothing another consumer could run.
    async fn pause(&mut self) -> Result<(), QueueError>;
}

/// What becomes of a delivery. Decided in one place by the caller, never defaulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Done with it: remove it from the queue.
    Ack,
    /// Hand it back for another attempt (counts toward the delivery limit).
    Requeue,
    /// Hand it back untried (this consumer could not run it): it comes back as the same
    /// attempt, and counts toward no limit.
    Return,
    /// Move it to the dead-letter queue now.
    DeadLetter,
}

/// Settles one delivery with its queue.
#[async_trait]
pub trait Acker: Send + Sync {
    /// Returns `Ok(false)` when the settlement could not be sent (the channel died): the
    /// broker will redeliver the message.
    async fn settle(&mut self, disposition: Disposition) -> Result<bool, QueueError>;
}

/// One delivered message. Dropping it unsettled returns it to the queue, as a dead consumer's
/// messages return to a broker's.
pub struct Delivery {
    pub body: Bytes,
    /// 1 on the first delivery.
    pub attempt: u32,
    /// Why it was dead-lettered (deliveries from the dead-letter queue only).
    pub dead_reason: Option<String>,
    acker: Box<dyn Acker>,
}

impl Delivery {
    pub fn new(
        body: Bytes,
        attempt: u32,
        dead_reason: Option<String>,
        acker: Box<dyn Acker>,
    ) -> Self {
        Delivery {
            body,
            attempt,
            dead_reason,
            acker,
        }
    }

    pub async fn settle(mut self, disposition: Disposition) -> Result<bool, QueueError> {
        self.acker.settle(disposition).await
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("bytes", &self.body.len())
            .field("attempt", &self.attempt)
            .field("dead_reason", &self.dead_reason)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPSoftError};

    use super::*;

    fn amqp(source: lapin::Error) -> QueueError {
        QueueError::Amqp {
            what: "declare a job's queue".to_owned(),
            source: Box::new(source),
        }
    }

    #[test]
    fn a_lost_connection_is_transient_and_a_refused_request_is_not() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let lost = amqp(lapin::Error::from(reset));
        assert!(lost.is_transient(), "{lost}");
        let refused = AMQPError::new(
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type'".into(),
        );
        let refused = amqp(lapin::Error::from(lapin::ErrorKind::ProtocolError(refused)));
        assert!(!refused.is_transient(), "{refused}");
        // The cause is kept, and the message still says what failed.
        assert!(std::error::Error::source(&refused).is_some());
        assert!(
            refused
                .to_string()
                .starts_with("queue backend: declare a job's queue: ")
        );
        assert!(!QueueError::Returned("no route".into()).is_transient());
        assert!(QueueError::Refused("no quorum".into()).is_transient());
    }
}
