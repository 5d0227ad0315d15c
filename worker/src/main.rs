//! `fleetrun-worker`: the node agent a fleet container runs.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "fleetrun-worker",
    version,
    about = "Serve a pool's mini-batches on this node."
)]
struct Cli {}

fn main() -> std::process::ExitCode {
    let _cli = Cli::parse();
    eprintln!(
        "fleetrun-worker serves a fleet's RabbitMQ queue, which this build does not connect to yet; \
         run a job on this machine with `fleetrun run JOB.toml`."
    );
    std::process::ExitCode::from(2)
}
