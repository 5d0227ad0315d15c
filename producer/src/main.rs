//! `fleetrun`: the user-facing command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fleetrun_common::ledger::JobState;
use fleetrun_producer::local::{JobReport, RunError, RunOptions, run_local};
use tokio_util::sync::CancellationToken;

/// Exit code for a job file that does not validate.
const EXIT_BAD_JOB: u8 = 2;

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
    Run {
        /// The job file (TOML).
        job: PathBuf,
        /// Override a job parameter for this run, e.g. `--set mini_batch_size=5`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Runner processes (default: the job's process_count_per_node, else the cores).
        #[arg(long)]
        processes: Option<usize>,
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match cli.command {
        Command::Run {
            job,
            overrides,
            processes,
            quiet,
        } => run(job, overrides, processes, quiet),
    }
}

fn init_tracing() {
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_from_env("FLEETRUN_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn run(job: PathBuf, overrides: Vec<String>, processes: Option<usize>, quiet: bool) -> ExitCode {
    let spec = match fleetrun_config::load(&job, &overrides) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_JOB);
        }
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let report = runtime.block_on(async {
        let interrupt = CancellationToken::new();
        let on_signal = interrupt.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("Interrupted: stopping the job.");
                on_signal.cancel();
            }
        });
        run_local(
            spec,
            RunOptions {
                processes,
                progress: !quiet,
            },
            interrupt,
        )
        .await
    });
    match report {
        Ok(report) => {
            print_report(&report);
            ExitCode::from(report.exit_code() as u8)
        }
        Err(RunError::Setup(e)) => {
            eprintln!("error: {}: {e}", job.display());
            ExitCode::from(EXIT_BAD_JOB)
        }
        Err(RunError::Other(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_report(r: &JobReport) {
    let s = &r.status;
    let total = s.total.map_or_else(|| "?".to_owned(), |t| t.to_string());
    println!(
        "Job {} {} in {:.1}s: {} of {total} mini-batches, {} items succeeded, {} failed.",
        r.job_id,
        s.state.as_str().to_lowercase(),
        r.elapsed.as_secs_f64(),
        s.done,
        s.items_succeeded,
        s.items_failed
    );
    if let Some(reason) = &s.reason {
        println!("Cause: {reason}");
    }
    if let Some(file) = &r.output_file {
        println!("Output: {}", file.display());
    }
    println!("Logs:   {}", r.log_dir.display());
    if s.state == JobState::Failed {
        println!(
            "See {} and {}.",
            r.log_dir.join("job_result.txt").display(),
            r.log_dir.join("user/error.txt").display()
        );
    }
}
