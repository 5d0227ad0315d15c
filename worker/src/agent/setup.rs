//! What an agent is given and what it answers: its configuration (the node's
//! [`WorkerConfig`]), its seams ([`Agent`]), where its jobs come from ([`Jobs`]), and what
//! it reports
//! ([`AgentEvent`]).

use std::sync::Arc;

use async_trait::async_trait;
use fleetrun_common::ledger::{JobState, Ledger, Status};
use fleetrun_common::queue::Queue;
use tokio::sync::mpsc;

use super::context::JobContext;
use crate::worker_config::WorkerConfig;

/// Deliveries a slot holds by default: one running, the next waiting in the runner's
/// channel, and two being finished in the background (a part stored, a recording in the
/// ledger, an acknowledgement: for a short `run()` they take longer than the run, and with
/// one fewer the slot often had nothing to send ahead; docs/benchmarks.md).
pub const DEFAULT_PREFETCH: u16 = 4;

/// Finds the job a message belongs to.
#[async_trait]
pub trait Jobs: Send + Sync {
    async fn get(&self, job: &str) -> Result<Option<Arc<JobContext>>, crate::job::JobError>;

    /// The job's context for a mini-batch of its `run`: one that serves an earlier run (the
    /// job was resumed since this node loaded it) is replaced by a new one.
    async fn get_for_run(
        &self,
        job: &str,
        run: u32,
    ) -> Result<Option<Arc<JobContext>>, crate::job::JobError> {
        let _ = run;
        self.get(job).await
    }

    /// Whether this node may work on the job: it holds, or has just won, one of the job's
    /// `node_count` places.
    async fn claim_place(&self, ctx: &JobContext) -> bool {
        ctx.node.has_place()
    }

    /// The pool's jobs not yet retired, oldest first: those whose lanes the node's slots
    /// share (see `share`).
    async fn live(&self) -> Result<Vec<String>, crate::job::JobError>;

    /// Returns once the pool's jobs may have changed (one was submitted, or one ended), for
    /// the node to share its slots out again at once. Never, by default: the share's period
    /// alone finds them.
    async fn changed(&self) {
        std::future::pending().await
    }
}

/// What the agent reports to whoever drives the job.
#[derive(Debug, Clone)]
pub enum AgentEvent {
    /// A recording moved the job's state (to Finalizing or Failed): the receiver owns what
    /// follows.
    Transitioned { job: String, status: Status },
    /// A runner of the job failed to start on this node (`processes`: the job's runner
    /// processes per node, as this node counts them).
    InitFailed {
        job: String,
        processes: u32,
        failure: String,
    },
    /// This node stopped trying to start runners for the job (init kept failing).
    GaveUp { job: String, reason: String },
    /// A runner's `init()` overran `3 × run_invocation_timeout + 30` while no runner of the
    /// job on this node was ready (CONTRACT §5 rule 3): the job fails unless a mini-batch
    /// has started somewhere.
    StuckInInit { job: String, reason: String },
}

pub struct Agent {
    pub config: WorkerConfig,
    pub queue: Arc<dyn Queue>,
    pub ledger: Arc<dyn Ledger>,
    pub jobs: Arc<dyn Jobs>,
    pub events: mpsc::UnboundedSender<AgentEvent>,
}

/// States in which the job's remaining mini-batches are no longer worked on.
pub fn is_stopped(state: JobState) -> bool {
    !state.accepts_work()
}
