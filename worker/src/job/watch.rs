//! Watching one job a node serves: its state in the ledger, its stop rules, its
//! finalization taken over, its place renewed, its overview and logs kept, and uploaded at
//! the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetrun_common::ledger::{JobState, Status};
use fleetrun_common::storage::{LocalStorage, Storage};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::driver::StopRules;
use super::finalize::conclude;
use super::leases::{BEAT_TTL, FOLLOW_TTL};
use super::node_job::NodeJob;
use super::results::overview_text;
use super::settings::Fleet;
use crate::agent::{self, JobContext};
use crate::logs;

/// How often a worker re-reads the state of each job it serves.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How long an ended job's runners on a node may take to end (a runner's `shutdown()` has
/// 10 s before it is killed) before the node lets the job go anyway.
const RUNNERS_END: Duration = Duration::from_secs(30);

/// How many nodes serve the pool, asked only while the job has not started (the stop rules
/// need it only then); `None` if the registry cannot tell.
pub async fn serving(fleet: &Fleet, status: &Status) -> Option<u64> {
    if status.started {
        return None;
    }
    fleet.registry.nodes(&fleet.pool).await.ok()
}

/// Follows a job's state in the ledger: stops its running attempts on this node as soon as
/// it no longer runs, takes its finalization over when whoever held it is gone, fails or
/// expires it when a stop rule says so (every node that serves the job watches them, so the job ends
/// whichever nodes are left), keeps its overview and flushes its logs now and then, and
/// uploads them at the end.
pub(super) async fn watch_job(
    fleet: Fleet,
    ctx: Arc<JobContext>,
    node: String,
    stop: CancellationToken,
    held: Arc<Mutex<HashMap<String, NodeJob>>>,
) {
    let age =
        Duration::from_secs_f64((super::record::unix_now() - ctx.job.submitted_at()).max(0.0));
    let ledger = fleet.ledger.clone();
    let mut rules = StopRules::new(ctx.job.spec(), age);
    let mut seen: Option<(JobState, Option<u64>)> = None;
    let mut place_renewed = tokio::time::Instant::now();
    let mut follow_renewed = tokio::time::Instant::now();
    let mut times_flushed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                if ctx.node.has_place() {
                    let _ = fleet.registry.release_place(ctx.job.id(), &node).await;
                }
                return;
            }
            _ = tokio::time::sleep(WATCH_EVERY) => {}
            // The job's event: its state changed.
            _ = ctx.changed.notified() => {}
        }
        if follow_renewed.elapsed() >= FOLLOW_TTL / 3 {
            follow_renewed = tokio::time::Instant::now();
            follow(&fleet, &ctx, &node).await;
        }
        if ctx.node.has_place() && place_renewed.elapsed() >= BEAT_TTL / 3 {
            place_renewed = tokio::time::Instant::now();
            renew_place(&fleet, &ctx, &node).await;
        }
        ctx.logs.flush();
        if times_flushed.elapsed() >= agent::times::FLUSH_EVERY {
            times_flushed = tokio::time::Instant::now();
            ctx.flush_times().await;
        }
        let status = match ledger.status(ctx.job.id()).await {
            Ok(Some(status)) => status,
            Ok(None) => continue,
            Err(e) => {
                warn!(job = %ctx.job.id(), error = %e, "Cannot read the job's state.");
                continue;
            }
        };
        if status.run > ctx.run() {
            // Resumed since: the context of its new run watches it.
            ctx.stop.cancel();
            return;
        }
        note_changes(&ctx, &node, &mut seen, &status);
        if let Some(stop) = rules.check(&status, serving(&fleet, &status).await) {
            ctx.job
                .stop_or_warn(stop, &*ctx.input, Some(&ctx.logs))
                .await;
            continue;
        }
        if !status.state.is_terminal() && ctx.job.spec().output.as_local().is_some() {
            // On a local output the log folder is the output's: the overview is in place.
            ctx.logs
                .write(logs::PROGRESS_OVERVIEW, &overview_text(&status));
        }
        match status.state {
            JobState::Finalizing => {
                // Whoever finalizes it may have died: take over once its claim runs out.
                ctx.stop.cancel();
                following(&fleet, &ctx, &node, conclude(&*ledger, &ctx, status)).await;
            }
            state if !state.accepts_work() => {
                ctx.stop.cancel();
                if state.is_terminal() {
                    let_go(&fleet, &ctx, &node, true).await;
                    held.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(ctx.job.id());
                    return;
                }
            }
            _ => {}
        }
    }
}

/// Renews the note that this node follows the job: whoever waits for the job's end waits
/// for this node to let it go too (see [`let_go`]). A node letting the job go, or that has
/// (a stopping worker does while this watcher still runs), renews nothing.
async fn follow(fleet: &Fleet, ctx: &JobContext, node: &str) {
    // Held while the note is renewed, so that a let-go waits for it and comes after.
    let Ok(done) = ctx.node.let_go.try_lock() else {
        return;
    };
    if *done {
        return;
    }
    if let Err(e) = fleet.registry.follow(ctx.job.id(), node, FOLLOW_TTL).await {
        warn!(job = %ctx.job.id(), error = %e, "Cannot note that this node follows the job.");
    }
}

/// Renews this node's place in the job while it serves it; a place lost (this node was
/// unreachable longer than its lease, and another took the place) is given up here too.
pub(super) async fn renew_place(fleet: &Fleet, ctx: &JobContext, node: &str) {
    let renewed = fleet
        .registry
        .claim_place(ctx.job.id(), node, ctx.job.spec().node_count, BEAT_TTL)
        .await;
    match renewed {
        Ok(true) => {}
        Ok(false) => {
            warn!(job = %ctx.job.id(), node, "This node lost its place in the job to another.");
            ctx.node.set_place(false);
        }
        Err(e) => {
            warn!(job = %ctx.job.id(), error = %e, "Cannot renew this node's place in the job.")
        }
    }
}

/// Notes in `sys/master_role.txt` what changed since the watcher last looked: the job
/// followed, its mini-batches all created, its finalization, its end.
pub(super) fn note_changes(
    ctx: &JobContext,
    node: &str,
    seen: &mut Option<(JobState, Option<u64>)>,
    status: &Status,
) {
    let master = |line: &str| ctx.logs.log(logs::MASTER_ROLE, line);
    let (state, total) = seen.get_or_insert_with(|| {
        master(&format!(
            "Job {} followed by node {node}: input {}, output {}; {} created so far.",
            ctx.job.id(),
            input_name(ctx.job.spec()),
            ctx.job.spec().output,
            status.created
        ));
        for setting in &ctx.job.spec().settings_from_arguments {
            master(&format!("Setting: {setting}."));
        }
        (JobState::Running, None)
    });
    if total.is_none()
        && let Some(all) = status.total
    {
        master(&format!("All {all} mini-batches created; total sealed."));
        *total = Some(all);
    }
    if *state != status.state {
        match status.state {
            JobState::Finalizing => master("Every mini-batch is done; finalizing."),
            _ => note_end(ctx, status),
        }
        *state = status.state;
    }
}

/// Notes in `sys/master_role.txt` how the job ended, once per node: by its watcher, or
/// as the worker stops when the job ended after the watcher last looked.
pub(super) fn note_end(ctx: &JobContext, status: &Status) {
    if status.state.is_terminal() && ctx.node.first_end_noted() {
        let reason = status.reason.as_deref().map(|r| format!(": {r}"));
        let line = format!(
            "Job {} ended {}{}.",
            ctx.job.id(),
            status.state,
            reason.unwrap_or_default()
        );
        ctx.logs.log(logs::MASTER_ROLE, &line);
    }
}

pub(super) fn input_name(spec: &fleetrun_config::JobSpec) -> String {
    spec.input.location().to_string()
}

/// This node lets go of a job, once: after any call of its own that is ending the job has
/// written the job's results; once the job has `ended`, its runners here gone first
/// (what they print reaches the logs); its monitor's last sample, its named outputs
/// delivered, its logs flushed and sent where they go and, once the job has ended, closed
/// (nothing more is written) and what it wrote in a local output folder recorded as
/// fleetrun's. Then the registry hears that the node follows the job no more: whoever waits
/// for the job's end knows its logs and output are whole. A job its end let go is not let
/// go again when the node stops (a worker that served many jobs would send all their logs
/// again); one being let go is waited for.
pub(super) async fn let_go(fleet: &Fleet, ctx: &JobContext, node: &str, ended: bool) {
    let mut done = ctx.node.let_go.lock().await;
    if *done {
        return;
    }
    // The note that this node follows the job stays while it lets go, however long that
    // takes: whoever waits for the job's end waits for all of it.
    following(fleet, ctx, node, write_last(ctx, node, ended)).await;
    if let Err(e) = fleet.registry.let_go(ctx.job.id(), node).await {
        warn!(job = %ctx.job.id(), error = %e, "Cannot note that this node let the job go.");
    }
    *done = true;
}

/// Runs `work`, renewing the note that this node follows the job meanwhile; no renewal is
/// under way when it returns.
pub(super) async fn following<T>(
    fleet: &Fleet,
    ctx: &JobContext,
    node: &str,
    work: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tokio::time::sleep(FOLLOW_TTL / 3) => {
                if let Err(e) = fleet.registry.follow(ctx.job.id(), node, FOLLOW_TTL).await {
                    warn!(job = %ctx.job.id(), error = %e, "Cannot note that this node follows the job.");
                }
            }
        }
    }
}

/// What this node writes last of a job it lets go (see [`let_go`]), once no call of its own
/// is ending the job.
async fn write_last(ctx: &JobContext, node: &str, ended: bool) {
    let _quiet = ctx.job.quiet().await;
    if ended
        && tokio::time::timeout(RUNNERS_END, ctx.node.seats.close())
            .await
            .is_err()
    {
        warn!(job = %ctx.job.id(), "The job's runners on this node did not end in time; letting the job go.");
    }
    ctx.node.monitor.stop().await;
    // Its runners have ended (or are let go): the last of their times.
    ctx.flush_times().await;
    agent::named::finish(ctx, node).await;
    if ended {
        ctx.logs.close();
    } else {
        ctx.logs.flush();
    }
    agent::outdir::sync_logged(ctx).await;
    upload_logs(ctx, node).await;
    if ended {
        ctx.job.release_output().await;
    }
}

/// Copies this node's log files of a job whose output is on S3 under `<output>/logs/`.
pub(super) async fn upload_logs(ctx: &JobContext, node: &str) {
    // Local outputs hold the logs already; a node that wrote none has nothing to send.
    if ctx.job.spec().output.as_local().is_some() || !ctx.logs.dir().is_dir() {
        return;
    }
    let logs = LocalStorage::new(ctx.logs.dir());
    let mut listing = logs.list("");
    while let Some(object) = listing.next().await {
        let copied = match object {
            Ok(object) => match logs.get(&object.key).await {
                Ok(body) => {
                    ctx.job
                        .output()
                        .put(&format!("logs/{}", object.key), body)
                        .await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = copied {
            warn!(job = %ctx.job.id(), node, error = %e, "Cannot upload a log file.");
        }
    }
}
