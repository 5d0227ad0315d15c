//! `fleetrun wait`: follows a job until it ends.

use std::process::ExitCode;

use fleetrun_producer::exit;
use fleetrun_producer::fleet as fleet_cmd;
use fleetrun_producer::local::Interrupt;
use fleetrun_worker::job::{Fleet, FleetArgs};

use crate::fleet::on_fleet;
use crate::out::{Shown, print_json};

#[derive(clap::Args)]
pub struct Args {
    pub job: String,
    /// Stop waiting after this many seconds (the job goes on).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// Print the job's summary as JSON (as `status --json`) when waiting ends.
    #[arg(long)]
    pub json: bool,
    /// No progress display.
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let shown = Shown::new(args.json, args.quiet);
    let (job, timeout) = (args.job, args.timeout);
    on_fleet(args.fleet, |fleet, interrupt| async move {
        wait(fleet, job, timeout, shown, interrupt).await
    })
}

/// `fleetrun wait JOB`: follows the job (and its stop rules) until it ends, `timeout`
/// seconds pass, or a signal comes.
async fn wait(
    fleet: Fleet,
    job: String,
    timeout: Option<u64>,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let record = fleet_cmd::record(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
    let stop = interrupt.token().child_token();
    if let Some(seconds) = timeout {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
            stop.cancel();
        });
    }
    let status = fleet_cmd::wait(&fleet, &job, &record, None, shown.progress, &stop).await?;
    if status.state.is_terminal() {
        fleet_cmd::settle(&fleet, &job, &stop).await;
    }
    let summary = fleet_cmd::summary(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
    if shown.json {
        print_json(&summary);
    } else if status.state.is_terminal() {
        say!("{}", summary.describe(fleetrun_worker::job::unix_now()));
    }
    if let Some(signal) = interrupt.signal() {
        if !shown.json {
            eprintln!("Stopped waiting; the job goes on.");
        }
        return Ok(ExitCode::from(exit::signaled(signal)));
    }
    if !status.state.is_terminal() && !shown.json {
        eprintln!(
            "Stopped waiting after {}s; the job goes on.",
            timeout.unwrap_or(0)
        );
    }
    Ok(ExitCode::from(summary.exit_code()))
}
