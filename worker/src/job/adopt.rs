//! The pool's jobs no node looks after: ended ones retired, Finalizing orphans followed,
//! Running jobs this node does not serve watched for their stop rules, and jobs this node
//! gave up on looked at again.

use std::sync::Arc;
use std::time::Duration;

use fleetrun_common::ledger::{JobState, LedgerError};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::driver::StopRules;
use super::finalize::{FINALIZE_LEASE, check_init_failures_at};
use super::lifecycle::Job;
use super::load::FleetJobs;
use super::record::JobRecord;
use super::settings::{Fleet, KEEP_ENDED_JOBS};
use super::watch::serving;
use crate::agent::{JobContext, Jobs};

/// How often a worker looks over its pool's unfinished jobs for one nobody looks after.
const ADOPT_EVERY: Duration = FINALIZE_LEASE;

/// Looks again at a job this node gave up on, in case no node is left to fail it by then:
/// once it has run two minutes (init failures over the fleet, CONTRACT §5 rule 2), and once
/// a node that could start the script would have ended a mini-batch (rule 3: init, then
/// every attempt of one mini-batch, run out their time), when the job fails if no
/// mini-batch has ended anywhere.
pub(super) async fn recheck_given_up(
    fleet: Fleet,
    ctx: Arc<JobContext>,
    processes: u32,
    reason: String,
) {
    let gave_up = tokio::time::Instant::now();
    let age = ctx.job.age();
    let spec = ctx.job.spec();
    let rule_2 =
        gave_up + super::driver::INIT_FAILURE_GRACE.saturating_sub(age) + Duration::from_secs(1);
    let timeout = spec.run_invocation_timeout;
    let stalled =
        gave_up + Duration::from_secs(3 * timeout + 30 + u64::from(spec.run_max_try) * timeout + 5);
    let mut checks = [rule_2, stalled];
    checks.sort();
    for at in checks {
        tokio::time::sleep_until(at).await;
        let Ok(Some(status)) = fleet.ledger.status(ctx.job.id()).await else {
            continue;
        };
        if status.state != JobState::Running {
            return;
        }
        // The job's age by this node's clock since it gave up (paused in flow tests).
        let age_now = age + gave_up.elapsed();
        if let Ok(failures) = fleet.registry.init_failures(ctx.job.id()).await
            && check_init_failures_at(&ctx, processes, failures, &reason, age_now).await
        {
            return;
        }
        if at == stalled && status.done == 0 {
            let waited = gave_up.elapsed().as_secs();
            let why = format!(
                "no mini-batch has ended on any node {waited}s after this one gave up on the job: {reason}"
            );
            ctx.job.fail_or_warn(&why, Some(&ctx.logs)).await;
            return;
        }
    }
}

/// Looks over the pool's unfinished jobs now and then: retires ended jobs (Redis forgets
/// them [`KEEP_ENDED_JOBS`] later), and follows a Finalizing job this node does not know
/// yet, so that its watcher takes the finalization over if whoever held it died (even when
/// no worker that served the job is left). Stops when the worker drains.
pub(super) async fn adopt_orphans(fleet: Fleet, jobs: Arc<FleetJobs>, drain: CancellationToken) {
    loop {
        if let Err(e) = adopt_once(&fleet, &jobs).await {
            warn!(error = %e, "Cannot look over the pool's unfinished jobs.");
        }
        tokio::select! {
            _ = drain.cancelled() => return,
            _ = tokio::time::sleep(ADOPT_EVERY) => {}
        }
    }
}

pub(super) async fn adopt_once(fleet: &Fleet, jobs: &FleetJobs) -> Result<(), LedgerError> {
    let pool = &fleet.pool;
    for job in fleet.registry.unfinished(pool).await? {
        // One job the ledger cannot answer for holds up none of the others.
        if let Err(e) = look_after(fleet, jobs, &job).await {
            warn!(job = %job, error = %e, "Cannot look after the job.");
        }
    }
    Ok(())
}

pub(super) async fn look_after(
    fleet: &Fleet,
    jobs: &FleetJobs,
    job: &str,
) -> Result<(), LedgerError> {
    match fleet.ledger.status(job).await?.map(|s| s.state) {
        // Registered only once in the ledger: gone from it means ended long ago.
        None => {}
        Some(state) if state.is_terminal() => {
            jobs.unserved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(job);
            fleet.ledger.retire(job, KEEP_ENDED_JOBS).await?;
        }
        Some(JobState::Running) if jobs.cached(job).is_none() => {
            return watch_unserved(fleet, jobs, job).await;
        }
        Some(JobState::Finalizing) if jobs.cached(job).is_none() => {
            info!(job = %job, "Following a Finalizing job in case its finalizer is gone.");
            if let Err(e) = jobs.get(job).await {
                warn!(job = %job, error = %e, "Cannot load the job.");
            }
            return Ok(());
        }
        Some(_) => return Ok(()),
    }
    // What its lane still holds is of no use now (a resume publishes what is left again).
    if let Err(e) = fleet.queue.close_lane(job).await {
        warn!(job = %job, error = %e, "Cannot remove the ended job's queue; trying again later.");
        return Ok(());
    }
    fleet
        .registry
        .retire(job, &fleet.pool, KEEP_ENDED_JOBS)
        .await
}

/// Checks the stop rules of a Running job this node does not serve, ending it when they
/// say so (from its record: its spec, its input and output).
pub(super) async fn watch_unserved(
    fleet: &Fleet,
    jobs: &FleetJobs,
    job: &str,
) -> Result<(), LedgerError> {
    let Some(status) = fleet.ledger.status(job).await? else {
        return Ok(());
    };
    let Some(bytes) = fleet.registry.record(job).await? else {
        return Ok(());
    };
    let Ok(record) = JobRecord::decode(&bytes) else {
        return Ok(());
    };
    let serving = serving(fleet, &status).await;
    let reason = {
        let mut unserved = jobs.unserved.lock().unwrap_or_else(|p| p.into_inner());
        let age =
            Duration::from_secs_f64((super::record::unix_now() - record.submitted_at).max(0.0));
        unserved
            .entry(job.to_owned())
            .or_insert_with(|| StopRules::new(&record.spec, age))
            .check(&status, serving)
    };
    let Some(stop) = reason else {
        return Ok(());
    };
    let job_handle = match Job::open(fleet, job, &record).await {
        Ok(handle) => handle,
        Err(e) => {
            warn!(job = %job, error = %e, "Cannot open the job's output to fail it.");
            return Ok(());
        }
    };
    let input = match super::open_input(&record.spec, &fleet.s3).await {
        Ok(input) => input,
        Err(e) => {
            warn!(job = %job, error = %e, "Cannot open the job's input to end it.");
            return Ok(());
        }
    };
    job_handle.stop(stop, &*input, None).await?;
    jobs.unserved
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(job);
    Ok(())
}
