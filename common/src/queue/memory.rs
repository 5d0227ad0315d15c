//! The embedded queue: in-process, with the delivery semantics of a RabbitMQ quorum queue.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Acker, Consumer, Delivery, Depth, Disposition, Queue, QueueError, QueueOptions};

/// An in-process queue. Cheap to clone; clones share the queue.
///
/// Optionally bounded: with a capacity, `publish` waits while that many messages are ready,
/// so a producer listing a huge input cannot outrun the workers' memory.
#[derive(Clone)]
pub struct MemoryQueue {
    shared: Arc<Shared>,
    /// This handle's `publish` waits for room in a bounded queue.
    waits_for_room: bool,
}

struct Shared {
    options: QueueOptions,
    state: Mutex<State>,
    /// One permit per ready message.
    ready: Semaphore,
    /// One permit per dead-lettered message.
    dead: Semaphore,
    /// One permit per free place, when bounded.
    space: Option<Semaphore>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Message>,
    dead: VecDeque<Message>,
    unacked: u64,
    /// Dead letters delivered to a consumer of the dead-letter queue and not yet settled.
    dead_held: u64,
}

struct Message {
    body: Bytes,
    /// Times it has come back unacknowledged.
    returns: u32,
    dead_reason: Option<&'static str>,
}

impl MemoryQueue {
    pub fn new(options: QueueOptions) -> Self {
        Self::build(options, None)
    }

    /// A queue whose `publish` waits while `capacity` messages are ready.
    pub fn bounded(options: QueueOptions, capacity: usize) -> Self {
        Self::build(options, Some(capacity.max(1)))
    }

    /// Another handle on the same queue whose `publish` never waits for room: for consumers
    /// that give a message back by publishing it again, who would wait forever on a full
    /// queue that only they empty.
    pub fn never_waiting(&self) -> MemoryQueue {
        MemoryQueue {
            shared: self.shared.clone(),
            waits_for_room: false,
        }
    }

    fn build(options: QueueOptions, capacity: Option<usize>) -> Self {
        MemoryQueue {
            waits_for_room: true,
            shared: Arc::new(Shared {
                options,
                state: Mutex::new(State::default()),
                ready: Semaphore::new(0),
                dead: Semaphore::new(0),
                space: capacity.map(Semaphore::new),
            }),
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A delivered message comes back: requeued, or dead-lettered past the limit.
    fn give_back(&self, mut message: Message, disposition: Disposition) {
        let mut state = self.lock();
        state.unacked -= 1;
        match disposition {
            Disposition::Ack => {}
            Disposition::Requeue => {
                message.returns += 1;
                let over = self
                    .options
                    .delivery_limit
                    .is_some_and(|l| message.returns > l);
                if over {
                    message.dead_reason = Some("delivery_limit");
                    state.dead.push_back(message);
                    self.dead.add_permits(1);
                } else {
                    state.ready.push_back(message);
                    self.ready.add_permits(1);
                }
            }
            Disposition::DeadLetter => {
                message.dead_reason = Some("rejected");
                state.dead.push_back(message);
                self.dead.add_permits(1);
            }
        }
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn publish(&self, body: Vec<u8>) -> Result<(), QueueError> {
        if let Some(space) = &self.shared.space {
            if self.waits_for_room {
                space
                    .acquire()
                    .await
                    .map_err(|_| QueueError::Closed)?
                    .forget();
            } else if let Ok(permit) = space.try_acquire() {
                // Takes its place when there is one; else the queue holds one more.
                permit.forget();
            }
        }
        let message = Message {
            body: body.into(),
            returns: 0,
            dead_reason: None,
        };
        self.shared.lock().ready.push_back(message);
        self.shared.ready.add_permits(1);
        Ok(())
    }

    async fn consume(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        Ok(Box::new(MemoryConsumer::new(
            self.shared.clone(),
            prefetch,
            false,
        )))
    }

    async fn consume_dead(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        Ok(Box::new(MemoryConsumer::new(
            self.shared.clone(),
            prefetch,
            true,
        )))
    }

    async fn depth(&self) -> Result<Depth, QueueError> {
        let state = self.shared.lock();
        Ok(Depth {
            ready: state.ready.len() as u64,
            unacked: state.unacked,
            dead: state.dead.len() as u64 + state.dead_held,
        })
    }
}

struct MemoryConsumer {
    shared: Arc<Shared>,
    prefetch: Arc<Semaphore>,
    dead_letters: bool,
}

impl MemoryConsumer {
    fn new(shared: Arc<Shared>, prefetch: u16, dead_letters: bool) -> Self {
        let prefetch = Arc::new(Semaphore::new(usize::from(prefetch.max(1))));
        MemoryConsumer {
            shared,
            prefetch,
            dead_letters,
        }
    }
}

#[async_trait]
impl Consumer for MemoryConsumer {
    async fn next(&mut self) -> Result<Delivery, QueueError> {
        let permit = self
            .prefetch
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| QueueError::Closed)?;
        let source = if self.dead_letters {
            &self.shared.dead
        } else {
            &self.shared.ready
        };
        source
            .acquire()
            .await
            .map_err(|_| QueueError::Closed)?
            .forget();
        let message = {
            let mut state = self.shared.lock();
            let message = if self.dead_letters {
                state.dead.pop_front()
            } else {
                state.ready.pop_front()
            };
            if self.dead_letters {
                state.dead_held += 1;
            } else {
                state.unacked += 1;
            }
            message.expect("a permit stands for a message")
        };
        if !self.dead_letters
            && let Some(space) = &self.shared.space
        {
            space.add_permits(1);
        }
        let body = message.body.clone();
        let attempt = message.returns + 1;
        let dead_reason = message.dead_reason.map(str::to_owned);
        let acker = MemoryAcker {
            shared: self.shared.clone(),
            message: Some(message),
            dead_letter: self.dead_letters,
            _permit: permit,
        };
        Ok(Delivery::new(body, attempt, dead_reason, Box::new(acker)))
    }
}

struct MemoryAcker {
    shared: Arc<Shared>,
    message: Option<Message>,
    /// Settles a dead letter (which only an ack removes; anything else puts it back).
    dead_letter: bool,
    _permit: OwnedSemaphorePermit,
}

impl MemoryAcker {
    fn finish(&mut self, disposition: Disposition) -> bool {
        let Some(message) = self.message.take() else {
            return false;
        };
        if self.dead_letter {
            let mut state = self.shared.lock();
            state.dead_held -= 1;
            if disposition != Disposition::Ack {
                state.dead.push_front(message);
                self.shared.dead.add_permits(1);
            }
        } else {
            self.shared.give_back(message, disposition);
        }
        true
    }
}

#[async_trait]
impl Acker for MemoryAcker {
    async fn settle(&mut self, disposition: Disposition) -> Result<bool, QueueError> {
        Ok(self.finish(disposition))
    }
}

impl Drop for MemoryAcker {
    fn drop(&mut self) {
        // An unsettled delivery whose consumer is gone comes back and costs an attempt.
        self.finish(Disposition::Requeue);
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    /// A consumer that gives a message back by publishing it again must not wait for room
    /// in a full queue that only consumers empty.
    #[tokio::test]
    async fn a_never_waiting_handle_publishes_into_a_full_queue() {
        let queue = MemoryQueue::bounded(QueueOptions::default(), 1);
        queue.publish(b"a".to_vec()).await.unwrap();
        assert!(
            queue.publish(b"b".to_vec()).now_or_never().is_none(),
            "the bounded handle waits"
        );
        let again = queue.never_waiting();
        again
            .publish(b"c".to_vec())
            .now_or_never()
            .expect("never waits")
            .unwrap();
        let mut consumer = queue.consume(1).await.unwrap();
        for body in [b"a", b"c"] {
            let d = consumer.next().await.unwrap();
            assert_eq!(&d.body[..], body);
            assert!(d.settle(Disposition::Ack).await.unwrap());
        }
        assert_eq!(queue.depth().await.unwrap().ready, 0);
    }
}
