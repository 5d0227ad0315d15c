//! A slot's runner process over its life ([`RunnerSeat`]): starting it (its environment, its
//! GPU), or why it did not start ([`StartFailure`]), stopping and killing it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fleetrun_common::ledger::RunnerId;
use fleetrun_common::protocol::{ErrorCause, InitParams, ReadyInfo, ScriptError, TabularInit};
use fleetrun_common::python::Python;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::environment::{RunnerEnv, runner_env};
use super::times::TimesMark;
use super::{AgentEvent, JobContext, Shared};
use crate::gpu::{
    AZ_GPU_COUNT_VAR, GPU_COUNT_VAR, GpuLease, RUNNERS_PER_GPU_VAR, VISIBLE_DEVICES_VAR,
};
use crate::logs;
use crate::monitor::MonitorSettings;
use crate::process::{InitOutcome, Launch, ProcessError, Runner, returncode};
use crate::worker_config::WorkerConfig;

pub(super) struct Active {
    pub(super) job: String,
    pub(super) name: String,
    pub(super) process: Box<dyn Runner>,
    /// The job's stop signal: once it fires the runner (its model, its GPU) is released.
    pub(super) job_stop: CancellationToken,
    /// Its GPU, released when the process is dropped.
    _gpu: Option<GpuLease>,
    /// Counts it among the job's ready runners on this node while it lives.
    _ready: ReadyMark,
    /// Its place among the job's runners on this node.
    _seat: super::seats::Seat,
    /// Its time on the job, by phase, until it is dropped.
    pub(super) times: TimesMark,
}

/// One ready runner in its job's count of them; taken off when dropped.
pub(super) struct ReadyMark(Arc<AtomicU32>);

impl ReadyMark {
    fn new(count: &Arc<AtomicU32>) -> ReadyMark {
        count.fetch_add(1, Ordering::Relaxed);
        ReadyMark(count.clone())
    }
}

impl Drop for ReadyMark {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A slot's runner, over its life: none, or one ready for a job. Starting answers with the
/// runner or why there is none; nothing else reaches the process.
#[derive(Default)]
pub(super) struct RunnerSeat {
    active: Option<Active>,
}

/// Why a slot has no runner for a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum StartFailure {
    /// As many runners of the job as it wants run on this node's other slots.
    #[error("the job's seats on this node are taken")]
    Seatless,
    /// This node gave up on the job: its Python cannot run here, or its runners kept failing
    /// to start.
    #[error("this node gave up on the job")]
    GaveUp,
    /// This start failed (counted, logged, and reported as `AgentEvent::InitFailed`).
    #[error("the runner failed to start")]
    Failed,
}

impl RunnerSeat {
    /// The runner, whichever job it runs.
    pub(super) fn active(&self) -> Option<&Active> {
        self.active.as_ref()
    }

    /// The runner, to send it work and wait for its answers.
    pub(super) fn active_mut(&mut self) -> Option<&mut Active> {
        self.active.as_mut()
    }

    /// The runner's process name, or `_main` when the slot has none.
    pub(super) fn name(&self) -> &str {
        self.active.as_ref().map_or("_main", |a| a.name.as_str())
    }

    /// The runner, ready for `ctx`'s job: the one this slot has, or a new one (a runner of
    /// another job is stopped first). On an init failure, counts it and gives up on the job
    /// on this node after `3 × process_count_per_node` of them.
    pub(super) async fn start(
        &mut self,
        shared: &Shared,
        ctx: &Arc<JobContext>,
    ) -> Result<&mut Active, StartFailure> {
        if self.active.as_ref().is_some_and(|a| a.job != ctx.job.id())
            && let Some(previous) = self.active.take()
        {
            previous.process.shutdown().await;
        }
        if self.active.is_none() {
            if ctx.node.gave_up.load(Ordering::Relaxed) {
                return Err(StartFailure::GaveUp);
            }
            let python = python_served(shared, ctx).await?;
            let seat = ctx.node.seats.take().ok_or(StartFailure::Seatless)?;
            self.active = Some(launch(shared, ctx, python, seat).await?);
        }
        self.active.as_mut().ok_or(StartFailure::Failed)
    }

    /// Kills the runner now (a job stopped, the node aborts).
    pub(super) async fn kill(&mut self) {
        if let Some(mut active) = self.active.take() {
            active.process.kill().await;
        }
    }

    /// Asks the runner to shut down and exit, logging `why` with its code.
    pub(super) async fn stop(&mut self, why: &str) {
        if let Some(active) = self.active.take() {
            let status = active.process.shutdown().await;
            debug!(process = %active.name, code = returncode(&status), "{why}");
        }
    }

    /// Forgets the runner, which is gone (killed at the timeout, or dead).
    pub(super) fn lose(&mut self) {
        self.active = None;
    }
}

/// Starts a runner of `ctx`'s job in `seat`, running `python`.
async fn launch(
    shared: &Shared,
    ctx: &Arc<JobContext>,
    python: Python,
    seat: super::seats::Seat,
) -> Result<Active, StartFailure> {
    let config = &shared.agent.config;
    let node = config.node_id.clone();
    let (name, gpu) = shared.next_start();
    let main_log = logs::JobLogs::node_main(&node);
    if ctx.node.first_gpu_note() {
        ctx.logs.log(&main_log, &gpu_line(config.gpus));
    }
    let times_id = RunnerId {
        node: node.clone(),
        runner: name.clone(),
        gpu: gpu
            .as_ref()
            .map_or_else(String::new, |g| g.device().to_owned()),
    };
    let born = tokio::time::Instant::now();
    let launch = launch_of(shared, ctx, &name, gpu.as_ref());
    let params = init_params(config, ctx, &name, python);
    let spec = ctx.job.spec();
    let init_timeout = Duration::from_secs(3 * spec.run_invocation_timeout + 30);
    ctx.node
        .monitor
        .start_once(|| monitor_settings(ctx, config), ctx.stop.clone());
    let started = config.launcher.start(&launch, params, init_timeout);
    let failure = match started.await {
        Ok((Some(process), InitOutcome::Ready(info))) => {
            started_logged(ctx, &node, &name, &info, gpu.as_ref());
            ctx.node.monitor.runner_started(&name, info.pid);
            config.metrics.runner_started();
            return Ok(Active {
                job: ctx.job.id().to_owned(),
                name,
                process,
                job_stop: ctx.stop.clone(),
                _gpu: gpu,
                _ready: ReadyMark::new(&ctx.node.ready_runners),
                _seat: seat,
                times: TimesMark::new(&ctx.node.times, times_id, born),
            });
        }
        Ok((_, InitOutcome::Failed(error))) => {
            script_error_at_init(&node, ctx, &name, &error);
            match error.cause {
                ErrorCause::MissingPackage => {
                    // The message is `class: text`; the class is said by the variant.
                    let (_, why) = error.message.split_once(": ").unwrap_or_default();
                    InitFailure::MissingPackage(why.to_owned())
                }
                ErrorCause::Script | ErrorCause::OutOfMemory => InitFailure::Raised(error.message),
            }
        }
        Ok((_, InitOutcome::TimedOut)) => {
            let failure = InitFailure::TimedOut {
                limit: init_timeout.as_secs(),
                run_invocation_timeout: spec.run_invocation_timeout,
            };
            if ctx.node.ready_runners.load(Ordering::Relaxed) == 0 {
                let reason = format!(
                    "no progress: every runner process on node {node} was stuck in init() (the last, {name}: {failure}) and no mini-batch has started"
                );
                let _ = shared.agent.events.send(AgentEvent::StuckInInit {
                    job: ctx.job.id().to_owned(),
                    reason,
                });
            }
            failure
        }
        Ok((_, InitOutcome::Died(status))) => {
            let code = returncode(&status);
            match crate::oom::killed_for_memory(&status) {
                Some(oom) => InitFailure::KilledForMemory { oom, code },
                None => InitFailure::Exited(code),
            }
        }
        Ok((None, InitOutcome::Ready(_))) => unreachable!("a ready runner is returned"),
        Err(e) => InitFailure::Launch(e),
    };
    ctx.node.times.failed_start(&times_id, born);
    start_failed(shared, ctx, &name, &failure);
    Err(StartFailure::Failed)
}

/// Says in the job's logs that runner `name` started on `node`: in its own log (the node's
/// IP, its pid) and in the node's main log (its Python, its GPU).
fn started_logged(
    ctx: &JobContext,
    node: &str,
    name: &str,
    info: &ReadyInfo,
    gpu: Option<&GpuLease>,
) {
    let main_log = logs::JobLogs::node_main(node);
    ctx.logs.log(
        logs::JobLogs::node_process(node, name),
        &format!(
            "{name} started on node {node}: ip {}, pid {}.",
            crate::ip::node_ip(),
            info.pid
        ),
    );
    let gpu_note = gpu.map_or_else(String::new, |lease| {
        let how = if lease.is_shared() {
            "shared"
        } else {
            "its own"
        };
        format!(", GPU {} ({how})", lease.device())
    });
    ctx.logs.log(
        &main_log,
        &format!(
            "{name} started: pid {}, Python {} ({}), prefix {}{gpu_note}.",
            info.pid,
            info.python_version.lines().next().unwrap_or_default(),
            info.python_executable,
            info.python_prefix
        ),
    );
}

/// Why a runner did not start. Its text is what the job's logs and events say.
#[derive(Debug, thiserror::Error)]
enum InitFailure {
    /// The script's `init()` (or loading the entry script) raised.
    #[error("init() failed: {0}")]
    Raised(String),
    /// The job's environment lacks a package its input needs (pandas, pyarrow): every start
    /// would fail the same way.
    #[error("the job's environment cannot read its input: {0}")]
    MissingPackage(String),
    #[error(
        "init() did not finish within {limit}s (3 × run_invocation_timeout {run_invocation_timeout} + 30)"
    )]
    TimedOut {
        limit: u64,
        run_invocation_timeout: u64,
    },
    #[error("the process was {oom} (returncode {code}) during init")]
    KilledForMemory { oom: String, code: i32 },
    #[error("the process exited with returncode {0} during init")]
    Exited(i32),
    /// The process could not be started, or its channel failed.
    #[error(transparent)]
    Launch(#[from] ProcessError),
}

impl InitFailure {
    /// The script's own error (in `user/error/`), not the process's or the node's.
    fn is_scripts(&self) -> bool {
        matches!(self, InitFailure::Raised(_))
    }

    /// Every further start would fail the same way.
    fn is_hopeless(&self) -> bool {
        matches!(self, InitFailure::MissingPackage(_))
    }
}

/// Logs, counts and reports a runner `name` that failed to start, and gives up on the job on
/// this node when every start would fail the same way or too many have.
fn start_failed(shared: &Shared, ctx: &JobContext, name: &str, failure: &InitFailure) {
    let config = &shared.agent.config;
    let node = &config.node_id;
    let main_log = logs::JobLogs::node_main(node);
    let hopeless = failure.is_hopeless();
    ctx.logs
        .log(&main_log, &format!("{name} failed to start: {failure}"));
    if !failure.is_scripts() {
        // Not the script's error (that is in user/error/): the process or the node's.
        ctx.logs.log(
            logs::JobLogs::sys_error(node, name),
            &format!("{name} failed to start: {failure}"),
        );
    }
    config.metrics.runner_start_failed();
    let failures = ctx.node.init_failures.fetch_add(1, Ordering::Relaxed) + 1;
    let processes = ctx.node.seats.cap() as u32;
    warn!(job = %ctx.job.id(), process = %name, failures, "Runner failed to start: {failure}");
    let _ = shared.agent.events.send(AgentEvent::InitFailed {
        job: ctx.job.id().to_owned(),
        processes,
        failure: failure.to_string(),
    });
    if (hopeless || failures >= 3 * processes) && !ctx.node.gave_up.swap(true, Ordering::Relaxed) {
        let reason = if hopeless {
            failure.to_string()
        } else {
            format!(
                "{failures} runner processes failed to start on node {node}; the last: {failure}"
            )
        };
        ctx.logs.log(
            &main_log,
            &format!("Giving up on job {}: {reason}.", ctx.job.id()),
        );
        let _ = shared.agent.events.send(AgentEvent::GaveUp {
            job: ctx.job.id().to_owned(),
            reason,
        });
    }
}

/// How runner `name` of `ctx`'s job is launched: its executable, its log files, and its
/// environment (its GPU, none of fleetrun's credentials).
fn launch_of(shared: &Shared, ctx: &JobContext, name: &str, gpu: Option<&GpuLease>) -> Launch {
    let config = &shared.agent.config;
    let node = &config.node_id;
    let RunnerEnv {
        set: mut env,
        remove: mut env_remove,
    } = runner_env(ctx.job.spec(), ctx.job.id(), node, name);
    let gpu_count = shared.gpus.count().to_string();
    env.push((GPU_COUNT_VAR.into(), gpu_count.clone()));
    env.push((AZ_GPU_COUNT_VAR.into(), gpu_count));
    match gpu {
        Some(lease) => {
            env.push((VISIBLE_DEVICES_VAR.into(), lease.device().to_owned()));
            let per_gpu = ctx.node.seats.cap().div_ceil(shared.gpus.count().max(1));
            env.push((RUNNERS_PER_GPU_VAR.into(), per_gpu.to_string()));
        }
        None => env_remove.push(VISIBLE_DEVICES_VAR.to_owned()),
    }
    Launch {
        exe: config.runner_exe.clone(),
        stdout: ctx.logs.user_stdout(node, name),
        stderr: ctx.logs.user_stderr(node, name),
        env,
        env_remove,
    }
}

/// What runner `name` of `ctx`'s job is told at init (a linear builder): its script, its
/// folders (made here), its input's format, its models. Folders that cannot be made are
/// warned of; the runner starts without them.
fn init_params(config: &WorkerConfig, ctx: &JobContext, name: &str, python: Python) -> InitParams {
    let node = &config.node_id;
    let spec = ctx.job.spec();
    let cache = config.cache();
    let working_dir = match super::workdir::make(cache, ctx.job.id(), node, name, spec) {
        Ok(dir) => Some(dir.display().to_string()),
        Err(e) => {
            warn!(job = %ctx.job.id(), process = %name, error = %e, "Cannot make the runner's working folder; it starts in the worker's.");
            None
        }
    };
    let work = super::workdir::job_work_dir(cache, ctx.job.id(), node);
    let arguments = match super::named::arguments(spec, &super::named::runner_folder(&work, name)) {
        Ok(arguments) => arguments,
        Err(e) => {
            warn!(job = %ctx.job.id(), process = %name, error = %e, "Cannot make the runner's named-output folders.");
            spec.arguments.clone()
        }
    };
    let output_dir = super::outdir::local_output_dir(ctx);
    if let Err(e) = std::fs::create_dir_all(&output_dir) {
        warn!(job = %ctx.job.id(), folder = %output_dir.display(), error = %e, "Cannot make the script's output_dir.");
    }
    InitParams {
        entry_script: local_path_string(&spec.entry_script),
        source_directory: spec.source_directory.as_ref().map(local_path_string),
        arguments,
        node_id: node.clone(),
        process_name: name.to_owned(),
        log_dir: ctx.logs.dir().display().to_string(),
        output_dir: output_dir.display().to_string(),
        logging_level: spec.logging_level.as_str().to_owned(),
        environment: spec.environment.as_ref().map(|p| p.display().to_string()),
        tabular: spec.input.tabular().map(|tabular| {
            let read = spec.mltable.as_ref().and_then(|table| table.read.as_ref());
            TabularInit {
                separator: tabular.separator,
                parquet: tabular.format == Some(fleetrun_config::TabularFormat::Parquet),
                encoding: read.and_then(|read| read.encoding.clone()),
                empty_as_string: read.is_some_and(|read| read.empty_as_string),
                drop_columns: spec
                    .mltable
                    .as_ref()
                    .map(|table| table.dropped_file_columns())
                    .unwrap_or_default(),
            }
        }),
        append_row_separator: spec.append_row_separator,
        working_dir,
        models: spec
            .models
            .iter()
            .map(|(name, location)| (name.clone(), local_path_string(location)))
            .collect(),
        profile: spec.profile.then(|| {
            let stats = logs::JobLogs::profile(node, name);
            ctx.logs.path(stats).display().to_string()
        }),
        hold_replies: spec.outputs.is_empty(),
        python: Some(Box::new(python)),
    }
}

/// Resolves the job's Python once on this node, before any of its runners starts: one that
/// fleetrun cannot run gives up on the job at once, with why, and starts nothing.
async fn python_served(shared: &Shared, ctx: &JobContext) -> Result<Python, StartFailure> {
    let config = &shared.agent.config;
    let main_log = logs::JobLogs::node_main(&config.node_id);
    let checked = ctx
        .node
        .python
        .get_or_init(|| async {
            let environment = ctx.job.spec().environment.clone();
            let checked = config.launcher.python(environment).await;
            let line = match &checked {
                Ok(python) => format!("The job's runners run {python}."),
                Err(e) => format!("The job's Python cannot run here: {e}."),
            };
            ctx.logs.log(&main_log, &line);
            checked
        })
        .await;
    let why = match checked {
        Ok(python) => return Ok(python.clone()),
        Err(e) => e.to_string(),
    };
    if !ctx.node.gave_up.swap(true, Ordering::Relaxed) {
        warn!(job = %ctx.job.id(), error = %why, "The job's Python cannot run here.");
        ctx.logs.log(
            &main_log,
            &format!("Giving up on job {}: {why}.", ctx.job.id()),
        );
        let _ = shared.agent.events.send(AgentEvent::GaveUp {
            job: ctx.job.id().to_owned(),
            reason: why.clone(),
        });
    }
    Err(StartFailure::GaveUp)
}

fn script_error_at_init(node: &str, ctx: &JobContext, process: &str, error: &ScriptError) {
    ctx.logs.append_text(
        logs::JobLogs::user_error(node, process),
        &format!(
            "{} loading the entry script / init():\n{}",
            logs::now(),
            error.traceback
        ),
    );
    ctx.logs.log(
        logs::USER_ERROR,
        &format!("{node} {process} init: {}", error.message),
    );
}

/// The node's GPUs as `_main.txt` tells them: NVML's names when the agent hands out the GPUs
/// NVML counted, else the count the agent was given.
fn gpu_line(count: usize) -> String {
    let detected = crate::gpu::detect();
    if detected.count == count {
        return detected.describe();
    }
    crate::gpu::Detected {
        count,
        names: Vec::new(),
        devices: Vec::new(),
        source: "as configured".to_owned(),
    }
    .describe()
}

/// What the job's monitor on this node watches: its interval, and the folders whose file
/// systems matter to the job (its logs, its local output and input, the node's staging
/// folder, the temp folder).
fn monitor_settings(ctx: &JobContext, config: &WorkerConfig) -> MonitorSettings {
    let spec = ctx.job.spec();
    let mut folders = vec![("logs".to_owned(), ctx.logs.dir().to_owned())];
    if let Some(output) = spec.output.as_local() {
        folders.push(("output".into(), output.to_owned()));
    }
    if let Some(input) = spec.input.location().as_local() {
        folders.push(("input".into(), input.to_owned()));
    }
    folders.push(("scratch".into(), config.staging_dir()));
    folders.push(("tmp".into(), std::env::temp_dir()));
    MonitorSettings {
        interval: Duration::from_secs(spec.resource_monitor_interval),
        node: config.node_id.clone(),
        logs: ctx.logs.clone(),
        folders,
        times: Some(ctx.node.times.clone()),
    }
}

fn local_path_string(location: &fleetrun_config::Location) -> String {
    match location {
        fleetrun_config::Location::Local(p) => p.display().to_string(),
        other => other.to_string(),
    }
}
