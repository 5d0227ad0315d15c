//! The embedded queue: in-process, with the delivery semantics of a RabbitMQ quorum queue,
//! one lane (queue) per job.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Acker, Consumer, Delivery, Depth, Disposition, Queue, QueueError, QueueOptions};

/// An in-process queue. Cheap to clone; clones share the queue.
///
/// Optionally bounded: with a capacity, `publish` waits while that many messages are ready
/// (over all lanes), so a producer listing a huge input cannot outrun the workers' memory.
#[derive(Clone)]
pub struct MemoryQueue {
    shared: Arc<Shared>,
}

struct Shared {
    options: QueueOptions,
    state: Mutex<State>,
    /// One permit per dead-lettered message.
    dead: Semaphore,
    /// One permit per free place, when bounded.
    space: Option<Semaphore>,
}

#[derive(Default)]
struct State {
    lanes: HashMap<String, Lane>,
    dead: VecDeque<Message>,
    /// Dead letters delivered to a consumer of the dead-letter queue and not yet settled.
    dead_held: u64,
}

/// One job's messages. Kept once made (a closed lane is emptied, not removed), so a
/// consumer's permits always stand for the lane it waits on.
struct Lane {
    ready: VecDeque<Message>,
    unacked: u64,
    /// One permit per ready message.
    permits: Arc<Semaphore>,
}

impl Default for Lane {
    fn default() -> Self {
        Lane {
            ready: VecDeque::new(),
            unacked: 0,
            permits: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Lane {
    fn push(&mut self, message: Message) {
        self.ready.push_back(message);
        self.permits.add_permits(1);
    }
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

    /// A delivered message comes back to `lane`: requeued, or dead-lettered past the limit.
    fn give_back(&self, lane: &str, mut message: Message, disposition: Disposition) {
        let mut state = self.lock();
        let state = &mut *state;
        let lane = state.lanes.entry(lane.to_owned()).or_default();
        lane.unacked -= 1;
        match disposition {
            Disposition::Ack => {}
            Disposition::Return => lane.push(message),
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
                    lane.push(message);
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
    async fn open_lane(&self, lane: &str) -> Result<(), QueueError> {
        self.shared.lock().lanes.entry(lane.to_owned()).or_default();
        Ok(())
    }

    async fn publish(&self, lane: &str, body: Vec<u8>) -> Result<(), QueueError> {
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
        self.shared
            .lock()
            .lanes
            .entry(lane.to_owned())
            .or_default()
            .push(message);
        Ok(())
    }

    async fn consume(&self, lane: &str, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        let permits = self
            .shared
            .lock()
            .lanes
            .entry(lane.to_owned())
            .or_default()
            .permits
            .clone();
        Ok(Box::new(MemoryConsumer::new(
            self.shared.clone(),
            prefetch,
            Source::Lane(lane.to_owned(), permits),
        )))
    }

    async fn consume_dead(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        Ok(Box::new(MemoryConsumer::new(
            self.shared.clone(),
            prefetch,
            Source::Dead,
        )))
    }

    async fn ready(&self, lane: &str) -> Result<u64, QueueError> {
        let state = self.shared.lock();
        Ok(state.lanes.get(lane).map_or(0, |l| l.ready.len() as u64))
    }

    async fn depth(&self, lanes: &[String]) -> Result<Depth, QueueError> {
        let state = self.shared.lock();
        let (mut ready, mut unacked) = (0, 0);
        for lane in lanes.iter().filter_map(|l| state.lanes.get(l)) {
            ready += lane.ready.len() as u64;
            unacked += lane.unacked;
        }
        Ok(Depth {
            ready,
            unacked: Some(unacked),
            dead: state.dead.len() as u64 + state.dead_held,
        })
    }

    async fn close_lane(&self, lane: &str) -> Result<(), QueueError> {
        let dropped = {
            let mut state = self.shared.lock();
            let Some(lane) = state.lanes.get_mut(lane) else {
                return Ok(());
            };
            let dropped = lane.ready.len();
            lane.ready.clear();
            lane.permits.forget_permits(dropped);
            dropped
        };
        if let Some(space) = &self.shared.space {
            space.add_permits(dropped);
        }
        Ok(())
    }
}

/// Where a consumer takes its messages from.
enum Source {
    Lane(String, Arc<Semaphore>),
    Dead,
}

struct MemoryConsumer {
    shared: Arc<Shared>,
    prefetch: Arc<Semaphore>,
    source: Source,
}

impl MemoryConsumer {
    fn new(shared: Arc<Shared>, prefetch: u16, source: Source) -> Self {
        let prefetch = Arc::new(Semaphore::new(usize::from(prefetch.max(1))));
        MemoryConsumer {
            shared,
            prefetch,
            source,
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
        let (message, lane) = loop {
            let source = match &self.source {
                Source::Lane(_, permits) => permits.as_ref(),
                Source::Dead => &self.shared.dead,
            };
            source
                .acquire()
                .await
                .map_err(|_| QueueError::Closed)?
                .forget();
            let mut state = self.shared.lock();
            match &self.source {
                Source::Dead => {
                    let message = state.dead.pop_front();
                    if message.is_some() {
                        state.dead_held += 1;
                    }
                    if let Some(message) = message {
                        break (message, None);
                    }
                }
                Source::Lane(name, _) => {
                    let Some(lane) = state.lanes.get_mut(name) else {
                        continue;
                    };
                    if let Some(message) = lane.ready.pop_front() {
                        lane.unacked += 1;
                        break (message, Some(name.clone()));
                    }
                }
            }
        };
        if lane.is_some()
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
            lane,
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
    /// The lane it came from; `None` for a dead letter (which only an ack removes; anything
    /// else puts it back).
    lane: Option<String>,
    _permit: OwnedSemaphorePermit,
}

impl MemoryAcker {
    fn finish(&mut self, disposition: Disposition) -> bool {
        let Some(message) = self.message.take() else {
            return false;
        };
        match &self.lane {
            None => {
                let mut state = self.shared.lock();
                state.dead_held -= 1;
                if disposition != Disposition::Ack {
                    state.dead.push_front(message);
                    self.shared.dead.add_permits(1);
                }
            }
            Some(lane) => self.shared.give_back(lane, message, disposition),
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
