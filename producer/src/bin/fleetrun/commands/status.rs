//! `fleetrun status`: a job's progress, once or until it ends.

use std::process::ExitCode;

use fleetrun_producer::fleet as fleet_cmd;
use fleetrun_producer::local::Interrupt;
use fleetrun_worker::job::{Fleet, FleetArgs};

use super::jobs;
use crate::fleet::on_fleet;
use crate::out::print_json;

#[derive(clap::Args)]
pub struct Args {
    pub job: Option<String>,
    /// Refresh until the job ends (needs JOB).
    #[arg(long, requires = "job", conflicts_with = "json")]
    pub watch: bool,
    /// Print JSON for programs (one object; a list without JOB).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let (watch, json) = (args.watch, args.json);
    on_fleet(args.fleet, |fleet, interrupt| async move {
        match args.job {
            Some(job) => status(fleet, job, watch, json, interrupt).await,
            None => jobs::list(fleet, json).await,
        }
    })
}

/// `fleetrun status JOB`: once, or every 2 s until it ends; exits with its state's code.
async fn status(
    fleet: Fleet,
    job: String,
    watch: bool,
    json: bool,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    loop {
        let summary = fleet_cmd::summary(&fleet, &job)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
        let open = if json {
            print_json(&summary);
            true
        } else {
            say!("{}", summary.describe(fleetrun_worker::job::unix_now()))
        };
        let code = ExitCode::from(summary.exit_code());
        if !open || !watch || summary.state.is_terminal() {
            return Ok(code);
        }
        tokio::select! {
            _ = interrupt.token().cancelled() => return Ok(code),
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
        }
    }
}
