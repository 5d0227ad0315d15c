//! Finishing a delivery whose `run()` returned, in the order that makes its output
//! exactly-once: store its part(s), record its outcome with the parts' reference in the
//! ledger, then settle the delivery (acknowledge it, or hand it back). [`Finish::settle`]
//! runs the whole sequence; a slot runs it in the background so that its runner gets the
//! next mini-batch at once.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use fleetrun_common::ledger::{Outcome, Status};
use fleetrun_common::queue::{Delivery, Disposition};
use tracing::{error, info, warn};

use super::holding::{self, Holding};
use super::{AgentEvent, JobContext, Shared, unavailable};
use crate::logs;
use crate::metrics::Metrics;
use crate::parts::{PartError, join_rows};
use crate::scratch::FolderError;

/// What finishing a returned mini-batch needs: its parts' bodies, its outcome and its report
/// row.
pub(super) struct Finish {
    pub(super) shared: Arc<Shared>,
    pub(super) ctx: Arc<JobContext>,
    pub(super) index: u64,
    /// The rows `run()` returned, as the part's body (`append_row` jobs).
    pub(super) rows: Option<Bytes>,
    /// Its lines of `failed_items.csv` (a short return lists every item).
    pub(super) failed: Option<Vec<String>>,
    pub(super) outcome: Outcome,
    pub(super) row: String,
    pub(super) holding: Holding,
}

impl Finish {
    /// Stores the parts, records the outcome, and settles `delivery` with what that gave;
    /// `slot` names the slot in logs.
    pub(super) async fn settle(self, slot: usize, delivery: Delivery) {
        let metrics = self.shared.agent.config.metrics.clone();
        let disposition = self.record().await;
        settle(slot, &metrics, delivery, disposition).await;
    }

    /// Stores the parts and records the outcome: `Ack` once recorded, else what becomes of
    /// the delivery.
    async fn record(self) -> Disposition {
        let Finish {
            shared,
            ctx,
            index,
            rows,
            failed,
            outcome,
            row,
            holding,
        } = self;
        let part = match rows {
            Some(body) => match store_part(&shared, &ctx, index, body, &row, &holding).await {
                Ok(part) => Some(part),
                Err(disposition) => return disposition,
            },
            None => None,
        };
        let part = match failed {
            Some(lines) => {
                let body = join_rows(&lines);
                match store_part(&shared, &ctx, index, body, &row, &holding).await {
                    Ok(failed) => crate::parts::reference(part.as_deref(), Some(&failed)),
                    Err(disposition) => return disposition,
                }
            }
            None => part,
        };
        // What the script wrote to output_dir reaches an S3 output before the mini-batch
        // counts as done.
        super::outdir::sync_logged(&ctx).await;
        if record_outcome(&shared, &ctx, index, outcome, part.as_deref(), &row).await {
            Disposition::Ack
        } else {
            Disposition::Requeue
        }
    }
}

/// Settles a delivery as decided, counting a broker that did not take it.
pub(super) async fn settle(
    slot: usize,
    metrics: &Metrics,
    delivery: Delivery,
    disposition: Disposition,
) {
    match delivery.settle(disposition).await {
        Ok(true) => {}
        Ok(false) => info!(slot, "Settlement not delivered; the broker will redeliver."),
        Err(e) => {
            metrics.broker_error();
            warn!(slot, error = %e, "Settling a delivery failed.");
        }
    }
}

/// Stores a part of mini-batch `index`; on failure, what becomes of the delivery: the job
/// fails for a folder that cannot take it, the mini-batch goes back untried when the
/// storage is unavailable, else it goes back to the queue.
async fn store_part(
    shared: &Shared,
    ctx: &Arc<JobContext>,
    index: u64,
    body: Bytes,
    row: &str,
    holding: &Holding,
) -> Result<String, Disposition> {
    match ctx.job.parts().put(index, body).await {
        Ok(part) => Ok(part),
        Err(PartError::Folder(e)) => Err(fail_job(shared, ctx, &e).await),
        Err(PartError::Storage(e)) if e.is_transient() => {
            let step = ("writing its part", &e);
            Err(unavailable::hand_back(shared, ctx, index, holding, row, step).await)
        }
        Err(e) => {
            warn!(job = %ctx.job.id(), mini_batch = index, error = %e, "Writing a part failed; requeueing.");
            holding::ended(ctx, index, Some(row), holding, false).await;
            Err(Disposition::Requeue)
        }
    }
}

/// Records an outcome in the ledger and reports a state change it caused.
pub(super) async fn record_outcome(
    shared: &Shared,
    ctx: &Arc<JobContext>,
    index: u64,
    outcome: Outcome,
    part: Option<&str>,
    row: &str,
) -> bool {
    let metrics = &shared.agent.config.metrics;
    match ctx.job.record(index, outcome, part, Some(row)).await {
        Ok(recorded) => {
            if recorded.first {
                metrics.items(outcome.succeeded, outcome.failed);
            }
            report_recorded(shared, ctx, recorded.transitioned, recorded.status);
            true
        }
        Err(e) => {
            metrics.ledger_error();
            warn!(job = %ctx.job.id(), mini_batch = index, error = %e, "Recording in the ledger failed; requeueing.");
            false
        }
    }
}

/// Acts on a step of the ledger: stops the job's work if it no longer runs, and hands a
/// state change this node made (`transitioned`) to whoever drives the job.
pub(super) fn report_recorded(
    shared: &Shared,
    ctx: &JobContext,
    transitioned: bool,
    status: Status,
) {
    if !status.state.accepts_work() {
        ctx.stop.cancel();
    }
    if transitioned {
        let _ = shared.agent.events.send(AgentEvent::Transitioned {
            job: ctx.job.id().to_owned(),
            status,
        });
    }
}

/// Fails the job for a folder of this node's that cannot take its writes: a system error,
/// which every further attempt would meet, and no item's fault. Returns what
/// becomes of the delivery in hand: dropped, as the job no longer runs, or handed back
/// untried (no attempt spent) when the ledger could not be told.
pub(super) async fn fail_job(
    shared: &Shared,
    ctx: &JobContext,
    folder: &FolderError,
) -> Disposition {
    let reason = system_error(ctx, folder);
    ctx.logs.log(
        logs::JobLogs::sys_error(&shared.agent.config.node_id, "_main"),
        &format!("Failing the job: {reason}"),
    );
    error!(job = %ctx.job.id(), folder = %folder.folder.display(), error = %folder.source, "A folder of this node cannot take its writes; failing the job.");
    match ctx.job.fail(&reason, Some(&ctx.logs)).await {
        Ok(status) => {
            if !status.state.accepts_work() {
                ctx.stop.cancel();
            }
            Disposition::Ack
        }
        Err(e) => {
            warn!(job = %ctx.job.id(), error = %e, "Cannot fail the job in the ledger; handing the mini-batch back.");
            Disposition::Return
        }
    }
}

/// The cause of a job failed by a folder of the node's: which folder, what is wrong with it,
/// and what to do. A folder in the job's output is the output's; any other is scratch.
fn system_error(ctx: &JobContext, e: &FolderError) -> String {
    let output = ctx.job.output().local_path("_parts");
    let in_output =
        matches!(output.as_deref().and_then(Path::parent), Some(o) if e.folder.starts_with(o));
    let hint = match (in_output, e.is_out_of_space()) {
        (true, true) => "free space there",
        (true, false) => "make it writable",
        (false, true) => {
            "free space there, or set TMPDIR (fleetrun-worker: --cache-dir) to another folder"
        }
        (false, false) => "set TMPDIR (fleetrun-worker: --cache-dir) to a writable folder",
    };
    format!(
        "system error: the {} folder {} {}: {}; {hint}",
        if in_output { "output" } else { "scratch" },
        e.folder.display(),
        e.state(),
        e.source
    )
}
