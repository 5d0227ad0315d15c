//! What a job's state changes tell the services around the fleet: one [`JobEvent`] per
//! change, published once by the process that made it, on the broker's durable topic
//! exchange [`EXCHANGE`] with routing key `job.<state>` (`job.completed`, `job.failed`, …).
//! A service binds a queue of its own to `job.#`, or to the ends it cares about.
//!
//! Two implementations: [`crate::queue::AmqpQueue`] publishes to RabbitMQ;
//! [`MemoryEvents`] hands events to whoever subscribed in the process (the embedded mode
//! has no broker to tell).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::ledger::{JobState, Status};
use crate::queue::QueueError;

/// The topic exchange every process that connects to the broker declares.
pub const EXCHANGE: &str = "fleetrun.events";

/// A job's mini-batches and items, counted as batch services count them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Mini-batches in the job; `None` until its input is fully listed.
    pub total_mini_batches: Option<u64>,
    /// Mini-batches done (succeeded or failed).
    pub completed_mini_batches: u64,
    /// Mini-batches that failed (all their attempts, or a short return).
    pub failed_mini_batches: u64,
    pub succeeded_items: u64,
    pub failed_items: u64,
}

impl Counts {
    pub fn of(status: &Status) -> Counts {
        Counts {
            total_mini_batches: status.total,
            completed_mini_batches: status.done,
            failed_mini_batches: status.batches_failed,
            succeeded_items: status.items_succeeded,
            failed_items: status.items_failed,
        }
    }
}

/// A change of a job's state, as published (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    pub job_id: String,
    /// The job's name (its file's `name`).
    pub name: String,
    /// The pool whose workers serve the job.
    pub pool: String,
    /// The state the job moved to.
    pub state: JobState,
    pub counts: Counts,
    /// Why the job failed or was canceled.
    pub cause: Option<String>,
    /// Where the job's output file (or folder) is: a path or an `s3://` URL.
    pub output: String,
    /// When the change was made, in seconds since the Unix epoch.
    pub time: f64,
    /// The digest (`sha256:<hex>`) of the job's `logs/manifest.json`, on the event of the
    /// end that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
}

impl JobEvent {
    /// `job.<state>`, lowercase: the routing key on [`EXCHANGE`].
    pub fn routing_key(&self) -> String {
        routing_key(self.state)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an event always encodes")
    }
}

/// The routing key of events of `state`.
pub fn routing_key(state: JobState) -> String {
    format!("job.{}", state.as_str().to_lowercase())
}

#[async_trait]
pub trait Events: Send + Sync {
    /// Publishes `event`; returns once the broker holds it.
    async fn publish(&self, event: &JobEvent) -> Result<(), QueueError>;

    /// The events published from now on, when they are published in this process (so one
    /// who waits for a job here wakes as it changes); `None` when they leave it.
    fn changes(&self) -> Option<broadcast::Receiver<JobEvent>> {
        None
    }

    /// Every event published from now on, by any process: a worker shares its slots out
    /// again as soon as a job of its pool starts or ends. Events published while the
    /// follower cannot hear them (its broker connection is being restored) are missed, and
    /// one who falls far behind skips the oldest (`RecvError::Lagged`): what an event says
    /// is re-read from the ledger.
    async fn follow(&self) -> Result<broadcast::Receiver<JobEvent>, QueueError>;
}

/// Events in one process: each subscriber gets every event published after it subscribed.
#[derive(Clone)]
pub struct MemoryEvents {
    sender: broadcast::Sender<JobEvent>,
}

impl MemoryEvents {
    pub fn new() -> MemoryEvents {
        MemoryEvents {
            sender: broadcast::channel(1024).0,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.sender.subscribe()
    }
}

impl Default for MemoryEvents {
    fn default() -> Self {
        MemoryEvents::new()
    }
}

#[async_trait]
impl Events for MemoryEvents {
    async fn publish(&self, event: &JobEvent) -> Result<(), QueueError> {
        // Nobody subscribed is no error: nobody is told.
        let _ = self.sender.send(event.clone());
        Ok(())
    }

    fn changes(&self) -> Option<broadcast::Receiver<JobEvent>> {
        Some(self.subscribe())
    }

    async fn follow(&self) -> Result<broadcast::Receiver<JobEvent>, QueueError> {
        Ok(self.subscribe())
    }
}
