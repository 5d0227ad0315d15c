//! `fleetrun run`: a job on this machine, with no services.

use std::path::PathBuf;
use std::process::ExitCode;

use fleetrun_common::ledger::JobState;
use fleetrun_common::report::one_line;
use fleetrun_producer::exit;
use fleetrun_producer::local::{JobReport, RunError, RunOptions, run_local};

use crate::job_file::{empty_input, load_job, note_settings_from_arguments, with_deadline};
use crate::signals::on_signals;

#[derive(clap::Args)]
pub struct Args {
    /// The job file (TOML), or an Azure ML v2 YAML (a parallel job, a parallel
    /// component, or a pipeline: `--job` names its parallel job when it has several).
    pub job: PathBuf,
    /// The parallel job of an Azure ML pipeline YAML to run.
    #[arg(long = "job", value_name = "NAME")]
    pub aml_job: Option<String>,
    /// Override a job parameter for this run, e.g. `--set mini_batch_size=5`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// End the job Expired once this long has passed since it started (`30s`, `90m`,
    /// `24h`, `7d`), keeping the rows of every mini-batch finished by then (exit 44):
    /// the job's `deadline`.
    #[arg(long, value_name = "DURATION")]
    pub deadline: Option<String>,
    /// Runner processes (default: the job's process_count_per_node, else the cores).
    #[arg(long, value_parser = fleetrun_worker::node::processes_parser())]
    pub processes: Option<usize>,
    /// No progress display.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run the job even if its input lists no item (else refused: exit 2).
    #[arg(long)]
    pub allow_empty_input: bool,
    /// Continue the last run on the output folder where it stopped (killed, interrupted
    /// or failed): keep every mini-batch it recorded, run only the rest. Refused when the
    /// job's settings, code or input changed since, unless --force.
    #[arg(long)]
    pub resume: bool,
    /// With --resume: resume even though the job changed since it ran.
    #[arg(long, requires = "resume")]
    pub force: bool,
}

pub fn main(args: Args) -> ExitCode {
    let options = RunOptions {
        processes: args.processes,
        progress: !args.quiet,
        empty_input: empty_input(args.allow_empty_input),
        resume: args.resume,
        force: args.force,
    };
    run(
        args.job,
        args.aml_job,
        with_deadline(args.overrides, args.deadline),
        options,
    )
}

fn run(
    job: PathBuf,
    aml_job: Option<String>,
    overrides: Vec<String>,
    options: RunOptions,
) -> ExitCode {
    let Some(spec) = load_job(&job, aml_job.as_deref(), &overrides) else {
        return ExitCode::from(exit::REFUSED);
    };
    note_settings_from_arguments(&job, &spec);
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
        Ok(run_local(spec, options, interrupt).await)
    });
    match report {
        Ok(Ok(report)) => {
            print_report(&report);
            ExitCode::from(report.exit_code())
        }
        Ok(Err(
            e @ (RunError::Setup(_)
            | RunError::Output(_)
            | RunError::Resume(_)
            | RunError::Input(_)
            | RunError::Fingerprint(_)
            | RunError::Journal(_)),
        )) => {
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
