//! One `run()` attempt of a mini-batch and its settlement: the part, the ledger's record,
//! the report line, and what a failed attempt becomes.

use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fleetrun_common::ledger::{Outcome, Recorded, Status};
use fleetrun_common::protocol::ScriptError;
use fleetrun_common::queue::{Consumer, Delivery, Disposition};
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::OutputAction;
use tracing::{error, info, warn};

use super::holding::{self, Holding};
use super::returns;
use super::slot::{Slot, Verdict};
use super::stage::{StageError, Staged};
use super::{AgentEvent, JobContext, Shared, unavailable};
use crate::logs::{self, csv_field};
use crate::parts::PartError;
use crate::process::{RunOutcome, returncode};
use crate::scratch::FolderError;

/// How long a slot pauses when the ledger does not answer before it hands the mini-batch in
/// hand back and takes the next.
const LEDGER_PAUSE: Duration = Duration::from_secs(2);

impl Slot {
    /// One `run()` attempt of a mini-batch, and what becomes of the delivery. `sent` holds
    /// the staged inputs of a mini-batch the runner already has (it was taken ahead).
    pub(super) async fn attempt(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempt: u32,
        sent: Option<Staged>,
        consumer: &mut Box<dyn Consumer>,
    ) -> Verdict {
        let node = self.config().node_id.clone();
        let metrics = self.config().metrics.clone();
        let _in_flight = metrics.in_flight();
        let process = self.runner.as_ref().map_or("_main", |a| a.name.as_str());
        // Numbered by the ledger's count of the attempts the script spent (the delivery's
        // number, which counts those lost with workers too, only when it cannot tell).
        let mut holding = Holding::new(&node, process, attempt, batch);
        if !holding::started(ctx, batch, &mut holding).await && sent.is_none() {
            // The ledger does not answer: neither the attempts spent nor this one's record
            // could be kept. The work pauses; the mini-batch goes back untried.
            tokio::select! {
                _ = ctx.stop.cancelled() => return Verdict::Drop,
                _ = tokio::time::sleep(LEDGER_PAUSE) => {}
            }
            return Verdict::Settle(Disposition::Return);
        }
        let attempt = holding.attempt;
        let (mut staged, sent) = match sent {
            Some(staged) => (staged, true),
            None => match self.stage(ctx, batch).await {
                Ok(s) => (s, false),
                Err(StageError::Scratch(e)) => {
                    return Verdict::Settle(fail_job(&self.shared, ctx, &e).await);
                }
                Err(StageError::Unavailable(e)) => {
                    let staged = (batch, "");
                    let disposition = self.staging_unavailable(ctx, staged, &holding, &e).await;
                    return Verdict::Settle(disposition);
                }
                Err(e @ (StageError::Input(_) | StageError::Overran(_))) => {
                    warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Staging inputs failed.");
                    let process = self.runner.as_ref().map_or("_main", |a| a.name.as_str());
                    ctx.logs.log(
                        logs::JobLogs::sys_error(&node, process),
                        &format!(
                            "mini-batch {} attempt {attempt}: staging inputs failed: {e}",
                            batch.index
                        ),
                    );
                    let cause = format!("staging inputs failed: {e}");
                    metrics.mini_batch("staging_failed");
                    let row = report_row(
                        batch,
                        &holding,
                        "staging_failed",
                        Outcome::default(),
                        None,
                        &cause,
                    );
                    return self.failed_attempt(ctx, batch, &holding, row, &cause).await;
                }
            },
        };
        let timeout = Duration::from_secs(ctx.job.spec().run_invocation_timeout);
        let start_wall = logs::now();
        let started = Instant::now();
        let active = self.runner.as_mut().expect("ensure_runner made one");
        let process = active.name.clone();
        ctx.logs.log(
            logs::JobLogs::node_process(&node, &process),
            &format!(
                "mini-batch {} picked: attempt {attempt}, {}, ip {}, pid {}.",
                batch.index,
                picked_items(batch),
                crate::ip::node_ip(),
                active.process.pid()
            ),
        );
        let submitted = sent || staged.send(&mut *active.process, ctx, batch).await.is_ok();
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
            RunOutcome::Done {
                rows,
                timing,
                given,
                header,
            } => {
                // A tabular mini-batch's items are the rows its DataFrame held.
                let items = given.unwrap_or(items);
                let returned = rows.len() as u64;
                let judged = returns::judge(returned, items, ctx.job.spec().error_threshold);
                let (outcome, note) = (judged.outcome, judged.note);
                if judged.more {
                    warn!(job = %ctx.job.id(), mini_batch = batch.index, returned, items, "run() returned more elements than it got; keeping them.");
                }
                ctx.logs.log(
                    logs::JobLogs::node_process(&node, &process),
                    &format!(
                        "mini-batch {} completed: ip {}, pid {}, items {items}, succeeded {}, failed {}, started {start_wall}, duration {elapsed:.3}s, cpu {:.3}s, run() {:.3}s",
                        batch.index, crate::ip::node_ip(), self.runner.as_ref().map_or(0, |a| a.process.pid()), outcome.succeeded, outcome.failed, timing.cpu_seconds, timing.run_seconds
                    ),
                );
                // A short return's items are listed in failed_items.csv, all of them.
                let failed_lines = (outcome.failed > 0).then(|| {
                    let cause = returns::short_cause(returned, items);
                    failed_item_lines(batch, attempt, &cause)
                });
                let result = if outcome.batch_failed {
                    "partial"
                } else {
                    "succeeded"
                };
                metrics.mini_batch(result);
                metrics.run_took(timing.run_seconds);
                let row = report_row(
                    batch,
                    &holding,
                    result,
                    outcome,
                    Some((elapsed, timing.run_seconds)),
                    &note,
                );
                let part = (ctx.job.spec().output_action == OutputAction::AppendRow).then(|| {
                    let header = header.filter(|_| ctx.job.spec().append_row_dataframe_header);
                    crate::parts::with_header(
                        header.as_deref(),
                        &rows,
                        ctx.job.spec().append_row_dataframe_header,
                    )
                });
                // The script's named-output files reach their place before the mini-batch
                // is recorded; while the runner runs the next one, only those written
                // before this one returned.
                if let Some(before) = self.named_cutoff(ctx, &node, &process) {
                    super::named::deliver_logged(ctx, &node, &process, before).await;
                }
                let (shared, ctx, index) = (self.shared.clone(), ctx.clone(), batch.index);
                let holding = holding.clone();
                Verdict::Finish(Box::pin(async move {
                    let part = match part {
                        Some(body) => {
                            match store_part(&shared, &ctx, index, body, &row, &holding).await {
                                Ok(part) => Some(part),
                                Err(disposition) => return disposition,
                            }
                        }
                        None => None,
                    };
                    let part = match failed_lines {
                        Some(lines) => {
                            let body = join_rows(&lines);
                            match store_part(&shared, &ctx, index, body, &row, &holding).await {
                                Ok(failed) => {
                                    crate::parts::reference(part.as_deref(), Some(&failed))
                                }
                                Err(disposition) => return disposition,
                            }
                        }
                        None => part,
                    };
                    // What the script wrote to output_dir reaches an S3 output before the
                    // mini-batch counts as done.
                    super::outdir::sync_logged(&ctx).await;
                    let recorded =
                        record_outcome(&shared, &ctx, index, outcome, part.as_deref(), &row);
                    if recorded.await {
                        Disposition::Ack
                    } else {
                        Disposition::Requeue
                    }
                }))
            }
            RunOutcome::Raised { error, timing } => {
                metrics.mini_batch("raised");
                metrics.run_took(timing.run_seconds);
                self.script_error(ctx, &process, batch, attempt, &error);
                // What this attempt wrote to the named outputs is never delivered as it is.
                if let Some(before) = self.named_cutoff(ctx, &node, &process) {
                    let failed = (batch.index, attempt);
                    super::named::withhold(ctx, &node, &process, failed, before).await;
                }
                let row = report_row(
                    batch,
                    &holding,
                    "raised",
                    Outcome::default(),
                    Some((elapsed, timing.run_seconds)),
                    &error.message,
                );
                self.failed_attempt(ctx, batch, &holding, row, &error.message)
                    .await
            }
            RunOutcome::ReplyLost { died, ahead } => {
                let culprit = self.lose_runner(Some(ahead)).await;
                metrics.runner_died();
                let Some(culprit) = culprit else {
                    // The page named none this slot sent: charged as a plain death.
                    let lost = RunOutcome::Died(died);
                    return self
                        .charge_lost(ctx, batch, &holding, &process, lost, Some(elapsed))
                        .await;
                };
                // The runner died in a mini-batch sent after this one, which had run: that
                // one is charged, and this one runs again, its attempt not spent.
                let (delivery, culprit_ctx, culprit_batch) = culprit;
                let verdict = self
                    .charge_ahead(
                        &culprit_ctx,
                        &culprit_batch,
                        delivery.attempt,
                        &process,
                        died,
                    )
                    .await;
                self.conclude(delivery, verdict).await;
                let culprit_index = culprit_batch.index;
                let cause = format!(
                    "it ran, but {process} held its result back and died in mini-batch {culprit_index} (returncode {})",
                    returncode(&died)
                );
                ctx.logs.log(
                    logs::JobLogs::node_process(&node, &process),
                    &format!("mini-batch {} lost: {cause}; it runs again.", batch.index),
                );
                let row = report_row(batch, &holding, "lost", Outcome::default(), None, &cause);
                holding::ended(ctx, batch.index, Some(&row), &holding, false).await;
                Verdict::Again
            }
            lost @ (RunOutcome::TimedOut | RunOutcome::Died(_)) => {
                self.lose_runner(None).await;
                if matches!(lost, RunOutcome::Died(_)) {
                    metrics.runner_died();
                }
                self.charge_lost(ctx, batch, &holding, &process, lost, Some(elapsed))
                    .await
            }
        }
    }

    /// Forgets the slot's runner, which is gone (killed at the timeout, or dead): the slot
    /// starts another, and what was sent to it ahead goes the usual way again. Returns the
    /// one sent `died_in` places ahead, which the runner died in, with what it was sent
    /// with, taken out of the look-ahead.
    async fn lose_runner(
        &mut self,
        died_in: Option<usize>,
    ) -> Option<(Delivery, Arc<JobContext>, MiniBatch)> {
        self.runner = None;
        let mut culprit = None;
        for (place, ahead) in self.ahead.iter_mut().enumerate() {
            if let Some(sent) = ahead.sent.take() {
                sent.staged.clean().await;
                if died_in == Some(place) {
                    culprit = Some((place, sent.ctx, sent.batch));
                }
            }
        }
        let (place, ctx, batch) = culprit?;
        let ahead = self.ahead.remove(place).expect("found at this place");
        Some((ahead.delivery, ctx, batch))
    }

    /// Charges `batch`, sent ahead to runner `process`, which died in it.
    async fn charge_ahead(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempt: u32,
        process: &str,
        died: ExitStatus,
    ) -> Verdict {
        let node = self.config().node_id.clone();
        let mut holding = Holding::new(&node, process, attempt, batch);
        holding::started(ctx, batch, &mut holding).await;
        let lost = RunOutcome::Died(died);
        self.charge_lost(ctx, batch, &holding, process, lost, None)
            .await
    }

    /// The attempt `holding` of `batch` ended with its runner, `process`, gone (`lost`):
    /// logged and reported, and charged to the script.
    async fn charge_lost(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        holding: &Holding,
        process: &str,
        lost: RunOutcome,
        elapsed: Option<f64>,
    ) -> Verdict {
        let node = self.config().node_id.clone();
        // Nothing the lost runner left in its named-output folders is delivered.
        if !ctx.job.spec().outputs.is_empty() {
            let failed = (batch.index, holding.attempt);
            super::named::withhold(ctx, &node, process, failed, None).await;
        }
        let (result, main_line, cause) = runner_lost(&lost, ctx, process, batch.index);
        self.config().metrics.mini_batch(result);
        ctx.logs.log(logs::JobLogs::node_main(&node), &main_line);
        ctx.logs
            .log(logs::JobLogs::sys_error(&node, process), &main_line);
        let times = elapsed.map(|e| (e, e));
        let row = report_row(batch, holding, result, Outcome::default(), times, &cause);
        self.failed_attempt(ctx, batch, holding, row, &cause).await
    }

    /// A failed attempt: another try while attempts remain, else the mini-batch fails whole.
    /// Which of runner `process`'s named-output files belong to the attempt that just ended:
    /// all (`Some(None)`) when the runner is idle; those last modified before now when it
    /// already runs the next mini-batch; `None` when the job has no named outputs, or the
    /// clock cannot be read.
    fn named_cutoff(&self, ctx: &JobContext, node: &str, process: &str) -> Option<Option<i128>> {
        if ctx.job.spec().outputs.is_empty() {
            return None;
        }
        let busy = self.ahead.iter().any(|a| a.sent.is_some());
        if !busy {
            return Some(None);
        }
        let work = super::workdir::job_work_dir(self.cache(), ctx.job.id(), node);
        super::named::clock(&super::named::runner_folder(&work, process)).map(Some)
    }

    async fn failed_attempt(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        holding: &Holding,
        row: String,
        cause: &str,
    ) -> Verdict {
        if ctx.stop.is_cancelled() {
            return Verdict::Drop;
        }
        let attempt = holding.attempt;
        if attempt < ctx.job.spec().run_max_try {
            info!(job = %ctx.job.id(), mini_batch = batch.index, attempt, "Attempt failed; requeueing.");
            // Its row kept, the next holder does not report it lost; the attempt is spent.
            holding::ended(ctx, batch.index, Some(&row), holding, true).await;
            return Verdict::Settle(Disposition::Requeue);
        }
        if super::isolate::isolates(ctx, batch) {
            holding::ended(ctx, batch.index, Some(&row), holding, true).await;
            return Verdict::isolate(ctx, batch, attempt);
        }
        if self
            .record_failure(ctx, batch, attempt, cause, Some(&row))
            .await
        {
            Verdict::Settle(Disposition::Ack)
        } else {
            Verdict::Settle(Disposition::Requeue)
        }
    }

    /// Records a mini-batch that used up its attempts: every item failed, no part.
    pub(super) async fn record_failure(
        &mut self,
        ctx: &Arc<JobContext>,
        batch: &MiniBatch,
        attempts: u32,
        cause: &str,
        row: Option<&str>,
    ) -> bool {
        let metrics = &self.config().metrics;
        match record_failed_batch(ctx, batch, attempts, cause, row).await {
            Ok(recorded) => {
                metrics.mini_batch("failed_whole");
                report_recorded(&self.shared, ctx, recorded.transitioned, recorded.status);
                true
            }
            Err(e) => {
                // Its part or its record: not told apart here, so not counted as the ledger's.
                warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Recording a failed mini-batch failed; requeueing.");
                false
            }
        }
    }

    pub(super) fn script_error(
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
}

/// An attempt's row of the job's report (`processed_mini-batches.csv`): its mini-batch,
/// attempt, result, items and counts, who ran it and when, how long it took (elapsed and
/// `run()` seconds, when known) and the first line of `note`.
pub(super) fn report_row(
    batch: &MiniBatch,
    holding: &Holding,
    result: &str,
    outcome: Outcome,
    times: Option<(f64, f64)>,
    note: &str,
) -> String {
    let times = times.map_or_else(
        || ",".to_owned(),
        |(elapsed, run)| format!("{elapsed:.3},{run:.3}"),
    );
    format!(
        "{},{},{result},{},{},{},{},{},{},{times},{}",
        batch.index,
        holding.attempt,
        report_items(batch, outcome),
        outcome.succeeded,
        outcome.failed,
        csv_field(&holding.node),
        csv_field(&holding.process),
        holding.start,
        csv_field(note.lines().next().unwrap_or_default()),
    )
}

/// The items of a mini-batch as its report row says: its files, or a tabular one's rows
/// (as many as the producer counted, or as `run()` was given).
pub(super) fn report_items(batch: &MiniBatch, outcome: Outcome) -> u64 {
    if batch.chunks.is_empty() {
        return batch.items.len() as u64;
    }
    let counted: u64 = batch.chunks.iter().filter_map(|c| c.rows).sum();
    counted.max(outcome.succeeded + outcome.failed)
}

/// Stores a part of mini-batch `index`; on failure, what becomes of the delivery: the job
/// fails for a folder that cannot take it, the mini-batch goes back untried when the
/// storage is unavailable, else it goes back to the queue.
async fn store_part(
    shared: &Shared,
    ctx: &Arc<JobContext>,
    index: u64,
    body: Bytes,
    row: &str,
    holding: &Holding,
) -> Result<String, Disposition> {
    match ctx.job.parts().put(index, body).await {
        Ok(part) => Ok(part),
        Err(PartError::Folder(e)) => Err(fail_job(shared, ctx, &e).await),
        Err(PartError::Storage(e)) if e.is_transient() => {
            let step = ("writing its part", &e);
            Err(unavailable::hand_back(shared, ctx, index, holding, row, step).await)
        }
        Err(e) => {
            warn!(job = %ctx.job.id(), mini_batch = index, error = %e, "Writing a part failed; requeueing.");
            holding::ended(ctx, index, Some(row), holding, false).await;
            Err(Disposition::Requeue)
        }
    }
}

/// Records an outcome in the ledger and reports a state change it caused.
pub(super) async fn record_outcome(
    shared: &Shared,
    ctx: &Arc<JobContext>,
    index: u64,
    outcome: Outcome,
    part: Option<&str>,
    row: &str,
) -> bool {
    let metrics = &shared.agent.config.metrics;
    match ctx.job.record(index, outcome, part, Some(row)).await {
        Ok(recorded) => {
            if recorded.first {
                metrics.items(outcome.succeeded, outcome.failed);
            }
            report_recorded(shared, ctx, recorded.transitioned, recorded.status);
            true
        }
        Err(e) => {
            metrics.ledger_error();
            warn!(job = %ctx.job.id(), mini_batch = index, error = %e, "Recording in the ledger failed; requeueing.");
            false
        }
    }
}

/// Acts on a step of the ledger: stops the job's work if it no longer runs, and hands a
/// state change this node made (`transitioned`) to whoever drives the job.
fn report_recorded(shared: &Shared, ctx: &JobContext, transitioned: bool, status: Status) {
    if !status.state.accepts_work() {
        ctx.stop.cancel();
    }
    if transitioned {
        let _ = shared.agent.events.send(AgentEvent::Transitioned {
            job: ctx.job.id().to_owned(),
            status,
        });
    }
}

/// Fails the job for a folder of this node's that cannot take its writes: a system error,
/// which every further attempt would meet, and no item's fault. Returns what
/// becomes of the delivery in hand: dropped, as the job no longer runs, or handed back
/// untried (no attempt spent) when the ledger could not be told.
pub(super) async fn fail_job(
    shared: &Shared,
    ctx: &JobContext,
    folder: &FolderError,
) -> Disposition {
    let reason = system_error(ctx, folder);
    ctx.logs.log(
        logs::JobLogs::sys_error(&shared.agent.config.node_id, "_main"),
        &format!("Failing the job: {reason}"),
    );
    error!(job = %ctx.job.id(), folder = %folder.folder.display(), error = %folder.source, "A folder of this node cannot take its writes; failing the job.");
    match ctx.job.fail(&reason, Some(&ctx.logs)).await {
        Ok(status) => {
            if !status.state.accepts_work() {
                ctx.stop.cancel();
            }
            Disposition::Ack
        }
        Err(e) => {
            warn!(job = %ctx.job.id(), error = %e, "Cannot fail the job in the ledger; handing the mini-batch back.");
            Disposition::Return
        }
    }
}

/// The cause of a job failed by a folder of the node's: which folder, what is wrong with it,
/// and what to do. A folder in the job's output is the output's; any other is scratch.
fn system_error(ctx: &JobContext, e: &FolderError) -> String {
    let output = ctx.job.output().local_path("_parts");
    let in_output =
        matches!(output.as_deref().and_then(Path::parent), Some(o) if e.folder.starts_with(o));
    let hint = match (in_output, e.is_out_of_space()) {
        (true, true) => "free space there",
        (true, false) => "make it writable",
        (false, true) => {
            "free space there, or set TMPDIR (fleetrun-worker: --cache-dir) to another folder"
        }
        (false, false) => "set TMPDIR (fleetrun-worker: --cache-dir) to a writable folder",
    };
    format!(
        "system error: the {} folder {} {}: {}; {hint}",
        if in_output { "output" } else { "scratch" },
        e.folder.display(),
        e.state(),
        e.source
    )
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
) -> Result<Recorded, String> {
    let failed = if batch.chunks.is_empty() {
        batch.items.len() as u64
    } else {
        super::tabular::count_rows(&*ctx.input, &batch.chunks)
            .await
            .unwrap_or(batch.chunks.len() as u64)
    };
    let lines = failed_item_lines(batch, attempts, cause);
    let part = ctx
        .job
        .parts()
        .put(batch.index, join_rows(&lines))
        .await
        .map_err(|e| e.to_string())?;
    let reference = crate::parts::reference(None, Some(&part));
    ctx.job
        .record(
            batch.index,
            Outcome::all_failed(failed),
            reference.as_deref(),
            row,
        )
        .await
        .map_err(|e| e.to_string())
}

/// An item's line of `failed_items.csv`: the item, its mini-batch, the attempts spent and the
/// first line of the cause.
pub(super) fn failed_item_line(item: &str, index: u64, attempts: u32, cause: &str) -> String {
    format!(
        "{},{index},{attempts},{}",
        csv_field(item),
        csv_field(cause.lines().next().unwrap_or_default())
    )
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

/// The lines of `failed_items.csv` for the items of `batch`: its files, or a tabular
/// mini-batch's file and byte range (its items are rows), each with the `cause`'s first line.
fn failed_item_lines(batch: &MiniBatch, attempts: u32, cause: &str) -> Vec<String> {
    let described: Vec<String> = batch.chunks.iter().map(|c| c.describe()).collect();
    batch
        .items
        .iter()
        .chain(&described)
        .map(|item| failed_item_line(item, batch.index, attempts, cause))
        .collect()
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

/// What a `picked` line says a mini-batch holds: its files, or a tabular input's chunks.
fn picked_items(batch: &MiniBatch) -> String {
    if batch.chunks.is_empty() {
        format!("items {}", batch.items.len())
    } else {
        format!("chunks {}", batch.chunks.len())
    }
}
