//! `fleetrun`: the user-facing command.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fleetrun_common::ledger::{JobState, LedgerError};
use fleetrun_common::report::one_line;
use fleetrun_producer::fleet::{self as fleet_cmd, EmptyInput, FleetError};
use fleetrun_producer::local::{Interrupt, JobReport, RunError, RunOptions, run_local};
use fleetrun_producer::{dlq, exit, verify};
use fleetrun_worker::job::{Fleet, FleetArgs, NewPool, SettingsError};
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
        /// The job file (TOML), or an Azure ML v2 YAML (a parallel job, a parallel
        /// component, or a pipeline: `--job` names its parallel job when it has several).
        job: PathBuf,
        /// The parallel job of an Azure ML pipeline YAML to run.
        #[arg(long = "job", value_name = "NAME")]
        aml_job: Option<String>,
        /// Override a job parameter for this run, e.g. `--set mini_batch_size=5`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// End the job Expired once this long has passed since it started (`30s`, `90m`,
        /// `24h`, `7d`), keeping the rows of every mini-batch finished by then (exit 44):
        /// the job's `deadline`.
        #[arg(long, value_name = "DURATION")]
        deadline: Option<String>,
        /// Runner processes (default: the job's process_count_per_node, else the cores).
        #[arg(long, value_parser = fleetrun_worker::node::processes_parser())]
        processes: Option<usize>,
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
        /// Run the job even if its input lists no item (else refused: exit 2).
        #[arg(long)]
        allow_empty_input: bool,
        /// Continue the last run on the output folder where it stopped (killed, interrupted
        /// or failed): keep every mini-batch it recorded, run only the rest. Refused when the
        /// job's settings, code or input changed since, unless --force.
        #[arg(long)]
        resume: bool,
        /// With --resume: resume even though the job changed since it ran.
        #[arg(long, requires = "resume")]
        force: bool,
    },
    /// Submit a job to a fleet (RabbitMQ + Redis + S3); prints its id.
    Submit {
        /// The job file (TOML) or Azure ML v2 YAML: the same file `fleetrun run` takes.
        job: PathBuf,
        /// The parallel job of an Azure ML pipeline YAML to submit.
        #[arg(long = "job", value_name = "NAME")]
        aml_job: Option<String>,
        /// Override a job parameter, e.g. `--set mini_batch_size=5`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// End the job Expired once this long has passed since its submission (`30s`,
        /// `90m`, `24h`, `7d`), keeping the rows of every mini-batch finished by then: the
        /// job's `deadline`.
        #[arg(long, value_name = "DURATION")]
        deadline: Option<String>,
        /// Wait for the job to end; exit 0 when it completed, 42 when it failed, 44 when it
        /// expired.
        #[arg(long)]
        wait: bool,
        /// The job's id (default: made from its name and the time). Submitting the same job
        /// again with the same id attaches to it: one submitter publishes, and another
        /// finishes what a submitter that died left unpublished; the same id with another
        /// job is refused (exit 2).
        #[arg(long, value_name = "ID", value_parser = fleet_cmd::parse_job_id)]
        job_id: Option<String>,
        /// No progress display while waiting.
        #[arg(long, short)]
        quiet: bool,
        /// Submit the job even if its input lists no item (else refused: exit 2).
        #[arg(long)]
        allow_empty_input: bool,
        /// Print JSON for programs: `{"job_id": ..., "attached": ...}`; with `--wait`, the
        /// job's summary once it ended (as `status --json`).
        #[arg(long)]
        json: bool,
        /// Submit to a pool no worker has started yet (its queues are declared now, and its
        /// workers take the job once they start); without it such a pool is refused (exit
        /// 2), since it is most often a misspelled --pool.
        #[arg(long)]
        create_pool: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Check a completed job's output against its manifest (logs/manifest.json): every
    /// item once in the output or in failed_items.csv, no foreign line, every part as the
    /// job wrote it, the signature. Exit 0 with one line of counts, or 1 naming each problem.
    Verify {
        /// The job's output folder, or its s3://bucket/prefix.
        output: String,
        /// List this input again (a folder or s3:// prefix) instead of trusting the
        /// manifest's listing.
        #[arg(long, value_name = "INPUT")]
        input: Option<String>,
        /// The key the manifest is signed with (default: $FLEETRUN_MANIFEST_KEY, else
        /// $FLEETRUN_WEBHOOK_SECRET); without one the signature is not checked.
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
    },
    /// Print an Azure ML v2 YAML's parallel job as a fleetrun job file (TOML), each line
    /// with a comment naming its YAML key.
    Convert {
        /// The YAML: a parallel job, a parallel component, or a pipeline.
        yaml: PathBuf,
        /// The parallel job of a pipeline that has several.
        #[arg(long = "job", value_name = "NAME")]
        aml_job: Option<String>,
        /// Give an input or output the YAML cannot reach here: `inputs.NAME=PATH`,
        /// `outputs.NAME=PATH`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Show a job's progress (or every job of the pool, without JOB). Exits 0 completed,
    /// 42 failed, 43 canceled, 44 expired, 75 not ended yet.
    Status {
        job: Option<String>,
        /// Refresh until the job ends (needs JOB).
        #[arg(long, requires = "job", conflicts_with = "json")]
        watch: bool,
        /// Print JSON for programs (one object; a list without JOB).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// List the jobs of the pool: running ones, and ended ones for a week.
    Jobs {
        /// Print a JSON list for programs.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Wait for a job to end, watching its stop rules. Exits 0 completed, 42 failed,
    /// 43 canceled, 44 expired, 75 when `--timeout` runs out first.
    Wait {
        job: String,
        /// Stop waiting after this many seconds (the job goes on).
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<u64>,
        /// Print the job's summary as JSON (as `status --json`) when waiting ends.
        #[arg(long)]
        json: bool,
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Serve the fleet's HTTP API: submit, follow and cancel jobs (`/v1/jobs`), `/healthz`,
    /// `/openapi.json`. Requests to `/v1` must carry `Authorization: Bearer $FLEETRUN_API_TOKEN`
    /// when that variable is set. Prints the address it listens on.
    Serve {
        /// Where to listen (port 0: any free port).
        #[arg(long, env = "FLEETRUN_LISTEN", default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Also serve the pool's jobs as Prometheus metrics at `/metrics` on this address
        /// (port 0: any free port), among them each job's expected seconds of work left
        /// (`fleetrun_job_work_seconds_left`), the autoscaling signal.
        #[arg(long, env = "FLEETRUN_METRICS_ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Serve a pool no worker has started yet (else refused, exit 2), so that jobs
        /// posted before its first worker starts wait for it.
        #[arg(long)]
        create_pool: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Continue a job that failed, was canceled or expired, under its id: keep every
    /// mini-batch it recorded whole and run only the rest (failed ones included). Refused when its input
    /// changed since it ran, unless --force. Exits as `submit`.
    Resume {
        job: String,
        /// Resume even though the input's listing changed since the job ran.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        follow: Follow,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Run a new job over exactly the items a job that ended failed (its
    /// `logs/failed_items.csv`), with its settings and code; the new job's output goes to
    /// `retries/<id>/` in the job's output. Prints the new job's id; exits as `submit`.
    Retry {
        job: String,
        /// The new job's id (default: made from its name and the time).
        #[arg(long, value_name = "ID", value_parser = fleet_cmd::parse_job_id)]
        job_id: Option<String>,
        #[command(flatten)]
        follow: Follow,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// The pool's dead-letter queue: list, show, replay or purge what it holds.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Cancel a job: workers drop its remaining mini-batches.
    Cancel {
        job: String,
        /// Print the job's summary as JSON (as `status --json`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
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
        Command::Run {
            job,
            aml_job,
            overrides,
            deadline,
            processes,
            quiet,
            allow_empty_input,
            resume,
            force,
        } => run(
            job,
            aml_job,
            with_deadline(overrides, deadline),
            RunOptions {
                processes,
                progress: !quiet,
                empty_input: empty_input(allow_empty_input),
                resume,
                force,
            },
        ),
        Command::Submit {
            job,
            aml_job,
            overrides,
            deadline,
            wait,
            job_id,
            quiet,
            allow_empty_input,
            json,
            create_pool,
            fleet,
        } => {
            let empty = empty_input(allow_empty_input);
            let overrides = with_deadline(overrides, deadline);
            let Some(spec) = load_job(&job, aml_job.as_deref(), &overrides) else {
                return ExitCode::from(exit::REFUSED);
            };
            note_settings_from_arguments(&job, &spec);
            let shown = Shown::new(json, quiet);
            on_pool(
                fleet,
                new_pool(create_pool),
                |fleet, interrupt| async move {
                    submit(spec, fleet, job_id, empty, wait, shown, interrupt).await
                },
            )
        }
        Command::Verify { output, input, key } => verify(&output, input.as_deref(), key),
        Command::Convert {
            yaml,
            aml_job,
            overrides,
        } => convert(&yaml, aml_job.as_deref(), &overrides),
        Command::Status {
            job,
            watch,
            json,
            fleet,
        } => on_fleet(fleet, |fleet, interrupt| async move {
            match job {
                Some(job) => status(fleet, job, watch, json, interrupt).await,
                None => jobs(fleet, json).await,
            }
        }),
        Command::Jobs { json, fleet } => {
            on_fleet(fleet, |fleet, _| async move { jobs(fleet, json).await })
        }
        Command::Wait {
            job,
            timeout,
            json,
            quiet,
            fleet,
        } => {
            let shown = Shown::new(json, quiet);
            on_fleet(fleet, |fleet, interrupt| async move {
                wait(fleet, job, timeout, shown, interrupt).await
            })
        }
        Command::Serve {
            listen,
            metrics_addr,
            create_pool,
            fleet,
        } => on_pool(
            fleet,
            new_pool(create_pool),
            |fleet, interrupt| async move {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
                say!("Listening on http://{}", listener.local_addr()?);
                let metrics = match metrics_addr {
                    Some(addr) => {
                        let metrics = tokio::net::TcpListener::bind(addr)
                            .await
                            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
                        say!("Metrics on http://{}/metrics", metrics.local_addr()?);
                        Some(metrics)
                    }
                    None => None,
                };
                let token = std::env::var("FLEETRUN_API_TOKEN").ok();
                let shutdown = interrupt.token().clone();
                fleetrun_producer::serve::run(fleet, listener, metrics, token, shutdown).await?;
                Ok(ExitCode::SUCCESS)
            },
        ),
        Command::Resume {
            job,
            force,
            follow,
            fleet,
        } => {
            let shown = Shown::new(follow.json, follow.quiet);
            on_fleet(fleet, |fleet, interrupt| async move {
                resume(fleet, job, force, follow.wait, shown, interrupt).await
            })
        }
        Command::Retry {
            job,
            job_id,
            follow,
            fleet,
        } => {
            let shown = Shown::new(follow.json, follow.quiet);
            on_fleet(fleet, |fleet, interrupt| async move {
                let retried = fleet_cmd::retry(&fleet, &job, job_id.as_deref(), |id| {
                    if !shown.json {
                        say!("{id}");
                    }
                })
                .await;
                submitted(fleet, retried, follow.wait, shown, interrupt).await
            })
        }
        Command::Dlq { command } => dead_letters(command),
        Command::Cancel { job, json, fleet } => on_fleet(fleet, |fleet, _| async move {
            let status = fleet_cmd::cancel(&fleet, &job, "canceled by the user").await?;
            if json {
                let summary = fleet_cmd::summary(&fleet, &job).await?;
                print_json(&summary);
            } else {
                say!("Job {job}: {}.", status.state);
            }
            Ok(ExitCode::SUCCESS)
        }),
    }
}

#[derive(Subcommand)]
enum DlqCommand {
    /// One line per dead letter, oldest first: its id, why it was dead-lettered, its
    /// deliveries, its run and first items (or its size, when it does not decode).
    List {
        /// Only the dead letters of this job.
        #[arg(long)]
        job: Option<String>,
        /// Print a JSON list for programs.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// One dead letter in full: its mini-batch's items or chunks, partition, run and
    /// headers. Exits 2 when no dead letter has the id.
    Show {
        /// `<job>:<index>`, or `raw-<digest>` for one that does not decode (as `list` shows).
        id: String,
        /// Print JSON for programs (a list: dead letters of one mini-batch share its id).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Put dead letters back to work: each is published again with a fresh delivery
    /// budget (its failure taken back from its Running job's counts), then removed. One of
    /// a job that ended is refused, saying what to run instead. Exits 2 when any is refused
    /// or none matched.
    Replay {
        #[command(flatten)]
        select: Selection,
        /// Print JSON for programs: what became of each.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Remove dead letters for good (their failures stay counted). Asks first on a
    /// terminal; elsewhere refused (exit 2) without --yes.
    Purge {
        #[command(flatten)]
        select: Selection,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
        /// Print JSON for programs: what was removed.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
}

/// Which dead letters `dlq replay` and `dlq purge` act on: ids, a job's, or all.
#[derive(clap::Args, Debug, Clone)]
#[group(required = true, multiple = false)]
struct Selection {
    /// Dead letters by id, as `dlq list` shows them.
    ids: Vec<String>,
    /// Every dead letter of this job.
    #[arg(long)]
    job: Option<String>,
    /// Every dead letter of the pool.
    #[arg(long)]
    all: bool,
}

impl Selection {
    fn select(self) -> dlq::Select {
        match (self.job, self.all) {
            (Some(job), _) => dlq::Select::Job(job),
            (None, true) => dlq::Select::All,
            (None, false) => dlq::Select::Ids(self.ids),
        }
    }
}

/// Following a job a command started (`resume`, `retry`).
#[derive(clap::Args, Debug, Clone, Copy)]
struct Follow {
    /// Wait for the job to end; exit 0 when it completed, 42 when it failed.
    #[arg(long)]
    wait: bool,
    /// No progress display while waiting.
    #[arg(long, short)]
    quiet: bool,
    /// Print JSON for programs: the job's id (`{"job_id": ...}`); with `--wait`, its summary
    /// once it ended (as `status --json`).
    #[arg(long)]
    json: bool,
}

/// How a command shows what it does: JSON for programs, a progress display for people.
#[derive(Debug, Clone, Copy)]
struct Shown {
    json: bool,
    progress: bool,
}

impl Shown {
    /// JSON when asked; else a progress display unless `quiet`.
    fn new(json: bool, quiet: bool) -> Shown {
        Shown {
            json,
            progress: !quiet && !json,
        }
    }
}

/// One JSON document on stdout, on one line.
fn print_json(value: &impl serde::Serialize) {
    say!(
        "{}",
        serde_json::to_string(value).expect("a summary always encodes")
    );
}

/// Whether `path` is an Azure ML YAML rather than a TOML job file.
fn is_yaml(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yml") || e.eq_ignore_ascii_case("yaml"))
}

/// The job of a TOML job file or an Azure ML YAML (saying once, on stderr, which YAML keys
/// it does not use), or `None` once the mistake is printed.
fn load_job(
    path: &std::path::Path,
    aml_job: Option<&str>,
    overrides: &[String],
) -> Option<fleetrun_config::JobSpec> {
    let loaded = if is_yaml(path) {
        fleetrun_config::load_aml(path, aml_job, overrides).map(|(spec, converted)| {
            if let Some(warning) = converted.warning() {
                eprintln!("warning: {}: {warning}.", path.display());
            }
            spec
        })
    } else if let Some(name) = aml_job {
        eprintln!(
            "error: --job {name}: {} is a job file; --job names a job of an Azure ML pipeline YAML",
            path.display()
        );
        return None;
    } else {
        fleetrun_config::load(path, overrides)
    };
    loaded.map_err(|e| eprintln!("error: {e}")).ok()
}

/// `fleetrun convert`: the YAML's job as TOML on stdout.
fn convert(yaml: &std::path::Path, aml_job: Option<&str>, overrides: &[String]) -> ExitCode {
    let text = match std::fs::read_to_string(yaml) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("error: {}: {e}", yaml.display());
            return ExitCode::from(exit::REFUSED);
        }
    };
    let base_dir = yaml
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let source = yaml.display().to_string();
    let converted = fleetrun_config::aml::convert(&text, &source, base_dir, aml_job, overrides)
        .and_then(|(mut converted, rest)| converted.set(&rest).map(|()| converted));
    match converted {
        Ok(converted) => {
            say!("{}", converted.to_toml(&source).trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::REFUSED)
        }
    }
}

/// Says once, on stderr, which ParallelRunStep settings the job takes from its `arguments`,
/// and warns of those its own keys overrule.
fn note_settings_from_arguments(job: &std::path::Path, spec: &fleetrun_config::JobSpec) {
    for setting in &spec.settings_from_arguments {
        let kind = if setting.taken { "note" } else { "warning" };
        eprintln!("{kind}: {}: {setting}.", job.display());
    }
}

fn empty_input(allow: bool) -> EmptyInput {
    if allow {
        EmptyInput::Accept
    } else {
        EmptyInput::Refuse
    }
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

/// The `--set` overrides with `--deadline`'s after them, as the job's `deadline`: the
/// flag wins over the job file, and is refused by the same rule.
fn with_deadline(mut overrides: Vec<String>, deadline: Option<String>) -> Vec<String> {
    overrides.extend(deadline.map(|d| format!("deadline={d}")));
    overrides
}

/// `fleetrun verify`: 0 when the output holds, 1 naming each problem (or why it could not
/// be checked).
fn verify(output: &str, input: Option<&str>, key: Option<String>) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let key = key.or_else(fleetrun_worker::job::manifest::signing_key);
    let result = runtime.block_on(async {
        let output = fleetrun_config::Location::parse(output)?;
        let input = input.map(fleetrun_config::Location::parse).transpose()?;
        let key = key.as_deref().map(str::as_bytes);
        anyhow::Ok(verify::verify_at(&output, input.as_ref(), key).await?)
    });
    match result {
        Ok(verified) if verified.problems.is_empty() => {
            say!("{}", verified.summary());
            ExitCode::from(exit::COMPLETED)
        }
        Ok(verified) => {
            for problem in &verified.problems {
                say!("problem: {problem}");
            }
            say!("{} problem(s) found", verified.problems.len());
            ExitCode::from(exit::ERROR)
        }
        Err(e) => {
            eprintln!("error: {}", one_line(e.as_ref()));
            ExitCode::from(exit::ERROR)
        }
    }
}

/// Runs a fleet command on a pool a worker has started: resolves the settings, connects,
/// maps errors to exit code 1 (2 for an unknown pool).
fn on_fleet<F, Fut>(args: FleetArgs, command: F) -> ExitCode
where
    F: FnOnce(Fleet, Interrupt) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    on_pool(args, NewPool::Refuse, command)
}

/// [`on_fleet`] that may declare a pool no worker has started, with `new`.
fn on_pool<F, Fut>(args: FleetArgs, new: NewPool, command: F) -> ExitCode
where
    F: FnOnce(Fleet, Interrupt) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = runtime.block_on(async {
        let args = args.resolve()?;
        let fleet = Fleet::connect_pool(&args, new).await?;
        command(fleet, on_signals()?).await
    });
    result.unwrap_or_else(|e: anyhow::Error| {
        eprintln!("error: {}", one_line(e.as_ref()));
        let unknown_pool = matches!(
            e.downcast_ref::<SettingsError>(),
            Some(SettingsError::UnknownPool { .. })
        );
        ExitCode::from(if unknown_pool {
            exit::REFUSED
        } else {
            exit::ERROR
        })
    })
}

/// Whether `--create-pool` was given.
fn new_pool(create: bool) -> NewPool {
    if create {
        NewPool::Create
    } else {
        NewPool::Refuse
    }
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
    self::submitted(fleet, submitted, wait, shown, interrupt).await
}

/// What `submit` (and `retry`) says once the job is submitted: its id, or with `wait` how it
/// ended.
async fn submitted(
    fleet: Fleet,
    submitted: Result<fleet_cmd::Submitted, FleetError>,
    wait: bool,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let submitted = match submitted {
        Ok(submitted) => submitted,
        Err(e) => return refused_or_failed(e),
    };
    if !wait {
        let job = &submitted.job;
        if shown.json {
            print_json(&serde_json::json!({"job_id": job, "attached": submitted.attached}));
        } else {
            let again = if submitted.attached {
                " (already submitted; attached)"
            } else {
                ""
            };
            eprintln!("Submitted {job}{again}; follow it with `fleetrun status {job} --watch`.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    follow(fleet, submitted, shown, interrupt).await
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

/// The exit of a submission that did not go through: refused (exit 2), or the job failed
/// while its input was cut (exit 42).
fn refused_or_failed(e: FleetError) -> anyhow::Result<ExitCode> {
    if let FleetError::Ledger(LedgerError::UnknownJob(job)) = &e {
        eprintln!("error: the fleet does not know job {job} (or has forgotten it)");
        return Ok(ExitCode::from(exit::REFUSED));
    }
    if e.is_refusal() {
        eprintln!("error: {e}");
        return Ok(ExitCode::from(exit::REFUSED));
    }
    if let FleetError::Partition(_) = e {
        // The job is Failed for it.
        eprintln!("error: {e}");
        return Ok(ExitCode::from(exit::FAILED));
    }
    Err(e.into())
}

/// Follows a submitted (or resumed) job to its end, says how it ended and exits with its
/// state's code.
async fn follow(
    fleet: Fleet,
    submitted: fleet_cmd::Submitted,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let job = submitted.job;
    let record = fleet_cmd::record(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("job {job} is not registered"))?;
    let output = fleetrun_worker::job::output_location(&record.spec);
    let status = fleet_cmd::wait(
        &fleet,
        &job,
        &record,
        Some(&submitted.produced),
        shown.progress,
        interrupt.token(),
    )
    .await?;
    if status.state.is_terminal() {
        // Its logs and output whole before this returns.
        fleet_cmd::settle(&fleet, &job, interrupt.token()).await;
    }
    if shown.json {
        print_json(&fleet_cmd::summary(&fleet, &job).await?);
    }
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
    if shown.json {
        return Ok(ExitCode::from(report.exit_code()));
    }
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

/// `fleetrun dlq …`.
fn dead_letters(command: DlqCommand) -> ExitCode {
    match command {
        DlqCommand::List { job, json, fleet } => on_fleet(fleet, |fleet, _| async move {
            let views: Vec<_> = dlq::list(&fleet, job.as_deref())
                .await?
                .into_iter()
                .map(dlq::DeadLetterView::brief)
                .collect();
            if json {
                print_json(&views);
            } else if views.is_empty() {
                say!("No dead letters.");
            }
            for view in views.iter().filter(|_| !json) {
                say!("{}", view.line());
            }
            Ok(ExitCode::SUCCESS)
        }),
        DlqCommand::Show { id, json, fleet } => on_fleet(fleet, |fleet, _| async move {
            let views: Vec<_> = dlq::list(&fleet, None)
                .await?
                .into_iter()
                .filter(|view| view.id == id)
                .collect();
            if views.is_empty() {
                eprintln!(
                    "error: no dead letter {id} in the pool's dead-letter queue (`fleetrun dlq list` shows them)"
                );
                return Ok(ExitCode::from(exit::REFUSED));
            }
            if json {
                print_json(&views);
                return Ok(ExitCode::SUCCESS);
            }
            for view in views {
                show_dead_letter(&view);
            }
            Ok(ExitCode::SUCCESS)
        }),
        DlqCommand::Replay {
            select,
            json,
            fleet,
        } => on_fleet(fleet, |fleet, _| async move {
            let settled = dlq::replay(&fleet, &select.select()).await?;
            Ok(settled_exit(&settled, json))
        }),
        DlqCommand::Purge {
            select,
            yes,
            json,
            fleet,
        } => {
            use std::io::IsTerminal;
            if !yes {
                if !io::stdin().is_terminal() {
                    eprintln!(
                        "error: dlq purge removes dead letters for good; pass --yes to do it without a terminal to ask on"
                    );
                    return ExitCode::from(exit::REFUSED);
                }
                eprint!("Remove the chosen dead letters for good? [y/N] ");
                let mut answer = String::new();
                if io::stdin().read_line(&mut answer).is_err()
                    || !answer.trim().eq_ignore_ascii_case("y")
                {
                    eprintln!("Nothing removed.");
                    return ExitCode::from(exit::REFUSED);
                }
            }
            on_fleet(fleet, |fleet, _| async move {
                let settled = dlq::purge(&fleet, &select.select()).await?;
                Ok(settled_exit(&settled, json))
            })
        }
    }
}

/// One dead letter in full, for people.
fn show_dead_letter(view: &dlq::DeadLetterView) {
    say!("Dead letter {}", view.id);
    let unknown = || "unknown".to_owned();
    say!(
        "  reason:      {}",
        view.reason.clone().unwrap_or_else(unknown)
    );
    say!(
        "  deliveries:  {}",
        view.deliveries.map_or_else(unknown, |n| n.to_string())
    );
    say!(
        "  dead since:  {}",
        view.dead_at
            .map_or_else(unknown, |t| format!("{t:.0} (Unix seconds)"))
    );
    say!("  size:        {} bytes", view.bytes);
    if let Some(why) = &view.undecodable {
        say!("  decodes:     no: {why}");
        return;
    }
    say!("  job:         {}", view.job.clone().unwrap_or_default());
    say!("  mini-batch:  {}", view.mini_batch.unwrap_or_default());
    say!("  run:         {}", view.run.unwrap_or_default());
    say!(
        "  wire:        version {}",
        view.wire_version.unwrap_or_default()
    );
    for (name, value) in &view.partition {
        say!("  partition:   {name} = {value}");
    }
    for item in &view.items {
        say!("  item:        {item}");
    }
    for chunk in &view.chunks {
        say!("  chunk:       {chunk}");
    }
}

/// What `dlq replay` and `dlq purge` say and exit with: 2 when any was refused or none
/// matched.
fn settled_exit(settled: &[dlq::Settled], json: bool) -> ExitCode {
    if json {
        print_json(&settled);
    } else if settled.is_empty() {
        eprintln!("No dead letter matched.");
    }
    for one in settled.iter().filter(|_| !json) {
        match &one.why {
            Some(why) => say!("{} {}: {why}", one.id, one.action),
            None => say!("{} {}", one.id, one.action),
        };
    }
    let refused = settled.iter().any(|one| one.action == "refused");
    if refused || settled.is_empty() {
        ExitCode::from(exit::REFUSED)
    } else {
        ExitCode::SUCCESS
    }
}

/// `fleetrun status JOB`: once, or every 2 s until it ends; exits with its state's code.
async fn status(
    fleet: Fleet,
    job: String,
    watch: bool,
    json: bool,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    loop {
        let summary = fleet_cmd::summary(&fleet, &job)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
        let open = if json {
            print_json(&summary);
            true
        } else {
            say!("{}", summary.describe(fleetrun_worker::job::unix_now()))
        };
        let code = ExitCode::from(summary.exit_code());
        if !open || !watch || summary.state.is_terminal() {
            return Ok(code);
        }
        tokio::select! {
            _ = interrupt.token().cancelled() => return Ok(code),
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
        }
    }
}

/// `fleetrun jobs`: the pool's jobs, a line each (or a JSON list).
async fn jobs(fleet: Fleet, json: bool) -> anyhow::Result<ExitCode> {
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

/// `fleetrun wait JOB`: follows the job (and its stop rules) until it ends, `timeout`
/// seconds pass, or a signal comes.
async fn wait(
    fleet: Fleet,
    job: String,
    timeout: Option<u64>,
    shown: Shown,
    interrupt: Interrupt,
) -> anyhow::Result<ExitCode> {
    let record = fleet_cmd::record(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
    let stop = interrupt.token().child_token();
    if let Some(seconds) = timeout {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
            stop.cancel();
        });
    }
    let status = fleet_cmd::wait(&fleet, &job, &record, None, shown.progress, &stop).await?;
    if status.state.is_terminal() {
        fleet_cmd::settle(&fleet, &job, &stop).await;
    }
    let summary = fleet_cmd::summary(&fleet, &job)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
    if shown.json {
        print_json(&summary);
    } else if status.state.is_terminal() {
        say!("{}", summary.describe(fleetrun_worker::job::unix_now()));
    }
    if let Some(signal) = interrupt.signal() {
        if !shown.json {
            eprintln!("Stopped waiting; the job goes on.");
        }
        return Ok(ExitCode::from(exit::signaled(signal)));
    }
    if !status.state.is_terminal() && !shown.json {
        eprintln!(
            "Stopped waiting after {}s; the job goes on.",
            timeout.unwrap_or(0)
        );
    }
    Ok(ExitCode::from(summary.exit_code()))
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
