//! A slot's loop: take a delivery, decide what becomes of it (one [`Verdict`]), settle it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fleetrun_common::queue::{Consumer, Delivery, Disposition};
use fleetrun_common::wire::MiniBatch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use super::ahead::Ahead;
use super::isolate::Isolation;
use super::runner::Active;
use super::{AgentConfig, JobContext, Shared};
use crate::metrics::Metrics;
use crate::process::returncode;

/// How long a node that gave up on a job holds one of its mini-batches before handing it back.
const GAVE_UP_BACKOFF: Duration = Duration::from_secs(1);

pub(super) struct Slot {
    pub(super) shared: Arc<Shared>,
    pub(super) index: usize,
    pub(super) runner: Option<Active>,
    /// The next deliveries, taken while the runner worked on the one before, in the order
    /// they were sent to it (see `ahead`).
    pub(super) ahead: std::collections::VecDeque<Ahead>,
    /// Stagings so far: each mini-batch's inputs get a folder of their own.
    pub(super) stagings: u64,
    /// Cancelled when the node drains: nothing more is taken, ahead or not.
    pub(super) drain: CancellationToken,
    /// Deliveries being finished in the background (at most the consumer's prefetch).
    pub(super) finishing: tokio::task::JoinSet<()>,
    /// The last start found the job's seats on this node taken.
    pub(super) seatless: bool,
    /// Mini-batches whose failed items are isolated once the runner has nothing else
    /// queued, with their deliveries (see `isolate`). Nothing is sent ahead meanwhile.
    pub(super) isolations: std::collections::VecDeque<(Delivery, Isolation)>,
}

/// What to do with a delivery, decided once.
pub(super) enum Verdict {
    Settle(Disposition),
    /// The job no longer runs: drop the message.
    Drop,
    /// `run()` succeeded: write the part and record the outcome, then settle with what that
    /// gives. Done in the background, so the runner gets its next mini-batch at once.
    Finish(futures::future::BoxFuture<'static, Disposition>),
    /// The mini-batch failed its attempts: isolate its failed items once the runner has
    /// nothing else queued.
    Isolate(Box<Isolation>),
    /// The mini-batch ran, but its reply was lost with its runner (which died in one sent
    /// after it): it runs again first, on the slot's next runner, its attempt not spent.
    Again,
}

impl Verdict {
    pub(super) fn isolate(ctx: &Arc<JobContext>, batch: &MiniBatch, attempts: u32) -> Verdict {
        Verdict::Isolate(Box::new(Isolation {
            ctx: ctx.clone(),
            batch: batch.clone(),
            attempts,
        }))
    }
}

impl Slot {
    pub(super) fn config(&self) -> &AgentConfig {
        &self.shared.agent.config
    }

    /// The node's cache folder: it holds the staging folder and the working folders.
    pub(super) fn cache(&self) -> &std::path::Path {
        let staging = &self.config().staging_dir;
        staging.parent().unwrap_or(staging)
    }

    pub(super) async fn run(mut self, drain: CancellationToken, abort: CancellationToken) {
        if let Some(job) = self.config().warm_job.clone() {
            tokio::select! {
                _ = abort.cancelled() => {}
                _ = self.warm(&job, &drain) => {}
            }
        }
        let mut share = self.shared.share.watch();
        // The lane this slot consumes from, and its consumer.
        let mut lane: Option<(Arc<str>, Box<dyn Consumer>)> = None;
        loop {
            if let Some(ahead) = self.ahead.pop_front() {
                let Some((_, consumer)) = lane.as_mut() else {
                    continue;
                };
                tokio::select! {
                    biased;
                    _ = abort.cancelled() => {
                        self.kill_runner().await;
                        break;
                    }
                    _ = self.handle_ahead(ahead, consumer) => {}
                }
                continue;
            }
            if let Some((delivery, isolation)) = self.isolations.pop_front() {
                tokio::select! {
                    biased;
                    _ = abort.cancelled() => {
                        // Dropping the delivery hands it back to the queue.
                        self.kill_runner().await;
                        break;
                    }
                    verdict = self.isolate(isolation) => self.conclude(delivery, verdict).await,
                }
                continue;
            }
            let job = share.borrow_and_update().get(self.index).cloned().flatten();
            if lane.is_none() || lane.as_ref().map(|(l, _)| l) != job.as_ref() {
                self.leave_lane(lane.take(), job.as_deref()).await;
                let Some(job) = job else {
                    // No job is owed this slot: it takes no work, and holds none either.
                    tokio::select! {
                        biased;
                        _ = drain.cancelled() => break,
                        _ = abort.cancelled() => break,
                        _ = share.changed() => {}
                    }
                    continue;
                };
                match self
                    .shared
                    .agent
                    .queue
                    .consume(&job, self.config().prefetch)
                    .await
                {
                    Ok(consumer) => lane = Some((job, consumer)),
                    Err(e) => {
                        self.config().metrics.broker_error();
                        warn!(slot = self.index, job = %job, error = %e, "Cannot consume the job's mini-batches; retrying.");
                        tokio::select! {
                            _ = drain.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
                continue;
            }
            let Some((_, consumer)) = lane.as_mut() else {
                continue;
            };
            let job_stop = self.runner.as_ref().map(|a| a.job_stop.clone());
            let job_stopped = async {
                match &job_stop {
                    Some(stop) => stop.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let delivery = tokio::select! {
                biased;
                _ = drain.cancelled() => break,
                _ = abort.cancelled() => break,
                _ = job_stopped => {
                    if let Some(active) = self.runner.take() {
                        let status = active.process.shutdown().await;
                        debug!(process = %active.name, code = returncode(&status), "Runner of an ended job stopped.");
                    }
                    self.shared.share.wake();
                    continue;
                }
                _ = share.changed() => continue,
                d = consumer.next() => d,
            };
            match delivery {
                Ok(d) => {
                    // Settling is often immediate on the embedded queue: let other tasks in.
                    tokio::task::yield_now().await;
                    tokio::select! {
                        biased;
                        _ = abort.cancelled() => {
                            // Dropping the delivery hands it back to the queue.
                            self.kill_runner().await;
                            break;
                        }
                        _ = self.handle(d, consumer) => {}
                    }
                }
                Err(e) => {
                    self.config().metrics.broker_error();
                    warn!(slot = self.index, error = %e, "Consuming failed; retrying.");
                    tokio::select! {
                        _ = drain.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
        let consumer = lane.as_mut().map(|(_, c)| c);
        if !abort.is_cancelled()
            && let Some(consumer) = consumer
        {
            // Draining: what was pushed here and not started goes to other nodes untried.
            pause(self.index, consumer).await;
        }
        // Settle what is being finished before stopping: nothing is left unacknowledged.
        while self.finishing.join_next().await.is_some() {}
        if let Some(active) = self.runner.take() {
            if abort.is_cancelled() {
                let mut process = active.process;
                process.kill().await;
            } else {
                let status = active.process.shutdown().await;
                debug!(process = %active.name, code = returncode(&status), "Runner stopped.");
            }
        }
    }

    pub(super) async fn handle(&mut self, delivery: Delivery, consumer: &mut Box<dyn Consumer>) {
        while self.finishing.try_join_next().is_some() {}
        let verdict = self.decide(&delivery, consumer).await;
        self.conclude(delivery, verdict).await;
    }

    async fn decide(&mut self, delivery: &Delivery, consumer: &mut Box<dyn Consumer>) -> Verdict {
        let batch = match MiniBatch::decode(&delivery.body) {
            Ok(b) => b,
            Err(e) => {
                warn!(slot = self.index, error = %e, bytes = delivery.body.len(), "Dead-lettering a message that does not decode.");
                return Verdict::Settle(Disposition::DeadLetter);
            }
        };
        let ctx = match self
            .shared
            .agent
            .jobs
            .get_for_run(&batch.job, batch.run)
            .await
        {
            Ok(Some(ctx)) => ctx,
            Ok(None) => {
                warn!(job = %batch.job, mini_batch = batch.index, "Dead-lettering a mini-batch of an unknown job.");
                return Verdict::Settle(Disposition::DeadLetter);
            }
            Err(e) => {
                warn!(job = %batch.job, error = %e, "Cannot look up the job; requeueing.");
                return Verdict::Settle(Disposition::Requeue);
            }
        };
        if batch.run < ctx.run() || !self.accepts_work(&ctx).await {
            // Left in the queue by a run the job was resumed from: the resumed run
            // published again whatever of it was still to do.
            return Verdict::Drop;
        }
        if !ctx.has_place() {
            if self.shared.agent.jobs.claim_place(&ctx).await {
                self.shared.share.wake();
            } else {
                // The job's node_count nodes are others: leave its work to them.
                return self.hand_back(&ctx).await;
            }
        }
        if ctx.gave_up.load(Ordering::Relaxed) {
            // This node cannot start the job's script; leave the work to other nodes.
            return self.hand_back(&ctx).await;
        }
        if super::lost_too_often(delivery.attempt, ctx.job.spec()) {
            let lost = delivery.attempt - 1 - ctx.job.spec().run_max_try;
            let cause = format!(
                "delivered {} times: lost at least {lost} times with the worker or broker connection that held it (the limit is {})",
                delivery.attempt - 1,
                super::LOST_LIMIT
            );
            let node = self.config().node_id.clone();
            super::holding::lost_before(&ctx, &batch, delivery.attempt - 1, &node).await;
            // Unrecorded (the ledger did not answer), it comes back: nothing is lost.
            let recorded = self
                .record_failure(&ctx, &batch, delivery.attempt - 1, &cause, None)
                .await;
            return Verdict::Settle(if recorded {
                Disposition::Ack
            } else {
                Disposition::Return
            });
        }
        if !self.ensure_runner(&ctx).await {
            if std::mem::take(&mut self.seatless) {
                // As many runners of the job as it wants run on this node's other slots.
                return self.hand_back(&ctx).await;
            }
            // No runner started: run() was not tried, so this was no attempt.
            return Verdict::Settle(Disposition::Return);
        }
        if ctx.first_start() {
            let (ledger, job) = (self.shared.agent.ledger.clone(), ctx.job.id().to_owned());
            tokio::spawn(async move {
                if let Err(e) = ledger.started(&job).await {
                    warn!(job = %job, error = %e, "Cannot note the job started.");
                }
            });
        }
        self.attempt(&ctx, &batch, delivery.attempt, None, consumer)
            .await
    }

    /// Hands a mini-batch this slot may not run back to the queue, untried, after a pause so
    /// that the slot does not spin on it.
    async fn hand_back(&self, ctx: &JobContext) -> Verdict {
        tokio::select! {
            _ = ctx.stop.cancelled() => return Verdict::Drop,
            _ = tokio::time::sleep(GAVE_UP_BACKOFF) => {}
        }
        Verdict::Settle(Disposition::Return)
    }

    /// Whether the job still takes work, from this node's knowledge and, now and then, the
    /// ledger's.
    async fn accepts_work(&self, ctx: &JobContext) -> bool {
        if ctx.stop.is_cancelled() {
            return false;
        }
        if ctx.due_for_check()
            && let Ok(Some(status)) = self.shared.agent.ledger.status(ctx.job.id()).await
            && !status.state.accepts_work()
        {
            ctx.stop.cancel();
            return false;
        }
        true
    }

    pub(super) async fn conclude(&mut self, delivery: Delivery, verdict: Verdict) {
        let disposition = match verdict {
            Verdict::Settle(d) => d,
            Verdict::Isolate(isolation) => {
                self.isolations.push_back((delivery, *isolation));
                return;
            }
            Verdict::Drop => Disposition::Ack,
            Verdict::Again => {
                self.ahead.push_front(Ahead {
                    delivery,
                    sent: None,
                });
                return;
            }
            Verdict::Finish(work) => {
                let (slot, metrics) = (self.index, self.config().metrics.clone());
                self.finishing.spawn(
                    async move {
                        let disposition = work.await;
                        settle(slot, &metrics, delivery, disposition).await;
                    }
                    .in_current_span(),
                );
                return;
            }
        };
        settle(self.index, &self.config().metrics, delivery, disposition).await;
    }
}

impl Slot {
    /// Whether the node's current share still gives this slot to `job`.
    pub(super) fn keeps(&self, job: &str) -> bool {
        self.shared.share.job_of(self.index).as_deref() == Some(job)
    }

    /// Leaves the lane this slot consumed from for `next` (or for none): what its consumer
    /// holds and has not handed out goes back untried, and a runner of another job than
    /// `next` stops, giving its seat back.
    async fn leave_lane(
        &mut self,
        lane: Option<(Arc<str>, Box<dyn Consumer>)>,
        next: Option<&str>,
    ) {
        if let Some((_, mut consumer)) = lane {
            pause(self.index, &mut consumer).await;
        }
        if self
            .runner
            .as_ref()
            .is_some_and(|a| Some(a.job.as_str()) != next)
            && let Some(active) = self.runner.take()
        {
            let status = active.process.shutdown().await;
            debug!(process = %active.name, code = returncode(&status), "Runner stopped: its slot serves another job now, or none.");
        }
    }
}

/// Stops the slot's consumer holding work it does not run (see [`Consumer::pause`]).
async fn pause(slot: usize, consumer: &mut Box<dyn Consumer>) {
    if let Err(e) = consumer.pause().await {
        warn!(slot, error = %e, "Cannot give back what the slot's consumer holds; it returns when the channel closes.");
    }
}

async fn settle(slot: usize, metrics: &Metrics, delivery: Delivery, disposition: Disposition) {
    match delivery.settle(disposition).await {
        Ok(true) => {}
        Ok(false) => info!(slot, "Settlement not delivered; the broker will redeliver."),
        Err(e) => {
            metrics.broker_error();
            warn!(slot, error = %e, "Settling a delivery failed.");
        }
    }
}
