//! Who runs each attempt, and its row of the job's report, as the ledger keeps them: an
//! attempt's row reaches the ledger before its recording, and the next holder of a
//! mini-batch learns of an attempt that ended with no word (its worker was killed, or lost
//! the broker) and reports it, naming the node that held it. So the report
//! (`processed_mini-batches.csv`) has a row for every attempt, whichever workers died.

use fleetrun_common::wire::MiniBatch;
use tracing::warn;

use super::JobContext;
pub(crate) use super::holder::Holding;
/// Re-exported where `job::lifecycle` reads it.
pub(crate) use super::holder::describe_in_flight;

/// Notes in the ledger that `holding` runs `batch`, reports an attempt that held it before
/// and ended with no word, and numbers `holding`'s attempt from the attempts the mini-batch
/// spent. False when the ledger did not answer: the number is left as it was.
pub(super) async fn started(ctx: &JobContext, batch: &MiniBatch, holding: &mut Holding) -> bool {
    match ctx
        .job
        .attempt_started(batch.index, &holding.encode())
        .await
    {
        Ok(started) => {
            holding.attempt = started.spent + 1;
            let lost = started.lost.as_deref();
            report_lost(ctx, batch, lost, started.spent + 1, &holding.node).await;
            true
        }
        Err(e) => {
            warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Cannot note who runs the mini-batch.");
            false
        }
    }
}

/// Keeps the `row` of `holding`'s attempt of mini-batch `index`, which has ended, spends it
/// when it failed by the script's fault (`charged`), and forgets its holder.
pub(super) async fn ended(
    ctx: &JobContext,
    index: u64,
    row: Option<&str>,
    holding: &Holding,
    charged: bool,
) {
    if let Err(e) = ctx.job.attempt_ended(index, row, charged).await {
        warn!(job = %ctx.job.id(), mini_batch = index, attempt = holding.attempt, error = %e, "Cannot keep the attempt's report row.");
    }
}

/// For a mini-batch lost with its workers too often: reports the attempt that held it
/// last (numbered `attempt`), lost with its worker, as node `by` learns of it.
pub(super) async fn lost_before(ctx: &JobContext, batch: &MiniBatch, attempt: u32, by: &str) {
    match ctx.job.attempt_ended(batch.index, None, false).await {
        Ok(before) => report_lost(ctx, batch, before.as_deref(), attempt, by).await,
        Err(e) => {
            warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Cannot read who held the mini-batch.");
        }
    }
}

/// Keeps the report row of attempt `attempt`, lost with its holder (`before`), noted by
/// node `by`.
async fn report_lost(
    ctx: &JobContext,
    batch: &MiniBatch,
    before: Option<&str>,
    attempt: u32,
    by: &str,
) {
    let Some(before) = before else {
        return;
    };
    let Ok(mut lost) = serde_json::from_str::<Holding>(before) else {
        warn!(job = %ctx.job.id(), mini_batch = batch.index, holder = before, "A mini-batch's holder is not one this worker reads.");
        return;
    };
    lost.attempt = attempt;
    let cause = format!(
        "lost with node {}: the attempt ended with no word from it (the worker was killed or lost the broker); noted by node {by}",
        lost.node
    );
    let row = super::report::report_row(batch, &lost, "lost", Default::default(), None, &cause);
    if let Err(e) = ctx.job.report(&row).await {
        warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Cannot keep a lost attempt's report row.");
    }
}
