//! `fleetrun run`: the fleet on the embedded seams, in one process.
//!
//! The in-process queue, ledger and registry and the local folders stand in for RabbitMQ,
//! Redis and S3. The worker is the same [`job::serve`] that `fleetrun-worker` runs, and the
//! job is submitted and followed as `fleetrun submit --wait` does, so whatever the fleet
//! guarantees (stop rules, init-failure rules, exactly-once output, the result files)
//! `fleetrun run` guarantees by construction. What is left here: guard the output folder,
//! build the embedded fleet, submit, wait, stop the worker, report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use fleetrun_common::ledger::journal::{Entry, Header, Journal, JournalError};
use fleetrun_common::ledger::{JobState, MemoryLedger, MemoryRegistry, Status};
use fleetrun_common::queue::{MemoryQueue, QueueOptions};
use fleetrun_common::storage::s3::S3Settings;
use fleetrun_common::storage::{LocalStorage, Storage};
use fleetrun_config::{Input, JobSpec, Location, OutputAction};
use fleetrun_worker::agent;
use fleetrun_worker::job::{self, Fleet, Job, JobRecord, Publication, WorkerConfig};
use fleetrun_worker::logs::JobLogs;
use fleetrun_worker::node;
use fleetrun_worker::output::{OutputError, OutputGuard};
use fleetrun_worker::process::{FindRunnerError, find_runner_exe};
use tokio_util::sync::CancellationToken;

use crate::exit;
use crate::fleet::{self as fleet_cmd, FleetError, Registered};
use crate::partition::Produced;

/// Deliveries each slot of a local run may hold: beside the one running and two being
/// finished, as many as a runner is sent ahead ([`fleetrun_common::protocol::HELD_REPLIES`]).
/// A fleet's workers hold fewer ([`agent::DEFAULT_PREFETCH`]): what one holds, other workers
/// cannot take; a local run has no other worker.
const LOCAL_PREFETCH: u16 =
    agent::DEFAULT_PREFETCH + fleetrun_common::protocol::HELD_REPLIES as u16 - 1;

/// The pool name of the one-process fleet.
const LOCAL_POOL: &str = "local";
/// The node id of the one-process fleet, as its logs show it (`sys/node/0/`).
const LOCAL_NODE: &str = "0";

/// Errors that stop `fleetrun run` before the job starts.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The job cannot start as written (exit 2): a folder it names is not there.
    #[error("{0}")]
    Setup(String),
    /// The output folder is not safe to write (exit 2): it holds what fleetrun did not
    /// write, or another job holds it.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// This machine has no runner to start.
    #[error(transparent)]
    Runner(#[from] FindRunnerError),
    /// The run cannot be resumed as asked (exit 2).
    #[error("{0}")]
    Resume(String),
    /// The job's input cannot be read as the job file says (exit 2).
    #[error(transparent)]
    Input(FleetError),
    /// What the job ran over cannot be fingerprinted or cut again (exit 2).
    #[error(transparent)]
    Fingerprint(#[from] crate::resume::FingerprintError),
    /// The run's journal cannot be read or written (exit 2).
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Fleet(#[from] FleetError),
}

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Runner processes; default: the job's `process_count_per_node`, else CONTRACT §2's.
    pub processes: Option<usize>,
    /// Show progress on the terminal.
    pub progress: bool,
    /// Whether an input that lists no item is run (by default it is refused).
    pub empty_input: fleet_cmd::EmptyInput,
    /// Continue the last run on the output folder, if it was left unfinished: keep what it
    /// recorded, run only the rest.
    pub resume: bool,
    /// Resume even when the job's settings, code or input changed since.
    pub force: bool,
}

/// A stop asked from outside the run (Ctrl-C, SIGTERM): the job is canceled, its result
/// names the signal, and the exit code is `128 + signal` (130, 143).
#[derive(Debug, Clone, Default)]
pub struct Interrupt {
    token: CancellationToken,
    signal: Arc<AtomicI32>,
}

impl Interrupt {
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Stops the run for `signal` (its number); the first signal is the one reported.
    pub fn raise(&self, signal: i32) {
        let _ = self
            .signal
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        self.token.cancel();
    }

    /// Cancelled once a signal came.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub fn signal(&self) -> Option<i32> {
        Some(self.signal.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }
}

/// How a job ended.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub job_id: String,
    pub status: Status,
    /// The `append_row` file, when one was written.
    pub output_file: Option<PathBuf>,
    pub log_dir: PathBuf,
    pub elapsed: Duration,
    /// The signal that canceled the job, if one did.
    pub signal: Option<i32>,
}

impl JobReport {
    /// The command's exit code: 0 completed, 42 failed, 44 expired, `128 + signal` canceled
    /// by one (130 by default).
    pub fn exit_code(&self) -> u8 {
        match self.status.state {
            JobState::Completed => exit::COMPLETED,
            JobState::Expired => exit::EXPIRED,
            JobState::Canceled => exit::signaled(self.signal.unwrap_or(exit::SIGINT)),
            _ => exit::FAILED,
        }
    }
}

/// The name of a signal, as a result file says it.
fn signal_name(signal: i32) -> String {
    match signal {
        exit::SIGINT => "SIGINT".to_owned(),
        exit::SIGTERM => "SIGTERM".to_owned(),
        n => format!("signal {n}"),
    }
}

/// Runs a job to its end on this machine. `interrupt` cancels it.
pub async fn run_local(
    mut spec: JobSpec,
    options: RunOptions,
    interrupt: Interrupt,
) -> Result<JobReport, RunError> {
    let started = Instant::now();
    let output_dir = check_folders(&mut spec, &options).await?;
    let runner_exe = find_runner_exe().map_err(RunError::Runner)?;
    // Held to the end: the output folder is this run's alone, and what it writes there is
    // recorded as fleetrun's.
    let mut guard = if options.resume {
        OutputGuard::claim_to_resume(&output_dir, &spec)?
    } else {
        OutputGuard::claim(&output_dir, &spec)?
    };
    let Resumed {
        job_id,
        journal,
        entries,
    } = open_journal(&guard, &spec, &options).await?;
    guard.runs_job(&job_id)?;
    let temp = std::env::temp_dir();
    node::sweep_stale_scratch(&temp);
    let gpus = fleetrun_worker::gpu::detect_gpus();
    let processes = options
        .processes
        .or(spec.process_count_per_node.map(|n| n as usize))
        .unwrap_or_else(|| node::default_process_count(gpus));
    let ledger = Arc::new(MemoryLedger::journaled(journal.clone()));
    let fleet = embedded_fleet(ledger.clone(), processes);
    let registered = fleet_cmd::register(
        spec,
        &fleet,
        Some(&job_id),
        fleet_cmd::OutputHold::Caller,
        Publication::Input,
    )
    .await?;
    let publishing = keep_recorded(&fleet, &ledger, &output_dir, &job_id, entries).await?;
    let scratch = node::scratch_dir(&temp, &format!("run-{job_id}"));
    let worker = LocalWorker::start(
        WorkerConfig {
            node_id: LOCAL_NODE.to_owned(),
            processes,
            prefetch: LOCAL_PREFETCH,
            runner_exe,
            launcher: fleetrun_worker::process::ProcessLauncher::shared(),
            cache_dir: scratch.clone(),
            gpus,
            warm_job: Some(job_id.clone()),
            sole_node: true,
            metrics: Default::default(),
        },
        &fleet,
    );
    // The journal notes how far the input is cut as it goes: a resume checks its own cut.
    let produced = Arc::new(Produced::noting_cuts({
        let journal = journal.clone();
        move |cut| journal.note_cut(&cut)
    }));
    let publisher = publish(publishing, registered.clone(), produced.clone());
    let record = &registered.record;
    let handle = Job::new(
        &job_id,
        record.spec.clone(),
        record.submitted_at,
        &fleet,
        Arc::new(LocalStorage::new(&output_dir)),
        &fleetrun_worker::parts::writer_name("run"),
    );
    let status = follow(&fleet, &handle, record, &produced, &options, &interrupt).await?;
    // Stop the work: a completed job's runners call shutdown(); anything else is cut short.
    publisher.abort();
    worker.stop(status.state == JobState::Completed).await;
    let _ = std::fs::remove_dir_all(&scratch);
    let status = fleet
        .ledger
        .status(&job_id)
        .await
        .ok()
        .flatten()
        .unwrap_or(status);
    let log_dir = leave_output(guard, &handle, &status, &journal, &output_dir, &job_id).await;
    let output_file = (status.state == JobState::Completed
        && record.spec.output_action == OutputAction::AppendRow)
        .then(|| output_dir.join(&record.spec.append_row_file_name));
    Ok(JobReport {
        job_id,
        status,
        output_file,
        log_dir,
        elapsed: started.elapsed(),
        signal: interrupt.signal(),
    })
}

/// The job's input and output are local folders and its input is there (a tabular one's
/// format settled; one that lists no item refused unless asked): its output folder, not
/// claimed yet.
async fn check_folders(spec: &mut JobSpec, options: &RunOptions) -> Result<PathBuf, RunError> {
    let (input_field, input_found) = match &spec.input {
        Input::Files(_) => ("input.files", Path::is_dir as fn(&Path) -> bool),
        Input::Tabular(_) => ("input.tabular", Path::exists as fn(&Path) -> bool),
    };
    let input_dir = local_dir(spec.input.location(), input_field)?;
    if !input_found(&input_dir) {
        return Err(RunError::Setup(format!(
            "{input_field}: {} not found (got {:?})",
            if spec.input.tabular().is_some() {
                "file or folder"
            } else {
                "folder"
            },
            input_dir.display().to_string()
        )));
    }
    let output_dir = local_dir(&spec.output, "output.path")?;
    // Before the output folder is claimed: a tabular input whose format cannot be told is
    // refused as the job file is.
    fleet_cmd::settle_input(spec, &S3Settings::default())
        .await
        .map_err(RunError::Input)?;
    fleet_cmd::check_input(spec, &S3Settings::default(), options.empty_input)
        .await
        .map_err(RunError::Input)?;
    Ok(output_dir)
}

/// The fleet on the embedded seams: an in-process queue, `ledger`, an in-memory registry
/// and events.
fn embedded_fleet(ledger: Arc<MemoryLedger>, processes: usize) -> Fleet {
    Fleet {
        events: Arc::new(fleetrun_common::events::MemoryEvents::new()),
        // Enough ready mini-batches that no runner waits, few enough that memory stays flat.
        queue: Arc::new(MemoryQueue::bounded(
            QueueOptions::default(),
            4 * processes + 16,
        )),
        ledger,
        registry: Arc::new(MemoryRegistry::new()),
        s3: S3Settings::default(),
        pool: LOCAL_POOL.to_owned(),
    }
}

/// Takes back what the last run recorded, as far as its rows are still as they were
/// written: those mini-batches are not published again. The fleet to publish through.
async fn keep_recorded(
    fleet: &Fleet,
    ledger: &Arc<MemoryLedger>,
    output_dir: &Path,
    job_id: &str,
    entries: Vec<Entry>,
) -> Result<Fleet, RunError> {
    let entries = {
        let output: Arc<dyn Storage> = Arc::new(LocalStorage::new(output_dir));
        let writer = fleetrun_worker::parts::writer_name("resume");
        let parts = fleetrun_worker::parts::for_job(output, ledger.clone(), job_id, &writer);
        crate::resume::kept_intact(&*parts, job_id, entries).await
    };
    let done: std::collections::HashSet<u64> = entries
        .iter()
        .filter(|e| !e.batch_failed && e.failed == 0)
        .map(|e| e.index)
        .collect();
    // Only a resumed run has mini-batches to leave out: a new one publishes straight to the
    // queue, with no message decoded again on the way.
    if done.is_empty() {
        return Ok(fleet.clone());
    }
    ledger.replay(job_id, &entries).map_err(FleetError::from)?;
    tracing::info!(job = %job_id, done = done.len(), "Resuming: mini-batches the last run recorded are kept.");
    Ok(Fleet {
        queue: Arc::new(crate::resume::Unfinished {
            queue: fleet.queue.clone(),
            done,
            run: 0,
        }),
        ..fleet.clone()
    })
}

/// The run's worker: [`job::serve`] on the embedded fleet, and the two ways it stops.
struct LocalWorker {
    task: tokio::task::JoinHandle<()>,
    drain: CancellationToken,
    abort: CancellationToken,
}

impl LocalWorker {
    fn start(config: WorkerConfig, fleet: &Fleet) -> LocalWorker {
        let (drain, abort) = (CancellationToken::new(), CancellationToken::new());
        let task = tokio::spawn(job::serve(
            config,
            fleet.clone(),
            drain.clone(),
            abort.clone(),
        ));
        LocalWorker { task, drain, abort }
    }

    /// Stops it, drained (its runners call `shutdown()`) when the job completed, else cut
    /// short; returns once it stopped.
    async fn stop(self, completed: bool) {
        if completed {
            self.drain.cancel();
        } else {
            self.abort.cancel();
        }
        let _ = self.task.await;
    }
}

/// Publishes the job's mini-batches while its input is listed, in the background.
fn publish(
    fleet: Fleet,
    registered: Registered,
    produced: Arc<Produced>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = fleet_cmd::publish(&fleet, &registered, &produced).await {
            tracing::warn!(job = %registered.job, error = %e, "Publishing stopped.");
        }
    })
}

/// Follows the job to its end; a signal first cancels it, naming the signal.
async fn follow(
    fleet: &Fleet,
    handle: &Job,
    record: &JobRecord,
    produced: &Arc<Produced>,
    options: &RunOptions,
    interrupt: &Interrupt,
) -> Result<Status, RunError> {
    let job_id = handle.id();
    let status = fleet_cmd::wait(
        fleet,
        job_id,
        record,
        Some(produced),
        options.progress,
        &interrupt.token,
    )
    .await?;
    if status.state.is_terminal() {
        return Ok(status);
    }
    let signal = interrupt.signal().unwrap_or(exit::SIGINT);
    let reason = format!("interrupted by {}", signal_name(signal));
    Ok(handle.cancel(&reason).await.map_err(FleetError::from)?)
}

/// Leaves the output folder as the job's end asks, and gives it up: the logs folder.
async fn leave_output(
    mut guard: OutputGuard,
    handle: &Job,
    status: &Status,
    journal: &Journal,
    output_dir: &Path,
    job_id: &str,
) -> PathBuf {
    if status.state != JobState::Completed {
        // The worker was stopped at once: make sure the results it may have been writing
        // are whole (failed_items.csv is joined from the parts, so before they go).
        let logs = JobLogs::new(guard.log_dir());
        handle.write_results(Some(&logs), status).await;
    }
    // A completed job has removed its parts, and its journal goes; another's are kept for
    // `--resume`, until the next run on the folder that does not resume.
    if status.state == JobState::Completed {
        let parts = output_dir.join(fleetrun_worker::output::PARTS_DIR);
        let _ = std::fs::remove_dir_all(parts.join(job_id));
        let _ = std::fs::remove_dir(&parts);
        if let Err(e) = journal.discard() {
            tracing::warn!(error = %e, "Cannot remove the run's journal.");
        }
    } else {
        guard.keep_for_resume(job_id);
    }
    let log_dir = guard.log_dir();
    if let Err(e) = guard.finish() {
        tracing::warn!(error = %e, "Cannot record what the job wrote in its output folder.");
    }
    log_dir
}

/// The job a run runs: a new one, or the last run's when resuming it (its id, its journal
/// reopened, the recordings it kept).
struct Resumed {
    job_id: String,
    journal: Journal,
    entries: Vec<Entry>,
}

/// Opens the run's journal in the output folder: the last run's, when resuming one left
/// unfinished whose job, code and input are the same (or `force`), else a new one.
async fn open_journal(
    guard: &OutputGuard,
    spec: &JobSpec,
    options: &RunOptions,
) -> Result<Resumed, RunError> {
    let path = guard.journal_path();
    let fingerprint = crate::resume::fingerprint(spec)?;
    let last = if options.resume {
        Journal::read(&path)?
    } else {
        None
    };
    let Some(last) = last else {
        if options.resume {
            tracing::info!(folder = %guard.dir().display(), "No unfinished run on this output folder to resume: running the job from the start.");
        }
        let job_id = crate::job_id::new(&spec.name);
        let journal = Journal::create(&path, &Header::new(&job_id, fingerprint))?;
        return Ok(Resumed {
            job_id,
            journal,
            entries: Vec::new(),
        });
    };
    let mut changed = crate::resume::changed(&last.header.fingerprint, &fingerprint);
    let mut entries = last.entries.clone();
    if !entries.is_empty() {
        // Its input: the mini-batches it recorded must hold the items they held.
        use crate::resume::CutNow;
        let job = &last.header.job;
        // Kept: what is cut as it was (with --force, a changed input keeps what is still the
        // same); the rest runs again.
        let same = match crate::resume::same_cut(spec, job, &last.cuts).await {
            Ok(CutNow::Same(same)) => same,
            Ok(CutNow::Changed { same }) => {
                changed.push(crate::resume::INPUT.to_owned());
                same
            }
            Err(e) => return Err(e.into()),
        };
        let recorded = entries.len();
        entries.retain(|entry| entry.index < same);
        if entries.len() < recorded {
            tracing::info!(job = %job, again = recorded - entries.len(), "Mini-batches the last run recorded past what its input is still cut as run again.");
        }
    }
    if !changed.is_empty() {
        if !options.force {
            return Err(RunError::Resume(format!(
                "cannot resume job {}: {} changed since it ran; run it from the start without --resume, or resume anyway with --force",
                last.header.job,
                changed.join(", ")
            )));
        }
        tracing::warn!(job = %last.header.job, changed = %changed.join(", "), "Resuming a job that changed since it ran (--force).");
    }
    let journal = Journal::append(&path, &last)?;
    Ok(Resumed {
        job_id: last.header.job,
        journal,
        entries,
    })
}

fn local_dir(location: &Location, field: &str) -> Result<PathBuf, RunError> {
    location.as_local().map(Path::to_path_buf).ok_or_else(|| {
        RunError::Setup(format!("{field}: `fleetrun run` reads and writes local folders; use `fleetrun submit` for {location}"))
    })
}
