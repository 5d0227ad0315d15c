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

    fn build(options: QueueOptions, capacity: Option<usize>) -> Self {
        MemoryQueue {
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
            Disposition::Return => {
                state.ready.push_back(message);
                self.ready.add_permits(1);
            }
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
            space
                .acquire()
                .await
                .map_err(|_| QueueError::Closed)?
                .forget();
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
            unacked: Some(state.unacked),
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

    async fn pause(&mut self) -> Result<(), QueueError> {
        // A message is taken only inside `next`: a consumer between calls holds nothing.
        Ok(())
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
