//! What a job tells its user (CONTRACT §7): `job_progress_overview.txt` while it runs, and
//! `job_result.txt`, the final overview and `job_error.txt` when it ends. Written the same
//! way by whichever process ends the job: a node that finalizes it or fails it, a waiting
//! submitter whose stop rules fire, a cancel, `fleetrun run`.

use bytes::Bytes;
use fleetrun_common::ledger::{JobState, Ledger, LedgerError, Status};
use fleetrun_common::storage::Storage;
use fleetrun_config::JobSpec;
use tracing::{info, warn};

use super::record::unix_now;
use crate::logs::{self, JobLogs};

/// A job as its results name it.
#[derive(Debug, Clone, Copy)]
pub struct JobView<'a> {
    pub id: &'a str,
    pub spec: &'a JobSpec,
    /// Seconds since the Unix epoch, from the job's record.
    pub submitted_at: f64,
}

impl JobView<'_> {
    fn elapsed(&self) -> f64 {
        (unix_now() - self.submitted_at).max(0.0)
    }
}

/// `job_result.txt`: the result, the counts and, for a job that did not complete, why and
/// where to look.
pub fn result_text(job: JobView<'_>, status: &Status) -> String {
    let threshold = match job.spec.error_threshold {
        -1 => "-1 (failures ignored)".to_owned(),
        n => n.to_string(),
    };
    let total = status.total.map_or_else(
        || format!("{} created (listing unfinished)", status.created),
        |t| t.to_string(),
    );
    let mut text = format!(
        "Job: {}\nResult: {}\nElapsed: {:.1}s\nMini-batches: {} processed of {total}\nItems: {} succeeded, {} failed (error_threshold {threshold})\nMini-batches failed: {}\n",
        job.id,
        status.state,
        job.elapsed(),
        status.done,
        status.items_succeeded,
        status.items_failed,
        status.batches_failed,
    );
    if let Some(reason) = &status.reason {
        text.push_str(&format!("Cause: {reason}\n"));
    }
    let system = status
        .reason
        .as_deref()
        .is_some_and(|r| r.starts_with("system error"));
    if status.state == JobState::Failed && system {
        text.push_str("Where to look: the cause above; it is the node's, not the script's.\n");
    } else if status.state == JobState::Failed {
        text.push_str("Where to look: user/error.txt (script errors), user/error/ (full tracebacks), sys/node/*/_main.txt (processes), failed_items.csv.\n");
    }
    text
}

/// `job_progress_overview.txt`: mini-batches created and processed, and once the job has
/// ended its result.
pub fn overview_text(status: &Status) -> String {
    let created = status.total.unwrap_or(status.created);
    let mut text = format!(
        "Mini-batches created: {created}{}\nMini-batches processed: {}\nItems succeeded: {}\nItems failed: {}\nMini-batches failed: {}\nState: {}\nUpdated: {}\n",
        if status.total.is_some() {
            " (all)"
        } else {
            " (so far)"
        },
        status.done,
        status.items_succeeded,
        status.items_failed,
        status.batches_failed,
        status.state,
        logs::now(),
    );
    if status.state.is_terminal() {
        text.push_str(&format!("Result: {}\n", status.state));
        if let Some(reason) = &status.reason {
            text.push_str(&format!("Cause: {reason}\n"));
        }
    }
    text
}

/// `job_error.txt`: how many script errors this process saw, and the first of them.
fn error_summary(logs: Option<&JobLogs>) -> String {
    let errors = logs
        .map(|l| {
            l.flush();
            std::fs::read_to_string(l.file(logs::USER_ERROR)).unwrap_or_default()
        })
        .unwrap_or_default();
    let count = errors.lines().count();
    let mut summary = format!("Script errors: {count}\n");
    for line in errors.lines().take(20) {
        summary.push_str(line);
        summary.push('\n');
    }
    if count > 20 {
        summary.push_str(&format!("... {} more in user/error.txt\n", count - 20));
    }
    summary
}

/// Writes an ended job's results into its output's `logs/`. `logs` are this process's log
/// files of the job, when it has any (the script errors it saw).
pub async fn write_results(
    output: &dyn Storage,
    logs: Option<&JobLogs>,
    job: JobView<'_>,
    status: &Status,
) {
    let files = [
        (logs::JOB_RESULT, result_text(job, status)),
        (logs::PROGRESS_OVERVIEW, overview_text(status)),
        (logs::JOB_ERROR, error_summary(logs)),
    ];
    for (name, text) in files {
        if let Err(e) = output.put(&format!("logs/{name}"), Bytes::from(text)).await {
            warn!(job = %job.id, file = name, error = %e, "Cannot write a result file.");
        }
    }
}

/// Fails a Running job for `reason` and writes its results, if this call moved it (exactly
/// one of the processes that watch a job does). Returns the status after.
pub async fn fail(
    ledger: &dyn Ledger,
    output: &dyn Storage,
    logs: Option<&JobLogs>,
    job: JobView<'_>,
    reason: &str,
) -> Result<Status, LedgerError> {
    let (moved, status) = ledger
        .transition(job.id, &[JobState::Running], JobState::Failed, Some(reason))
        .await?;
    if moved {
        info!(job = %job.id, "Job failed: {reason}.");
        write_results(output, logs, job, &status).await;
    }
    Ok(status)
}

/// Cancels a Running or Finalizing job for `reason` and writes its results, if this call
/// moved it. Returns the status after.
pub async fn cancel(
    ledger: &dyn Ledger,
    output: &dyn Storage,
    job: JobView<'_>,
    reason: &str,
) -> Result<Status, LedgerError> {
    let (moved, status) = ledger
        .transition(
            job.id,
            &[JobState::Running, JobState::Finalizing],
            JobState::Canceled,
            Some(reason),
        )
        .await?;
    if moved {
        info!(job = %job.id, "Job canceled: {reason}.");
        write_results(output, None, job, &status).await;
    }
    Ok(status)
}
