//! `fleetrun retry`: a new job over exactly the items a job that ended failed.

use std::process::ExitCode;

use fleetrun_producer::fleet as fleet_cmd;
use fleetrun_worker::job::FleetArgs;

use crate::fleet::on_fleet;
use crate::follow::{Follow, submitted};
use crate::out::Shown;

#[derive(clap::Args)]
pub struct Args {
    pub job: String,
    /// The new job's id (default: made from its name and the time).
    #[arg(long, value_name = "ID", value_parser = fleetrun_producer::job_id::parse)]
    pub job_id: Option<String>,
    #[command(flatten)]
    pub follow: Follow,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let shown = Shown::new(args.follow.json, args.follow.quiet);
    let (job, job_id, wait) = (args.job, args.job_id, args.follow.wait);
    on_fleet(args.fleet, |fleet, interrupt| async move {
        let retried = fleet_cmd::retry(&fleet, &job, job_id.as_deref(), |id| {
            if !shown.json {
                say!("{id}");
            }
        })
        .await;
        submitted(fleet, retried, wait, shown, interrupt).await
    })
}
