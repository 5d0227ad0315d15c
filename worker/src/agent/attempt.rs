//! One `run()` attempt of a mini-batch on a slot's [`Bench`] (its runner, its staging, its
//! look-ahead), in two steps the slot calls: [`Bench::begin`] notes who runs it, stages its
//! inputs and sends it to the runner; [`Bench::end`] waits for its outcome and decides what
//! becomes of the delivery (a [`Verdict`]). Isolation runs its pieces with the same
//! [`Bench::wait`] and [`Bench::lose_runner`].

use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetrun_common::ledger::{LedgerError, Outcome, Recorded};
use fleetrun_common::protocol::{ErrorCause, ScriptError, Timing};
use fleetrun_common::queue::{Delivery, Disposition};
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::OutputAction;
use tracing::{info, warn};

use super::ahead::LookAhead;
use super::finish::{Finish, fail_job, report_recorded};
use super::holding::{self, Holding};
use super::report::{failed_item_lines, report_row};
use super::runner::RunnerSeat;
use super::settle::{self, AfterFailure, Limits};
use super::stage::{Staged, Stager};
use super::stage_error::StageError;
use super::unavailable::staging_unavailable;
use super::verdict::{Isolation, Verdict, Why, divisible, isolates};
use super::{JobContext, Shared};
use crate::logs;
use crate::metrics::InFlight;
use crate::parts::{PartError, join_rows};
use crate::process::{RunOutcome, returncode};
use crate::worker_config::WorkerConfig;

/// How long a slot pauses when the ledger does not answer before it hands the mini-batch in
/// hand back and takes the next.
const LEDGER_PAUSE: Duration = Duration::from_secs(2);

/// What a slot runs attempts with: its runner, its staging, and what it took ahead.
pub(super) struct Bench {
    pub(super) shared: Arc<Shared>,
    pub(super) seat: RunnerSeat,
    pub(super) stager: Stager,
    pub(super) ahead: LookAhead,
}

/// An attempt whose mini-batch went to the runner: what [`Bench::end`] needs.
pub(super) struct Running {
    holding: Holding,
    staged: Staged,
    started: Instant,
    start_wall: String,
    process: String,
    /// The runner has it (a failed send means a dead runner: its outcome says so at once).
    pub(super) submitted: bool,
    _in_flight: InFlight,
}

/// How waiting for the runner's outcome ended.
pub(super) enum Waited {
    /// The runner answered (or was lost) after `elapsed` seconds.
    Ran { outcome: RunOutcome, elapsed: f64 },
    /// The job stopped: the runner was killed.
    Stopped,
    /// The slot has no runner: nothing ran.
    NoRunner,
}

/// A mini-batch sent after another, which its runner died in while holding the other's
/// reply (see [`RunOutcome::ReplyLost`]).
pub(super) struct Culprit {
    delivery: Delivery,
    ctx: Arc<JobContext>,
    batch: MiniBatch,
    died: ExitStatus,
}

impl Bench {
    pub(super) fn config(&self) -> &WorkerConfig {
        &self.shared.agent.config
    }

    /// Starts an attempt of `batch` (delivery number `attempt`): notes who runs it in the
    /// ledger, stages its inputs (unless `sent` holds those of a mini-batch the runner already
    /// has: it was taken ahead) and sends it. `Err` is what becomes of the delivery when it
    /// never reached the runner.
    pub(super) async fn begin(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempt: u32,
        sent: Option<Staged>,
    ) -> Result<Running, Verdict> {
        let node = self.config().node_id.clone();
        let in_flight = self.config().metrics.in_flight();
        // Numbered by the ledger's count of the attempts the script spent (the delivery's
        // number, which counts those lost with workers too, only when it cannot tell).
        let mut holding = Holding::new(&node, self.seat.name(), attempt, batch);
        if !holding::started(ctx, batch, &mut holding).await && sent.is_none() {
            // The ledger does not answer: neither the attempts spent nor this one's record
            // could be kept. The work pauses; the mini-batch goes back untried.
            tokio::select! {
                _ = ctx.stop.cancelled() => return Err(Verdict::Drop),
                _ = tokio::time::sleep(LEDGER_PAUSE) => {}
            }
            return Err(Verdict::Settle(Disposition::Return));
        }
        let (mut staged, sent) = match sent {
            Some(staged) => (staged, true),
            None => match self.stager.stage(ctx, batch).await {
                Ok(s) => (s, false),
                Err(e) => return Err(self.staging_failed(ctx, batch, &holding, e).await),
            },
        };
        let start_wall = logs::now();
        let started = Instant::now();
        // The slot started the runner before it began (or sent `sent` to it).
        let Some(active) = self.seat.active_mut() else {
            staged.clean().await;
            return Err(Verdict::Settle(Disposition::Return));
        };
        let process = active.name.clone();
        ctx.logs.log(
            logs::JobLogs::node_process(&node, &process),
            &format!(
                "mini-batch {} picked: attempt {}, {}, ip {}, pid {}.",
                batch.index,
                holding.attempt,
                picked_items(batch),
                crate::ip::node_ip(),
                active.process.pid()
            ),
        );
        let submitted = sent || staged.send(&mut *active.process, ctx, batch).await.is_ok();
        Ok(Running {
            holding,
            staged,
            started,
            start_wall,
            process,
            submitted,
            _in_flight: in_flight,
        })
    }

    /// What becomes of an attempt whose inputs were not staged (`e`).
    async fn staging_failed(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        holding: &Holding,
        e: StageError,
    ) -> Verdict {
        match e {
            StageError::Scratch(e) => Verdict::Settle(fail_job(&self.shared, ctx, &e).await),
            StageError::Unavailable(e) => {
                let staged = (batch, "");
                let disposition = staging_unavailable(&self.shared, ctx, staged, holding, &e);
                Verdict::Settle(disposition.await)
            }
            e @ (StageError::Input(_) | StageError::Overran(_)) => {
                warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Staging inputs failed.");
                let node = &self.config().node_id;
                ctx.logs.log(
                    logs::JobLogs::sys_error(node, self.seat.name()),
                    &format!(
                        "mini-batch {} attempt {}: staging inputs failed: {e}",
                        batch.index, holding.attempt
                    ),
                );
                let cause = format!("staging inputs failed: {e}");
                self.config().metrics.mini_batch("staging_failed");
                let row = report_row(
                    batch,
                    holding,
                    "staging_failed",
                    Outcome::default(),
                    None,
                    &cause,
                );
                self.failed_attempt(ctx, batch, holding, row, &cause).await
            }
        }
    }

    /// Ends an attempt `begin` started: waits for its outcome and decides what becomes of
    /// the delivery.
    pub(super) async fn end(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        running: Running,
    ) -> Verdict {
        let Running {
            holding,
            staged,
            started,
            start_wall,
            process,
            ..
        } = running;
        let timeout = Duration::from_secs(ctx.job.spec().run_invocation_timeout);
        let left = timeout.saturating_sub(started.elapsed());
        let (outcome, elapsed) = match self.wait(ctx, staged, started, left).await {
            Waited::Ran { outcome, elapsed } => (outcome, elapsed),
            Waited::Stopped => return Verdict::Drop,
            Waited::NoRunner => return Verdict::Settle(Disposition::Return),
        };
        let attempt = Tried {
            ctx,
            batch,
            holding,
            process,
            elapsed,
        };
        match outcome {
            RunOutcome::Done {
                rows,
                timing,
                given,
                header,
            } => {
                let returned = Returned {
                    rows,
                    timing,
                    given,
                    header,
                    start_wall,
                };
                self.returned(attempt, returned).await
            }
            RunOutcome::Raised { error, timing } => self.raised(attempt, &error, timing).await,
            lost => match self.lose_runner(lost).await {
                (lost, None) => self.charge_lost(&attempt, lost, Some(elapsed)).await,
                (_, Some(culprit)) => self.reply_lost(attempt, culprit).await,
            },
        }
    }

    /// Waits at most `left` for the runner's outcome of what it was sent last (`staged`,
    /// cleaned after; `started` when it was sent). A job that stops meanwhile kills the
    /// runner: its reply must never be taken for another mini-batch's.
    pub(super) async fn wait(
        &mut self,
        ctx: &JobContext,
        staged: Staged,
        started: Instant,
        left: Duration,
    ) -> Waited {
        let Some(active) = self.seat.active_mut() else {
            staged.clean().await;
            return Waited::NoRunner;
        };
        let outcome = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => None,
            o = active.process.outcome(left) => Some(o),
        };
        let Some(outcome) = outcome else {
            self.seat.kill().await;
            staged.clean().await;
            return Waited::Stopped;
        };
        if let RunOutcome::Done { timing, .. } | RunOutcome::Raised { timing, .. } = &outcome {
            active.times.ran(timing);
        }
        let elapsed = started.elapsed().as_secs_f64();
        staged.clean().await;
        Waited::Ran { outcome, elapsed }
    }

    /// Forgets the slot's runner, gone with `lost` (killed at the timeout, or dead): the
    /// slot starts another, and what was sent to it ahead goes the usual way again. Returns
    /// how it was lost (timed out, or died), and the mini-batch it died in when that was one
    /// sent after the one it answered for.
    pub(super) async fn lose_runner(&mut self, lost: RunOutcome) -> (RunOutcome, Option<Culprit>) {
        self.seat.lose();
        let died_in = match &lost {
            RunOutcome::ReplyLost { ahead, .. } => Some(*ahead),
            _ => None,
        };
        let culprit = self.ahead.lose(died_in).await;
        let lost = match lost {
            RunOutcome::ReplyLost { died, .. } => RunOutcome::Died(died),
            other => other,
        };
        if let RunOutcome::Died(died) = &lost {
            self.config().metrics.runner_died();
            if let Some((delivery, ctx, batch)) = culprit {
                let died = *died;
                return (
                    lost,
                    Some(Culprit {
                        delivery,
                        ctx,
                        batch,
                        died,
                    }),
                );
            }
        }
        (lost, None)
    }

    /// An attempt whose `run()` returned: its named outputs delivered, what remains
    /// (part, ledger, acknowledgement) is a [`Finish`].
    async fn returned(&mut self, attempt: Tried<'_>, returned: Returned) -> Verdict {
        let Tried {
            ctx,
            batch,
            holding,
            process,
            elapsed,
        } = attempt;
        let Returned {
            rows,
            timing,
            given,
            header,
            start_wall,
        } = returned;
        let node = self.config().node_id.clone();
        let metrics = &self.config().metrics;
        let spec = ctx.job.spec();
        // A tabular mini-batch's items are the rows its DataFrame held.
        let items = given.unwrap_or(batch.items.len() as u64);
        let count = rows.len() as u64;
        if divisible(batch) {
            ctx.node.fit.ran_well(batch.items.len());
        }
        let settled = settle::returned(count, items, spec.error_threshold);
        let outcome = settled.judged.outcome;
        if settled.judged.more {
            warn!(job = %ctx.job.id(), mini_batch = batch.index, returned = count, items, "run() returned more elements than it got; keeping them.");
        }
        ctx.logs.log(
            logs::JobLogs::node_process(&node, &process),
            &format!(
                "mini-batch {} completed: ip {}, pid {}, items {items}, succeeded {}, failed {}, started {start_wall}, duration {elapsed:.3}s, cpu {:.3}s, run() {:.3}s",
                batch.index, crate::ip::node_ip(), self.seat.active().map_or(0, |a| a.process.pid()), outcome.succeeded, outcome.failed, timing.cpu_seconds, timing.run_seconds
            ),
        );
        // A short return's items are listed in failed_items.csv, all of them.
        let failed = settled
            .short_cause
            .map(|cause| failed_item_lines(batch, holding.attempt, &cause));
        metrics.mini_batch(settled.result);
        metrics.run_took(timing.run_seconds);
        let row = report_row(
            batch,
            &holding,
            settled.result,
            outcome,
            Some((elapsed, timing.run_seconds)),
            &settled.judged.note,
        );
        let rows = (spec.output_action == OutputAction::AppendRow).then(|| {
            let header = header.filter(|_| spec.append_row_dataframe_header);
            crate::parts::with_header(header.as_deref(), &rows, spec.append_row_dataframe_header)
        });
        // The script's named-output files reach their place before the mini-batch is
        // recorded; while the runner runs the next one, only those written before this one
        // returned.
        if let Some(before) = self.named_cutoff(ctx, &node, &process) {
            super::named::deliver_logged(ctx, &node, &process, before).await;
        }
        Verdict::Finish(Box::new(Finish {
            shared: self.shared.clone(),
            ctx: ctx.clone(),
            index: batch.index,
            rows,
            failed,
            outcome,
            row,
            holding,
        }))
    }

    /// An attempt whose `run()` raised.
    async fn raised(&mut self, attempt: Tried<'_>, error: &ScriptError, timing: Timing) -> Verdict {
        let Tried {
            ctx,
            batch,
            holding,
            process,
            elapsed,
        } = attempt;
        let node = self.config().node_id.clone();
        let metrics = &self.config().metrics;
        let out_of_memory = error.cause == ErrorCause::OutOfMemory && divisible(batch);
        metrics.mini_batch(if out_of_memory {
            OUT_OF_GPU_MEMORY
        } else {
            "raised"
        });
        metrics.run_took(timing.run_seconds);
        if out_of_memory {
            let size = ctx.node.fit.ran_out(batch.items.len());
            let items = batch.items.len();
            let log = (node.as_str(), process.as_str());
            let then = format!("it runs again in pieces of at most {size}, its attempt not spent");
            out_of_memory_logged(log, ctx, batch, holding.attempt, items, error, &then);
        } else {
            script_error(&node, ctx, &process, batch, holding.attempt, error);
        }
        // What this attempt wrote to the named outputs is never delivered as it is.
        if let Some(before) = self.named_cutoff(ctx, &node, &process) {
            let failed = (batch.index, holding.attempt);
            super::named::withhold(ctx, &node, &process, failed, before).await;
        }
        let row = report_row(
            batch,
            &holding,
            if out_of_memory {
                OUT_OF_GPU_MEMORY
            } else {
                "raised"
            },
            Outcome::default(),
            Some((elapsed, timing.run_seconds)),
            &error.message,
        );
        if out_of_memory {
            // No attempt spent: the mini-batch runs again at once, in pieces that fit.
            holding::ended(ctx, batch.index, Some(&row), &holding, false).await;
            return Verdict::Isolate(Box::new(Isolation {
                ctx: ctx.clone(),
                batch: batch.clone(),
                attempts: holding.attempt,
                why: Why::OutOfMemory,
            }));
        }
        self.failed_attempt(ctx, batch, &holding, row, &error.message)
            .await
    }

    /// An attempt that ran, whose reply was lost with its runner, which died in `culprit`,
    /// sent after it: that one is charged, and this one runs again, its attempt not spent.
    async fn reply_lost(&mut self, attempt: Tried<'_>, culprit: Culprit) -> Verdict {
        let Tried {
            ctx,
            batch,
            holding,
            process,
            ..
        } = attempt;
        let Culprit {
            delivery,
            ctx: culprit_ctx,
            batch: culprit_batch,
            died,
        } = culprit;
        let node = self.config().node_id.clone();
        let mut charged = Holding::new(&node, &process, delivery.attempt, &culprit_batch);
        holding::started(&culprit_ctx, &culprit_batch, &mut charged).await;
        let charged = Tried {
            ctx: &culprit_ctx,
            batch: &culprit_batch,
            holding: charged,
            process: process.clone(),
            elapsed: 0.0,
        };
        let verdict = self
            .charge_lost(&charged, RunOutcome::Died(died), None)
            .await;
        let cause = format!(
            "it ran, but {process} held its result back and died in mini-batch {} (returncode {})",
            culprit_batch.index,
            returncode(&died)
        );
        ctx.logs.log(
            logs::JobLogs::node_process(&node, &process),
            &format!("mini-batch {} lost: {cause}; it runs again.", batch.index),
        );
        let row = report_row(batch, &holding, "lost", Outcome::default(), None, &cause);
        holding::ended(ctx, batch.index, Some(&row), &holding, false).await;
        Verdict::Again {
            batch: Box::new(batch.clone()),
            culprit: Box::new((delivery, verdict)),
        }
    }

    /// An attempt that ended with its runner gone (`lost`: timed out, or died), after
    /// `elapsed` seconds when known: logged and reported, and charged to the script.
    async fn charge_lost(
        &mut self,
        attempt: &Tried<'_>,
        lost: RunOutcome,
        elapsed: Option<f64>,
    ) -> Verdict {
        let Tried {
            ctx,
            batch,
            holding,
            process,
            ..
        } = attempt;
        let node = self.config().node_id.clone();
        // Nothing the lost runner left in its named-output folders is delivered.
        if !ctx.job.spec().outputs.is_empty() {
            let failed = (batch.index, holding.attempt);
            super::named::withhold(ctx, &node, process, failed, None).await;
        }
        let (result, cause) = lost_logged(&node, ctx, process, batch.index, &lost);
        self.config().metrics.mini_batch(result);
        let times = elapsed.map(|e| (e, e));
        let row = report_row(batch, holding, result, Outcome::default(), times, &cause);
        self.failed_attempt(ctx, batch, holding, row, &cause).await
    }

    /// Which of runner `process`'s named-output files belong to the attempt that just ended:
    /// all (`Some(None)`) when the runner is idle; those last modified before now when it
    /// already runs the next mini-batch; `None` when the job has no named outputs, or the
    /// clock cannot be read.
    fn named_cutoff(&self, ctx: &JobContext, node: &str, process: &str) -> Option<Option<i128>> {
        if ctx.job.spec().outputs.is_empty() {
            return None;
        }
        if !self.ahead.busy() {
            return Some(None);
        }
        let work = super::workdir::job_work_dir(self.config().cache(), ctx.job.id(), node);
        super::named::clock(&super::named::runner_folder(&work, process)).map(Some)
    }

    /// A failed attempt, its report `row` written: another try while attempts remain, else
    /// the mini-batch is isolated or fails whole (see [`settle::after_failure`]).
    pub(super) async fn failed_attempt(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        holding: &Holding,
        row: String,
        cause: &str,
    ) -> Verdict {
        let attempt = holding.attempt;
        let limits = Limits {
            run_max_try: ctx.job.spec().run_max_try,
            isolates: isolates(ctx, batch),
            stopped: ctx.stop.is_cancelled(),
        };
        match settle::after_failure(attempt, limits) {
            AfterFailure::Drop => Verdict::Drop,
            AfterFailure::Retry => {
                info!(job = %ctx.job.id(), mini_batch = batch.index, attempt, "Attempt failed; requeueing.");
                // Its row kept, the next holder does not report it lost; the attempt is spent.
                holding::ended(ctx, batch.index, Some(&row), holding, true).await;
                Verdict::Settle(Disposition::Requeue)
            }
            AfterFailure::Isolate => {
                holding::ended(ctx, batch.index, Some(&row), holding, true).await;
                Verdict::Isolate(Box::new(Isolation {
                    ctx: ctx.clone(),
                    batch: batch.clone(),
                    attempts: attempt,
                    why: Why::Failed,
                }))
            }
            AfterFailure::FailWhole => {
                let recorded = record_failure(&self.shared, ctx, batch, attempt, cause, Some(&row));
                Verdict::Settle(if recorded.await {
                    Disposition::Ack
                } else {
                    Disposition::Requeue
                })
            }
        }
    }
}

/// An attempt that ran: its job, its mini-batch, its holder, its runner and how long it took.
pub(super) struct Tried<'a> {
    ctx: &'a Arc<JobContext>,
    batch: &'a MiniBatch,
    holding: Holding,
    process: String,
    elapsed: f64,
}

/// What a `run()` that returned gave.
struct Returned {
    rows: Vec<String>,
    timing: Timing,
    given: Option<u64>,
    header: Option<String>,
    /// When the attempt started, as the `completed` line writes it.
    start_wall: String,
}

/// Why a mini-batch that failed whole was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Its part (its lines of `failed_items.csv`) was not stored.
    #[error("storing its part: {0}")]
    Part(#[from] PartError),
    /// The ledger did not record it.
    #[error("recording it: {0}")]
    Ledger(#[source] LedgerError),
}

/// Records a mini-batch that used up its attempts: every item failed, no part.
pub(super) async fn record_failure(
    shared: &Shared,
    ctx: &Arc<JobContext>,
    batch: &MiniBatch,
    attempts: u32,
    cause: &str,
    row: Option<&str>,
) -> bool {
    let metrics = &shared.agent.config.metrics;
    match record_failed_batch(ctx, batch, attempts, cause, row).await {
        Ok(recorded) => {
            metrics.mini_batch("failed_whole");
            report_recorded(shared, ctx, recorded.transitioned, recorded.status);
            true
        }
        Err(e) => {
            // Its part or its record: not told apart here, so not counted as the ledger's.
            warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Recording a failed mini-batch failed; requeueing.");
            false
        }
    }
}

/// Logs a runner lost while it ran mini-batch `index` (`lost`: killed at the timeout, or
/// dead) in the node's logs; returns the report's result and the cause.
pub(super) fn lost_logged(
    node: &str,
    ctx: &JobContext,
    process: &str,
    index: u64,
    lost: &RunOutcome,
) -> (&'static str, String) {
    let (result, line, cause) = runner_lost(lost, ctx, process, index);
    ctx.logs.log(logs::JobLogs::node_main(node), &line);
    ctx.logs.log(logs::JobLogs::sys_error(node, process), &line);
    (result, cause)
}

/// The report's result of a `run()` that ran out of GPU memory (a piece's or a whole
/// mini-batch's), which costs no attempt and counts apart from the script's errors.
pub(super) const OUT_OF_GPU_MEMORY: &str = "out_of_gpu_memory";

/// Logs a `run()` of `items` items of `batch` (attempt `attempt`) that ran out of GPU memory
/// on runner `process` of node `node` (`log`): its traceback in the runner's user error
/// file, one line in its process log saying what happens `then`; not in `user/error.txt`,
/// which lists the script's errors.
pub(super) fn out_of_memory_logged(
    (node, process): (&str, &str),
    ctx: &JobContext,
    batch: &MiniBatch,
    attempt: u32,
    items: usize,
    error: &ScriptError,
    then: &str,
) {
    ctx.logs.append_text(
        logs::JobLogs::user_error(node, process),
        &format!(
            "{} mini-batch {} attempt {attempt}, out of GPU memory at {items} items:\n{}",
            logs::now(),
            batch.index,
            error.traceback
        ),
    );
    ctx.logs.log(
        logs::JobLogs::node_process(node, process),
        &format!(
            "mini-batch {} ran out of GPU memory at {items} items: {}; {then}.",
            batch.index, error.message
        ),
    );
    info!(job = %ctx.job.id(), mini_batch = batch.index, items, "Out of GPU memory; running the mini-batch in pieces.");
}

/// Logs the script's error in attempt `attempt` of `batch`, by runner `process`.
pub(super) fn script_error(
    node: &str,
    ctx: &JobContext,
    process: &str,
    batch: &MiniBatch,
    attempt: u32,
    error: &ScriptError,
) {
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

/// Records a mini-batch that failed whole (its attempts spent, with the last one's report
/// `row`, or dead-lettered): counts its items all as failed, and stores their lines of `failed_items.csv` as its part, which the
/// job's results join with every other node's (one an earlier attempt stored of rows is
/// never read). A mini-batch already recorded (it succeeded on an attempt whose
/// acknowledgement was lost, and came back past its attempts) keeps its outcome and its
/// part, so its items are never listed as failed.
pub async fn record_failed_batch(
    ctx: &JobContext,
    batch: &MiniBatch,
    attempts: u32,
    cause: &str,
    row: Option<&str>,
) -> Result<Recorded, RecordError> {
    let failed = if batch.chunks.is_empty() {
        batch.items.len() as u64
    } else {
        super::tabular::count_rows(&*ctx.input, &batch.chunks)
            .await
            .unwrap_or(batch.chunks.len() as u64)
    };
    let lines = failed_item_lines(batch, attempts, cause);
    let part = ctx.job.parts().put(batch.index, join_rows(&lines)).await?;
    let reference = crate::parts::reference(None, Some(&part));
    ctx.job
        .record(
            batch.index,
            Outcome::all_failed(failed),
            reference.as_deref(),
            row,
        )
        .await
        .map_err(RecordError::Ledger)
}

/// What a runner lost while it ran a mini-batch (killed at the timeout, or dead) says: the
/// report's result, the line for the node's logs, and the cause.
pub(super) fn runner_lost(
    lost: &RunOutcome,
    ctx: &JobContext,
    process: &str,
    index: u64,
) -> (&'static str, String, String) {
    match lost {
        RunOutcome::Died(status) | RunOutcome::ReplyLost { died: status, .. } => {
            let code = returncode(status);
            match crate::oom::killed_for_memory(status) {
                Some(oom) => (
                    "out_of_memory",
                    format!("{process} {oom} (returncode {code})."),
                    format!(
                        "the process was {oom} (returncode {code}) while running the mini-batch"
                    ),
                ),
                None => (
                    "died",
                    format!("{process} exits with returncode {code}."),
                    format!("the process died (returncode {code}) while running the mini-batch"),
                ),
            }
        }
        _ => {
            let cause = format!(
                "run() exceeded run_invocation_timeout ({}s); the process was killed",
                ctx.job.spec().run_invocation_timeout
            );
            (
                "timeout",
                format!("{process} killed: mini-batch {index} {cause}."),
                cause,
            )
        }
    }
}

/// What a `picked` line says a mini-batch holds: its files, or a tabular input's chunks.
fn picked_items(batch: &MiniBatch) -> String {
    if batch.chunks.is_empty() {
        format!("items {}", batch.items.len())
    } else {
        format!("chunks {}", batch.chunks.len())
    }
}
