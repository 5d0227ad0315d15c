//! The dead-letter recorder: what reaches the pool's dead-letter queue counts against its job.

use std::sync::Arc;
use std::time::Duration;

use fleetrun_common::queue::{Delivery, Disposition};
use fleetrun_common::wire::MiniBatch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::finalize::conclude;
use super::load::FleetJobs;
use super::settings::Fleet;
use crate::agent::{self, Jobs};

/// Dead-lettered mini-batches count as failed in their job's ledger, so a crash loop can
/// neither stall a job nor hide from its error count. The recorder reads the recorders'
/// inbox, a copy of each dead letter, and holds nothing: a message it cannot count (it does
/// not decode, or its job is unknown here) is logged and acknowledged, since the dead-letter
/// queue keeps the message itself for operators (`fleetrun dlq`).
pub(super) async fn record_dead_letters(
    fleet: Fleet,
    jobs: Arc<FleetJobs>,
    drain: CancellationToken,
) {
    const PREFETCH: u16 = 16;
    let mut consumer = match fleet.queue.consume_dead(PREFETCH).await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "Cannot consume the dead-letter inbox.");
            return;
        }
    };
    loop {
        let delivery = tokio::select! {
            _ = drain.cancelled() => return,
            d = consumer.next() => d,
        };
        let delivery = match delivery {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "Reading the dead-letter inbox failed; retrying.");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let disposition = record(&fleet, &jobs, &delivery).await;
        if disposition == Disposition::Requeue {
            // The ledger did not answer: try again in a moment, not in a tight loop.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let _ = delivery.settle(disposition).await;
    }
}

/// What becomes of one copy in the inbox: acknowledged once counted (or once it is clear it
/// cannot be), given back when the ledger did not answer.
async fn record(fleet: &Fleet, jobs: &FleetJobs, delivery: &Delivery) -> Disposition {
    let batch = match MiniBatch::decode(&delivery.body) {
        Ok(batch) => batch,
        Err(e) => {
            info!(bytes = delivery.body.len(), error = %e, "A dead letter does not decode; it stays in the dead-letter queue for operators.");
            return Disposition::Ack;
        }
    };
    let reason = delivery.dead_reason.as_deref().unwrap_or("unknown");
    match jobs.get_for_run(&batch.job, batch.run).await {
        // Of a run the job was resumed from: the resumed run published it again.
        Ok(Some(ctx)) if batch.run < ctx.run() => Disposition::Ack,
        Ok(Some(ctx)) => {
            let cause = format!("dead-lettered by the broker ({reason})");
            match agent::record_failed_batch(&ctx, &batch, delivery.attempt, &cause, None).await {
                Ok(recorded) => {
                    if recorded.transitioned {
                        conclude(&*fleet.ledger, &ctx, recorded.status).await;
                    }
                    Disposition::Ack
                }
                Err(_) => Disposition::Requeue,
            }
        }
        Ok(None) => {
            info!(job = %batch.job, mini_batch = batch.index, "A dead letter of a job this pool does not know; it stays in the dead-letter queue for operators.");
            Disposition::Ack
        }
        Err(e) => {
            warn!(job = %batch.job, error = %e, "Cannot look up a dead letter's job; trying again.");
            Disposition::Requeue
        }
    }
}
