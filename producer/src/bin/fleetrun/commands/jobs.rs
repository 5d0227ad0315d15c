//! `fleetrun jobs`: the pool's jobs.

use std::process::ExitCode;

use fleetrun_producer::fleet as fleet_cmd;
use fleetrun_worker::job::{Fleet, FleetArgs};

use crate::fleet::on_fleet;
use crate::out::print_json;

#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON list for programs.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let json = args.json;
    on_fleet(
        args.fleet,
        |fleet, _| async move { list(fleet, json).await },
    )
}

/// `fleetrun jobs`: the pool's jobs, a line each (or a JSON list).
pub async fn list(fleet: Fleet, json: bool) -> anyhow::Result<ExitCode> {
    let jobs = fleet_cmd::summaries(&fleet).await?;
    if json {
        print_json(&jobs);
        return Ok(ExitCode::SUCCESS);
    }
    if jobs.is_empty() {
        say!("No jobs.");
    }
    for job in jobs {
        let c = &job.counts;
        let total = c
            .total_mini_batches
            .map_or_else(|| "?".to_owned(), |t| t.to_string());
        say!(
            "{:<40} {:<10} {:>8}/{total:<8} mini-batches  {} items failed",
            job.job_id,
            job.state,
            c.completed_mini_batches,
            c.failed_items
        );
    }
    Ok(ExitCode::SUCCESS)
}
