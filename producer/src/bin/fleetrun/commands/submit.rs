//! `fleetrun submit`: a job to a fleet.

use std::path::PathBuf;
use std::process::ExitCode;

use fleetrun_producer::exit;
use fleetrun_producer::fleet::{self as fleet_cmd, EmptyInput};
use fleetrun_producer::local::Interrupt;
use fleetrun_worker::job::{Fleet, FleetArgs};

use crate::fleet::{new_pool, on_pool};
use crate::follow;
use crate::job_file::{empty_input, load_job, note_settings_from_arguments, with_deadline};
use crate::out::Shown;

#[derive(clap::Args)]
pub struct Args {
    /// The job file (TOML) or Azure ML v2 YAML: the same file `fleetrun run` takes.
    pub job: PathBuf,
    /// The parallel job of an Azure ML pipeline YAML to submit.
    #[arg(long = "job", value_name = "NAME")]
    pub aml_job: Option<String>,
    /// Override a job parameter, e.g. `--set mini_batch_size=5`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// End the job Expired once this long has passed since its submission (`30s`,
    /// `90m`, `24h`, `7d`), keeping the rows of every mini-batch finished by then: the
    /// job's `deadline`.
    #[arg(long, value_name = "DURATION")]
    pub deadline: Option<String>,
    /// Wait for the job to end; exit 0 when it completed, 42 when it failed, 44 when it
    /// expired.
    #[arg(long)]
    pub wait: bool,
    /// The job's id (default: made from its name and the time). Submitting the same job
    /// again with the same id attaches to it: one submitter publishes, and another
    /// finishes what a submitter that died left unpublished; the same id with another
    /// job is refused (exit 2).
    #[arg(long, value_name = "ID", value_parser = fleetrun_producer::job_id::parse)]
    pub job_id: Option<String>,
    /// No progress display while waiting.
    #[arg(long, short)]
    pub quiet: bool,
    /// Submit the job even if its input lists no item (else refused: exit 2).
    #[arg(long)]
    pub allow_empty_input: bool,
    /// Print JSON for programs: `{"job_id": ..., "attached": ...}`; with `--wait`, the
    /// job's summary once it ended (as `status --json`).
    #[arg(long)]
    pub json: bool,
    /// Submit to a pool no worker has started yet (its queues are declared now, and its
    /// workers take the job once they start); without it such a pool is refused (exit
    /// 2), since it is most often a misspelled --pool.
    #[arg(long)]
    pub create_pool: bool,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

pub fn main(args: Args) -> ExitCode {
    let empty = empty_input(args.allow_empty_input);
    let overrides = with_deadline(args.overrides, args.deadline);
    let Some(spec) = load_job(&args.job, args.aml_job.as_deref(), &overrides) else {
        return ExitCode::from(exit::REFUSED);
    };
    note_settings_from_arguments(&args.job, &spec);
    let shown = Shown::new(args.json, args.quiet);
    let (job_id, wait) = (args.job_id, args.wait);
    on_pool(
        args.fleet,
        new_pool(args.create_pool),
        |fleet, interrupt| async move {
            submit(spec, fleet, job_id, empty, wait, shown, interrupt).await
        },
    )
}

async fn submit(
    spec: fleetrun_config::JobSpec,
    fleet: Fleet,
    job_id: Option<String>,
    empty: EmptyInput,
    wait: bool,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let submitted = fleet_cmd::submit(spec, &fleet, job_id.as_deref(), empty, |id| {
        if !shown.json {
            say!("{id}");
        }
    })
    .await;
    follow::submitted(fleet, submitted, wait, shown, interrupt).await
}
