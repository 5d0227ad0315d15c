//! A slot's loop: take a delivery, decide what becomes of it (one [`Verdict`]), settle it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fleetrun_common::queue::{Consumer, Delivery, Disposition};
use fleetrun_common::wire::{MiniBatch, WireError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, warn};

use super::ahead::{Ahead, Sent, Taken};
use super::attempt::{Bench, record_failure};
use super::finish::settle;
use super::isolate::isolate;
use super::runner::StartFailure;
use super::share::Assignment;
use super::verdict::{Isolation, Verdict, Why, splits};
use super::{JobContext, Shared};
use crate::worker_config::WorkerConfig;

/// The job a slot consumes for, and its consumer.
type Lane = (Arc<str>, Box<dyn Consumer>);

/// Whether a slot's loop goes on.
enum Flow {
    Go,
    Stop,
}

/// How long a node that gave up on a job holds one of its mini-batches before handing it back.
const GAVE_UP_BACKOFF: Duration = Duration::from_secs(1);

pub(super) struct Slot {
    pub(super) shared: Arc<Shared>,
    pub(super) index: usize,
    /// What the slot runs attempts with: its runner, its staging, its look-ahead.
    pub(super) bench: Bench,
    /// Cancelled when the node drains: nothing more is taken, ahead or not.
    pub(super) drain: CancellationToken,
    /// Deliveries being finished in the background (at most the consumer's prefetch).
    pub(super) finishing: tokio::task::JoinSet<()>,
    /// Mini-batches whose failed items are isolated once the runner has nothing else
    /// queued, with their deliveries (see `isolate`). Nothing is sent ahead meanwhile.
    pub(super) isolations: std::collections::VecDeque<(Delivery, Isolation)>,
}

impl Slot {
    fn config(&self) -> &WorkerConfig {
        &self.shared.agent.config
    }

    /// The slot's loop, until the node drains or aborts.
    pub(super) async fn run(mut self, drain: CancellationToken, abort: CancellationToken) {
        if let Some(job) = self.config().warm_job.clone() {
            tokio::select! {
                _ = abort.cancelled() => {}
                _ = self.warm(&job, &drain) => {}
            }
        }
        let mut share = self.shared.share.watch();
        // The lane this slot consumes from, and its consumer.
        let mut lane: Option<Lane> = None;
        loop {
            if let Some(ahead) = self.bench.ahead.next() {
                let Some((_, consumer)) = lane.as_mut() else {
                    continue;
                };
                tokio::select! {
                    biased;
                    _ = abort.cancelled() => {
                        self.bench.seat.kill().await;
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
                        self.bench.seat.kill().await;
                        break;
                    }
                    verdict = isolate(&mut self.bench, isolation) => self.conclude(delivery, verdict).await,
                }
                continue;
            }
            let job = share.borrow_and_update().get(self.index).cloned().flatten();
            let flow = match lane.as_mut() {
                Some((current, consumer)) if job.as_ref() == Some(current) => {
                    self.take(consumer, &mut share, &drain, &abort).await
                }
                _ => {
                    self.switch_lane(&mut lane, job, &mut share, &drain, &abort)
                        .await
                }
            };
            if let Flow::Stop = flow {
                break;
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
        if abort.is_cancelled() {
            self.bench.seat.kill().await;
        } else {
            self.bench.seat.stop("Runner stopped.").await;
        }
    }

    /// Leaves the slot's lane for `job`'s (or for none, waiting for the share to change):
    /// consumes `job`'s mini-batches, retrying a broker that refuses.
    async fn switch_lane(
        &mut self,
        lane: &mut Option<Lane>,
        job: Option<Arc<str>>,
        share: &mut watch::Receiver<Assignment>,
        drain: &CancellationToken,
        abort: &CancellationToken,
    ) -> Flow {
        self.leave_lane(lane.take(), job.as_deref()).await;
        let Some(job) = job else {
            // No job is owed this slot: it takes no work, and holds none either.
            tokio::select! {
                biased;
                _ = drain.cancelled() => return Flow::Stop,
                _ = abort.cancelled() => return Flow::Stop,
                _ = share.changed() => {}
            }
            return Flow::Go;
        };
        let prefetch = self.config().prefetch;
        match self.shared.agent.queue.consume(&job, prefetch).await {
            Ok(consumer) => *lane = Some((job, consumer)),
            Err(e) => {
                self.config().metrics.broker_error();
                warn!(slot = self.index, job = %job, error = %e, "Cannot consume the job's mini-batches; retrying.");
                tokio::select! {
                    _ = drain.cancelled() => return Flow::Stop,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
        Flow::Go
    }

    /// Takes the lane's next delivery and handles it, unless the node drains or aborts, the
    /// runner's job ends (the runner stops), or the share changes first.
    async fn take(
        &mut self,
        consumer: &mut Box<dyn Consumer>,
        share: &mut watch::Receiver<Assignment>,
        drain: &CancellationToken,
        abort: &CancellationToken,
    ) -> Flow {
        let job_stop = self.bench.seat.active().map(|a| a.job_stop.clone());
        let job_stopped = async {
            match &job_stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let delivery = tokio::select! {
            biased;
            _ = drain.cancelled() => return Flow::Stop,
            _ = abort.cancelled() => return Flow::Stop,
            _ = job_stopped => {
                self.bench.seat.stop("Runner of an ended job stopped.").await;
                self.shared.share.wake();
                return Flow::Go;
            }
            _ = share.changed() => return Flow::Go,
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
                        self.bench.seat.kill().await;
                        return Flow::Stop;
                    }
                    _ = self.handle(d, None, consumer) => {}
                }
            }
            Err(e) => {
                self.config().metrics.broker_error();
                warn!(slot = self.index, error = %e, "Consuming failed; retrying.");
                tokio::select! {
                    _ = drain.cancelled() => return Flow::Stop,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
        Flow::Go
    }

    /// Starts this slot's runner for `job` before any work arrives, retrying init failures
    /// until the node gives up.
    async fn warm(&mut self, job: &str, drain: &CancellationToken) {
        let Ok(Some(ctx)) = self.shared.agent.jobs.get(job).await else {
            return;
        };
        while !drain.is_cancelled()
            && !ctx.node.gave_up.load(Ordering::Relaxed)
            && !ctx.stop.is_cancelled()
        {
            let started = tokio::select! {
                _ = drain.cancelled() => return,
                _ = ctx.stop.cancelled() => return,
                started = self.bench.seat.start(&self.shared, &ctx) => started.map(|_| ()),
            };
            match started {
                // Started, or the job's seats on this node are taken: this slot warms nothing.
                Ok(()) | Err(StartFailure::Seatless) => return,
                Err(StartFailure::GaveUp | StartFailure::Failed) => {}
            }
        }
    }

    /// Handles a delivery: decides what becomes of it, and settles it. `decoded` holds its
    /// mini-batch when it was decoded already (it was taken ahead).
    async fn handle(
        &mut self,
        delivery: Delivery,
        decoded: Option<Result<MiniBatch, WireError>>,
        consumer: &mut Box<dyn Consumer>,
    ) {
        while self.finishing.try_join_next().is_some() {}
        let decoded = decoded.unwrap_or_else(|| MiniBatch::decode(&delivery.body));
        let verdict = self.decide(&delivery, decoded, consumer).await;
        self.conclude(delivery, verdict).await;
    }

    /// Handles a delivery taken ahead: one sent to the runner is already running there; any
    /// other goes the usual way.
    async fn handle_ahead(&mut self, ahead: Ahead, consumer: &mut Box<dyn Consumer>) {
        let Ahead { delivery, taken } = ahead;
        let Sent { ctx, batch, staged } = match taken {
            Taken::Waiting(decoded) => return self.handle(delivery, Some(decoded), consumer).await,
            Taken::Sent(sent) => sent,
        };
        while self.finishing.try_join_next().is_some() {}
        let verdict = if ctx.stop.is_cancelled() {
            // Its reply must never be taken for another mini-batch's.
            self.bench.seat.kill().await;
            staged.clean().await;
            Verdict::Drop
        } else {
            self.attempt(&ctx, &batch, delivery.attempt, Some(staged), consumer)
                .await
        };
        self.conclude(delivery, verdict).await;
    }

    /// One attempt of `batch`: begun, the next deliveries taken ahead while it runs, ended.
    async fn attempt(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempt: u32,
        sent: Option<super::stage::Staged>,
        consumer: &mut Box<dyn Consumer>,
    ) -> Verdict {
        let running = match self.bench.begin(ctx, batch, attempt, sent).await {
            Ok(running) => running,
            Err(verdict) => return verdict,
        };
        if running.submitted {
            self.look_ahead(ctx, consumer).await;
        }
        self.bench.end(ctx, batch, running).await
    }

    /// Takes the deliveries already in hand ahead, and sends those of the runner's job to it
    /// (see `ahead`), while the node does not drain, the slot isolates nothing and its share
    /// still gives it the job.
    async fn look_ahead(&mut self, ctx: &Arc<JobContext>, consumer: &mut Box<dyn Consumer>) {
        let Bench {
            seat,
            stager,
            ahead,
            ..
        } = &mut self.bench;
        let Some(runner) = seat.active_mut() else {
            return;
        };
        let (drain, isolations, share) = (&self.drain, &self.isolations, &self.shared.share);
        let (index, job) = (self.index, ctx.job.id());
        // A slot whose share moved on takes no more of this job: it changes jobs after the
        // mini-batch it runs.
        let may_take = || {
            !drain.is_cancelled()
                && isolations.is_empty()
                && share.job_of(index).as_deref() == Some(job)
        };
        ahead.fill(consumer, ctx, runner, stager, may_take).await;
    }

    async fn decide(
        &mut self,
        delivery: &Delivery,
        decoded: Result<MiniBatch, WireError>,
        consumer: &mut Box<dyn Consumer>,
    ) -> Verdict {
        let batch = match decoded {
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
        if !ctx.node.has_place() {
            if self.shared.agent.jobs.claim_place(&ctx).await {
                self.shared.share.wake();
            } else {
                // The job's node_count nodes are others: leave its work to them.
                return self.hand_back(&ctx).await;
            }
        }
        if ctx.node.gave_up.load(Ordering::Relaxed) {
            // This node cannot start the job's script; leave the work to other nodes.
            return self.hand_back(&ctx).await;
        }
        if super::settle::lost_too_often(delivery.attempt, ctx.job.spec()) {
            let lost = delivery.attempt - 1 - ctx.job.spec().run_max_try;
            let cause = format!(
                "delivered {} times: lost at least {lost} times with the worker or broker connection that held it (the limit is {})",
                delivery.attempt - 1,
                super::LOST_LIMIT
            );
            let node = self.config().node_id.clone();
            super::holding::lost_before(&ctx, &batch, delivery.attempt - 1, &node).await;
            // Unrecorded (the ledger did not answer), it comes back: nothing is lost.
            let attempts = delivery.attempt - 1;
            let recorded = record_failure(&self.shared, &ctx, &batch, attempts, &cause, None);
            let recorded = recorded.await;
            return Verdict::Settle(if recorded {
                Disposition::Ack
            } else {
                Disposition::Return
            });
        }
        match self.bench.seat.start(&self.shared, &ctx).await {
            Ok(_) => {}
            // As many runners of the job as it wants run on this node's other slots.
            Err(StartFailure::Seatless) => return self.hand_back(&ctx).await,
            // No runner started: run() was not tried, so this was no attempt.
            Err(StartFailure::GaveUp | StartFailure::Failed) => {
                return Verdict::Settle(Disposition::Return);
            }
        }
        if ctx.node.first_start() {
            let (ledger, job) = (self.shared.agent.ledger.clone(), ctx.job.id().to_owned());
            tokio::spawn(async move {
                if let Err(e) = ledger.started(&job).await {
                    warn!(job = %job, error = %e, "Cannot note the job started.");
                }
            });
        }
        if splits(&ctx, &batch) {
            // It would run out of GPU memory whole: it runs in pieces of the size that fits.
            return Verdict::Isolate(Box::new(Isolation {
                ctx,
                batch,
                attempts: delivery.attempt,
                why: Why::OutOfMemory,
            }));
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
        if ctx.node.due_for_check()
            && let Ok(Some(status)) = self.shared.agent.ledger.status(ctx.job.id()).await
            && !status.state.accepts_work()
        {
            ctx.stop.cancel();
            return false;
        }
        true
    }

    async fn conclude(&mut self, delivery: Delivery, verdict: Verdict) {
        let disposition = match verdict {
            Verdict::Settle(d) => d,
            Verdict::Isolate(isolation) => {
                self.isolations.push_back((delivery, *isolation));
                return;
            }
            Verdict::Drop => Disposition::Ack,
            Verdict::Again { batch, culprit } => {
                // The mini-batch its runner died in is settled first.
                let (culprit, verdict) = *culprit;
                Box::pin(self.conclude(culprit, verdict)).await;
                self.bench.ahead.again(delivery, *batch);
                return;
            }
            Verdict::Finish(finish) => {
                let finished = finish.settle(self.index, delivery);
                self.finishing.spawn(finished.in_current_span());
                return;
            }
        };
        settle(self.index, &self.config().metrics, delivery, disposition).await;
    }
}

impl Slot {
    /// Leaves the lane this slot consumed from for `next` (or for none): what its consumer
    /// holds and has not handed out goes back untried, and a runner of another job than
    /// `next` stops, giving its seat back.
    async fn leave_lane(&mut self, lane: Option<Lane>, next: Option<&str>) {
        if let Some((_, mut consumer)) = lane {
            pause(self.index, &mut consumer).await;
        }
        if self
            .bench
            .seat
            .active()
            .is_some_and(|a| Some(a.job.as_str()) != next)
        {
            let why = "Runner stopped: its slot serves another job now, or none.";
            self.bench.seat.stop(why).await;
        }
    }
}

/// Stops the slot's consumer holding work it does not run (see [`Consumer::pause`]).
async fn pause(slot: usize, consumer: &mut Box<dyn Consumer>) {
    if let Err(e) = consumer.pause().await {
        warn!(slot, error = %e, "Cannot give back what the slot's consumer holds; it returns when the channel closes.");
    }
}
