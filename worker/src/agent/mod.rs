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
//! Imports form a tree (`scripts/module-graph.py --check worker/src/agent`); from the
//! bottom up:
//!
//! - `setup`: what an agent is given and answers (the node's `WorkerConfig`, `Agent`, `Jobs`,
//!   `AgentEvent`); `context`: `JobContext`, a job as a node sees it (the `Job`
//!   handle, and `node_state`'s `NodeState`, what this node keeps of it); `shared`: what
//!   the slots share.
//! - `slot`: a slot's loop, and nothing else: take a delivery, decide, conclude its
//!   `verdict` (settle, finish, isolate, run again).
//! - `attempt`: a slot's `Bench` (runner seat, staging, look-ahead) and one `run()` attempt
//!   on it, begun and ended.
//! - `settle`: the pure rules an attempt's outcome is settled by (`returns`: the
//!   short-return rule).
//! - `finish`: a returned mini-batch finished: part, ledger record, acknowledgement, in
//!   that order.
//! - `report`: an attempt's report row and its lines of `failed_items.csv`.
//! - `isolate`: a mini-batch that failed its attempts, split down to the items that fail
//!   alone.
//! - `holder`, `holding`: who runs each attempt, kept in the ledger, so an attempt lost with
//!   its worker still gets its report row.
//! - `share`: which job each slot consumes for: the node's slots shared among its pool's
//!   jobs, by priority, evenly, within each job's seats; `seats`: a job's seats on the node.
//! - `runner`: a slot's runner over its life (`RunnerSeat`): started, or why not
//!   (`StartFailure`), stopped, killed.
//! - `environment`: a runner's environment, which holds none of fleetrun's credentials.
//! - `ahead`: the deliveries taken ahead while the runner works (`LookAhead`).
//! - `stage`, `stage_error`, `tabular`: staging a mini-batch's inputs into the node's cache.
//! - `unavailable`: a mini-batch handed back untried when storage does not answer.
//! - `workdir`: each runner's working folder, holding the source directory.
//! - `outdir`: `EntryScript().output_dir`, uploaded to an S3 output.
//! - `named`, `named_outputs`: named outputs (`${{outputs.name}}`), delivered after every
//!   mini-batch; files left in working folders, kept when the job ends.

mod ahead;
mod attempt;
mod context;
pub mod environment;
mod finish;
mod fit;
mod holder;
pub(crate) mod holding;
mod isolate;
pub mod named;
mod named_outputs;
mod node_state;
pub mod outdir;
mod report;
mod returns;
mod runner;
pub mod seats;
mod settle;
mod setup;
pub mod share;
mod shared;
mod slot;
mod stage;
mod stage_error;
mod tabular;
pub mod times;
mod unavailable;
mod verdict;
pub mod workdir;

pub use crate::parts::join_rows;
pub use attempt::{RecordError, record_failed_batch};
pub use context::JobContext;
pub use holder::{HeldAttempt, held_attempts};
pub use node_state::NodeState;
pub use settle::LOST_LIMIT;
pub use setup::{Agent, AgentEvent, DEFAULT_PREFETCH, Jobs, is_stopped};

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, warn};

use crate::gpu::GpuPool;
use shared::Shared;
use slot::Slot;

/// Runs the agent until `drain` is cancelled (finish the mini-batch in hand, take no more)
/// or `abort` is (kill the runners now; unsettled deliveries go back to the queue).
pub async fn run(agent: Agent, drain: CancellationToken, abort: CancellationToken) {
    // Before any runner starts: a runner killed for memory is told by the count growing.
    crate::oom::watch();
    // Only what the worker's own CUDA_VISIBLE_DEVICES lists, when it inherited one; MIG
    // instances by UUID.
    let devices = crate::gpu::node_devices(agent.config.gpus);
    let gpus = GpuPool::with_devices(devices);
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
        let staging = shared.agent.config.staging_dir();
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
