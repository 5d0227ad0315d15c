//! A mini-batch run in pieces, for one of two causes ([`Why`]), by one mechanism.
//!
//! Bad-item isolation: a mini-batch of several items that failed all its attempts is split
//! in halves, each run once more, and a half that fails is split again, down to the items
//! that fail alone. The items of halves that ran keep their rows, in input order; only the
//! items that failed alone are failed, each with its own error. One bad item among `n`
//! costs at most `2⌈log₂ n⌉` more `run()` calls.
//!
//! Out of GPU memory: a mini-batch whose `run()` ran out of GPU memory, or that is larger
//! than the size that fits on this node (`fit`), runs in pieces of that size; a piece that
//! runs out is halved the same way, and the node keeps the smaller size for its next
//! mini-batches. No attempt is spent and no item failed, except an item that runs out
//! alone ("out of GPU memory alone"); a piece that fails otherwise fails the attempt, as a
//! whole mini-batch's failure would. Under either cause a piece larger than the size that
//! fits is cut to it before it runs, and a piece that runs out of memory is halved.
//!
//! The slot runs a mini-batch's pieces itself, on its own runner, once nothing else is
//! queued in that runner, and records the mini-batch once, with the rows and the failed
//! items it found: one part, exactly-once as for any mini-batch. A worker lost meanwhile
//! leaves the delivery unacknowledged; whoever takes it next runs it again.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetrun_common::ledger::Outcome;
use fleetrun_common::protocol::ErrorCause;
use fleetrun_common::queue::Disposition;
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::OutputAction;
use tracing::info;

use super::JobContext;
use super::attempt::{
    Bench, OUT_OF_GPU_MEMORY, Waited, lost_logged, out_of_memory_logged, script_error,
};
use super::finish::{fail_job, record_outcome};
use super::fit;
use super::holding::{self, Holding};
use super::report::{failed_item_line, report_row};
use super::stage::Staged;
use super::stage_error::StageError;
use super::unavailable::staging_unavailable;
use super::verdict::{Isolation, Verdict, Why};
use crate::logs;
use crate::parts::{PartError, join_rows};
use crate::process::RunOutcome;

/// What one run of a piece of the mini-batch gave.
enum Piece {
    /// `run()` returned: its rows, and how many of the piece's items they cover.
    Returned {
        rows: Vec<String>,
        header: Option<String>,
        succeeded: u64,
    },
    /// The piece failed, for this cause (its report row's first line).
    Failed(String),
    /// The piece ran out of GPU memory, with this message.
    OutOfMemory(String),
}

/// What running a mini-batch in pieces found.
#[derive(Default)]
struct Found {
    rows: Vec<String>,
    header: Option<String>,
    succeeded: u64,
    /// The items that failed alone (their index in the mini-batch) and their causes.
    failed_alone: Vec<(usize, String)>,
    runs: u32,
    /// Pieces that ran out of GPU memory.
    ran_out: u32,
    /// The largest piece that returned.
    largest: usize,
}

/// The two halves of a piece, the first the larger when its length is odd.
fn halves(piece: Range<usize>) -> [Range<usize>; 2] {
    let middle = piece.start + piece.len().div_ceil(2);
    [piece.start..middle, middle..piece.end]
}

/// Runs a mini-batch in pieces, for `isolation.why`, and records it.
pub(super) async fn isolate(bench: &mut Bench, isolation: Isolation) -> Verdict {
    let Isolation {
        ctx,
        batch,
        attempts,
        why,
    } = isolation;
    if ctx.stop.is_cancelled() {
        return Verdict::Drop;
    }
    let _in_flight = bench.config().metrics.in_flight();
    let node = bench.config().node_id.clone();
    let process = bench.seat.name();
    let mut holding = Holding::new(&node, process, attempts, &batch);
    // Unnoted, a worker lost meanwhile leaves no lost row: the pieces go on.
    let _ = holding::started(&ctx, &batch, &mut holding).await;
    let all = 0..batch.items.len();
    // Depth first, the first piece before the next: pieces run in input order, so the
    // rows they return are in input order too.
    let mut pieces: Vec<Range<usize>> = match why {
        Why::Failed => {
            // The isolation's rows and failed items name the attempts spent whole.
            holding.attempt = attempts;
            info!(job = %ctx.job.id(), mini_batch = batch.index, items = batch.items.len(), "Isolating the failed items of a mini-batch.");
            halves(all).into_iter().rev().collect()
        }
        // Larger than the size that fits (or the size not believed for it): halves.
        Why::OutOfMemory if !ctx.node.fit.splits(all.len()) => {
            halves(all).into_iter().rev().collect()
        }
        Why::OutOfMemory => vec![all],
    };
    let mut found = Found::default();
    while let Some(piece) = pieces.pop() {
        if piece.is_empty() {
            continue;
        }
        if let Some(size) = ctx.node.fit.size()
            && piece.len() > size
        {
            pieces.extend(fit::cut(piece, size).into_iter().rev());
            continue;
        }
        let ran = run_piece(bench, &ctx, &batch, piece.clone(), &holding, why).await;
        let ran = match ran {
            Ok(ran) => ran,
            Err(verdict) => return verdict,
        };
        found.runs += 1;
        match ran {
            Piece::Returned {
                rows,
                header,
                succeeded,
            } => {
                ctx.node.fit.ran_well(piece.len());
                found.largest = found.largest.max(piece.len());
                found.header = found.header.or(header);
                found.rows.extend(rows);
                found.succeeded += succeeded;
            }
            Piece::OutOfMemory(_) if piece.len() > 1 => {
                found.ran_out += 1;
                let size = ctx.node.fit.ran_out(piece.len());
                let [first, mut rest] = fit::cut(piece, size);
                // For memory alone, what follows is cut afresh at the new size.
                if why == Why::OutOfMemory
                    && let Some(next) = pieces.pop_if(|next| next.start == rest.end)
                {
                    rest = rest.start..next.end;
                }
                pieces.extend([rest, first]);
            }
            Piece::OutOfMemory(cause) => {
                // An item that does not fit alone says nothing of the size that fits.
                found.ran_out += 1;
                let cause = format!("{OUT_OF_MEMORY_ALONE}: {cause}");
                found.failed_alone.push((piece.start, cause));
            }
            Piece::Failed(cause) if why == Why::OutOfMemory => {
                // Not memory: the attempt fails as the whole mini-batch's would.
                let note = format!("in pieces for GPU memory, a piece failed: {cause}");
                let row = report_row(&batch, &holding, "raised", Outcome::default(), None, &note);
                return bench
                    .failed_attempt(&ctx, &batch, &holding, row, &cause)
                    .await;
            }
            Piece::Failed(_) if piece.len() > 1 => {
                pieces.extend(halves(piece).into_iter().rev());
            }
            Piece::Failed(cause) => found.failed_alone.push((piece.start, cause)),
        }
    }
    record_isolated(bench, &ctx, &batch, &holding, found, why).await
}

/// The cause an item that runs out of GPU memory alone fails with (before the error).
pub(super) const OUT_OF_MEMORY_ALONE: &str = "out of GPU memory alone";

/// Runs `piece` of the mini-batch once on this slot's runner (started if need be).
/// `Err` holds what becomes of the delivery when the isolation cannot go on: the job
/// stopped, no runner could start, or a folder of the node's failed.
async fn run_piece(
    bench: &mut Bench,
    ctx: &Arc<JobContext>,
    batch: &MiniBatch,
    piece: Range<usize>,
    holding: &Holding,
    why: Why,
) -> Result<Piece, Verdict> {
    let node = bench.config().node_id.clone();
    let of = batch.items.len();
    let (first, last) = (piece.start + 1, piece.end);
    let mut note = match why {
        Why::Failed => format!("isolating items {first}-{last} of {of}"),
        Why::OutOfMemory => format!("in pieces for GPU memory: items {first}-{last} of {of}"),
    };
    let part = MiniBatch {
        items: batch.items[piece].to_vec(),
        ..batch.clone()
    };
    let Ok(active) = bench.seat.start(&bench.shared, ctx).await else {
        // Untried here: whoever takes it next isolates it.
        return Err(Verdict::Settle(Disposition::Return));
    };
    let process = active.name.clone();
    let mut staged = match stage_piece(bench, ctx, &part, &note, holding).await? {
        Ok(staged) => staged,
        Err(failed) => return Ok(failed),
    };
    let timeout = Duration::from_secs(ctx.job.spec().run_invocation_timeout);
    let started = Instant::now();
    if let Some(active) = bench.seat.active_mut() {
        // A failed submit means a dead runner: its outcome says so at once.
        let _ = staged.send(&mut *active.process, ctx, &part).await;
    }
    let (outcome, elapsed) = match bench.wait(ctx, staged, started, timeout).await {
        Waited::Ran { outcome, elapsed } => (outcome, elapsed),
        Waited::Stopped => return Err(Verdict::Drop),
        Waited::NoRunner => return Err(Verdict::Settle(Disposition::Return)),
    };
    let log = (node.as_str(), process.as_str());
    let Ran {
        result,
        piece,
        outcome,
        run_seconds,
        cause,
    } = judge(bench, ctx, log, (&part, holding), outcome, elapsed).await;
    bench.config().metrics.mini_batch(result);
    if !cause.is_empty() {
        note = format!("{note}: {cause}");
    }
    let row = report_row(
        &part,
        holding,
        result,
        outcome,
        Some((elapsed, run_seconds)),
        &note,
    );
    keep_row(ctx, &row).await;
    Ok(piece)
}

/// What one run of a piece came to: its report row's result, outcome and cause, and what
/// becomes of the piece.
struct Ran {
    result: &'static str,
    piece: Piece,
    outcome: Outcome,
    run_seconds: f64,
    cause: String,
}

/// Judges the `outcome` of piece `part` of the delivery `holding` holds, run on `log`'s
/// runner (node, process) in `elapsed` seconds, logging a script error, an out-of-memory
/// or a lost runner as a whole mini-batch's are.
async fn judge(
    bench: &mut Bench,
    ctx: &Arc<JobContext>,
    log: (&str, &str),
    (part, holding): (&MiniBatch, &Holding),
    outcome: RunOutcome,
    elapsed: f64,
) -> Ran {
    let (node, process) = log;
    let attempt = holding.attempt;
    match outcome {
        RunOutcome::Done {
            rows,
            timing,
            header,
            ..
        } => {
            // Returns are judged as a whole mini-batch's are (`settle`).
            let items = part.items.len() as u64;
            let settled =
                super::settle::returned(rows.len() as u64, items, ctx.job.spec().error_threshold);
            let outcome = settled.judged.outcome;
            let ran = Piece::Returned {
                rows,
                header,
                succeeded: outcome.succeeded,
            };
            Ran {
                result: settled.result,
                piece: ran,
                outcome,
                run_seconds: timing.run_seconds,
                cause: String::new(),
            }
        }
        RunOutcome::Raised { error, timing } if error.cause == ErrorCause::OutOfMemory => {
            let items = part.items.len();
            let then = if items > 1 {
                "the piece runs again in smaller pieces".to_owned()
            } else {
                format!("the item fails: {OUT_OF_MEMORY_ALONE}")
            };
            out_of_memory_logged(log, ctx, part, attempt, items, &error, &then);
            let cause = error.message.clone();
            Ran {
                result: OUT_OF_GPU_MEMORY,
                piece: Piece::OutOfMemory(cause.clone()),
                outcome: Outcome::default(),
                run_seconds: timing.run_seconds,
                cause,
            }
        }
        RunOutcome::Raised { error, timing } => {
            script_error(node, ctx, process, part, attempt, &error);
            let cause = error.message.clone();
            Ran {
                result: "raised",
                piece: Piece::Failed(cause.clone()),
                outcome: Outcome::default(),
                run_seconds: timing.run_seconds,
                cause,
            }
        }
        // An isolated item runs alone: nothing is sent after it, so a runner that died
        // died in it.
        lost => {
            let (lost, _) = bench.lose_runner(lost).await;
            let (result, cause) = lost_logged(node, ctx, process, part.index, &lost);
            Ran {
                result,
                piece: Piece::Failed(cause.clone()),
                outcome: Outcome::default(),
                run_seconds: elapsed,
                cause,
            }
        }
    }
}

/// Stages the inputs of `part`, a piece being isolated (its report rows start with `note`):
/// `Ok(Err(piece))` when they could not be, as the piece's failure; `Err` when the
/// isolation cannot go on (the storage or a folder of the node's failed).
async fn stage_piece(
    bench: &mut Bench,
    ctx: &Arc<JobContext>,
    part: &MiniBatch,
    note: &str,
    holding: &Holding,
) -> Result<Result<Staged, Piece>, Verdict> {
    match bench.stager.stage(ctx, part).await {
        Ok(staged) => Ok(Ok(staged)),
        Err(StageError::Scratch(e)) => Err(Verdict::Settle(fail_job(&bench.shared, ctx, &e).await)),
        Err(StageError::Unavailable(e)) => {
            let note = format!("{note}: ");
            let staged = (part, note.as_str());
            let disposition = staging_unavailable(&bench.shared, ctx, staged, holding, &e);
            Err(Verdict::Settle(disposition.await))
        }
        Err(e @ (StageError::Input(_) | StageError::Overran(_))) => {
            let cause = format!("staging inputs failed: {e}");
            bench.config().metrics.mini_batch("staging_failed");
            let row = report_row(
                part,
                holding,
                "staging_failed",
                Outcome::default(),
                None,
                &format!("{note}: {cause}"),
            );
            keep_row(ctx, &row).await;
            Ok(Err(Piece::Failed(cause)))
        }
    }
}

/// Records an isolated mini-batch: the rows its pieces returned as its part, and the
/// items that failed alone as its lines of `failed_items.csv`.
async fn record_isolated(
    bench: &mut Bench,
    ctx: &Arc<JobContext>,
    batch: &MiniBatch,
    holding: &Holding,
    found: Found,
    why: Why,
) -> Verdict {
    let items = batch.items.len() as u64;
    let outcome = Outcome {
        succeeded: found.succeeded,
        failed: items - found.succeeded,
        batch_failed: found.succeeded < items,
    };
    let spec = ctx.job.spec();
    let rows =
        (spec.output_action == OutputAction::AppendRow && !found.rows.is_empty()).then(|| {
            let header = found
                .header
                .clone()
                .filter(|_| spec.append_row_dataframe_header);
            crate::parts::with_header(
                header.as_deref(),
                &found.rows,
                spec.append_row_dataframe_header,
            )
        });
    let lines: Vec<String> = found
        .failed_alone
        .iter()
        .map(|(item, cause)| {
            failed_item_line(&batch.items[*item], batch.index, holding.attempt, cause)
        })
        .collect();
    let failed = (!lines.is_empty()).then(|| join_rows(&lines));
    let mut stored = [None, None];
    for (slot, body) in stored.iter_mut().zip([rows, failed]) {
        let Some(body) = body else { continue };
        match ctx.job.parts().put(batch.index, body).await {
            Ok(part) => *slot = Some(part),
            Err(PartError::Folder(e)) => {
                return Verdict::Settle(fail_job(&bench.shared, ctx, &e).await);
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Storage unavailable writing an isolated mini-batch's part; handing it back untried.");
                bench.config().metrics.storage_hand_back();
                return Verdict::Settle(Disposition::Return);
            }
            Err(e) => {
                tracing::warn!(job = %ctx.job.id(), mini_batch = batch.index, error = %e, "Writing an isolated mini-batch's part failed; requeueing.");
                return Verdict::Settle(Disposition::Requeue);
            }
        }
    }
    let [rows, failed] = stored;
    let reference = crate::parts::reference(rows.as_deref(), failed.as_deref());
    let first_cause = found
        .failed_alone
        .first()
        .map_or("", |(_, cause)| cause.as_str());
    let note = piece_note(&found, why, items, first_cause);
    let (result, done) = match why {
        Why::Failed => ("isolated", "isolated"),
        Why::OutOfMemory => (SPLIT, "ran in pieces"),
    };
    ctx.logs.log(
        logs::JobLogs::node_process(&holding.node, &holding.process),
        &format!("mini-batch {} {done}: {note}", batch.index),
    );
    bench.config().metrics.mini_batch(result);
    if found.largest > 0 && why == Why::OutOfMemory {
        bench.config().metrics.split_into(found.largest);
    }
    let row = report_row(batch, holding, result, outcome, None, &note);
    super::outdir::sync_logged(ctx).await;
    super::named::deliver_logged(ctx, &holding.node, &holding.process, None).await;
    if record_outcome(
        &bench.shared,
        ctx,
        batch.index,
        outcome,
        reference.as_deref(),
        &row,
    )
    .await
    {
        Verdict::Settle(Disposition::Ack)
    } else {
        Verdict::Settle(Disposition::Requeue)
    }
}

/// The report's result of a mini-batch that ran in pieces for GPU memory.
pub(super) const SPLIT: &str = "split";

/// The note of a mini-batch's row once its pieces ran: for GPU memory, the size its pieces
/// held (`in pieces of at most 3 items`, which `job_result.txt` reads back), then the items
/// that failed alone.
fn piece_note(found: &Found, why: Why, items: u64, first_cause: &str) -> String {
    let failed = found.failed_alone.len();
    let first = if first_cause.is_empty() {
        String::new()
    } else {
        format!("; the first: {first_cause}")
    };
    let runs = found.runs;
    let memory = format!(
        "in pieces of at most {} items: {runs} runs, {} out of GPU memory",
        found.largest, found.ran_out
    );
    match why {
        Why::OutOfMemory => {
            format!("{memory}; {failed} of {items} items failed alone{first}")
        }
        Why::Failed if found.ran_out > 0 => {
            format!(
                "{failed} of {items} items failed alone, {runs} isolation runs ({memory}){first}"
            )
        }
        Why::Failed => {
            format!("{failed} of {items} items failed alone, {runs} isolation runs{first}")
        }
    }
}

/// Keeps an isolation run's row of the job's report.
async fn keep_row(ctx: &JobContext, row: &str) {
    if let Err(e) = ctx.job.report(row).await {
        tracing::warn!(job = %ctx.job.id(), error = %e, "Cannot keep an isolation run's report row.");
    }
}

#[cfg(test)]
mod tests {
    use super::halves;

    #[test]
    fn halves_cover_the_piece_in_order_the_first_the_larger() {
        assert_eq!(halves(0..10), [0..5, 5..10]);
        assert_eq!(halves(5..10), [5..8, 8..10]);
        assert_eq!(halves(8..10), [8..9, 9..10]);
    }
}
