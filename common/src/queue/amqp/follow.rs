//! Following every job event on the broker ([`Events::follow`]): a queue of this process's
//! own, `fleetrun.<pool>.events.<random>`, bound to every key of the events exchange.
//!
//! The queue is exclusive (the broker deletes it with the connection), holds at most
//! [`QUEUE_LIMIT`] events (the oldest go first), and is read without acknowledgements: an
//! event only says that something changed, which the follower reads again from the ledger.
//! The connection's recovery declares, binds and consumes it again; when a subscription ends
//! anyway (its channel closed, or its connection given up), it is opened again, pausing
//! longer each time it fails. The
//! relay stops, and closes its channel, once every receiver is dropped.
//!
//! [`Events::follow`]: crate::events::Events::follow

use std::sync::Arc;

use backon::ExponentialBackoff;
use futures::StreamExt;
use lapin::Consumer;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::broadcast;
use tracing::debug;

use super::link::Opened;
use super::{HEALTH_CHECK, Shared, long_string, names, reopen_backoff};
use crate::events::JobEvent;
use crate::queue::QueueError;

/// Events the follow queue holds while nobody reads them; older ones are dropped.
const QUEUE_LIMIT: i32 = 1000;
/// Events a receiver holds before it skips the oldest.
const HELD: usize = 64;

/// Declares the follow queue, subscribes to it, and relays its events to the receiver it
/// returns (and to receivers subscribed from it) until they are all dropped.
pub(super) async fn follow(
    shared: Arc<Shared>,
) -> Result<broadcast::Receiver<JobEvent>, QueueError> {
    let queue = names::follower(&shared.pool, rand::random());
    let subscription = subscribe(&shared, &queue).await?;
    let (sender, receiver) = broadcast::channel(HELD);
    tokio::spawn(relay(shared, queue, subscription, sender));
    Ok(receiver)
}

/// A channel of its own consuming the follow queue, declared and bound first (idempotent).
async fn subscribe(shared: &Shared, queue: &str) -> Result<(Opened, Consumer), QueueError> {
    let tag = format!("{} events", shared.link.name());
    shared
        .retrying_on("follow the job events", None, |opened| {
            let tag = tag.as_str();
            async move {
                let channel = &opened.channel;
                let mut arguments = FieldTable::default();
                // Never a quorum queue, whatever the vhost's default: those cannot be
                // exclusive.
                arguments.insert(names::QUEUE_TYPE.into(), long_string("classic"));
                arguments.insert(names::MAX_LENGTH.into(), AMQPValue::LongInt(QUEUE_LIMIT));
                let options = QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                };
                channel
                    .queue_declare(queue.into(), options, arguments)
                    .await?;
                channel
                    .queue_bind(
                        queue.into(),
                        names::EVENTS.into(),
                        "job.#".into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                let options = BasicConsumeOptions {
                    no_ack: true,
                    exclusive: true,
                    ..Default::default()
                };
                let consumer = channel
                    .basic_consume(queue.into(), tag.into(), options, FieldTable::default())
                    .await?;
                Ok((opened.clone(), consumer))
            }
        })
        .await
}

/// Hands each event of the subscription to `sender`'s receivers, subscribing again when the
/// subscription ends; returns once no receiver is left.
async fn relay(
    shared: Arc<Shared>,
    queue: String,
    subscription: (Opened, Consumer),
    sender: broadcast::Sender<JobEvent>,
) {
    let (mut channel, mut consumer) = subscription;
    let mut pauses: Option<ExponentialBackoff> = None;
    loop {
        let next = tokio::select! {
            _ = sender.closed() => break,
            next = consumer.next() => next,
            // A subscription on a connection given up waits for good.
            _ = tokio::time::sleep(HEALTH_CHECK) => {
                if shared.link.alive(&channel) {
                    continue;
                }
                None
            }
        };
        match next {
            Some(Ok(delivery)) => {
                pauses = None;
                match serde_json::from_slice::<JobEvent>(&delivery.data) {
                    // No receiver left: `closed` ends the loop.
                    Ok(event) => drop(sender.send(event)),
                    Err(e) => {
                        debug!(error = %e, "A message on the events exchange is no event; skipped.")
                    }
                }
                continue;
            }
            Some(Err(e)) => {
                debug!(queue, error = %e, "The events subscription failed; subscribing again.")
            }
            None => debug!(queue, "The events subscription ended; subscribing again."),
        }
        loop {
            let pause = pauses.get_or_insert_with(reopen_backoff).next();
            tokio::select! {
                _ = sender.closed() => {
                    close(&channel).await;
                    return;
                }
                _ = tokio::time::sleep(pause.unwrap_or_default()) => {}
            }
            match subscribe(&shared, &queue).await {
                Ok((c, s)) => {
                    close(&channel).await;
                    (channel, consumer) = (c, s);
                    break;
                }
                Err(e) => debug!(queue, error = %e, "Cannot follow the job events yet."),
            }
        }
    }
    close(&channel).await;
}

/// Closes the follower's channel; one on a connection given up does not answer, and is not
/// waited for.
async fn close(opened: &Opened) {
    let closing = opened.channel.close(200, "".into());
    let _ = tokio::time::timeout(HEALTH_CHECK, closing).await;
}
