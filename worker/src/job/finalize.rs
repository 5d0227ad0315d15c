//! How a job ends: its finalization under a renewed claim, `job_result.txt`, and failing a
//! job (CONTRACT §5 rule 2 over the whole fleet).

use std::sync::atomic::Ordering;
use std::time::Duration;

use fleetrun_common::ledger::{JobState, Ledger, Status};
use tracing::{info, warn};

use crate::agent::JobContext;

/// How long a finalization claim lasts unless renewed (every third of it): a worker that
/// dies while finalizing is replaced, this long after, by another that served the job.
pub(super) const FINALIZE_LEASE: Duration = Duration::from_secs(10);

/// Concludes a job whose state a recording just moved (the caller saw `transitioned`), or
/// one found Finalizing: finalizes it if every mini-batch is done and this node can claim
/// the finalization, then writes `logs/job_result.txt`. Returns `Finalizing` when another
/// node holds the claim (and writes nothing).
pub async fn conclude(ledger: &dyn Ledger, ctx: &JobContext, status: Status) -> JobState {
    // From before the finalization moves the job's state until its results are written: this
    // node lets the job go only after.
    let _ending = ctx.job.ending().await;
    let state = if status.state == JobState::Finalizing {
        match finalize_claimed(ledger, ctx).await {
            // Another node holds the claim, or took it over while this one worked.
            None | Some(JobState::Finalizing) => return JobState::Finalizing,
            Some(state) => state,
        }
    } else {
        status.state
    };
    let status = ctx.job.status().await.ok().flatten().unwrap_or(status);
    info!(job = %ctx.job.id(), state = %state, "Job ended.");
    // This node's runners' times so far reach the results; other nodes' as last flushed.
    ctx.flush_times().await;
    ctx.job.write_results(Some(&ctx.logs), &status).await;
    state
}

/// Finalizes the job if this node can claim it, renewing the claim while it works; `None`
/// if another node holds it (or this node is at it already).
async fn finalize_claimed(ledger: &dyn Ledger, ctx: &JobContext) -> Option<JobState> {
    if ctx.node.finalizing.swap(true, Ordering::Relaxed) {
        return None;
    }
    let claim = || ledger.claim_finalization(ctx.job.id(), &ctx.node.finalizer, FINALIZE_LEASE);
    let state = if claim().await.unwrap_or(false) {
        let finalize = finalize_job(ledger, ctx);
        tokio::pin!(finalize);
        Some(loop {
            tokio::select! {
                state = &mut finalize => break state,
                _ = tokio::time::sleep(FINALIZE_LEASE / 3) => {
                    if let Err(e) = claim().await {
                        warn!(job = %ctx.job.id(), error = %e, "Cannot renew the finalization claim.");
                    }
                }
            }
        })
    } else {
        None
    };
    ctx.node.finalizing.store(false, Ordering::Relaxed);
    state
}

/// Joins the parts and completes the job; for the holder of the finalization claim, who
/// alone may fail the job over an output it could not write. The parts are removed only
/// once the job is Completed, so a finalizer that took over from a stalled one never finds
/// them gone.
async fn finalize_job(ledger: &dyn Ledger, ctx: &JobContext) -> JobState {
    let still_held = || async {
        ledger
            .claim_finalization(ctx.job.id(), &ctx.node.finalizer, FINALIZE_LEASE)
            .await
            .unwrap_or(false)
    };
    ctx.job.finish(&*ctx.input, still_held).await
}

/// Fails the job if its init failures over all nodes break CONTRACT §5 rule 2; `detail`
/// ends the reason. True if the rule fails the job.
pub(super) async fn check_init_failures(
    ctx: &JobContext,
    processes: u32,
    failures: u64,
    detail: &str,
) -> bool {
    check_init_failures_at(ctx, processes, failures, detail, ctx.job.age()).await
}

/// [`check_init_failures`] for a job `age` old by the caller's clock.
pub(super) async fn check_init_failures_at(
    ctx: &JobContext,
    processes: u32,
    failures: u64,
    detail: &str,
    age: Duration,
) -> bool {
    let Some(reason) =
        super::driver::init_failures_fail_job(ctx.job.spec().node_count, processes, failures, age)
    else {
        return false;
    };
    let reason = format!("{reason}; {detail}");
    ctx.job.fail_or_warn(&reason, Some(&ctx.logs)).await;
    true
}
