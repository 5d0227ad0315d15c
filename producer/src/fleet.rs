//! `fleetrun submit`, `status` and `cancel`: a job on a fleet (RabbitMQ + Redis + S3).
//!
//! Submitting registers the job (its validated spec, with its code shipped to S3 when the
//! output is there), enters it in the ledger, partitions the input onto the pool's queue and
//! seals the total; workers do the rest, and the one that records the last mini-batch
//! finalizes the output. `--wait` follows the ledger until the job ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fleetrun_common::ledger::{JobState, Limits, Status};
use fleetrun_common::queue::Depth;
use fleetrun_config::{Input, JobSpec, Location, MiniBatchSize, OutputAction};
use fleetrun_worker::agent::JobContext;
use fleetrun_worker::job::{self, Fleet, JobRecord};
use fleetrun_worker::logs::JobLogs;
use fleetrun_worker::parts;
use tokio_util::sync::CancellationToken;

use crate::local::new_job_id;
use crate::partition::{Produced, publish_files};
use crate::progress::{Figures, Progress};

/// How often a waiting submitter or `status --watch` reads the ledger.
const POLL: Duration = Duration::from_millis(100);

/// Registers and partitions a job; returns its id once every mini-batch is published.
pub async fn submit(
    spec: JobSpec,
    fleet: &Fleet,
    on_id: impl FnOnce(&str),
) -> Result<(String, Arc<Produced>), String> {
    let job = new_job_id(&spec.name);
    let spec = job::ship_code(spec, &fleet.s3).await?;
    let Input::Files(input_location) = &spec.input;
    let input = job::open_storage(input_location, &fleet.s3)
        .await
        .map_err(|e| e.to_string())?;
    let limits = Limits {
        error_threshold: spec.error_threshold,
        allowed_failed_count: spec.allowed_failed_count,
        allowed_failed_percent: spec.allowed_failed_percent,
    };
    fleet
        .ledger
        .create(&job, limits)
        .await
        .map_err(|e| e.to_string())?;
    // Registered once in the ledger: a registered job that the ledger does not know has
    // ended (workers take it off the pool's unfinished jobs).
    let record = JobRecord::new(spec.clone(), &fleet.pool);
    fleet
        .registry
        .register(&job, &fleet.pool, &record.encode())
        .await
        .map_err(|e| e.to_string())?;
    on_id(&job);

    // Stop publishing as soon as the job stops (threshold, cancel).
    let stop = CancellationToken::new();
    let watcher = {
        let (ledger, job, stop) = (fleet.ledger.clone(), job.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(POLL).await;
                if let Ok(Some(s)) = ledger.status(&job).await
                    && !s.state.accepts_work()
                {
                    stop.cancel();
                    return;
                }
            }
        })
    };
    let MiniBatchSize::Files(size) = spec.mini_batch_size else {
        unreachable!("validated: a file input counts files")
    };
    let produced = Arc::new(Produced::default());
    let published = publish_files(
        &*input,
        "",
        &job,
        size as usize,
        &*fleet.queue,
        &produced,
        &stop,
    )
    .await;
    watcher.abort();
    let total = match published {
        Ok(total) => total,
        Err(e) => {
            let reason = format!("partitioning the input failed: {e}");
            let _ = fleet
                .ledger
                .transition(&job, &[JobState::Running], JobState::Failed, Some(&reason))
                .await;
            return Err(reason);
        }
    };
    if !stop.is_cancelled() {
        let sealed = fleet
            .ledger
            .seal(&job, total)
            .await
            .map_err(|e| e.to_string())?;
        if sealed.transitioned && sealed.status.state == JobState::Finalizing {
            // Every mini-batch was done before the seal (or there were none): finalize here.
            let ctx = context(fleet, &job, &spec).await?;
            job::conclude(&*fleet.ledger, &ctx, sealed.status).await;
        }
    }
    Ok((job, produced))
}

async fn context(fleet: &Fleet, job: &str, spec: &JobSpec) -> Result<JobContext, String> {
    let Input::Files(input_location) = &spec.input;
    let input = job::open_storage(input_location, &fleet.s3)
        .await
        .map_err(|e| e.to_string())?;
    let output = job::open_storage(&spec.output, &fleet.s3)
        .await
        .map_err(|e| e.to_string())?;
    let logs = Arc::new(JobLogs::new(
        std::env::temp_dir().join(format!("fleetrun-submit-{job}")),
    ));
    let parts = parts::for_job(output.clone(), job, &parts::writer_name("submit"));
    Ok(JobContext::new(
        job.to_owned(),
        spec.clone(),
        input,
        output,
        parts,
        logs,
    ))
}

/// Follows the job in the ledger until it ends; `interrupt` stops following (not the job).
pub async fn wait(
    fleet: &Fleet,
    job: &str,
    name: &str,
    produced: Option<&Produced>,
    progress: bool,
    interrupt: &CancellationToken,
) -> Result<Status, String> {
    let mut bar = progress.then(|| Progress::new(name));
    loop {
        let status = fleet
            .ledger
            .status(job)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("job {job} is not in the ledger"))?;
        if status.state.is_terminal() {
            if let Some(b) = &bar {
                b.finish();
            }
            return Ok(status);
        }
        if let Some(b) = bar.as_mut() {
            let listed = produced.map_or(0, |p| p.items.load(Ordering::Relaxed));
            let created = produced.map_or(status.total.unwrap_or(0), |p| {
                p.mini_batches.load(Ordering::Relaxed)
            });
            b.update(Figures {
                status: &status,
                created,
                items_listed: listed,
            });
        }
        tokio::select! {
            _ = interrupt.cancelled() => return Ok(status),
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Cancels a job: workers drop its remaining mini-batches.
pub async fn cancel(fleet: &Fleet, job: &str) -> Result<Status, String> {
    let (moved, status) = fleet
        .ledger
        .transition(
            job,
            &[JobState::Running, JobState::Finalizing],
            JobState::Canceled,
            Some("canceled by the user"),
        )
        .await
        .map_err(|e| e.to_string())?;
    if moved && let Some(record) = record(fleet, job).await? {
        let ctx = context(fleet, job, &record.spec).await?;
        job::write_job_result(&ctx, &status).await;
    }
    Ok(status)
}

pub async fn record(fleet: &Fleet, job: &str) -> Result<Option<JobRecord>, String> {
    match fleet
        .registry
        .record(job)
        .await
        .map_err(|e| e.to_string())?
    {
        Some(bytes) => JobRecord::decode(&bytes).map(Some),
        None => Ok(None),
    }
}

/// One job's status as `fleetrun status JOB` prints it.
pub fn describe(job: &str, record: &JobRecord, status: &Status, depth: Option<Depth>) -> String {
    let spec = &record.spec;
    let elapsed = (job::unix_now() - record.submitted_at).max(0.001);
    let processed = status.items_succeeded + status.items_failed;
    let rate = processed as f64 / elapsed;
    let total = status
        .total
        .map_or_else(|| "? (listing)".to_owned(), |t| t.to_string());
    let threshold = match spec.error_threshold {
        -1 => "no threshold".to_owned(),
        t => format!("threshold {t}"),
    };
    let mut out = format!(
        "job:           {job}\nstate:         {}\nmini-batches:  {} done of {total}, {} failed\nitems:         {} succeeded, {} failed ({threshold})\nrate:          {rate:.0} items/s over {elapsed:.0}s\n",
        status.state,
        status.done,
        status.batches_failed,
        status.items_succeeded,
        status.items_failed,
    );
    if let (Some(total), true) = (status.total, status.done > 0 && !status.state.is_terminal()) {
        let eta = elapsed / status.done as f64 * total.saturating_sub(status.done) as f64;
        out.push_str(&format!("eta:           {eta:.0}s\n"));
    }
    if let Some(d) = depth {
        out.push_str(&format!(
            "pool {}:  {} ready, {} unacknowledged, {} dead-lettered\n",
            record.pool, d.ready, d.unacked, d.dead
        ));
    }
    if let Some(reason) = &status.reason {
        out.push_str(&format!("cause:         {reason}\n"));
    }
    out.push_str(&format!("output:        {}\n", output_file(spec)));
    out
}

/// Where the job's output file is (or its folder, for `summary_only`).
pub fn output_file(spec: &JobSpec) -> String {
    let name = match spec.output_action {
        OutputAction::AppendRow => spec.append_row_file_name.as_str(),
        OutputAction::SummaryOnly => "",
    };
    match &spec.output {
        Location::Local(dir) => dir.join(name).display().to_string(),
        Location::S3 { bucket, prefix } => {
            format!(
                "s3://{bucket}/{}",
                fleetrun_common::storage::join_key(prefix, name)
            )
        }
    }
}
