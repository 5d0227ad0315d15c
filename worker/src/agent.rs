//! The node agent: takes mini-batches off the queue and drives one runner process per slot.
//!
//! Each slot is a loop: take a delivery, decide what becomes of it, settle it. The order of
//! effects makes a mini-batch's output exactly-once even though delivery is at-least-once:
//! store the output part, then record the outcome with the part's reference in the ledger
//! (the first recording wins, reference included), then acknowledge. A worker killed between
//! any two steps leaves the message unacknowledged; its re-run stores another part, which
//! the ledger never names, and its second recording changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use fleetrun_common::ledger::{JobState, Ledger, Outcome, Recorded, Status};
use fleetrun_common::protocol::{InitParams, ScriptError};
use fleetrun_common::queue::{Consumer, Delivery, Disposition, Queue};
use fleetrun_common::storage::Storage;
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::{JobSpec, OutputAction};
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::gpu::{GPU_COUNT_VAR, GpuLease, GpuPool};
use crate::logs::{self, JobLogs, csv_field};
use crate::parts::Parts;
use crate::process::{InitOutcome, Launch, RunOutcome, RunnerProcess, returncode};

/// How often a slot re-reads a job's state from the ledger between its own recordings.
const STATE_RECHECK: Duration = Duration::from_millis(500);
/// How long a node that gave up on a job holds one of its mini-batches before handing it back.
const GAVE_UP_BACKOFF: Duration = Duration::from_secs(1);
/// How long a job runs before init failures across all its nodes can fail it.
pub const INIT_FAILURE_GRACE: Duration = Duration::from_secs(120);

/// CONTRACT.md §5 rule 2: a job that has run longer than [`INIT_FAILURE_GRACE`] fails once
/// `2 × node_count × processes` runners have failed to start over the whole job. Returns
/// the reason to fail it with.
pub fn init_failures_fail_job(
    node_count: u32,
    processes: u32,
    failures: u64,
    age: Duration,
) -> Option<String> {
    let limit = 2 * u64::from(node_count.max(1)) * u64::from(processes.max(1));
    (age > INIT_FAILURE_GRACE && failures >= limit).then(|| {
        format!(
            "{failures} runner processes failed to start over the job (the limit is {limit}: 2 × node_count {node_count} × {processes} processes per node)"
        )
    })
}

/// Deliveries a slot holds by default: one running, the next waiting in the runner's
/// channel, and one being finished in the background.
pub const DEFAULT_PREFETCH: u16 = 3;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's id in logs (`sys/node/<node_id>/…`).
    pub node_id: String,
    /// Runner slots (processes) on this node.
    pub processes: usize,
    /// Unsettled deliveries each slot may hold.
    pub prefetch: u16,
    pub runner_exe: PathBuf,
    /// Where inputs that are not local files are staged.
    pub staging_dir: PathBuf,
    /// Start every slot's runner for this job before taking work (one-job runs).
    pub warm_job: Option<String>,
    /// GPUs on this node, handed to runners one index each (CONTRACT.md §3).
    pub gpus: usize,
}

/// A job as a node sees it: its spec, its storages, its log folder, and what this node
/// learned about it.
pub struct JobContext {
    pub id: String,
    pub spec: JobSpec,
    pub input: Arc<dyn Storage>,
    pub output: Arc<dyn Storage>,
    /// Where the mini-batches' output parts wait for the finalizer.
    pub parts: Arc<dyn Parts>,
    pub logs: Arc<JobLogs>,
    /// Cancelled once the job stops accepting work; running attempts are killed.
    pub stop: CancellationToken,
    /// Who this node is when it claims the job's finalization (unique per node and job).
    pub finalizer: String,
    /// This node is finalizing the job.
    pub finalizing: AtomicBool,
    init_failures: AtomicU32,
    gave_up: AtomicBool,
    last_check: std::sync::Mutex<Instant>,
}

impl JobContext {
    pub fn new(
        id: String,
        spec: JobSpec,
        input: Arc<dyn Storage>,
        output: Arc<dyn Storage>,
        parts: Arc<dyn Parts>,
        logs: Arc<JobLogs>,
    ) -> JobContext {
        JobContext {
            id,
            spec,
            input,
            output,
            parts,
            logs,
            stop: CancellationToken::new(),
            finalizer: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
            finalizing: AtomicBool::new(false),
            init_failures: AtomicU32::new(0),
            gave_up: AtomicBool::new(false),
            last_check: std::sync::Mutex::new(Instant::now()),
        }
    }

    /// True when the last status check is older than [`STATE_RECHECK`] (and claims the next).
    fn due_for_check(&self) -> bool {
        let mut last = self.last_check.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= STATE_RECHECK {
            *last = Instant::now();
            true
        } else {
            false
        }
    }
}

/// Finds the job a message belongs to.
#[async_trait]
pub trait Jobs: Send + Sync {
    async fn get(&self, job: &str) -> Result<Option<Arc<JobContext>>, String>;
}

/// What the agent reports to whoever drives the job.
#[derive(Debug, Clone)]
pub enum AgentEvent {
    /// A recording moved the job's state (to Finalizing or Failed): the receiver owns what
    /// follows.
    Transitioned { job: String, status: Status },
    /// A runner of the job failed to start on this node (`processes`: the job's runner
    /// processes per node, as this node counts them).
    InitFailed {
        job: String,
        processes: u32,
        failure: String,
    },
    /// This node stopped trying to start runners for the job (init kept failing).
    GaveUp { job: String, reason: String },
}

pub struct Agent {
    pub config: AgentConfig,
    pub queue: Arc<dyn Queue>,
    pub ledger: Arc<dyn Ledger>,
    pub jobs: Arc<dyn Jobs>,
    pub events: mpsc::UnboundedSender<AgentEvent>,
}

/// Runs the agent until `drain` is cancelled (finish the mini-batch in hand, take no more)
/// or `abort` is (kill the runners now; unsettled deliveries go back to the queue).
pub async fn run(agent: Agent, drain: CancellationToken, abort: CancellationToken) {
    let gpus = GpuPool::new(agent.config.gpus);
    let shared = Arc::new(Shared {
        agent,
        next_process: AtomicU32::new(0),
        gpus,
    });
    let mut slots = tokio::task::JoinSet::new();
    for index in 0..shared.agent.config.processes.max(1) {
        let slot = Slot {
            shared: shared.clone(),
            index,
            runner: None,
            ahead: None,
            stagings: 0,
            drain: drain.clone(),
            finishing: tokio::task::JoinSet::new(),
        };
        slots.spawn(slot.run(drain.clone(), abort.clone()));
    }
    while let Some(result) = slots.join_next().await {
        if let Err(e) = result {
            warn!(error = %e, "A runner slot ended abnormally.");
        }
    }
}

struct Shared {
    agent: Agent,
    next_process: AtomicU32,
    gpus: Arc<GpuPool>,
}

struct Active {
    job: String,
    name: String,
    process: RunnerProcess,
    /// The job's stop signal: once it fires the runner (its model, its GPU) is released.
    job_stop: CancellationToken,
    /// Its GPU, released when the process is dropped.
    _gpu: Option<GpuLease>,
}

struct Slot {
    shared: Arc<Shared>,
    index: usize,
    runner: Option<Active>,
    /// The next delivery, taken while the runner worked on the one before.
    ahead: Option<Ahead>,
    /// Stagings so far: each mini-batch's inputs get a folder of their own.
    stagings: u64,
    /// Cancelled when the node drains: nothing more is taken, ahead or not.
    drain: CancellationToken,
    /// Deliveries being finished in the background (at most the consumer's prefetch).
    finishing: tokio::task::JoinSet<()>,
}

/// A delivery taken while the runner ran another mini-batch, so that the runner finds its
/// next one waiting in its channel instead of waiting for a round trip through the agent.
struct Ahead {
    delivery: Delivery,
    /// Set when it was sent to this slot's runner (its job's, inputs staged); otherwise, or
    /// once that runner is lost, it goes the usual way when its turn comes.
    sent: Option<Sent>,
}

struct Sent {
    ctx: Arc<JobContext>,
    batch: MiniBatch,
    staged: Staged,
}

/// What to do with a delivery, decided once.
enum Verdict {
    Settle(Disposition),
    /// The job no longer runs: drop the message.
    Drop,
    /// `run()` succeeded: write the part and record the outcome, then settle with what that
    /// gives. Done in the background, so the runner gets its next mini-batch at once.
    Finish(futures::future::BoxFuture<'static, Disposition>),
}

impl Slot {
    fn config(&self) -> &AgentConfig {
        &self.shared.agent.config
    }

    async fn run(mut self, drain: CancellationToken, abort: CancellationToken) {
        if let Some(job) = self.config().warm_job.clone() {
            tokio::select! {
                _ = abort.cancelled() => {}
                _ = self.warm(&job, &drain) => {}
            }
        }
        let queue = self.shared.agent.queue.clone();
        let mut consumer = match queue.consume(self.config().prefetch).await {
            Ok(c) => c,
            Err(e) => {
                warn!(slot = self.index, error = %e, "Cannot consume; slot stops.");
                return;
            }
        };
        loop {
            if let Some(ahead) = self.ahead.take() {
                tokio::select! {
                    biased;
                    _ = abort.cancelled() => {
                        self.kill_runner().await;
                        break;
                    }
                    _ = self.handle_ahead(ahead, &mut consumer) => {}
                }
                continue;
            }
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
                    continue;
                }
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
                        _ = self.handle(d, &mut consumer) => {}
                    }
                }
                Err(e) => {
                    warn!(slot = self.index, error = %e, "Consuming failed; retrying.");
                    tokio::select! {
                        _ = drain.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
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

    /// Starts this slot's runner for `job` before any work arrives, retrying init failures
    /// until the node gives up.
    async fn warm(&mut self, job: &str, drain: &CancellationToken) {
        let Ok(Some(ctx)) = self.shared.agent.jobs.get(job).await else {
            return;
        };
        while !drain.is_cancelled()
            && !ctx.gave_up.load(Ordering::Relaxed)
            && !ctx.stop.is_cancelled()
        {
            tokio::select! {
                _ = drain.cancelled() => return,
                _ = ctx.stop.cancelled() => return,
                ready = self.ensure_runner(&ctx) => if ready { return },
            }
        }
    }

    async fn kill_runner(&mut self) {
        if let Some(mut active) = self.runner.take() {
            active.process.kill().await;
        }
    }

    async fn handle(&mut self, delivery: Delivery, consumer: &mut Box<dyn Consumer>) {
        while self.finishing.try_join_next().is_some() {}
        let verdict = self.decide(&delivery, consumer).await;
        self.conclude(delivery, verdict).await;
    }

    /// Handles a delivery taken ahead: one sent to the runner is already running there; any
    /// other goes the usual way.
    async fn handle_ahead(&mut self, ahead: Ahead, consumer: &mut Box<dyn Consumer>) {
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

    async fn conclude(&mut self, delivery: Delivery, verdict: Verdict) {
        let disposition = match verdict {
            Verdict::Settle(d) => d,
            Verdict::Drop => Disposition::Ack,
            Verdict::Finish(work) => {
                let slot = self.index;
                self.finishing.spawn(async move {
                    let disposition = work.await;
                    settle(slot, delivery, disposition).await;
                });
                return;
            }
        };
        settle(self.index, delivery, disposition).await;
    }

    async fn decide(&mut self, delivery: &Delivery, consumer: &mut Box<dyn Consumer>) -> Verdict {
        let batch = match MiniBatch::decode(&delivery.body) {
            Ok(b) => b,
            Err(e) => {
                warn!(slot = self.index, error = %e, bytes = delivery.body.len(), "Dead-lettering a message that does not decode.");
                return Verdict::Settle(Disposition::DeadLetter);
            }
        };
        let ctx = match self.shared.agent.jobs.get(&batch.job).await {
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
        if !self.accepts_work(&ctx).await {
            return Verdict::Drop;
        }
        if ctx.gave_up.load(Ordering::Relaxed) {
            // This node cannot start the job's script; leave the work to other nodes, without
            // spinning on it meanwhile.
            tokio::select! {
                _ = ctx.stop.cancelled() => return Verdict::Drop,
                _ = tokio::time::sleep(GAVE_UP_BACKOFF) => {}
            }
            return Verdict::Settle(Disposition::Return);
        }
        let max = ctx.spec.run_max_try;
        if delivery.attempt > max {
            let cause =
                format!("all {max} attempts were lost with the process or worker that held them");
            self.record_failure(&ctx, &batch, delivery.attempt - 1, &cause)
                .await;
            return Verdict::Settle(Disposition::Ack);
        }
        if !self.ensure_runner(&ctx).await {
            // No runner started: run() was not tried, so this was no attempt.
            return Verdict::Settle(Disposition::Return);
        }
        self.attempt(&ctx, &batch, delivery.attempt, None, consumer)
            .await
    }

    /// Whether the job still takes work, from this node's knowledge and, now and then, the
    /// ledger's.
    async fn accepts_work(&self, ctx: &JobContext) -> bool {
        if ctx.stop.is_cancelled() {
            return false;
        }
        if ctx.due_for_check()
            && let Ok(Some(status)) = self.shared.agent.ledger.status(&ctx.id).await
            && !status.state.accepts_work()
        {
            ctx.stop.cancel();
            return false;
        }
        true
    }

    /// One `run()` attempt of a mini-batch, and what becomes of the delivery. `sent` holds
    /// the staged inputs of a mini-batch the runner already has (it was taken ahead).
    async fn attempt(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempt: u32,
        sent: Option<Staged>,
        consumer: &mut Box<dyn Consumer>,
    ) -> Verdict {
        let node = self.config().node_id.clone();
        let (mut staged, sent) = match sent {
            Some(staged) => (staged, true),
            None => match self.stage(ctx, batch).await {
                Ok(s) => (s, false),
                Err(e) => {
                    warn!(job = %ctx.id, mini_batch = batch.index, error = %e, "Staging inputs failed.");
                    return self
                        .failed_attempt(ctx, batch, attempt, &format!("staging inputs failed: {e}"))
                        .await;
                }
            },
        };
        let timeout = Duration::from_secs(ctx.spec.run_invocation_timeout);
        let start_wall = logs::now();
        let started = Instant::now();
        let active = self.runner.as_mut().expect("ensure_runner made one");
        let process = active.name.clone();
        let submitted = sent
            || active
                .process
                .submit(batch.index, std::mem::take(&mut staged.paths))
                .await
                .is_ok();
        if submitted {
            self.look_ahead(ctx, consumer).await;
        }
        let active = self.runner.as_mut().expect("still this slot's runner");
        let outcome = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => {
                self.kill_runner().await;
                staged.clean().await;
                return Verdict::Drop;
            }
            // A failed submit means a dead runner: its outcome says so at once.
            o = active.process.outcome(timeout.saturating_sub(started.elapsed())) => o,
        };
        let elapsed = started.elapsed().as_secs_f64();
        staged.clean().await;
        let items = batch.items.len() as u64;
        match outcome {
            RunOutcome::Done { rows, timing } => {
                let returned = rows.len() as u64;
                let succeeded = returned.min(items);
                let outcome = Outcome {
                    succeeded,
                    failed: items - succeeded,
                    batch_failed: returned < items,
                };
                let note = match returned.cmp(&items) {
                    std::cmp::Ordering::Less => {
                        format!("returned {returned} elements for {items} items")
                    }
                    std::cmp::Ordering::Greater => {
                        warn!(job = %ctx.id, mini_batch = batch.index, returned, items, "run() returned more elements than it got; keeping them.");
                        format!("returned MORE elements than items: {returned} for {items}")
                    }
                    std::cmp::Ordering::Equal => String::new(),
                };
                ctx.logs.log(
                    logs::JobLogs::node_process(&node, &process),
                    &format!(
                        "mini-batch {} completed: pid {}, items {items}, succeeded {succeeded}, failed {}, started {start_wall}, duration {elapsed:.3}s, cpu {:.3}s, run() {:.3}s",
                        batch.index, self.runner.as_ref().map_or(0, |a| a.process.pid()), items - succeeded, timing.cpu_seconds, timing.run_seconds
                    ),
                );
                let result = if outcome.batch_failed {
                    "partial"
                } else {
                    "succeeded"
                };
                self.report(
                    ctx,
                    batch,
                    attempt,
                    result,
                    outcome,
                    &process,
                    &start_wall,
                    elapsed,
                    timing.run_seconds,
                    &note,
                );
                let part =
                    (ctx.spec.output_action == OutputAction::AppendRow).then(|| join_rows(&rows));
                let (shared, ctx, index) = (self.shared.clone(), ctx.clone(), batch.index);
                Verdict::Finish(Box::pin(async move {
                    let part = match part {
                        Some(body) => match ctx.parts.put(index, body).await {
                            Ok(part) => Some(part),
                            Err(e) => {
                                warn!(job = %ctx.id, mini_batch = index, error = %e, "Writing the output part failed; requeueing.");
                                return Disposition::Requeue;
                            }
                        },
                        None => None,
                    };
                    if record_outcome(&shared, &ctx, index, outcome, part.as_deref()).await {
                        Disposition::Ack
                    } else {
                        Disposition::Requeue
                    }
                }))
            }
            RunOutcome::Raised { error, timing } => {
                self.script_error(ctx, &process, batch, attempt, &error);
                self.report(
                    ctx,
                    batch,
                    attempt,
                    "raised",
                    Outcome::default(),
                    &process,
                    &start_wall,
                    elapsed,
                    timing.run_seconds,
                    &error.message,
                );
                self.failed_attempt(ctx, batch, attempt, &error.message)
                    .await
            }
            lost @ (RunOutcome::TimedOut | RunOutcome::Died(_)) => {
                // The runner is gone (killed at the timeout, or dead): the slot starts another,
                // and what it had sent ahead goes the usual way again.
                self.runner = None;
                if let Some(sent) = self.ahead.as_mut().and_then(|a| a.sent.take()) {
                    sent.staged.clean().await;
                }
                let (result, main_line, cause) = match lost {
                    RunOutcome::Died(status) => {
                        let code = returncode(&status);
                        (
                            "died",
                            format!("{process} exits with returncode {code}."),
                            format!(
                                "the process died (returncode {code}) while running the mini-batch"
                            ),
                        )
                    }
                    _ => {
                        let cause = format!(
                            "run() exceeded run_invocation_timeout ({}s); the process was killed",
                            ctx.spec.run_invocation_timeout
                        );
                        (
                            "timeout",
                            format!("{process} killed: mini-batch {} {cause}.", batch.index),
                            cause,
                        )
                    }
                };
                ctx.logs.log(logs::JobLogs::node_main(&node), &main_line);
                self.report(
                    ctx,
                    batch,
                    attempt,
                    result,
                    Outcome::default(),
                    &process,
                    &start_wall,
                    elapsed,
                    elapsed,
                    &cause,
                );
                self.failed_attempt(ctx, batch, attempt, &cause).await
            }
        }
    }

    /// A failed attempt: another try while attempts remain, else the mini-batch fails whole.
    async fn failed_attempt(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempt: u32,
        cause: &str,
    ) -> Verdict {
        if ctx.stop.is_cancelled() {
            return Verdict::Drop;
        }
        if attempt < ctx.spec.run_max_try {
            info!(job = %ctx.id, mini_batch = batch.index, attempt, "Attempt failed; requeueing.");
            return Verdict::Settle(Disposition::Requeue);
        }
        if self.record_failure(ctx, batch, attempt, cause).await {
            Verdict::Settle(Disposition::Ack)
        } else {
            Verdict::Settle(Disposition::Requeue)
        }
    }

    /// Records a mini-batch that used up its attempts: every item failed, no part.
    async fn record_failure(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempts: u32,
        cause: &str,
    ) -> bool {
        match record_failed_batch(&*self.shared.agent.ledger, ctx, batch, attempts, cause).await {
            Ok(recorded) => {
                report_recorded(&self.shared, ctx, recorded);
                true
            }
            Err(e) => {
                warn!(job = %ctx.id, mini_batch = batch.index, error = %e, "Recording a failed mini-batch failed; requeueing.");
                false
            }
        }
    }

    /// Makes sure this slot has a ready runner for the job. On an init failure, counts it and
    /// gives up on the job on this node after `3 × process_count_per_node` of them.
    async fn ensure_runner(&mut self, ctx: &Arc<JobContext>) -> bool {
        if self.runner.as_ref().is_some_and(|a| a.job == ctx.id) {
            return true;
        }
        if let Some(previous) = self.runner.take() {
            previous.process.shutdown().await;
        }
        if ctx.gave_up.load(Ordering::Relaxed) {
            return false;
        }
        let node = self.config().node_id.clone();
        let number = self.shared.next_process.fetch_add(1, Ordering::Relaxed);
        let name = format!("process{number:03}");
        let gpu = self.shared.gpus.acquire();
        let mut env = runner_env(ctx, &node, &name);
        env.push((GPU_COUNT_VAR.into(), self.shared.gpus.count().to_string()));
        let mut env_remove = Vec::new();
        match &gpu {
            Some(lease) => env.push(("CUDA_VISIBLE_DEVICES".into(), lease.index().to_string())),
            None => env_remove.push("CUDA_VISIBLE_DEVICES".to_owned()),
        }
        let launch = Launch {
            exe: self.config().runner_exe.clone(),
            stdout: ctx.logs.user_stdout(&node, &name),
            stderr: ctx.logs.user_stderr(&node, &name),
            env,
            env_remove,
        };
        let spec = &ctx.spec;
        let params = InitParams {
            entry_script: local_path_string(&spec.entry_script),
            source_directory: spec.source_directory.as_ref().map(local_path_string),
            arguments: spec.arguments.clone(),
            node_id: node.clone(),
            process_name: name.clone(),
            log_dir: ctx.logs.dir().display().to_string(),
            output_dir: local_path_string(&spec.output),
            logging_level: spec.logging_level.as_str().to_owned(),
            environment: spec.environment.as_ref().map(|p| p.display().to_string()),
        };
        let init_timeout = Duration::from_secs(3 * spec.run_invocation_timeout + 30);
        let main_log = logs::JobLogs::node_main(&node);
        let failure = match RunnerProcess::start(&launch, params, init_timeout).await {
            Ok((Some(process), InitOutcome::Ready(info))) => {
                ctx.logs.log(
                    &main_log,
                    &format!(
                        "{name} started: pid {}, Python {} ({}), prefix {}.",
                        info.pid,
                        info.python_version.lines().next().unwrap_or_default(),
                        info.python_executable,
                        info.python_prefix
                    ),
                );
                self.runner = Some(Active {
                    job: ctx.id.clone(),
                    name,
                    process,
                    job_stop: ctx.stop.clone(),
                    _gpu: gpu,
                });
                return true;
            }
            Ok((_, InitOutcome::Failed(error))) => {
                self.script_error_at_init(ctx, &name, &error);
                format!("init() failed: {}", error.message)
            }
            Ok((_, InitOutcome::TimedOut)) => {
                format!("init() did not finish within {}s", init_timeout.as_secs())
            }
            Ok((_, InitOutcome::Died(status))) => {
                format!(
                    "the process exited with returncode {} during init",
                    returncode(&status)
                )
            }
            Ok((None, InitOutcome::Ready(_))) => unreachable!("a ready runner is returned"),
            Err(e) => e.to_string(),
        };
        ctx.logs
            .log(&main_log, &format!("{name} failed to start: {failure}"));
        let failures = ctx.init_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let processes = spec
            .process_count_per_node
            .unwrap_or(self.config().processes as u32)
            .max(1);
        warn!(job = %ctx.id, process = %name, failures, "Runner failed to start: {failure}");
        let _ = self.shared.agent.events.send(AgentEvent::InitFailed {
            job: ctx.id.clone(),
            processes,
            failure: failure.clone(),
        });
        if failures >= 3 * processes && !ctx.gave_up.swap(true, Ordering::Relaxed) {
            let reason = format!(
                "{failures} runner processes failed to start on node {node}; the last: {failure}"
            );
            ctx.logs.log(
                &main_log,
                &format!("Giving up on job {}: {reason}.", ctx.id),
            );
            let _ = self.shared.agent.events.send(AgentEvent::GaveUp {
                job: ctx.id.clone(),
                reason,
            });
        }
        false
    }

    fn script_error(
        &self,
        ctx: &JobContext,
        process: &str,
        batch: &MiniBatch,
        attempt: u32,
        error: &ScriptError,
    ) {
        let node = &self.config().node_id;
        ctx.logs.append_text(
            logs::JobLogs::user_error(node, process),
            &format!(
                "{} mini-batch {} attempt {attempt}:\n{}",
                logs::now(),
                batch.index,
                error.traceback
            ),
        );
        ctx.logs.log(
            logs::USER_ERROR,
            &format!(
                "{node} {process} mini-batch {} attempt {attempt}: {}",
                batch.index, error.message
            ),
        );
    }

    fn script_error_at_init(&self, ctx: &JobContext, process: &str, error: &ScriptError) {
        let node = &self.config().node_id;
        ctx.logs.append_text(
            logs::JobLogs::user_error(node, process),
            &format!(
                "{} loading the entry script / init():\n{}",
                logs::now(),
                error.traceback
            ),
        );
        ctx.logs.log(
            logs::USER_ERROR,
            &format!("{node} {process} init: {}", error.message),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        ctx: &JobContext,
        batch: &MiniBatch,
        attempt: u32,
        result: &str,
        outcome: Outcome,
        process: &str,
        start: &str,
        elapsed: f64,
        run_seconds: f64,
        note: &str,
    ) {
        ctx.logs.csv(
            logs::REPORT_CSV,
            logs::REPORT_HEADER,
            &format!(
                "{},{attempt},{result},{},{},{},{},{process},{start},{elapsed:.3},{run_seconds:.3},{}",
                batch.index,
                batch.items.len(),
                outcome.succeeded,
                outcome.failed,
                self.config().node_id,
                csv_field(note.lines().next().unwrap_or_default()),
            ),
        );
    }

    /// Takes the next delivery if one is already in hand, and when it is for the job the
    /// runner runs, stages its inputs and sends it: the runner starts it as soon as it has
    /// returned the one it runs now.
    async fn look_ahead(&mut self, ctx: &Arc<JobContext>, consumer: &mut Box<dyn Consumer>) {
        if self.ahead.is_some() || self.drain.is_cancelled() {
            return;
        }
        let Some(Ok(delivery)) = consumer.next().now_or_never() else {
            return;
        };
        let sent = match MiniBatch::decode(&delivery.body) {
            Ok(batch)
                if batch.job == ctx.id
                    && delivery.attempt <= ctx.spec.run_max_try
                    && !ctx.stop.is_cancelled()
                    && !ctx.gave_up.load(Ordering::Relaxed) =>
            {
                // A staging failure is met again, and handled, when its turn comes.
                match self.stage(ctx, &batch).await {
                    Ok(mut staged) => {
                        let active = self.runner.as_mut().expect("running the job");
                        let paths = std::mem::take(&mut staged.paths);
                        if active.process.submit(batch.index, paths).await.is_ok() {
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
        self.ahead = Some(Ahead { delivery, sent });
    }

    /// Local paths for the mini-batch's items: the files themselves when the input is a local
    /// folder, else copies in a staging folder of their own.
    async fn stage(&mut self, ctx: &JobContext, batch: &MiniBatch) -> Result<Staged, String> {
        let mut staged = Staged {
            paths: Vec::with_capacity(batch.items.len()),
            folder: None,
        };
        for key in &batch.items {
            if let Some(path) = ctx.input.local_path(key) {
                staged.paths.push(path);
                continue;
            }
            let folder = match &staged.folder {
                Some(folder) => folder,
                None => {
                    self.stagings += 1;
                    let name = format!("{}-slot{}-{}", ctx.id, self.index, self.stagings);
                    staged.folder.insert(self.config().staging_dir.join(name))
                }
            };
            match stage_one(&*ctx.input, key, folder).await {
                Ok(path) => staged.paths.push(path),
                Err(e) => {
                    staged.clean().await;
                    return Err(e);
                }
            }
        }
        Ok(staged)
    }
}

/// Copies the object `key` into `folder`, at the same relative path.
async fn stage_one(input: &dyn Storage, key: &str, folder: &Path) -> Result<PathBuf, String> {
    fleetrun_common::storage::check_key(key).map_err(|e| e.to_string())?;
    let body = input.get(key).await.map_err(|e| e.to_string())?;
    let path = folder.join(key);
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| e.to_string())?;
    }
    tokio::fs::write(&path, &body)
        .await
        .map_err(|e| e.to_string())?;
    Ok(path)
}

async fn settle(slot: usize, delivery: Delivery, disposition: Disposition) {
    match delivery.settle(disposition).await {
        Ok(true) => {}
        Ok(false) => info!(slot, "Settlement not delivered; the broker will redeliver."),
        Err(e) => warn!(slot, error = %e, "Settling a delivery failed."),
    }
}

/// Records an outcome in the ledger and reports a state change it caused.
async fn record_outcome(
    shared: &Shared,
    ctx: &Arc<JobContext>,
    index: u64,
    outcome: Outcome,
    part: Option<&str>,
) -> bool {
    match shared
        .agent
        .ledger
        .record(&ctx.id, index, outcome, part)
        .await
    {
        Ok(recorded) => {
            report_recorded(shared, ctx, recorded);
            true
        }
        Err(e) => {
            warn!(job = %ctx.id, mini_batch = index, error = %e, "Recording in the ledger failed; requeueing.");
            false
        }
    }
}

/// Acts on a recording: stops the job's work if it no longer runs, and hands a state change
/// to whoever drives the job.
fn report_recorded(shared: &Shared, ctx: &JobContext, recorded: Recorded) {
    if !recorded.status.state.accepts_work() {
        ctx.stop.cancel();
    }
    if recorded.transitioned {
        let _ = shared.agent.events.send(AgentEvent::Transitioned {
            job: ctx.id.clone(),
            status: recorded.status,
        });
    }
}

/// Records a mini-batch that failed whole (its attempts spent, or dead-lettered): lists its
/// items in `failed_items.csv` and counts them all as failed, with no part (one an earlier
/// attempt stored is never read).
pub async fn record_failed_batch(
    ledger: &dyn Ledger,
    ctx: &JobContext,
    batch: &MiniBatch,
    attempts: u32,
    cause: &str,
) -> Result<Recorded, String> {
    let cause_line = csv_field(cause.lines().next().unwrap_or_default());
    for item in &batch.items {
        ctx.logs.csv(
            logs::FAILED_ITEMS_CSV,
            logs::FAILED_ITEMS_HEADER,
            &format!(
                "{},{},{attempts},{cause_line}",
                csv_field(item),
                batch.index
            ),
        );
    }
    ledger
        .record(
            &ctx.id,
            batch.index,
            Outcome::all_failed(batch.items.len() as u64),
            None,
        )
        .await
        .map_err(|e| e.to_string())
}

struct Staged {
    paths: Vec<PathBuf>,
    folder: Option<PathBuf>,
}

impl Staged {
    async fn clean(self) {
        if let Some(folder) = self.folder {
            let _ = tokio::fs::remove_dir_all(folder).await;
        }
    }
}

/// A part: the rows, one per line.
pub fn join_rows(rows: &[String]) -> Bytes {
    let mut part = Vec::with_capacity(rows.iter().map(|r| r.len() + 1).sum());
    for row in rows {
        part.extend_from_slice(row.as_bytes());
        part.push(b'\n');
    }
    part.into()
}

fn local_path_string(location: &fleetrun_config::Location) -> String {
    match location {
        fleetrun_config::Location::Local(p) => p.display().to_string(),
        other => other.to_string(),
    }
}

/// The runner's environment: the job's variables and who the process is.
fn runner_env(ctx: &JobContext, node: &str, process: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = ctx
        .spec
        .environment_variables
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.push(("FLEETRUN_JOB_ID".into(), ctx.id.clone()));
    env.push(("FLEETRUN_NODE_ID".into(), node.to_owned()));
    env.push(("FLEETRUN_PROCESS_NAME".into(), process.to_owned()));
    env
}

/// States in which the job's remaining mini-batches are no longer worked on.
pub fn is_stopped(state: JobState) -> bool {
    !state.accepts_work()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_failures_fail_a_job_at_twice_its_runners_once_it_has_run_two_minutes() {
        let late = INIT_FAILURE_GRACE + Duration::from_secs(1);
        // 2 nodes × 3 processes: the limit is 12.
        assert_eq!(init_failures_fail_job(2, 3, 11, late), None);
        let reason = init_failures_fail_job(2, 3, 12, late).expect("at the limit");
        assert!(
            reason.starts_with("12 runner processes failed to start"),
            "{reason}"
        );
        assert!(reason.contains("the limit is 12"), "{reason}");
        // Not before the job has run two minutes, however many.
        assert_eq!(init_failures_fail_job(2, 3, 100, INIT_FAILURE_GRACE), None);
    }
}
