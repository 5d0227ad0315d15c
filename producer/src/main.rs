//! `fleetrun`: the user-facing command.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fleetrun_common::ledger::JobState;
use fleetrun_common::report::one_line;
use fleetrun_producer::exit;
use fleetrun_producer::fleet::{self as fleet_cmd, EmptyInput, FleetError};
use fleetrun_producer::local::{Interrupt, JobReport, RunError, RunOptions, run_local};
use fleetrun_worker::job::{Fleet, FleetArgs};
use tokio::signal::unix::{SignalKind, signal};

/// `println!` that ends quietly when stdout is closed (`fleetrun run job.toml | head -1`):
/// the reader has what it wanted, and the exit code stays the job's. Says whether stdout is
/// still open.
macro_rules! say {
    ($($arg:tt)*) => { print_line(format_args!($($arg)*)) };
}

fn print_line(line: std::fmt::Arguments) -> bool {
    match writeln!(io::stdout().lock(), "{line}") {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => false,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            false
        }
    }
}

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
        #[arg(long, value_parser = fleetrun_worker::node::processes_parser())]
        processes: Option<usize>,
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
        /// Run the job even if its input lists no item (else refused: exit 2).
        #[arg(long)]
        allow_empty_input: bool,
    },
    /// Submit a job to a fleet (RabbitMQ + Redis + S3); prints its id.
    Submit {
        /// The job file (TOML): the same file `fleetrun run` takes.
        job: PathBuf,
        /// Override a job parameter, e.g. `--set mini_batch_size=5`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Wait for the job to end; exit 0 when it completed, 42 when it failed.
        #[arg(long)]
        wait: bool,
        /// The job's id (default: made from its name and the time). Submitting the same job
        /// again with the same id attaches to it: one submitter publishes, and another
        /// finishes what a submitter that died left unpublished; the same id with another
        /// job is refused (exit 2).
        #[arg(long, value_name = "ID", value_parser = parse_job_id)]
        job_id: Option<String>,
        /// No progress display while waiting.
        #[arg(long, short)]
        quiet: bool,
        /// Submit the job even if its input lists no item (else refused: exit 2).
        #[arg(long)]
        allow_empty_input: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Show a job's progress (or the state of every job of the pool, without JOB).
    Status {
        job: Option<String>,
        /// Refresh until the job ends (needs JOB).
        #[arg(long, requires = "job")]
        watch: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Cancel a job: workers drop its remaining mini-batches.
    Cancel {
        job: String,
        #[command(flatten)]
        fleet: FleetArgs,
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
            allow_empty_input,
        } => run(
            job,
            overrides,
            processes,
            quiet,
            empty_input(allow_empty_input),
        ),
        Command::Submit {
            job,
            overrides,
            wait,
            job_id,
            quiet,
            allow_empty_input,
            fleet,
        } => {
            let empty = empty_input(allow_empty_input);
            let spec = match fleetrun_config::load(&job, &overrides) {
                Ok(spec) => spec,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(exit::REFUSED);
                }
            };
            on_fleet(fleet, |fleet, interrupt| async move {
                submit(spec, fleet, job_id, empty, wait, !quiet, interrupt).await
            })
        }
        Command::Status { job, watch, fleet } => on_fleet(fleet, |fleet, interrupt| async move {
            status(fleet, job, watch, interrupt).await
        }),
        Command::Cancel { job, fleet } => on_fleet(fleet, |fleet, _| async move {
            let status = fleet_cmd::cancel(&fleet, &job, "canceled by the user").await?;
            say!("Job {job}: {}.", status.state);
            Ok(ExitCode::SUCCESS)
        }),
    }
}

fn empty_input(allow: bool) -> EmptyInput {
    if allow {
        EmptyInput::Accept
    } else {
        EmptyInput::Refuse
    }
}

fn init_tracing() {
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_from_env("FLEETRUN_LOG")
        // lapin logs the broker's errors in its own Debug form; fleetrun says what they mean.
        .unwrap_or_else(|_| EnvFilter::new("warn,lapin=off"));
    // Colour for a person at a terminal only, and never under NO_COLOR (no-color.org).
    let ansi =
        io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .init();
}

fn run(
    job: PathBuf,
    overrides: Vec<String>,
    processes: Option<usize>,
    quiet: bool,
    empty: EmptyInput,
) -> ExitCode {
    let spec = match fleetrun_config::load(&job, &overrides) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(exit::REFUSED);
        }
    };
    if spec.node_count > 1 {
        eprintln!(
            "note: {}: node_count = {n}: `fleetrun run` runs the job on this machine alone, as \
             one node; `fleetrun submit` spreads it over {n} workers.",
            job.display(),
            n = spec.node_count
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let report = runtime.block_on(async {
        let interrupt = match on_signals() {
            Ok(interrupt) => interrupt,
            Err(e) => return Err(anyhow::Error::from(e)),
        };
        Ok(run_local(
            spec,
            RunOptions {
                processes,
                progress: !quiet,
                empty_input: empty,
            },
            interrupt,
        )
        .await)
    });
    match report {
        Ok(Ok(report)) => {
            print_report(&report);
            ExitCode::from(report.exit_code())
        }
        Ok(Err(e @ (RunError::Setup(_) | RunError::Output(_)))) => {
            eprintln!("error: {}: {e}", job.display());
            ExitCode::from(exit::REFUSED)
        }
        Ok(Err(RunError::Fleet(e))) if e.is_refusal() => {
            eprintln!("error: {}: {e}", job.display());
            ExitCode::from(exit::REFUSED)
        }
        Ok(Err(e)) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(exit::ERROR)
        }
        Err(e) => {
            eprintln!("error: {}", one_line(e.as_ref()));
            ExitCode::from(exit::ERROR)
        }
    }
}

/// SIGINT and SIGTERM alike stop what the command does; the exit code says which (130, 143).
fn on_signals() -> std::io::Result<Interrupt> {
    let interrupt = Interrupt::new();
    let on_signal = interrupt.clone();
    let mut terminate = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let number = tokio::select! {
            _ = int.recv() => exit::SIGINT,
            _ = terminate.recv() => exit::SIGTERM,
        };
        eprintln!("Interrupted.");
        on_signal.raise(number);
    });
    Ok(interrupt)
}

fn print_report(r: &JobReport) {
    let s = &r.status;
    let total = s.total.map_or_else(|| "?".to_owned(), |t| t.to_string());
    say!(
        "Job {} {} in {:.1}s: {} of {total} mini-batches, {} items succeeded, {} failed.",
        r.job_id,
        s.state.as_str().to_lowercase(),
        r.elapsed.as_secs_f64(),
        s.done,
        s.items_succeeded,
        s.items_failed
    );
    if let Some(reason) = &s.reason {
        say!("Cause: {reason}");
    }
    if let Some(file) = &r.output_file {
        say!("Output: {}", file.display());
    }
    say!("Logs:   {}", r.log_dir.display());
    if s.state == JobState::Failed {
        say!(
            "See {} and {}.",
            r.log_dir.join("job_result.txt").display(),
            r.log_dir.join("user/error.txt").display()
        );
    }
}

/// Runs a fleet command: resolves the settings, connects, maps errors to exit code 1.
fn on_fleet<F, Fut>(args: FleetArgs, command: F) -> ExitCode
where
    F: FnOnce(Fleet, Interrupt) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = runtime.block_on(async {
        let args = args.resolve()?;
        let fleet = Fleet::connect(&args).await?;
        command(fleet, on_signals()?).await
    });
    result.unwrap_or_else(|e: anyhow::Error| {
        eprintln!("error: {}", one_line(e.as_ref()));
        ExitCode::from(exit::ERROR)
    })
}

async fn submit(
    spec: fleetrun_config::JobSpec,
    fleet: Fleet,
    job_id: Option<String>,
    empty: EmptyInput,
    wait: bool,
    progress: bool,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let output = fleetrun_worker::job::output_location(&spec);
    let submitted = match fleet_cmd::submit(spec, &fleet, job_id.as_deref(), empty, |id| {
        say!("{id}");
    })
    .await
    {
        Ok(submitted) => submitted,
        Err(e) if e.is_refusal() => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(exit::REFUSED));
        }
        Err(e @ FleetError::Partition(_)) => {
            // The job is Failed for it.
            eprintln!("error: {e}");
            return Ok(ExitCode::from(exit::FAILED));
        }
        Err(e) => return Err(e.into()),
    };
    let job = submitted.job;
    if !wait {
        let again = if submitted.attached {
            " (already submitted; attached)"
        } else {
            ""
        };
        eprintln!("Submitted {job}{again}; follow it with `fleetrun status {job} --watch`.");
        return Ok(ExitCode::SUCCESS);
    }
    let record = fleet_cmd::record(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("job {job} is not registered"))?;
    let status = fleet_cmd::wait(
        &fleet,
        &job,
        &record,
        Some(&submitted.produced),
        progress,
        interrupt.token(),
    )
    .await?;
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

/// A job id: what Redis keys and log lines can hold (the job names' alphabet, plus `_` and
/// `.`), 1 to 128 characters.
fn parse_job_id(id: &str) -> Result<String, String> {
    let ok = (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && id.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(id.to_owned())
    } else {
        Err("1 to 128 of a-z, A-Z, 0-9, '-', '_', '.', starting with a letter or digit".into())
    }
}

async fn status(
    fleet: Fleet,
    job: Option<String>,
    watch: bool,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let Some(job) = job else {
        let jobs = fleet.registry.jobs().await?;
        if jobs.is_empty() {
            say!("No jobs.");
        }
        for job in jobs {
            // One record this build cannot read (written by another version) hides no other.
            let pool = match fleet_cmd::record(&fleet, &job).await {
                Ok(record) => record.map(|r| r.pool),
                Err(e) => {
                    tracing::warn!(job = %job, error = %e, "Skipping a job whose record does not decode.");
                    continue;
                }
            };
            if pool.as_deref() != Some(fleet.pool.as_str()) {
                continue;
            }
            if let Some(s) = fleet.ledger.status(&job).await? {
                let total = s.total.map_or_else(|| "?".to_owned(), |t| t.to_string());
                say!(
                    "{job:<40} {:<10} {:>8}/{total:<8} mini-batches  {} items failed",
                    s.state,
                    s.done,
                    s.items_failed
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    let record = fleet_cmd::record(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
    loop {
        let status = fleet
            .ledger
            .status(&job)
            .await?
            .ok_or_else(|| anyhow::anyhow!("job {job} is not in the ledger"))?;
        let depth = fleet.queue.depth().await.ok();
        let open = say!("{}", fleet_cmd::describe(&job, &record, &status, depth));
        if !open || !watch || status.state.is_terminal() {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            _ = interrupt.token().cancelled() => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
        }
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
