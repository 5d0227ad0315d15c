//! A job as a node sees it ([`JobContext`]): its `Job` handle (the job every node shares),
//! its input and logs, and what this node keeps of it ([`NodeState`]).

use std::sync::Arc;

use fleetrun_common::storage::Storage;
use tokio_util::sync::CancellationToken;

use super::named_outputs::NamedOutputs;
use super::node_state::NodeState;
use super::times::TimesBook;
use crate::job::Job;
use crate::logs::JobLogs;

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
    /// The job's run this context serves (the ledger's `Status::run`): a mini-batch of a
    /// later run finds the job resumed and a new context; one of an earlier run is dropped.
    run: u32,
    /// What this node keeps of the job: its runners, seats, notes, outputs delivered.
    pub node: NodeState,
}

impl JobContext {
    pub fn new(job: Job, input: Arc<dyn Storage>, logs: Arc<JobLogs>) -> JobContext {
        JobContext {
            job,
            input,
            logs,
            stop: CancellationToken::new(),
            changed: tokio::sync::Notify::new(),
            run: 0,
            node: NodeState::default(),
        }
    }

    /// Counts its runners' flushed times in `metrics` (see `times`).
    pub fn counted_in(mut self, metrics: Arc<crate::metrics::Metrics>) -> JobContext {
        self.node.times = Arc::new(TimesBook::counted_in(metrics));
        self
    }

    /// Adds what this node's runners of the job did since the last flush to the ledger's times
    /// of the job (and to `/metrics`); what the ledger does not take goes with the next flush.
    pub async fn flush_times(&self) {
        for (runner, delta) in self.node.times.take_unflushed() {
            match self.job.add_runner_times(&runner, &delta).await {
                Ok(()) => self.node.times.counted(&delta),
                Err(e) => {
                    tracing::warn!(job = %self.job.id(), runner = %runner.runner, error = %e, "Cannot add the runner's times to the job's; the next flush carries them.");
                    self.node.times.unflushed(&runner, &delta);
                }
            }
        }
    }

    /// Delivers the job's named outputs, and keeps what runners leave in their working
    /// folders, as `named` says.
    pub fn with_named(mut self, named: NamedOutputs) -> JobContext {
        self.node.named = named;
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
        self.node.seat(processes, places);
        self
    }
}
