//! A slot's runner process: starting it (its environment, its GPU), warming it before work
//! arrives, killing it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fleetrun_common::protocol::{InitParams, ScriptError, TabularInit};
use fleetrun_common::python::Python;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::environment::{RunnerEnv, runner_env};
use super::slot::Slot;
use super::{AgentEvent, JobContext};
use crate::gpu::{AZ_GPU_COUNT_VAR, GPU_COUNT_VAR, GpuLease};
use crate::logs;
use crate::monitor::MonitorSettings;
use crate::process::{InitOutcome, Launch, Runner, returncode};

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

impl Slot {
    /// Starts this slot's runner for `job` before any work arrives, retrying init failures
    /// until the node gives up.
    pub(super) async fn warm(&mut self, job: &str, drain: &CancellationToken) {
        let Ok(Some(ctx)) = self.shared.agent.jobs.get(job).await else {
            return;
        };
        while !drain.is_cancelled()
            && !ctx.gave_up.load(Ordering::Relaxed)
            && !ctx.stop.is_cancelled()
        {
            tokio::select! {
                _ = drain.cancelled() => return,
                _ = ctx.stop.cancelled() => return,
                ready = self.ensure_runner(&ctx) => if ready { return },
            }
            if std::mem::take(&mut self.seatless) {
                // The job's seats on this node are taken: this slot warms nothing.
                return;
            }
        }
    }

    /// Makes sure this slot has a ready runner for the job. On an init failure, counts it and
    /// gives up on the job on this node after `3 × process_count_per_node` of them.
    pub(super) async fn ensure_runner(&mut self, ctx: &Arc<JobContext>) -> bool {
        if self.runner.as_ref().is_some_and(|a| a.job == ctx.job.id()) {
            return true;
        }
        if let Some(previous) = self.runner.take() {
            previous.process.shutdown().await;
        }
        if ctx.gave_up.load(Ordering::Relaxed) {
            return false;
        }
        let Some(python) = self.python_served(ctx).await else {
            return false;
        };
        let Some(seat) = ctx.seats.take() else {
            self.seatless = true;
            return false;
        };
        let node = self.config().node_id.clone();
        let (name, gpu) = self.shared.next_start();
        let main_log = logs::JobLogs::node_main(&node);
        if ctx.first_gpu_note() {
            ctx.logs.log(&main_log, &gpu_line(self.config().gpus));
        }
        let RunnerEnv {
            set: mut env,
            remove: mut env_remove,
        } = runner_env(ctx.job.spec(), ctx.job.id(), &node, &name);
        let gpu_count = self.shared.gpus.count().to_string();
        env.push((GPU_COUNT_VAR.into(), gpu_count.clone()));
        env.push((AZ_GPU_COUNT_VAR.into(), gpu_count));
        match &gpu {
            Some(lease) => env.push(("CUDA_VISIBLE_DEVICES".into(), lease.index().to_string())),
            None => env_remove.push("CUDA_VISIBLE_DEVICES".to_owned()),
        }
        let launch = Launch {
            exe: self.config().runner_exe.clone(),
            stdout: ctx.logs.user_stdout(&node, &name),
            stderr: ctx.logs.user_stderr(&node, &name),
            env,
            env_remove,
        };
        let spec = ctx.job.spec();
        let cache = self.cache();
        let working_dir = match super::workdir::make(cache, ctx.job.id(), &node, &name, spec) {
            Ok(dir) => Some(dir.display().to_string()),
            Err(e) => {
                warn!(job = %ctx.job.id(), process = %name, error = %e, "Cannot make the runner's working folder; it starts in the worker's.");
                None
            }
        };
        let work = super::workdir::job_work_dir(cache, ctx.job.id(), &node);
        let arguments = match super::named::arguments(
            spec,
            &super::named::runner_folder(&work, &name),
        ) {
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
        let params = InitParams {
            entry_script: local_path_string(&spec.entry_script),
            source_directory: spec.source_directory.as_ref().map(local_path_string),
            arguments,
            node_id: node.clone(),
            process_name: name.clone(),
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
                let stats = logs::JobLogs::profile(&node, &name);
                ctx.logs.path(stats).display().to_string()
            }),
            hold_replies: spec.outputs.is_empty(),
            python: Some(Box::new(python)),
        };
        let init_timeout = Duration::from_secs(3 * spec.run_invocation_timeout + 30);
        ctx.monitor
            .start_once(|| monitor_settings(ctx, self.config()), ctx.stop.clone());
        let started = self.config().launcher.start(&launch, params, init_timeout);
        // A package the input needs is missing: every start would fail the same way.
        let mut hopeless = false;
        let failure = match started.await {
            Ok((Some(process), InitOutcome::Ready(info))) => {
                ctx.logs.log(
                    logs::JobLogs::node_process(&node, &name),
                    &format!(
                        "{name} started on node {node}: ip {}, pid {}.",
                        crate::ip::node_ip(),
                        info.pid
                    ),
                );
                let gpu_note = gpu.as_ref().map_or_else(String::new, |lease| {
                    let how = if lease.is_shared() {
                        "shared"
                    } else {
                        "its own"
                    };
                    format!(", GPU {} ({how})", lease.index())
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
                ctx.monitor.runner_started(&name, info.pid);
                self.config().metrics.runner_started();
                self.runner = Some(Active {
                    job: ctx.job.id().to_owned(),
                    name,
                    process,
                    job_stop: ctx.stop.clone(),
                    _gpu: gpu,
                    _ready: ReadyMark::new(&ctx.ready_runners),
                    _seat: seat,
                });
                return true;
            }
            Ok((_, InitOutcome::Failed(error))) => {
                self.script_error_at_init(ctx, &name, &error);
                match error.message.strip_prefix(MISSING_PACKAGE) {
                    Some(why) => {
                        hopeless = true;
                        format!("the job's environment cannot read its input{why}")
                    }
                    None => format!("init() failed: {}", error.message),
                }
            }
            Ok((_, InitOutcome::TimedOut)) => {
                let failure = format!(
                    "init() did not finish within {}s (3 × run_invocation_timeout {} + 30)",
                    init_timeout.as_secs(),
                    spec.run_invocation_timeout
                );
                if ctx.ready_runners.load(Ordering::Relaxed) == 0 {
                    let reason = format!(
                        "no progress: every runner process on node {node} was stuck in init() (the last, {name}: {failure}) and no mini-batch has started"
                    );
                    let _ = self.shared.agent.events.send(AgentEvent::StuckInInit {
                        job: ctx.job.id().to_owned(),
                        reason,
                    });
                }
                failure
            }
            Ok((_, InitOutcome::Died(status))) => match crate::oom::killed_for_memory(&status) {
                Some(oom) => format!(
                    "the process was {oom} (returncode {}) during init",
                    returncode(&status)
                ),
                None => format!(
                    "the process exited with returncode {} during init",
                    returncode(&status)
                ),
            },
            Ok((None, InitOutcome::Ready(_))) => unreachable!("a ready runner is returned"),
            Err(e) => e.to_string(),
        };
        ctx.logs
            .log(&main_log, &format!("{name} failed to start: {failure}"));
        if !failure.starts_with("init() failed: ") {
            // Not the script's error (that is in user/error/): the process or the node's.
            ctx.logs.log(
                logs::JobLogs::sys_error(&node, &name),
                &format!("{name} failed to start: {failure}"),
            );
        }
        self.config().metrics.runner_start_failed();
        let failures = ctx.init_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let processes = ctx.seats.cap() as u32;
        warn!(job = %ctx.job.id(), process = %name, failures, "Runner failed to start: {failure}");
        let _ = self.shared.agent.events.send(AgentEvent::InitFailed {
            job: ctx.job.id().to_owned(),
            processes,
            failure: failure.clone(),
        });
        if (hopeless || failures >= 3 * processes) && !ctx.gave_up.swap(true, Ordering::Relaxed) {
            let reason = if hopeless {
                failure.clone()
            } else {
                format!(
                    "{failures} runner processes failed to start on node {node}; the last: {failure}"
                )
            };
            ctx.logs.log(
                &main_log,
                &format!("Giving up on job {}: {reason}.", ctx.job.id()),
            );
            let _ = self.shared.agent.events.send(AgentEvent::GaveUp {
                job: ctx.job.id().to_owned(),
                reason,
            });
        }
        false
    }

    /// Resolves the job's Python once on this node, before any of its runners starts: one that
    /// fleetrun cannot run gives up on the job at once, with why, and starts nothing.
    async fn python_served(&self, ctx: &JobContext) -> Option<Python> {
        let node = &self.config().node_id;
        let main_log = logs::JobLogs::node_main(node);
        let checked = ctx
            .python
            .get_or_init(|| async {
                let environment = ctx.job.spec().environment.clone();
                let checked = self.config().launcher.python(environment).await;
                let line = match &checked {
                    Ok(python) => format!("The job's runners run {python}."),
                    Err(e) => format!("The job's Python cannot run here: {e}."),
                };
                ctx.logs.log(&main_log, &line);
                checked.map_err(|e| e.to_string())
            })
            .await;
        let why = match checked {
            Ok(python) => return Some(python.clone()),
            Err(why) => why,
        };
        if !ctx.gave_up.swap(true, Ordering::Relaxed) {
            warn!(job = %ctx.job.id(), error = %why, "The job's Python cannot run here.");
            ctx.logs.log(
                &main_log,
                &format!("Giving up on job {}: {why}.", ctx.job.id()),
            );
            let _ = self.shared.agent.events.send(AgentEvent::GaveUp {
                job: ctx.job.id().to_owned(),
                reason: why.clone(),
            });
        }
        None
    }

    fn script_error_at_init(&self, ctx: &JobContext, process: &str, error: &ScriptError) {
        let node = &self.config().node_id;
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

    pub(super) async fn kill_runner(&mut self) {
        if let Some(mut active) = self.runner.take() {
            active.process.kill().await;
        }
    }
}

/// How the runner names the error of a tabular input whose packages (pandas, pyarrow) the
/// job's environment lacks (`runner/src/python/tabular.py`).
const MISSING_PACKAGE: &str = "fleetrun_tabular.MissingPackage";

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
        source: "as configured".to_owned(),
    }
    .describe()
}

/// What the job's monitor on this node watches: its interval, and the folders whose file
/// systems matter to the job (its logs, its local output and input, the node's staging
/// folder, the temp folder).
fn monitor_settings(ctx: &JobContext, config: &super::AgentConfig) -> MonitorSettings {
    let spec = ctx.job.spec();
    let mut folders = vec![("logs".to_owned(), ctx.logs.dir().to_owned())];
    if let Some(output) = spec.output.as_local() {
        folders.push(("output".into(), output.to_owned()));
    }
    if let Some(input) = spec.input.location().as_local() {
        folders.push(("input".into(), input.to_owned()));
    }
    folders.push(("scratch".into(), config.staging_dir.clone()));
    folders.push(("tmp".into(), std::env::temp_dir()));
    MonitorSettings {
        interval: Duration::from_secs(spec.resource_monitor_interval),
        node: config.node_id.clone(),
        logs: ctx.logs.clone(),
        folders,
    }
}

fn local_path_string(location: &fleetrun_config::Location) -> String {
    match location {
        fleetrun_config::Location::Local(p) => p.display().to_string(),
        other => other.to_string(),
    }
}
