//! A job as a node sees it ([`JobContext`]): its `Job` handle, its input and logs, and what
//! this node learned of it (its runners, its seats, its place, its outputs delivered, the
//! mini-batch size that fits its GPU memory).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::time::{Duration, Instant};

use fleetrun_common::python::{Python, PythonError};
use fleetrun_common::storage::Storage;
use tokio_util::sync::CancellationToken;

use super::fit::Fit;
use super::named_outputs::NamedOutputs;
use super::seats::Seats;
use super::times::TimesBook;
use crate::job::Job;
use crate::logs::JobLogs;

/// How often a slot re-reads a job's state from the ledger between its own recordings.
const STATE_RECHECK: Duration = Duration::from_millis(500);

/// What was uploaded of each file of `EntryScript().output_dir` (relative key → size, mtime
/// in nanoseconds; see `outdir`).
pub type Uploaded = HashMap<String, (u64, i128)>;

/// A job as a node sees it: the job (its spec as staged here, its output and parts, the
/// moves of its state), its input, its log folder, and what this node learned about it.
pub struct JobContext {
    pub job: Job,
    pub input: Arc<dyn Storage>,
    pub logs: Arc<JobLogs>,
    /// Cancelled once the job stops accepting work; running attempts are killed.
    pub stop: CancellationToken,
    /// Told when the job's state changed (its event): its watcher looks at once.
    pub changed: tokio::sync::Notify,
    /// Who this node is when it claims the job's finalization (unique per node and job).
    pub finalizer: String,
    /// This node is finalizing the job.
    pub finalizing: AtomicBool,
    pub(super) init_failures: AtomicU32,
    pub(super) gave_up: AtomicBool,
    /// The job's Python on this node, resolved once before its first runner starts, or why
    /// fleetrun cannot run it.
    pub(super) python: tokio::sync::OnceCell<Result<Python, PythonError>>,
    pub(super) started_noted: AtomicBool,
    pub(super) end_noted: AtomicBool,
    /// The node has let the job go (see `job::watch::let_go`): held while it does.
    pub(crate) let_go: tokio::sync::Mutex<bool>,
    pub(super) gpus_noted: AtomicBool,
    /// This node's runners of the job that finished init and live.
    pub(super) ready_runners: Arc<AtomicU32>,
    /// How many of this node's slots may run the job at once.
    pub seats: Arc<Seats>,
    /// This node is one of the job's `node_count` nodes (always, where places are not kept).
    pub(super) place: AtomicBool,
    pub(super) last_check: std::sync::Mutex<Instant>,
    /// What of `EntryScript().output_dir` reached an S3 output (see `outdir`).
    pub(crate) output_sync: tokio::sync::Mutex<Uploaded>,
    /// The job's named outputs on this node, and the node's working folders (see `named`).
    pub(crate) named: NamedOutputs,
    /// The job's resource monitor on this node (`perf/<node_id>/`).
    pub monitor: crate::monitor::Monitor,
    /// The job's run this context serves (the ledger's `Status::run`): a mini-batch of a
    /// later run finds the job resumed and a new context; one of an earlier run is dropped.
    pub(super) run: u32,
    /// The mini-batch size that fits the GPU's memory on this node (see `fit`).
    pub(super) fit: Fit,
    /// Where this node's runners' time on the job went (see `times`).
    pub times: Arc<TimesBook>,
}

impl JobContext {
    pub fn new(job: Job, input: Arc<dyn Storage>, logs: Arc<JobLogs>) -> JobContext {
        JobContext {
            job,
            started_noted: AtomicBool::new(false),
            end_noted: AtomicBool::new(false),
            let_go: tokio::sync::Mutex::new(false),
            gpus_noted: AtomicBool::new(false),
            ready_runners: Arc::new(AtomicU32::new(0)),
            seats: Seats::new(crate::node::MAX_PROCESSES as usize),
            place: AtomicBool::new(true),
            input,
            logs,
            stop: CancellationToken::new(),
            changed: tokio::sync::Notify::new(),
            finalizer: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
            finalizing: AtomicBool::new(false),
            init_failures: AtomicU32::new(0),
            gave_up: AtomicBool::new(false),
            python: tokio::sync::OnceCell::new(),
            last_check: std::sync::Mutex::new(Instant::now()),
            output_sync: Default::default(),
            named: Default::default(),
            monitor: Default::default(),
            run: 0,
            fit: Fit::default(),
            times: Arc::default(),
        }
    }

    /// Counts its runners' flushed times in `metrics` (see `times`).
    pub fn counted_in(mut self, metrics: Arc<crate::metrics::Metrics>) -> JobContext {
        self.times = Arc::new(TimesBook::counted_in(metrics));
        self
    }

    /// Adds what this node's runners of the job did since the last flush to the ledger's times
    /// of the job (and to `/metrics`); what the ledger does not take goes with the next flush.
    pub async fn flush_times(&self) {
        for (runner, delta) in self.times.take_unflushed() {
            match self.job.add_runner_times(&runner, &delta).await {
                Ok(()) => self.times.counted(&delta),
                Err(e) => {
                    tracing::warn!(job = %self.job.id(), runner = %runner.runner, error = %e, "Cannot add the runner's times to the job's; the next flush carries them.");
                    self.times.unflushed(&runner, &delta);
                }
            }
        }
    }

    /// Delivers the job's named outputs, and keeps what runners leave in their working
    /// folders, as `named` says.
    pub fn with_named(mut self, named: NamedOutputs) -> JobContext {
        self.named = named;
        self
    }

    /// Serves the job's `run` (see [`JobContext::run`]).
    pub fn for_run(mut self, run: u32) -> JobContext {
        self.run = run;
        self
    }

    /// The job's run this context serves: 0 for the first, one more each time it resumed.
    pub fn run(&self) -> u32 {
        self.run
    }

    /// Runs at most `processes` runners of the job on this node; with `places`, the node
    /// takes the job's work only once it holds one of the job's `node_count` places.
    pub fn with_seats(mut self, processes: usize, places: bool) -> JobContext {
        self.seats = Seats::new(processes);
        self.place = AtomicBool::new(!places);
        self
    }

    /// Whether this node holds one of the job's places (see [`JobContext::with_seats`]).
    pub fn has_place(&self) -> bool {
        self.place.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes whether this node holds one of the job's places.
    pub fn set_place(&self, held: bool) {
        self.place.store(held, std::sync::atomic::Ordering::Relaxed);
    }

    /// True once per node and job: the first mini-batch this node starts notes the job
    /// started in the ledger (`first_task_creation_timeout` is met).
    pub(crate) fn first_start(&self) -> bool {
        !self
            .started_noted
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// True once per node and job: the job's end is noted in `sys/master_role.txt`.
    pub(crate) fn first_end_noted(&self) -> bool {
        !self
            .end_noted
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// True once per node and job: the node's GPUs are noted in its `_main.txt`.
    pub(crate) fn first_gpu_note(&self) -> bool {
        !self
            .gpus_noted
            .swap(true, std::sync::atomic::Ordering::Relaxed)
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
