//! Following a job a command submitted, resumed or retried: its id at once, or with
//! `--wait` how it ended, and the exit code of its state.

use std::path::PathBuf;
use std::process::ExitCode;

use fleetrun_common::ledger::{JobState, LedgerError};
use fleetrun_producer::exit;
use fleetrun_producer::fleet::{self as fleet_cmd, FleetError};
use fleetrun_producer::local::{Interrupt, JobReport};
use fleetrun_worker::job::Fleet;

use crate::out::{Shown, print_json};

/// Following a job a command started (`resume`, `retry`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Follow {
    /// Wait for the job to end; exit 0 when it completed, 42 when it failed.
    #[arg(long)]
    pub wait: bool,
    /// No progress display while waiting.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print JSON for programs: the job's id (`{"job_id": ...}`); with `--wait`, its summary
    /// once it ended (as `status --json`).
    #[arg(long)]
    pub json: bool,
}

/// What `submit` (and `retry`) says once the job is submitted: its id, or with `wait` how it
/// ended.
pub async fn submitted(
    fleet: Fleet,
    submitted: Result<fleet_cmd::Submitted, FleetError>,
    wait: bool,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let submitted = match submitted {
        Ok(submitted) => submitted,
        Err(e) => return refused_or_failed(e),
    };
    if !wait {
        let job = &submitted.job;
        if shown.json {
            print_json(&serde_json::json!({"job_id": job, "attached": submitted.attached}));
        } else {
            let again = if submitted.attached {
                " (already submitted; attached)"
            } else {
                ""
            };
            eprintln!("Submitted {job}{again}; follow it with `fleetrun status {job} --watch`.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    follow(fleet, submitted, shown, interrupt).await
}

/// The exit of a submission that did not go through: refused (exit 2), or the job failed
/// while its input was cut (exit 42).
pub fn refused_or_failed(e: FleetError) -> anyhow::Result<ExitCode> {
    if let FleetError::Ledger(LedgerError::UnknownJob(job)) = &e {
        eprintln!("error: the fleet does not know job {job} (or has forgotten it)");
        return Ok(ExitCode::from(exit::REFUSED));
    }
    if e.is_refusal() {
        eprintln!("error: {e}");
        return Ok(ExitCode::from(exit::REFUSED));
    }
    if let FleetError::Partition(_) = e {
        // The job is Failed for it.
        eprintln!("error: {e}");
        return Ok(ExitCode::from(exit::FAILED));
    }
    Err(e.into())
}

/// Follows a submitted (or resumed) job to its end, says how it ended and exits with its
/// state's code.
pub async fn follow(
    fleet: Fleet,
    submitted: fleet_cmd::Submitted,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let job = submitted.job;
    let record = fleet_cmd::record(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("job {job} is not registered"))?;
    let output = fleetrun_worker::job::output_location(&record.spec);
    let status = fleet_cmd::wait(
        &fleet,
        &job,
        &record,
        Some(&submitted.produced),
        shown.progress,
        interrupt.token(),
    )
    .await?;
    if status.state.is_terminal() {
        // Its logs and output whole before this returns.
        fleet_cmd::settle(&fleet, &job, interrupt.token()).await;
    }
    if shown.json {
        print_json(&fleet_cmd::summary(&fleet, &job).await?);
    }
    if !status.state.is_terminal() {
        eprintln!("Stopped waiting; the job goes on. `fleetrun status {job}` follows it.");
        return Ok(ExitCode::from(exit::signaled(
            interrupt.signal().unwrap_or(exit::SIGINT),
        )));
    }
    let report = JobReport {
        job_id: job,
        status,
        output_file: None,
        log_dir: PathBuf::new(),
        elapsed: std::time::Duration::ZERO,
        signal: None,
    };
    if shown.json {
        return Ok(ExitCode::from(report.exit_code()));
    }
    say!(
        "Job {} {}: {} of {} mini-batches, {} items succeeded, {} failed.",
        report.job_id,
        report.status.state.as_str().to_lowercase(),
        report.status.done,
        report.status.total.unwrap_or(0),
        report.status.items_succeeded,
        report.status.items_failed
    );
    if let Some(reason) = &report.status.reason {
        say!("Cause: {reason}");
    }
    if report.status.state == JobState::Completed {
        say!("Output: {output}");
    }
    Ok(ExitCode::from(report.exit_code()))
}
