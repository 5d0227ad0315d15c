//! The dead-letter recorder: what reaches the pool's dead-letter queue counts against its job.

use std::sync::Arc;
use std::time::Duration;

use fleetrun_common::queue::Disposition;
use fleetrun_common::wire::MiniBatch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::finalize::conclude;
use super::load::FleetJobs;
use super::settings::Fleet;
use crate::agent::{self, Jobs};

/// Dead-lettered mini-batches count as failed in their job's ledger, so a crash loop can
/// neither stall a job nor hide from its error count. Messages that do not decode stay in
/// the dead-letter queue for operators: this consumer holds them unacknowledged.
pub(super) async fn record_dead_letters(
    fleet: Fleet,
    jobs: Arc<FleetJobs>,
    drain: CancellationToken,
) {
    const HOLD: u16 = 1_000;
    let mut consumer = match fleet.queue.consume_dead(HOLD).await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "Cannot consume the dead-letter queue.");
            return;
        }
    };
    let mut held = Vec::new();
    loop {
        let delivery = tokio::select! {
            _ = drain.cancelled() => return,
            d = consumer.next() => d,
        };
        let delivery = match delivery {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "Reading the dead-letter queue failed; retrying.");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Ok(batch) = MiniBatch::decode(&delivery.body) else {
            held.push(delivery);
            continue;
        };
        let reason = delivery
            .dead_reason
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let disposition = match jobs.get_for_run(&batch.job, batch.run).await {
            // Of a run the job was resumed from: the resumed run published it again.
            Ok(Some(ctx)) if batch.run < ctx.run() => Disposition::Ack,
            Ok(Some(ctx)) => {
                let cause = format!("dead-lettered by the broker ({reason})");
                match agent::record_failed_batch(&ctx, &batch, delivery.attempt, &cause, None).await
                {
                    Ok(recorded) => {
                        if recorded.transitioned {
                            conclude(&*fleet.ledger, &ctx, recorded.status).await;
                        }
                        Disposition::Ack
                    }
                    Err(_) => Disposition::Requeue,
                }
            }
            // A job this pool does not know: keep it for operators.
            _ => {
                held.push(delivery);
                continue;
            }
        };
        let _ = delivery.settle(disposition).await;
    }
}
