//! The look-ahead: the next deliveries, taken and sent to the runner while it works on the
//! one before. A runner that holds its replies back (`InitParams::hold_replies`) gets up to
//! `HELD_REPLIES` of them, so that it always has the next in hand while it holds; one that
//! does not (a job with named outputs), the next one only. Once a delivery cannot be sent
//! (another job's, say), nothing is taken after it: the runner answers in the order it was
//! sent, and that one goes to it only when its turn comes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use fleetrun_common::queue::{Consumer, Delivery};
use fleetrun_common::wire::MiniBatch;
use futures::FutureExt;

use super::JobContext;
use super::slot::{Slot, Verdict};
use super::stage::Staged;

/// A delivery taken while the runner ran another mini-batch, so that the runner finds its
/// next one waiting in its channel instead of waiting for a round trip through the agent.
pub(super) struct Ahead {
    pub(super) delivery: Delivery,
    /// Set when it was sent to this slot's runner (its job's, inputs staged); otherwise, or
    /// once that runner is lost, it goes the usual way when its turn comes.
    pub(super) sent: Option<Sent>,
}

pub(super) struct Sent {
    pub(super) ctx: Arc<JobContext>,
    pub(super) batch: MiniBatch,
    pub(super) staged: Staged,
}

impl Slot {
    /// Takes the next deliveries already in hand and, while they are for the job the runner
    /// runs, stages their inputs and sends them: the runner starts each as soon as it has
    /// returned the one before.
    pub(super) async fn look_ahead(
        &mut self,
        ctx: &Arc<JobContext>,
        consumer: &mut Box<dyn Consumer>,
    ) {
        let depth = if ctx.job.spec().outputs.is_empty() {
            fleetrun_common::protocol::HELD_REPLIES
        } else {
            1
        };
        while self.ahead.len() < depth && self.ahead.iter().all(|a| a.sent.is_some()) {
            if !self.take_ahead(ctx, consumer).await {
                return;
            }
        }
    }

    /// Takes the next delivery if one is already in hand (false: none was), and sends it
    /// when it may.
    async fn take_ahead(
        &mut self,
        ctx: &Arc<JobContext>,
        consumer: &mut Box<dyn Consumer>,
    ) -> bool {
        if self.drain.is_cancelled() || !self.isolations.is_empty() || !self.keeps(ctx.job.id()) {
            // A slot whose share moved on takes no more of this job: it changes jobs after
            // the mini-batch it runs.
            return false;
        }
        let Some(Ok(delivery)) = consumer.next().now_or_never() else {
            return false;
        };
        let sent = match MiniBatch::decode(&delivery.body) {
            Ok(batch)
                if batch.job == ctx.job.id()
                    && !super::lost_too_often(delivery.attempt, ctx.job.spec())
                    && !ctx.stop.is_cancelled()
                    && !ctx.gave_up.load(Ordering::Relaxed) =>
            {
                // A staging failure is met again, and handled, when its turn comes.
                match self.stage(ctx, &batch).await {
                    Ok(mut staged) => {
                        let active = self.runner.as_mut().expect("running the job");
                        if staged.send(&mut *active.process, ctx, &batch).await.is_ok() {
                            Some(Sent {
                                ctx: ctx.clone(),
                                batch,
                                staged,
                            })
                        } else {
                            staged.clean().await;
                            None
                        }
                    }
                    Err(_) => None,
                }
            }
            _ => None,
        };
        self.ahead.push_back(Ahead { delivery, sent });
        true
    }

    /// Handles a delivery taken ahead: one sent to the runner is already running there; any
    /// other goes the usual way.
    pub(super) async fn handle_ahead(&mut self, ahead: Ahead, consumer: &mut Box<dyn Consumer>) {
        let Some(Sent { ctx, batch, staged }) = ahead.sent else {
            return self.handle(ahead.delivery, consumer).await;
        };
        while self.finishing.try_join_next().is_some() {}
        let verdict = if ctx.stop.is_cancelled() {
            // Its reply must never be taken for another mini-batch's.
            self.kill_runner().await;
            staged.clean().await;
            Verdict::Drop
        } else {
            let attempt = ahead.delivery.attempt;
            self.attempt(&ctx, &batch, attempt, Some(staged), consumer)
                .await
        };
        self.conclude(ahead.delivery, verdict).await;
    }
}
