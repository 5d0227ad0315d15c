//! Storage that does not take a request within its client's retries (S3 throttling, failing
//! or unreachable: [`StorageError::is_transient`]) is the infrastructure's fault, not the
//! items': the mini-batch in hand goes back to the queue untried — no attempt spent, no item
//! failed — for this node a little later or for another node.

use std::time::Duration;

use fleetrun_common::ledger::Outcome;
use fleetrun_common::queue::Disposition;
use fleetrun_common::storage::StorageError;
use fleetrun_common::wire::MiniBatch;
use tracing::warn;

use super::holding::{self, Holding};
use super::report::report_row;
use super::{JobContext, Shared};
use crate::logs;

/// How long the mini-batch is held before it goes back: the storage gets a moment, and a
/// slot does not spin on a queue whose every mini-batch meets the same fault.
pub(super) const STORAGE_PAUSE: Duration = Duration::from_secs(2);

/// Hands mini-batch `index` back untried because `step` of it (staging its inputs,
/// writing its part) met `e`, a fault of the storage's: logs and counts it, ends
/// `holding`'s attempt uncharged with its report `row`, and pauses. Returns how the
/// delivery is settled.
pub(super) async fn hand_back(
    shared: &Shared,
    ctx: &JobContext,
    index: u64,
    holding: &Holding,
    row: &str,
    (step, e): (&str, &StorageError),
) -> Disposition {
    let config = &shared.agent.config;
    config.metrics.storage_hand_back();
    warn!(job = %ctx.job.id(), mini_batch = index, error = %e, "Storage unavailable while {step}; handing the mini-batch back untried.");
    ctx.logs.log(
        logs::JobLogs::sys_error(&holding.node, &holding.process),
        &format!(
            "mini-batch {index} attempt {}: {step}: {e}; handed back untried, no attempt spent.",
            holding.attempt
        ),
    );
    holding::ended(ctx, index, Some(row), holding, false).await;
    tokio::select! {
        _ = ctx.stop.cancelled() => {}
        _ = tokio::time::sleep(STORAGE_PAUSE) => {}
    }
    Disposition::Return
}

/// The report row's result of an attempt handed back for the storage's fault.
const HANDED_BACK: &str = "storage_unavailable";

/// Hands a mini-batch back untried because staging the inputs of `staged` (it, or a piece
/// of it being isolated, with the note its report row starts with) met `e`.
pub(super) async fn staging_unavailable(
    shared: &Shared,
    ctx: &JobContext,
    (staged, note): (&MiniBatch, &str),
    holding: &Holding,
    e: &StorageError,
) -> Disposition {
    let cause = format!("{note}staging inputs: {e}");
    let row = report_row(
        staged,
        holding,
        HANDED_BACK,
        Outcome::default(),
        None,
        &cause,
    );
    let step = ("staging inputs", e);
    hand_back(shared, ctx, staged.index, holding, &row, step).await
}
