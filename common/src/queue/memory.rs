//! The embedded queue: in-process, with the delivery semantics of a RabbitMQ quorum queue,
//! one lane (queue) per job.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{
    Acker, Consumer, DeadLetter, DeadLetterHold, Delivery, Depth, Disposition, Queue, QueueError,
    QueueOptions,
};

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
    /// One permit per message in the recorders' inbox.
    inbox: Semaphore,
    /// One permit per free place, when bounded.
    space: Option<Semaphore>,
}

#[derive(Default)]
struct State {
    lanes: HashMap<String, Lane>,
    /// The dead-letter queue, for operators.
    dead: VecDeque<DeadLetter>,
    /// Dead letters an operator's tool holds.
    dead_held: u64,
    /// The recorders' copy of each dead letter.
    inbox: VecDeque<Message>,
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
                inbox: Semaphore::new(0),
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
                    let deliveries = message.returns;
                    self.dead_letter(state, message, "delivery_limit", deliveries);
                } else {
                    lane.push(message);
                }
            }
            Disposition::DeadLetter => {
                let deliveries = message.returns + 1;
                self.dead_letter(state, message, "rejected", deliveries);
            }
        }
    }
    /// Dead-letters `message`: into the dead-letter queue, and a copy into the inbox.
    fn dead_letter(
        &self,
        state: &mut State,
        mut message: Message,
        reason: &'static str,
        deliveries: u32,
    ) {
        message.dead_reason = Some(reason);
        state.dead.push_back(DeadLetter {
            body: message.body.clone(),
            reason: Some(reason.to_owned()),
            deliveries: Some(deliveries),
            dead_at: Some(crate::ledger::unix_now()),
        });
        state.inbox.push_back(message);
        self.inbox.add_permits(1);
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

    async fn hold_dead(&self, limit: usize) -> Result<Box<dyn DeadLetterHold>, QueueError> {
        let mut state = self.shared.lock();
        let take = limit.min(state.dead.len());
        let letters: Vec<DeadLetter> = state.dead.drain(..take).collect();
        state.dead_held += letters.len() as u64;
        Ok(Box::new(MemoryDeadHold {
            shared: self.shared.clone(),
            removed: vec![false; letters.len()],
            letters,
        }))
    }
}

/// Dead letters taken from the front of the dead-letter queue; put back there.
struct MemoryDeadHold {
    shared: Arc<Shared>,
    letters: Vec<DeadLetter>,
    removed: Vec<bool>,
}

impl MemoryDeadHold {
    fn put_back(&mut self) {
        let mut state = self.shared.lock();
        state.dead_held -= self.letters.len() as u64;
        let kept = std::mem::take(&mut self.letters)
            .into_iter()
            .zip(std::mem::take(&mut self.removed))
            .filter(|(_, removed)| !removed)
            .map(|(letter, _)| letter);
        for letter in kept.rev() {
            state.dead.push_front(letter);
        }
    }
}

#[async_trait]
impl DeadLetterHold for MemoryDeadHold {
    fn letters(&self) -> &[DeadLetter] {
        &self.letters
    }

    async fn remove(&mut self, i: usize) -> Result<(), QueueError> {
        if let Some(removed) = self.removed.get_mut(i) {
            *removed = true;
        }
        Ok(())
    }

    async fn release(mut self: Box<Self>) -> Result<(), QueueError> {
        self.put_back();
        Ok(())
    }
}

impl Drop for MemoryDeadHold {
    fn drop(&mut self) {
        self.put_back();
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
                Source::Dead => &self.shared.inbox,
            };
            source
                .acquire()
                .await
                .map_err(|_| QueueError::Closed)?
                .forget();
            let mut state = self.shared.lock();
            match &self.source {
                Source::Dead => {
                    if let Some(message) = state.inbox.pop_front() {
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
    /// The lane it came from; `None` for a copy in the recorders' inbox (which only an ack
    /// removes; anything else puts it back).
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
                if disposition != Disposition::Ack {
                    self.shared.lock().inbox.push_front(message);
                    self.shared.inbox.add_permits(1);
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
