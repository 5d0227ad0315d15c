//! `fleetrun run`: the whole job on this machine, with the embedded queue and ledger and
//! local storage, through the same agent, partitioner and finalizer the fleet uses.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fleetrun_common::ledger::{JobState, Ledger, Limits, MemoryLedger, Status};
use fleetrun_common::queue::{MemoryQueue, QueueOptions};
use fleetrun_common::storage::{LocalStorage, Storage};
use fleetrun_config::{Input, JobSpec, Location, OutputAction};
use fleetrun_worker::agent::{self, Agent, AgentConfig, AgentEvent, JobContext, Jobs};
use fleetrun_worker::logs::{self, JobLogs};
use fleetrun_worker::parts::{self, Parts, SegmentParts};
use fleetrun_worker::process::find_runner_exe;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::partition::{Produced, publish_files};
use crate::progress::{Figures, Progress};

/// How often the driver refreshes progress, flushes logs and checks for a stall.
const TICK: Duration = Duration::from_millis(250);

/// Errors that stop `fleetrun run` before the job starts.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The job file names something that is not there.
    #[error("{0}")]
    Setup(String),
    #[error("{0}")]
    Other(String),
}

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Runner processes; default: the job's `process_count_per_node`, else the cores.
    pub processes: Option<usize>,
    /// Show progress on the terminal.
    pub progress: bool,
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
}

impl JobReport {
    /// The command's exit code: 0 completed, 42 failed, 130 canceled.
    pub fn exit_code(&self) -> i32 {
        match self.status.state {
            JobState::Completed => 0,
            JobState::Canceled => 130,
            _ => 42,
        }
    }
}

struct OneJob(Arc<JobContext>);

#[async_trait]
impl Jobs for OneJob {
    async fn get(&self, job: &str) -> Result<Option<Arc<JobContext>>, String> {
        Ok((job == self.0.id).then(|| self.0.clone()))
    }
}

/// A job id: the name, the start time and a few random characters.
pub fn new_job_id(name: &str) -> String {
    let suffix: u16 = rand::random();
    format!(
        "{name}-{}-{suffix:04x}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S")
    )
}

/// Runs a job to its end on this machine. `interrupt` cancels it (Ctrl-C).
pub async fn run_local(
    spec: JobSpec,
    options: RunOptions,
    interrupt: CancellationToken,
) -> Result<JobReport, RunError> {
    let started = Instant::now();
    let Input::Files(input_location) = &spec.input;
    let input_dir = local_dir(input_location, "input.files")?;
    if !input_dir.is_dir() {
        return Err(RunError::Setup(format!(
            "input.files: folder not found (got {:?})",
            input_dir.display().to_string()
        )));
    }
    let output_dir = local_dir(&spec.output, "output.path")?;
    let runner_exe = find_runner_exe().map_err(RunError::Other)?;
    let log_dir = output_dir.join("logs");
    prepare_output(&output_dir, &log_dir, &spec)
        .map_err(|e| RunError::Other(format!("preparing {}: {e}", output_dir.display())))?;

    let job_id = new_job_id(&spec.name);
    let logs = Arc::new(JobLogs::new(&log_dir));
    let gpus = fleetrun_worker::gpu::detect_gpus();
    // CONTRACT.md §2: 1 on a GPU machine, the number of cores on a CPU machine.
    let processes = options
        .processes
        .or(spec.process_count_per_node.map(|n| n as usize))
        .unwrap_or_else(|| {
            if gpus > 0 {
                1
            } else {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            }
        });
    let output: Arc<dyn Storage> = Arc::new(LocalStorage::new(&output_dir));
    let input: Arc<dyn Storage> = Arc::new(LocalStorage::new(&input_dir));
    // Enough ready mini-batches that no runner waits, few enough that memory stays flat.
    let queue = Arc::new(MemoryQueue::bounded(
        QueueOptions::default(),
        4 * processes + 16,
    ));
    let ledger = Arc::new(MemoryLedger::new());
    let limits = Limits {
        error_threshold: spec.error_threshold,
        allowed_failed_count: spec.allowed_failed_count,
        allowed_failed_percent: spec.allowed_failed_percent,
    };
    ledger
        .create(&job_id, limits)
        .await
        .map_err(|e| RunError::Other(e.to_string()))?;
    // This process's scratch folder: staged inputs and the parts' segment.
    let node_dir = std::env::temp_dir().join(format!("fleetrun-{job_id}"));
    let parts: Arc<dyn Parts> = Arc::new(SegmentParts::new(node_dir.join("parts"), "local"));
    let ctx = Arc::new(JobContext::new(
        job_id.clone(),
        spec.clone(),
        input.clone(),
        output.clone(),
        parts.clone(),
        logs.clone(),
    ));

    let master = |line: &str| logs.log(logs::MASTER_ROLE, line);
    master(&format!(
        "Job {job_id} started: {processes} processes on 1 node, input {input_location}, output {}.",
        spec.output
    ));

    let (events, mut event_rx) = mpsc::unbounded_channel();
    let drain = CancellationToken::new();
    let abort = CancellationToken::new();
    let agent_task = tokio::spawn(agent::run(
        Agent {
            config: AgentConfig {
                node_id: "0".into(),
                processes,
                prefetch: agent::DEFAULT_PREFETCH,
                runner_exe,
                staging_dir: node_dir.clone(),
                warm_job: Some(job_id.clone()),
                gpus,
            },
            queue: queue.clone(),
            ledger: ledger.clone(),
            jobs: Arc::new(OneJob(ctx.clone())),
            events: events.clone(),
        },
        drain.clone(),
        abort.clone(),
    ));

    let produced = Arc::new(Produced::default());
    let (produce_tx, mut produce_rx) = mpsc::channel::<Result<u64, String>>(1);
    let producer_task = {
        let (input, queue, produced, job_id) = (
            input.clone(),
            queue.clone(),
            produced.clone(),
            job_id.clone(),
        );
        let stop = ctx.stop.clone();
        let size = match spec.mini_batch_size {
            fleetrun_config::MiniBatchSize::Files(n) => n as usize,
            fleetrun_config::MiniBatchSize::Bytes(_) => {
                unreachable!("validated: a file input counts files")
            }
        };
        tokio::spawn(async move {
            let result = publish_files(&*input, "", &job_id, size, &*queue, &produced, &stop).await;
            let _ = produce_tx.send(result.map_err(|e| e.to_string())).await;
        })
    };

    let mut progress = options.progress.then(|| Progress::new(&spec.name));
    let mut tick = tokio::time::interval(TICK);
    let mut last_done = (0u64, Instant::now());
    let stall_after = Duration::from_secs(spec.progress_update_timeout);
    let first_task_deadline = Duration::from_secs(spec.first_task_creation_timeout);
    let mut producing = true;
    let mut init_failures = 0;
    let final_state = loop {
        tokio::select! {
            event = event_rx.recv() => match event.expect("the driver holds a sender") {
                AgentEvent::Transitioned { status, .. } if status.state == JobState::Finalizing => {
                    break finalize(&*ledger, &job_id, &spec, &*output, &*parts, &master).await;
                }
                AgentEvent::Transitioned { status, .. } => break status.state,
                AgentEvent::GaveUp { reason, .. } => {
                    let reason = format!("no runner process could start: {reason}");
                    break fail(&*ledger, &job_id, &reason).await;
                }
                AgentEvent::InitFailed { processes, failure, .. } => {
                    init_failures += 1;
                    if let Some(reason) = fleetrun_worker::job::init_failures_fail_job(spec.node_count, processes, init_failures, started.elapsed()) {
                        break fail(&*ledger, &job_id, &format!("{reason}; the last: {failure}")).await;
                    }
                }
            },
            result = produce_rx.recv(), if producing => {
                producing = false;
                match result {
                    Some(Ok(total)) => {
                        master(&format!("All {total} mini-batches created ({} items); total sealed.", produced.items.load(Ordering::Relaxed)));
                        match ledger.seal(&job_id, total).await {
                            Ok(r) if r.transitioned => {
                                let _ = events.send(AgentEvent::Transitioned { job: job_id.clone(), status: r.status });
                            }
                            Ok(_) => {}
                            Err(e) => break fail(&*ledger, &job_id, &format!("sealing the job failed: {e}")).await,
                        }
                    }
                    Some(Err(e)) => break fail(&*ledger, &job_id, &e).await,
                    None => break fail(&*ledger, &job_id, "the producer stopped unexpectedly").await,
                }
            }
            _ = interrupt.cancelled() => {
                let (_, status) = ledger
                    .transition(&job_id, &[JobState::Running, JobState::Finalizing], JobState::Canceled, Some("interrupted by the user"))
                    .await
                    .map_err(|e| RunError::Other(e.to_string()))?;
                break status.state;
            }
            _ = tick.tick() => {
                let Ok(Some(status)) = ledger.status(&job_id).await else { continue };
                if status.state.is_terminal() {
                    break status.state;
                }
                let created = produced.mini_batches.load(Ordering::Relaxed);
                if let Some(p) = progress.as_mut() {
                    p.update(Figures { status: &status, created, items_listed: produced.items.load(Ordering::Relaxed) });
                }
                write_overview(&logs, &status, created, None);
                logs.flush();
                if status.done != last_done.0 {
                    last_done = (status.done, Instant::now());
                } else if status.state == JobState::Running
                    && created > status.done
                    && last_done.1.elapsed() >= stall_after
                {
                    let reason = format!(
                        "stalled: no mini-batch completed in {}s (progress_update_timeout); {} of {created} created were done",
                        stall_after.as_secs(), status.done
                    );
                    break fail(&*ledger, &job_id, &reason).await;
                }
                if producing && created == 0 && started.elapsed() >= first_task_deadline {
                    let reason = format!("no mini-batch was created within first_task_creation_timeout ({}s)", first_task_deadline.as_secs());
                    break fail(&*ledger, &job_id, &reason).await;
                }
            }
        }
    };

    // Stop the work: a completed job's runners call shutdown(); anything else is cut short.
    ctx.stop.cancel();
    if final_state == JobState::Completed {
        drain.cancel()
    } else {
        abort.cancel()
    }
    producer_task.abort();
    let _ = agent_task.await;
    let _ = std::fs::remove_dir_all(&node_dir);
    if let Some(p) = &progress {
        p.finish();
    }
    let status = ledger
        .status(&job_id)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let created = produced.mini_batches.load(Ordering::Relaxed);
    write_results(&logs, &job_id, &spec, &status, created, started.elapsed());
    master(&format!("Job {job_id} ended {}.", status.state));
    logs.flush();
    let output_file = (status.state == JobState::Completed
        && spec.output_action == OutputAction::AppendRow)
        .then(|| output_dir.join(&spec.append_row_file_name));
    Ok(JobReport {
        job_id,
        status,
        output_file,
        log_dir,
        elapsed: started.elapsed(),
    })
}

fn local_dir(location: &Location, field: &str) -> Result<PathBuf, RunError> {
    location.as_local().map(Path::to_path_buf).ok_or_else(|| {
        RunError::Setup(format!("{field}: `fleetrun run` reads and writes local folders; use `fleetrun submit` for {location}"))
    })
}

/// Clears what a previous run of a job left in the output folder: its logs and its output
/// file (they describe another run).
fn prepare_output(output_dir: &Path, log_dir: &Path, spec: &JobSpec) -> std::io::Result<()> {
    std::fs::create_dir_all(output_dir)?;
    match std::fs::remove_dir_all(log_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    match std::fs::remove_file(output_dir.join(&spec.append_row_file_name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::create_dir_all(log_dir)
}

async fn fail(ledger: &dyn Ledger, job: &str, reason: &str) -> JobState {
    match ledger
        .transition(
            job,
            &[JobState::Running, JobState::Finalizing],
            JobState::Failed,
            Some(reason),
        )
        .await
    {
        Ok((_, status)) => status.state,
        Err(_) => JobState::Failed,
    }
}

async fn finalize(
    ledger: &dyn Ledger,
    job: &str,
    spec: &JobSpec,
    output: &dyn Storage,
    parts: &dyn Parts,
    master: &impl Fn(&str),
) -> JobState {
    if spec.output_action == OutputAction::AppendRow {
        let total = ledger
            .status(job)
            .await
            .ok()
            .flatten()
            .and_then(|s| s.total);
        master(&format!(
            "Finalizing: joining {} parts into {}.",
            total.unwrap_or(0),
            spec.append_row_file_name
        ));
    }
    // The only finalizer: nobody else could fail the job.
    parts::finish_job(ledger, job, spec, output, parts, || async { true }).await
}

fn write_overview(logs: &JobLogs, status: &Status, created: u64, result: Option<&str>) {
    let mut text = format!(
        "Mini-batches created: {created}{}\nMini-batches processed: {}\nItems succeeded: {}\nItems failed: {}\nMini-batches failed: {}\nState: {}\nUpdated: {}\n",
        if status.total.is_some() {
            " (all)"
        } else {
            " (so far)"
        },
        status.done,
        status.items_succeeded,
        status.items_failed,
        status.batches_failed,
        status.state,
        logs::now(),
    );
    if let Some(result) = result {
        text.push_str(result);
    }
    logs.write(logs::PROGRESS_OVERVIEW, &text);
}

fn write_results(
    logs: &JobLogs,
    job: &str,
    spec: &JobSpec,
    status: &Status,
    created: u64,
    elapsed: Duration,
) {
    let threshold = match spec.error_threshold {
        -1 => "-1 (failures ignored)".to_owned(),
        n => n.to_string(),
    };
    let mut result = format!(
        "Job: {job}\nResult: {}\nElapsed: {:.1}s\nMini-batches: {} processed of {}\nItems: {} succeeded, {} failed (error_threshold {threshold})\nMini-batches failed: {}\n",
        status.state,
        elapsed.as_secs_f64(),
        status.done,
        status.total.map_or_else(
            || format!("{created} created (listing unfinished)"),
            |t| t.to_string()
        ),
        status.items_succeeded,
        status.items_failed,
        status.batches_failed,
    );
    if let Some(reason) = &status.reason {
        result.push_str(&format!("Cause: {reason}\n"));
    }
    if status.state == JobState::Failed {
        result.push_str("Where to look: user/error.txt (script errors), user/error/ (full tracebacks), sys/node/*/_main.txt (processes), failed_items.csv.\n");
    }
    logs.write(logs::JOB_RESULT, &result);
    write_overview(
        logs,
        status,
        created,
        Some(&format!(
            "Result: {}\n{}",
            status.state,
            status
                .reason
                .as_deref()
                .map(|r| format!("Cause: {r}\n"))
                .unwrap_or_default()
        )),
    );
    let errors = std::fs::read_to_string(logs.path(logs::USER_ERROR)).unwrap_or_default();
    let count = errors.lines().count();
    let mut summary = format!("Script errors: {count}\n");
    for line in errors.lines().take(20) {
        summary.push_str(line);
        summary.push('\n');
    }
    if count > 20 {
        summary.push_str(&format!("... {} more in user/error.txt\n", count - 20));
    }
    logs.write(logs::JOB_ERROR, &summary);
}
