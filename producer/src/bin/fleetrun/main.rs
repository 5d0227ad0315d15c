//! `fleetrun`: the user-facing command. Each command is a file of `commands/`, holding its
//! arguments and what it does; what several commands share is beside this file: what they
//! print (`out.rs`), the signals they stop on (`signals.rs`), the job file they read
//! (`job_file.rs`), the fleet they reach (`fleet.rs`) and the job they follow (`follow.rs`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fleetrun_producer::exit;

#[macro_use]
mod out;
mod commands;
mod fleet;
mod follow;
mod job_file;
mod signals;

use commands::{
    cancel, convert, dlq, jobs, resume, retry, run, serve, status, submit, verify, wait,
};

#[derive(Parser)]
#[command(
    name = "fleetrun",
    version,
    about = "Run a Python scoring script over many files, in parallel."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job on this machine, with no services, and wait for it.
    Run(run::Args),
    /// Submit a job to a fleet (RabbitMQ + Redis + S3); prints its id.
    Submit(submit::Args),
    /// Check a completed job's output against its manifest (logs/manifest.json): every
    /// item once in the output or in failed_items.csv, no foreign line, every part as the
    /// job wrote it, the signature. Exit 0 with one line of counts, or 1 naming each problem.
    Verify(verify::Args),
    /// Print an Azure ML v2 YAML's parallel job as a fleetrun job file (TOML), each line
    /// with a comment naming its YAML key.
    Convert(convert::Args),
    /// Show a job's progress (or every job of the pool, without JOB). Exits 0 completed,
    /// 42 failed, 43 canceled, 44 expired, 75 not ended yet.
    Status(status::Args),
    /// List the jobs of the pool: running ones, and ended ones for a week.
    Jobs(jobs::Args),
    /// Wait for a job to end, watching its stop rules. Exits 0 completed, 42 failed,
    /// 43 canceled, 44 expired, 75 when `--timeout` runs out first.
    Wait(wait::Args),
    /// Serve the fleet's HTTP API: submit, follow and cancel jobs (`/v1/jobs`), `/healthz`,
    /// `/openapi.json`. Requests to `/v1` must carry `Authorization: Bearer $FLEETRUN_API_TOKEN`
    /// when that variable is set. Prints the address it listens on.
    Serve(serve::Args),
    /// Continue a job that failed, was canceled or expired, under its id: keep every
    /// mini-batch it recorded whole and run only the rest (failed ones included). Refused when its input
    /// changed since it ran, unless --force. Exits as `submit`.
    Resume(resume::Args),
    /// Run a new job over exactly the items a job that ended failed (its
    /// `logs/failed_items.csv`), with its settings and code; the new job's output goes to
    /// `retries/<id>/` in the job's output. Prints the new job's id; exits as `submit`.
    Retry(retry::Args),
    /// The pool's dead-letter queue: list, show, replay or purge what it holds.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// Cancel a job: workers drop its remaining mini-batches.
    Cancel(cancel::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // lapin logs the broker's errors in its own Debug form; fleetrun says what they mean.
    fleetrun_common::tls::install_crypto_provider();
    if let Err(e) = fleetrun_worker::log_format::init("warn,lapin=off", false) {
        eprintln!("error: {e}");
        return ExitCode::from(exit::REFUSED);
    }
    match cli.command {
        Command::Run(args) => run::main(args),
        Command::Submit(args) => submit::main(args),
        Command::Verify(args) => verify::main(args),
        Command::Convert(args) => convert::main(args),
        Command::Status(args) => status::main(args),
        Command::Jobs(args) => jobs::main(args),
        Command::Wait(args) => wait::main(args),
        Command::Serve(args) => serve::main(args),
        Command::Resume(args) => resume::main(args),
        Command::Retry(args) => retry::main(args),
        Command::Dlq(args) => dlq::main(args),
        Command::Cancel(args) => cancel::main(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    #[test]
    fn status_watch_needs_a_job() {
        assert!(Cli::try_parse_from(["fleetrun", "status", "--watch"]).is_err());
        assert!(Cli::try_parse_from(["fleetrun", "status", "job-1", "--watch"]).is_ok());
        assert!(Cli::try_parse_from(["fleetrun", "status"]).is_ok());
    }
}
