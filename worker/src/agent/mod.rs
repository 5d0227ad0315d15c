//! The node agent: takes mini-batches off the queue and drives one runner process per slot.
//!
//! Each slot is a loop: take a delivery, decide what becomes of it, settle it. The order of
//! effects makes a mini-batch's output exactly-once even though delivery is at-least-once:
//! store the output part, then record the outcome with the part's reference in the ledger
//! (the first recording wins, reference included), then acknowledge. A worker killed between
//! any two steps leaves the message unacknowledged; its re-run stores another part, which
//! the ledger never names, and its second recording changes nothing.
//!
//! # Layout
//!
//! - `slot`: a slot's loop and its verdict on each delivery, settled in one place.
//! - `attempt`: one `run()` attempt on a slot's bench (runner, staging, look-ahead), begun
//!   and ended, and the verdict it gives.
//! - `settle`: what an attempt's outcome makes of its mini-batch (pure rules).
//! - `finish`: a returned mini-batch finished: part, ledger record, acknowledgement.
//! - `report`: an attempt's report row and its lines of `failed_items.csv`.
//! - `isolate`: a mini-batch that failed its attempts, split down to the items that fail
//!   alone.
//! - `holding`: who runs each attempt, kept in the ledger, so an attempt lost with its
//!   worker still gets its report row.
//! - `share`: which job each slot consumes for: the node's slots shared among its pool's
//!   jobs, by priority, evenly, within each job's seats.
//! - `runner`: a slot's runner over its life: started (or why not), stopped, killed.
//! - `environment`: a runner's environment, which holds none of fleetrun's credentials.
//! - `ahead`: the delivery taken ahead while the runner works.
//! - `stage`: staging a mini-batch's inputs into the node's cache.
//! - `unavailable`: a mini-batch handed back untried when storage does not answer.
//! - `workdir`: each runner's working folder, holding the source directory.
//! - `outdir`: `EntryScript().output_dir`, uploaded to an S3 output.
//! - `named`: named outputs (`${{outputs.name}}`), delivered after every mini-batch; files
//!   left in working folders, kept when the job ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fleetrun_common::ledger::{JobState, Ledger, Status};
use fleetrun_common::protocol::RunContext;
use fleetrun_common::queue::Queue;
use fleetrun_common::storage::Storage;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, warn};

use crate::gpu::GpuPool;
use crate::job::Job;
use crate::logs::JobLogs;
use crate::process::Launcher;

mod ahead;
mod attempt;
pub mod environment;
mod finish;
pub(crate) mod holding;
mod isolate;
pub mod named;
pub mod outdir;
mod report;
mod returns;
mod runner;
pub mod seats;
mod settle;
pub mod share;
mod slot;
mod stage;
mod tabular;
mod unavailable;
pub mod workdir;

pub use crate::parts::join_rows;
pub use attempt::{RecordError, record_failed_batch};
pub use holding::{HeldAttempt, held_attempts};
use slot::Slot;

/// How often a slot re-reads a job's state from the ledger between its own recordings.
const STATE_RECHECK: Duration = Duration::from_millis(500);

/// Deliveries a slot holds by default: one running, the next waiting in the runner's
/// channel, and two being finished in the background (a part stored, a recording in the
/// ledger, an acknowledgement: for a short `run()` they take longer than the run, and with
/// one fewer the slot often had nothing to send ahead; docs/benchmarks.md).
pub const DEFAULT_PREFETCH: u16 = 4;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's id in logs (`sys/node/<node_id>/…`).
    pub node_id: String,
    /// Runner slots (processes) on this node.
    pub processes: usize,
    /// Unsettled deliveries each slot may hold.
    pub prefetch: u16,
    pub runner_exe: PathBuf,
    /// Starts the runners: real processes, or a flow test's fakes.
    pub launcher: Arc<dyn Launcher>,
    /// Where inputs that are not local files are staged.
    pub staging_dir: PathBuf,
    /// Start every slot's runner for this job before taking work (one-job runs).
    pub warm_job: Option<String>,
    /// GPUs on this node, handed to runners one index each (CONTRACT.md §3).
    pub gpus: usize,
    /// What the node counts, for `/metrics`.
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl AgentConfig {
    /// The node's cache folder: it holds the staging folder and the working folders.
    pub(crate) fn cache(&self) -> &std::path::Path {
        self.staging_dir.parent().unwrap_or(&self.staging_dir)
    }
}

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
    init_failures: AtomicU32,
    gave_up: AtomicBool,
    /// The job's Python on this node, resolved once before its first runner starts, or why
    /// fleetrun cannot run it.
    python: tokio::sync::OnceCell<Result<fleetrun_common::python::Python, String>>,
    started_noted: AtomicBool,
    end_noted: AtomicBool,
    /// The node has let the job go (see `job::watch::let_go`): held while it does.
    pub(crate) let_go: tokio::sync::Mutex<bool>,
    gpus_noted: AtomicBool,
    /// This node's runners of the job that finished init and live.
    ready_runners: Arc<AtomicU32>,
    /// How many of this node's slots may run the job at once.
    pub seats: Arc<seats::Seats>,
    /// This node is one of the job's `node_count` nodes (always, where places are not kept).
    place: AtomicBool,
    last_check: std::sync::Mutex<Instant>,
    /// What of `EntryScript().output_dir` reached an S3 output (see `outdir`).
    pub(crate) output_sync: tokio::sync::Mutex<outdir::Uploaded>,
    /// The job's named outputs on this node, and the node's working folders (see `named`).
    pub(crate) named: named::NamedOutputs,
    /// The job's resource monitor on this node (`perf/<node_id>/`).
    pub monitor: crate::monitor::Monitor,
    /// The job's run this context serves (the ledger's `Status::run`): a mini-batch of a
    /// later run finds the job resumed and a new context; one of an earlier run is dropped.
    run: u32,
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
            seats: seats::Seats::new(crate::node::MAX_PROCESSES as usize),
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
        }
    }

    /// Delivers the job's named outputs, and keeps what runners leave in their working
    /// folders, as `named` says.
    pub fn with_named(mut self, named: named::NamedOutputs) -> JobContext {
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
        self.seats = seats::Seats::new(processes);
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
    fn due_for_check(&self) -> bool {
        let mut last = self.last_check.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= STATE_RECHECK {
            *last = Instant::now();
            true
        } else {
            false
        }
    }
}

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
        ctx.has_place()
    }

    /// The pool's jobs not yet retired, oldest first: those whose lanes the node's slots
    /// share (see [`share`]).
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
    pub config: AgentConfig,
    pub queue: Arc<dyn Queue>,
    pub ledger: Arc<dyn Ledger>,
    pub jobs: Arc<dyn Jobs>,
    pub events: mpsc::UnboundedSender<AgentEvent>,
}

/// Runs the agent until `drain` is cancelled (finish the mini-batch in hand, take no more)
/// or `abort` is (kill the runners now; unsettled deliveries go back to the queue).
pub async fn run(agent: Agent, drain: CancellationToken, abort: CancellationToken) {
    // Before any runner starts: a runner killed for memory is told by the count growing.
    crate::oom::watch();
    let gpus = GpuPool::new(agent.config.gpus);
    let agent_slots = agent.config.processes.max(1);
    let shared = Arc::new(Shared {
        agent,
        next_process: AtomicU32::new(0),
        gpus,
        starting: std::sync::Mutex::new(()),
        share: share::Share::new(agent_slots),
    });
    // The first share before any slot starts: a slot warming a runner keeps it.
    shared.share.share(&shared.agent).await;
    let sharing = {
        let (shared, stop) = (shared.clone(), drain.clone());
        tokio::spawn(async move { shared.share.keep(&shared.agent, stop).await })
    };
    let mut slots = tokio::task::JoinSet::new();
    for index in 0..agent_slots {
        let staging = shared.agent.config.staging_dir.clone();
        let slot = Slot {
            shared: shared.clone(),
            index,
            bench: attempt::Bench {
                shared: shared.clone(),
                seat: Default::default(),
                stager: stage::Stager::new(staging, index),
                ahead: Default::default(),
            },
            drain: drain.clone(),
            finishing: tokio::task::JoinSet::new(),
            isolations: Default::default(),
        };
        // Every line a slot logs names its node: one worker's lines among a fleet's.
        let span = tracing::info_span!("slot", node = %shared.agent.config.node_id, slot = index);
        slots.spawn(slot.run(drain.clone(), abort.clone()).instrument(span));
    }
    while let Some(result) = slots.join_next().await {
        if let Err(e) = result {
            warn!(error = %e, "A runner slot ended abnormally.");
        }
    }
    sharing.abort();
}

struct Shared {
    agent: Agent,
    next_process: AtomicU32,
    gpus: Arc<GpuPool>,
    /// Held while a start takes its name and its GPU, so that process names and GPU indexes
    /// are handed out in the same order.
    starting: std::sync::Mutex<()>,
    /// Which job each slot consumes for.
    share: share::Share,
}

impl Shared {
    /// The next process's name (`processNNN`, never reused) and its GPU.
    fn next_start(&self) -> (String, Option<crate::gpu::GpuLease>) {
        let _in_order = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        let number = self
            .next_process
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (format!("process{number:03}"), self.gpus.acquire())
    }
}

/// Deliveries of a mini-batch lost with a worker or its broker connection (beyond the
/// attempts its script may spend) before it is failed: infrastructure faults spend none of
/// the script's `run_max_try` attempts, and have this bound of their own. The broker's own
/// limit ([`crate::job::POOL_DELIVERY_LIMIT`]) stands above both for `run_max_try` up to 80.
pub const LOST_LIMIT: u32 = 20;

/// Whether a delivery numbered `attempt` has come back more often than the script's attempts
/// and [`LOST_LIMIT`] allow: it is failed untried.
fn lost_too_often(attempt: u32, spec: &fleetrun_config::JobSpec) -> bool {
    attempt > spec.run_max_try + LOST_LIMIT
}

/// States in which the job's remaining mini-batches are no longer worked on.
pub fn is_stopped(state: JobState) -> bool {
    !state.accepts_work()
}

/// What `run(mini_batch, mini_batch_context)` receives with `batch`.
fn run_context(ctx: &JobContext, batch: &fleetrun_common::wire::MiniBatch) -> RunContext {
    RunContext {
        partition_key_value: batch.partition.clone(),
        dataset: ctx.job.spec().input.location().to_string(),
    }
}
