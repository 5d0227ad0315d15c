//! `fleetrun cancel`: a job's remaining mini-batches dropped.

use std::process::ExitCode;

use fleetrun_producer::fleet as fleet_cmd;
use fleetrun_worker::job::FleetArgs;

use crate::fleet::on_fleet;
use crate::out::print_json;

#[derive(clap::Args)]
pub struct Args {
    pub job: String,
    /// Print the job's summary as JSON (as `status --json`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let (job, json) = (args.job, args.json);
    on_fleet(args.fleet, |fleet, _| async move {
        let status = fleet_cmd::cancel(&fleet, &job, "canceled by the user").await?;
        if json {
            let summary = fleet_cmd::summary(&fleet, &job).await?;
            print_json(&summary);
        } else {
            say!("Job {job}: {}.", status.state);
        }
        Ok(ExitCode::SUCCESS)
    })
}
