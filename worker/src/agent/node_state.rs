//! What one node keeps of a job it serves ([`NodeState`]): its runners of the job and how
//! their starts went, its seats and place, the notes it writes once, its claim to finalize,
//! what it delivered of the job's outputs, and the mini-batch size that fits its GPU memory.
//! The job itself, shared by every node, is the `Job` handle beside it in `JobContext`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use fleetrun_common::python::{Python, PythonError};

use super::fit::Fit;
use super::named_outputs::NamedOutputs;
use super::seats::Seats;
use super::times::TimesBook;

/// How often a slot re-reads a job's state from the ledger between its own recordings.
const STATE_RECHECK: Duration = Duration::from_millis(500);

/// What was uploaded of each file of `EntryScript().output_dir` (relative key → size, mtime
/// in nanoseconds; see `outdir`).
pub type Uploaded = HashMap<String, (u64, i128)>;

/// What this node learned of a job and keeps for it: nothing here is shared with other
/// nodes except through the ledger.
pub struct NodeState {
    /// Who this node is when it claims the job's finalization (unique per node and job).
    pub finalizer: String,
    /// This node is finalizing the job.
    pub finalizing: AtomicBool,
    pub(super) init_failures: AtomicU32,
    pub(super) gave_up: AtomicBool,
    /// The job's Python on this node, resolved once before its first runner starts, or why
    /// fleetrun cannot run it.
    pub(super) python: tokio::sync::OnceCell<Result<Python, PythonError>>,
    /// The notes written once per node and job.
    notes: Notes,
    /// The node has let the job go (see `job::watch::let_go`): held while it does.
    pub(crate) let_go: tokio::sync::Mutex<bool>,
    /// This node's runners of the job that finished init and live.
    pub(super) ready_runners: Arc<AtomicU32>,
    /// How many of this node's slots may run the job at once.
    pub seats: Arc<Seats>,
    /// This node is one of the job's `node_count` nodes (always, where places are not kept).
    place: AtomicBool,
    last_check: std::sync::Mutex<Instant>,
    /// What of `EntryScript().output_dir` reached an S3 output (see `outdir`).
    pub(crate) output_sync: tokio::sync::Mutex<Uploaded>,
    /// The job's named outputs on this node, and the node's working folders (see `named`).
    pub(crate) named: NamedOutputs,
    /// The job's resource monitor on this node (`perf/<node_id>/`).
    pub monitor: crate::monitor::Monitor,
    /// The mini-batch size that fits the GPU's memory on this node (see `fit`).
    pub(super) fit: Fit,
    /// Where this node's runners' time on the job went (see `times`).
    pub times: Arc<TimesBook>,
}

/// Whether each note written once per node and job was written.
#[derive(Default)]
struct Notes {
    started: AtomicBool,
    ended: AtomicBool,
    gpus: AtomicBool,
}

impl Default for NodeState {
    fn default() -> NodeState {
        NodeState {
            finalizer: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
            finalizing: AtomicBool::new(false),
            init_failures: AtomicU32::new(0),
            gave_up: AtomicBool::new(false),
            python: tokio::sync::OnceCell::new(),
            notes: Notes::default(),
            let_go: tokio::sync::Mutex::new(false),
            ready_runners: Arc::new(AtomicU32::new(0)),
            seats: Seats::new(crate::node::MAX_PROCESSES as usize),
            place: AtomicBool::new(true),
            last_check: std::sync::Mutex::new(Instant::now()),
            output_sync: Default::default(),
            named: Default::default(),
            monitor: Default::default(),
            fit: Fit::default(),
            times: Arc::default(),
        }
    }
}

impl NodeState {
    /// Runs at most `processes` runners of the job on this node; with `places`, the node
    /// takes the job's work only once it holds one of the job's `node_count` places.
    pub(super) fn seat(&mut self, processes: usize, places: bool) {
        self.seats = Seats::new(processes);
        self.place = AtomicBool::new(!places);
    }

    /// Whether this node holds one of the job's places (see `JobContext::with_seats`).
    pub fn has_place(&self) -> bool {
        self.place.load(Ordering::Relaxed)
    }

    /// Notes whether this node holds one of the job's places.
    pub fn set_place(&self, held: bool) {
        self.place.store(held, Ordering::Relaxed);
    }

    /// True once per node and job: the first mini-batch this node starts notes the job
    /// started in the ledger (`first_task_creation_timeout` is met).
    pub(crate) fn first_start(&self) -> bool {
        !self.notes.started.swap(true, Ordering::Relaxed)
    }

    /// True once per node and job: the job's end is noted in `sys/master_role.txt`.
    pub(crate) fn first_end_noted(&self) -> bool {
        !self.notes.ended.swap(true, Ordering::Relaxed)
    }

    /// True once per node and job: the node's GPUs are noted in its `_main.txt`.
    pub(crate) fn first_gpu_note(&self) -> bool {
        !self.notes.gpus.swap(true, Ordering::Relaxed)
    }

    /// True when the last status check is older than [`STATE_RECHECK`] (and claims the next).
    pub(super) fn due_for_check(&self) -> bool {
        let mut last = self.last_check.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= STATE_RECHECK {
            *last = Instant::now();
            true
        } else {
            false
        }
    }
}
