//! The look-ahead: the next deliveries, taken and sent to the runner while it works on the
//! one before. A runner that holds its replies back (`InitParams::hold_replies`) gets up to
//! `HELD_REPLIES` of them, so that it always has the next in hand while it holds; one that
//! does not (a job with named outputs), the next one only. Once a delivery cannot be sent
//! (another job's, say), nothing is taken after it: the runner answers in the order it was
//! sent, and that one goes to it only when its turn comes.
//!
//! [`LookAhead`] owns what it took: each delivery with its mini-batch, decoded once, and,
//! for one sent, its job and staged inputs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fleetrun_common::queue::{Consumer, Delivery};
use fleetrun_common::wire::{MiniBatch, WireError};
use futures::FutureExt;

use super::JobContext;
use super::runner::Active;
use super::stage::{Staged, Stager};

/// A delivery taken while the runner ran another mini-batch, so that the runner finds its
/// next one waiting in its channel instead of waiting for a round trip through the agent.
pub(super) struct Ahead {
    pub(super) delivery: Delivery,
    pub(super) taken: Taken,
}

/// What became of a delivery taken ahead.
pub(super) enum Taken {
    /// Not sent (not the runner's job's, its inputs not staged, or its runner lost): it goes
    /// the usual way when its turn comes, its mini-batch decoded once, here.
    Waiting(Result<MiniBatch, WireError>),
    /// Sent to this slot's runner, which runs it after the ones before.
    Sent(Sent),
}

pub(super) struct Sent {
    pub(super) ctx: Arc<JobContext>,
    pub(super) batch: MiniBatch,
    pub(super) staged: Staged,
}

/// The deliveries a slot took ahead, in the order they were taken.
#[derive(Default)]
pub(super) struct LookAhead {
    taken: VecDeque<Ahead>,
}

impl LookAhead {
    /// The oldest delivery taken ahead: the next the slot handles.
    pub(super) fn next(&mut self) -> Option<Ahead> {
        self.taken.pop_front()
    }

    /// Puts a delivery whose mini-batch runs again first, before what was taken after it.
    pub(super) fn again(&mut self, delivery: Delivery, batch: MiniBatch) {
        self.taken.push_front(Ahead {
            delivery,
            taken: Taken::Waiting(Ok(batch)),
        });
    }

    /// Whether the runner has mini-batches sent after the one it runs.
    pub(super) fn busy(&self) -> bool {
        self.taken.iter().any(|a| matches!(a.taken, Taken::Sent(_)))
    }

    /// Takes the next deliveries already in hand and, while they are for the job `runner`
    /// runs, stages their inputs and sends them: the runner starts each as soon as it has
    /// returned the one before. Takes none while `may_take` says no (the node drains, the
    /// slot's share moved on, or it isolates).
    pub(super) async fn fill(
        &mut self,
        consumer: &mut Box<dyn Consumer>,
        ctx: &Arc<JobContext>,
        runner: &mut Active,
        stager: &mut Stager,
        may_take: impl Fn() -> bool,
    ) {
        let depth = if ctx.job.spec().outputs.is_empty() {
            fleetrun_common::protocol::HELD_REPLIES
        } else {
            1
        };
        while self.taken.len() < depth && !self.blocked() && may_take() {
            let Some(Ok(delivery)) = consumer.next().now_or_never() else {
                return;
            };
            let taken = send(ctx, runner, stager, &delivery).await;
            self.taken.push_back(Ahead { delivery, taken });
        }
    }

    /// Whether a delivery waits that was not sent: nothing is sent after it.
    fn blocked(&self) -> bool {
        self.taken
            .iter()
            .any(|a| matches!(a.taken, Taken::Waiting(_)))
    }

    /// Forgets what was sent to the slot's runner, which is gone: those deliveries go the
    /// usual way again. Returns the one sent `died_in` places ahead, which the runner died
    /// in, with its job and mini-batch, taken out of the look-ahead.
    pub(super) async fn lose(
        &mut self,
        died_in: Option<usize>,
    ) -> Option<(Delivery, Arc<JobContext>, MiniBatch)> {
        let mut culprit = None;
        for (place, Ahead { delivery, taken }) in
            std::mem::take(&mut self.taken).into_iter().enumerate()
        {
            let taken = match taken {
                Taken::Sent(sent) => {
                    sent.staged.clean().await;
                    if died_in == Some(place) {
                        culprit = Some((delivery, sent.ctx, sent.batch));
                        continue;
                    }
                    Taken::Waiting(Ok(sent.batch))
                }
                waiting => waiting,
            };
            self.taken.push_back(Ahead { delivery, taken });
        }
        culprit
    }
}

/// Decodes a delivery taken ahead and, when it is for the job `runner` runs and may run,
/// stages its inputs and sends it. A staging failure is met again, and handled, when its
/// turn comes.
async fn send(
    ctx: &Arc<JobContext>,
    runner: &mut Active,
    stager: &mut Stager,
    delivery: &Delivery,
) -> Taken {
    let batch = match MiniBatch::decode(&delivery.body) {
        Ok(batch) => batch,
        Err(e) => return Taken::Waiting(Err(e)),
    };
    let runs = batch.job == ctx.job.id()
        && !super::settle::lost_too_often(delivery.attempt, ctx.job.spec())
        && !ctx.stop.is_cancelled()
        && !ctx.node.gave_up.load(Ordering::Relaxed)
        // One that runs in pieces for GPU memory waits its turn.
        && !super::verdict::splits(ctx, &batch);
    if !runs {
        return Taken::Waiting(Ok(batch));
    }
    let Ok(mut staged) = stager.stage(ctx, &batch).await else {
        return Taken::Waiting(Ok(batch));
    };
    if staged
        .send(&mut *runner.process, ctx, &batch)
        .await
        .is_err()
    {
        staged.clean().await;
        return Taken::Waiting(Ok(batch));
    }
    Taken::Sent(Sent {
        ctx: ctx.clone(),
        batch,
        staged,
    })
}
