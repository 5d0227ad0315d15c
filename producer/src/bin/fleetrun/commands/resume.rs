//! `fleetrun resume`: a job that ended unfinished continued under its id.

use std::process::ExitCode;

use fleetrun_producer::fleet as fleet_cmd;
use fleetrun_producer::local::Interrupt;
use fleetrun_worker::job::{Fleet, FleetArgs};

use crate::fleet::on_fleet;
use crate::follow::{Follow, follow, refused_or_failed};
use crate::out::{Shown, print_json};

#[derive(clap::Args)]
pub struct Args {
    pub job: String,
    /// Resume even though the input's listing changed since the job ran.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub follow: Follow,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let shown = Shown::new(args.follow.json, args.follow.quiet);
    let (job, force, wait) = (args.job, args.force, args.follow.wait);
    on_fleet(args.fleet, |fleet, interrupt| async move {
        resume(fleet, job, force, wait, shown, interrupt).await
    })
}

/// `fleetrun resume JOB`: reopens a job that failed or was canceled and publishes what it
/// has left to do; with `wait`, follows it to its end as `submit --wait` does.
async fn resume(
    fleet: Fleet,
    job: String,
    force: bool,
    wait: bool,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let resumed = match fleet_cmd::resume(&fleet, &job, force).await {
        Ok(resumed) => resumed,
        Err(e) => return refused_or_failed(e),
    };
    if !wait {
        if shown.json {
            print_json(&serde_json::json!({"job_id": job, "resumed": true}));
        } else {
            eprintln!("Resumed {job}; follow it with `fleetrun status {job} --watch`.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    follow(fleet, resumed, shown, interrupt).await
}
