//! Who runs each attempt, and its row of the job's report, as the ledger keeps them: an
//! attempt's row reaches the ledger before its recording, and the next holder of a
//! mini-batch learns of an attempt that ended with no word (its worker was killed, or lost
//! the broker) and reports it, naming the node that held it. So the report
//! (`processed_mini-batches.csv`) has a row for every attempt, whichever workers died.

use fleetrun_common::wire::MiniBatch;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::JobContext;
use crate::logs;

/// One attempt's holder: what its report row names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Holding {
    pub(super) node: String,
    pub(super) process: String,
    pub(super) attempt: u32,
    /// When the attempt started, as report rows write it.
    pub(super) start: String,
    /// Tells this attempt from any other, on any node.
    id: u64,
}

impl Holding {
    pub(super) fn new(node: &str, process: &str, attempt: u32) -> Holding {
        Holding {
            node: node.to_owned(),
            process: process.to_owned(),
            attempt,
            start: logs::now(),
            id: rand::random(),
        }
    }

    fn encode(&self) -> String {
        serde_json::to_string(self).expect("a holding always encodes")
    }
}

/// Notes in the ledger that `holding` runs `batch`, and reports an attempt that held it
/// before and ended with no word. The ledger not answering loses only the notes.
pub(super) async fn started(ctx: &JobContext, batch: &MiniBatch, holding: &Holding) {
    match ctx
        .job
        .attempt_started(batch.index, &holding.encode())
        .await
    {
        Ok(before) => report_lost(ctx, batch, before.as_deref(), &holding.node).await,
        Err(e) => {
            warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Cannot note who runs the mini-batch.");
        }
    }
}

/// Keeps the `row` of `holding`'s attempt of mini-batch `index`, which has ended, and
/// forgets its holder.
pub(super) async fn ended(ctx: &JobContext, index: u64, row: Option<&str>, holding: &Holding) {
    if let Err(e) = ctx.job.attempt_ended(index, row).await {
        warn!(job = %ctx.job.id(), mini_batch = index, attempt = holding.attempt, error = %e, "Cannot keep the attempt's report row.");
    }
}

/// For a mini-batch that came back past its attempts: reports the attempt that held it
/// last, lost with its worker, as node `by` learns of it.
pub(super) async fn lost_before(ctx: &JobContext, batch: &MiniBatch, by: &str) {
    match ctx.job.attempt_ended(batch.index, None).await {
        Ok(before) => report_lost(ctx, batch, before.as_deref(), by).await,
        Err(e) => {
            warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Cannot read who held the mini-batch.");
        }
    }
}

/// Keeps the report row of an attempt lost with its holder (`before`), noted by node `by`.
async fn report_lost(ctx: &JobContext, batch: &MiniBatch, before: Option<&str>, by: &str) {
    let Some(before) = before else {
        return;
    };
    let Ok(lost) = serde_json::from_str::<Holding>(before) else {
        warn!(job = %ctx.job.id(), mini_batch = batch.index, holder = before, "A mini-batch's holder is not one this worker reads.");
        return;
    };
    let cause = format!(
        "lost with node {}: the attempt ended with no word from it (the worker was killed or lost the broker); noted by node {by}",
        lost.node
    );
    let row = super::attempt::report_row(batch, &lost, "lost", Default::default(), None, &cause);
    if let Err(e) = ctx.job.report(&row).await {
        warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Cannot keep a lost attempt's report row.");
    }
}
