//! Serving a pool: the agent, the jobs this node follows (each watched in the ledger), the
//! orphans it adopts, and what it does with the agent's events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fleetrun_common::ledger::{JobState, LedgerError, Status};
use fleetrun_common::storage::{LocalStorage, Storage};
use fleetrun_config::Location;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::code::stage_code;
use super::dead_letters::record_dead_letters;
use super::driver::StopRules;
use super::error::JobError;
use super::finalize::{FINALIZE_LEASE, check_init_failures, check_init_failures_at, conclude};
use super::lifecycle::Job;
use super::record::JobRecord;
use super::results::overview_text;
use super::settings::{Fleet, KEEP_ENDED_JOBS, WorkerConfig, open_input, open_storage};
use super::side::{Held, stage_side};
use crate::agent::{self, Agent, AgentConfig, AgentEvent, JobContext, Jobs};
use crate::logs::{self, JobLogs};
use crate::parts;

/// How often a worker re-reads the state of each job it serves.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How long a node's word that it serves its pool lasts (renewed every third of it).
const BEAT_TTL: Duration = Duration::from_secs(15);

/// How often a worker looks over its pool's unfinished jobs for one nobody looks after.
const ADOPT_EVERY: Duration = FINALIZE_LEASE;

/// Serves every job of the fleet's pool until `drain` (finish what is in hand) or `abort`.
pub async fn serve(
    config: WorkerConfig,
    fleet: Fleet,
    drain: CancellationToken,
    abort: CancellationToken,
) {
    let (events, mut event_rx) = mpsc::unbounded_channel();
    let jobs = Arc::new(FleetJobs {
        fleet: fleet.clone(),
        config: config.clone(),
        contexts: Mutex::new(HashMap::new()),
        held: Arc::new(Mutex::new(HashMap::new())),
        unserved: Mutex::new(HashMap::new()),
        loading: tokio::sync::Mutex::new(()),
        stop: abort.clone(),
    });
    let agent = tokio::spawn(agent::run(
        Agent {
            config: AgentConfig {
                node_id: config.node_id.clone(),
                processes: config.processes,
                prefetch: config.prefetch,
                runner_exe: config.runner_exe.clone(),
                launcher: config.launcher.clone(),
                staging_dir: config.cache_dir.join("staging"),
                warm_job: config.warm_job.clone(),
                gpus: config.gpus,
                metrics: config.metrics.clone(),
            },
            queue: fleet.queue.clone(),
            ledger: fleet.ledger.clone(),
            jobs: jobs.clone(),
            events,
        },
        drain.clone(),
        abort.clone(),
    ));
    let recorder = tokio::spawn(record_dead_letters(
        fleet.clone(),
        jobs.clone(),
        drain.clone(),
    ));
    let adopter = tokio::spawn(adopt_orphans(fleet.clone(), jobs.clone(), drain.clone()));
    let beater = tokio::spawn(beat(fleet.clone(), config.node_id.clone(), drain.clone()));
    let mut finisher = {
        let (fleet, jobs, node) = (fleet.clone(), jobs.clone(), config.node_id.clone());
        tokio::spawn(async move {
            while let Some(event) = event_rx.recv().await {
                handle_event(&fleet, &jobs, &node, event).await;
            }
        })
    };
    let _ = agent.await;
    recorder.abort();
    adopter.abort();
    beater.abort();
    // The agent is gone, and with it the events' sender: the finisher ends once it has
    // finalized a job this node saw complete (nobody else would), unless told to stop now.
    tokio::select! {
        _ = &mut finisher => {}
        _ = abort.cancelled() => finisher.abort(),
    }
    for ctx in jobs.all() {
        // Its last sample written before the logs are flushed and sent.
        ctx.monitor.stop().await;
        if ctx.has_place() && !config.sole_node {
            // Another node takes this one's place in the job now, not when it runs out.
            let _ = fleet
                .registry
                .release_place(ctx.job.id(), &config.node_id)
                .await;
        }
        if let Ok(Some(status)) = fleet.ledger.status(ctx.job.id()).await {
            note_end(&ctx, &status);
        }
        ctx.logs.flush();
        agent::outdir::sync_logged(&ctx).await;
        upload_logs(&ctx, &config.node_id).await;
    }
    // The runners are gone: the jobs' working folders and cache holds go with them.
    jobs.held.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// Says, while the node serves its pool, that it does (until it drains): a job that waits for
/// a busy pool waits, one whose pool nobody serves fails on `first_task_creation_timeout`.
async fn beat(fleet: Fleet, node: String, drain: CancellationToken) {
    loop {
        if let Err(e) = fleet.registry.beat(&fleet.pool, &node, BEAT_TTL).await {
            warn!(error = %e, "Cannot say this node serves its pool.");
        }
        tokio::select! {
            _ = drain.cancelled() => return,
            _ = tokio::time::sleep(BEAT_TTL / 3) => {}
        }
    }
}

/// Acts on what the agent reports: finalizes a job this node saw complete, announces a
/// failure it caused, or fails a job no node can start.
async fn handle_event(fleet: &Fleet, jobs: &FleetJobs, node: &str, event: AgentEvent) {
    match event {
        AgentEvent::Transitioned { job, status } => {
            let Ok(Some(ctx)) = jobs.get(&job).await else {
                return;
            };
            conclude(&*fleet.ledger, &ctx, status).await;
        }
        AgentEvent::GaveUp { job, reason } => {
            let Ok(Some(ctx)) = jobs.get(&job).await else {
                return;
            };
            if ctx.job.spec().node_count <= 1 || jobs.config.sole_node {
                let reason = format!("no runner process could start: {reason}");
                ctx.job.fail_or_warn(&reason, Some(&ctx.logs)).await;
            } else {
                warn!(job = %job, node, "This node gave up on the job; other nodes keep serving it.");
                let processes = ctx.seats.cap() as u32;
                tokio::spawn(recheck_given_up(fleet.clone(), ctx, processes, reason));
            }
        }
        AgentEvent::StuckInInit { job, reason } => {
            let Ok(Some(ctx)) = jobs.get(&job).await else {
                return;
            };
            // A mini-batch started somewhere: some process is past init, so not every one
            // is stuck (CONTRACT §5 rule 3).
            match fleet.ledger.status(&job).await {
                Ok(Some(status)) if !status.started && status.state == JobState::Running => {
                    ctx.job.fail_or_warn(&reason, Some(&ctx.logs)).await;
                }
                Ok(_) => {}
                Err(e) => warn!(job = %job, error = %e, "Cannot read the job's state."),
            }
        }
        AgentEvent::InitFailed {
            job,
            processes,
            failure,
        } => {
            let failures = match fleet.registry.add_init_failure(&job).await {
                Ok(n) => n,
                Err(e) => {
                    warn!(job = %job, error = %e, "Cannot count an init failure.");
                    return;
                }
            };
            if let Some(ctx) = jobs.cached(&job) {
                let last = format!("the last: {failure}");
                check_init_failures(&ctx, processes, failures, &last).await;
            }
        }
    }
}

/// Looks again at a job this node gave up on, in case no node is left to fail it by then:
/// once it has run two minutes (init failures over the fleet, CONTRACT §5 rule 2), and once
/// a node that could start the script would have ended a mini-batch (rule 3: init, then
/// every attempt of one mini-batch, run out their time), when the job fails if no
/// mini-batch has ended anywhere.
async fn recheck_given_up(fleet: Fleet, ctx: Arc<JobContext>, processes: u32, reason: String) {
    let gave_up = tokio::time::Instant::now();
    let age = ctx.job.age();
    let spec = ctx.job.spec();
    let rule_2 =
        gave_up + super::driver::INIT_FAILURE_GRACE.saturating_sub(age) + Duration::from_secs(1);
    let timeout = spec.run_invocation_timeout;
    let stalled =
        gave_up + Duration::from_secs(3 * timeout + 30 + u64::from(spec.run_max_try) * timeout + 5);
    let mut checks = [rule_2, stalled];
    checks.sort();
    for at in checks {
        tokio::time::sleep_until(at).await;
        let Ok(Some(status)) = fleet.ledger.status(ctx.job.id()).await else {
            continue;
        };
        if status.state != JobState::Running {
            return;
        }
        // The job's age by this node's clock since it gave up (paused in flow tests).
        let age_now = age + gave_up.elapsed();
        if let Ok(failures) = fleet.registry.init_failures(ctx.job.id()).await
            && check_init_failures_at(&ctx, processes, failures, &reason, age_now).await
        {
            return;
        }
        if at == stalled && status.done == 0 {
            let waited = gave_up.elapsed().as_secs();
            let why = format!(
                "no mini-batch has ended on any node {waited}s after this one gave up on the job: {reason}"
            );
            ctx.job.fail_or_warn(&why, Some(&ctx.logs)).await;
            return;
        }
    }
}

/// Looks over the pool's unfinished jobs now and then: retires ended jobs (Redis forgets
/// them [`KEEP_ENDED_JOBS`] later), and follows a Finalizing job this node does not know
/// yet, so that its watcher takes the finalization over if whoever held it died (even when
/// no worker that served the job is left). Stops when the worker drains.
async fn adopt_orphans(fleet: Fleet, jobs: Arc<FleetJobs>, drain: CancellationToken) {
    loop {
        if let Err(e) = adopt_once(&fleet, &jobs).await {
            warn!(error = %e, "Cannot look over the pool's unfinished jobs.");
        }
        tokio::select! {
            _ = drain.cancelled() => return,
            _ = tokio::time::sleep(ADOPT_EVERY) => {}
        }
    }
}

async fn adopt_once(fleet: &Fleet, jobs: &FleetJobs) -> Result<(), LedgerError> {
    let pool = &fleet.pool;
    for job in fleet.registry.unfinished(pool).await? {
        // One job the ledger cannot answer for holds up none of the others.
        if let Err(e) = look_after(fleet, jobs, &job).await {
            warn!(job = %job, error = %e, "Cannot look after the job.");
        }
    }
    Ok(())
}

async fn look_after(fleet: &Fleet, jobs: &FleetJobs, job: &str) -> Result<(), LedgerError> {
    match fleet.ledger.status(job).await?.map(|s| s.state) {
        // Registered only once in the ledger: gone from it means ended long ago.
        None => {}
        Some(state) if state.is_terminal() => {
            jobs.unserved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(job);
            fleet.ledger.retire(job, KEEP_ENDED_JOBS).await?;
        }
        Some(JobState::Running) if jobs.cached(job).is_none() => {
            return watch_unserved(fleet, jobs, job).await;
        }
        Some(JobState::Finalizing) if jobs.cached(job).is_none() => {
            info!(job = %job, "Following a Finalizing job in case its finalizer is gone.");
            if let Err(e) = jobs.get(job).await {
                warn!(job = %job, error = %e, "Cannot load the job.");
            }
            return Ok(());
        }
        Some(_) => return Ok(()),
    }
    fleet
        .registry
        .retire(job, &fleet.pool, KEEP_ENDED_JOBS)
        .await
}

/// How many nodes serve the pool, asked only while the job has not started (the stop rules
/// need it only then); `None` if the registry cannot tell.
pub async fn serving(fleet: &Fleet, status: &Status) -> Option<u64> {
    if status.started {
        return None;
    }
    fleet.registry.nodes(&fleet.pool).await.ok()
}

/// Checks the stop rules of a Running job this node does not serve, failing it when they
/// say so (from its record: its spec, its output).
async fn watch_unserved(fleet: &Fleet, jobs: &FleetJobs, job: &str) -> Result<(), LedgerError> {
    let Some(status) = fleet.ledger.status(job).await? else {
        return Ok(());
    };
    let Some(bytes) = fleet.registry.record(job).await? else {
        return Ok(());
    };
    let Ok(record) = JobRecord::decode(&bytes) else {
        return Ok(());
    };
    let serving = serving(fleet, &status).await;
    let reason = {
        let mut unserved = jobs.unserved.lock().unwrap_or_else(|p| p.into_inner());
        let age =
            Duration::from_secs_f64((super::record::unix_now() - record.submitted_at).max(0.0));
        unserved
            .entry(job.to_owned())
            .or_insert_with(|| StopRules::new(&record.spec, age))
            .check(&status, serving)
    };
    let Some(reason) = reason else {
        return Ok(());
    };
    let job_handle = match Job::open(fleet, job, &record).await {
        Ok(handle) => handle,
        Err(e) => {
            warn!(job = %job, error = %e, "Cannot open the job's output to fail it.");
            return Ok(());
        }
    };
    job_handle.fail(&reason, None).await?;
    jobs.unserved
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(job);
    Ok(())
}

/// What a job holds on this node while it runs here; released when dropped.
struct NodeJob {
    /// Its side inputs' and models' cache entries.
    _held: Held,
    /// Its runners' working folders, removed with it.
    work: std::path::PathBuf,
}

impl Drop for NodeJob {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

pub(super) struct FleetJobs {
    fleet: Fleet,
    config: WorkerConfig,
    contexts: Mutex<HashMap<String, Arc<JobContext>>>,
    /// What each job this node serves holds on it until the job ends here: its side inputs
    /// and models in the cache, its runners' working folders.
    held: Arc<Mutex<HashMap<String, NodeJob>>>,
    /// The stop rules of the pool's Running jobs this node does not serve (none of their
    /// mini-batches reached it): a job whose submitter died before publishing anything is
    /// watched too.
    unserved: Mutex<HashMap<String, StopRules>>,
    /// One job is loaded at a time, so slots asking for the same new job load it once.
    loading: tokio::sync::Mutex<()>,
    stop: CancellationToken,
}

impl FleetJobs {
    fn cached(&self, job: &str) -> Option<Arc<JobContext>> {
        self.contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(job)
            .cloned()
    }

    fn all(&self) -> Vec<Arc<JobContext>> {
        self.contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    async fn load(&self, job: &str) -> Result<Option<Arc<JobContext>>, JobError> {
        let Some(bytes) = self.fleet.registry.record(job).await? else {
            return Ok(None);
        };
        let record = JobRecord::decode(&bytes)?;
        let spec = stage_code(record.spec, &self.config.cache_dir, &self.fleet.s3).await?;
        let (spec, held) =
            match stage_side(spec.clone(), &self.config.cache_dir, &self.fleet.s3).await {
                Ok(staged) => staged,
                Err(e) => {
                    // Another attempt would meet it again: the job fails, and this node drops
                    // its mini-batches like those of any job that no longer runs.
                    let reason = format!(
                        "side_inputs or models cannot be staged on node {}: {e}",
                        self.config.node_id
                    );
                    let output = open_storage(&spec.output, &self.fleet.s3).await?;
                    let writer = parts::writer_name(&self.config.node_id);
                    let submitted = record.submitted_at;
                    Job::new(job, spec.clone(), submitted, &self.fleet, output, &writer)
                        .fail_or_warn(&reason, None)
                        .await;
                    (spec, Held::default())
                }
            };
        self.held.lock().unwrap_or_else(|p| p.into_inner()).insert(
            job.to_owned(),
            NodeJob {
                _held: held,
                work: agent::workdir::job_work_dir(
                    &self.config.cache_dir,
                    job,
                    &self.config.node_id,
                ),
            },
        );
        let input = open_input(&spec, &self.fleet.s3).await?;
        let output = open_storage(&spec.output, &self.fleet.s3).await?;
        let log_dir = match &spec.output {
            Location::Local(dir) => dir.join("logs"),
            Location::S3 { .. } => self.config.cache_dir.join("jobs").join(job).join("logs"),
        };
        let logs = Arc::new(if self.config.sole_node {
            JobLogs::new(log_dir)
        } else {
            JobLogs::for_node(log_dir, &self.config.node_id)
        });
        let processes = job_processes(&self.config, &spec);
        let writer = parts::writer_name(&self.config.node_id);
        let handle = Job::new(job, spec, record.submitted_at, &self.fleet, output, &writer);
        let ctx = Arc::new(
            JobContext::new(handle, input, logs)
                // `fleetrun run` is the job's one node; fleet nodes take one of its places.
                .with_seats(processes, !self.config.sole_node),
        );
        tokio::spawn(watch_job(
            self.fleet.clone(),
            ctx.clone(),
            self.config.node_id.clone(),
            self.stop.clone(),
            self.held.clone(),
        ));
        Ok(Some(ctx))
    }
}

/// The job's runners on this node: `fleetrun run`'s process count (the job's, or its
/// `--processes`); on a fleet node the job's `process_count_per_node` (CONTRACT §2's default
/// when it sets none), at most the worker's `--max-processes`.
fn job_processes(config: &WorkerConfig, spec: &fleetrun_config::JobSpec) -> usize {
    let slots = config.processes.max(1);
    if config.sole_node {
        return slots;
    }
    let wanted = spec.process_count_per_node.map_or_else(
        || crate::node::default_process_count(config.gpus),
        |n| n as usize,
    );
    wanted.clamp(1, slots)
}

#[async_trait]
impl Jobs for FleetJobs {
    async fn claim_place(&self, ctx: &JobContext) -> bool {
        if ctx.has_place() {
            return true;
        }
        let claimed = self
            .fleet
            .registry
            .claim_place(
                ctx.job.id(),
                &self.config.node_id,
                ctx.job.spec().node_count,
                BEAT_TTL,
            )
            .await;
        match claimed {
            Ok(held) => {
                if held {
                    info!(job = %ctx.job.id(), node_count = ctx.job.spec().node_count, "This node took one of the job's places.");
                    ctx.logs.log(
                        JobLogs::node_main(&self.config.node_id),
                        &format!(
                            "Node {} took one of the job's {} node places (node_count).",
                            self.config.node_id,
                            ctx.job.spec().node_count
                        ),
                    );
                }
                ctx.set_place(held);
                held
            }
            Err(e) => {
                warn!(job = %ctx.job.id(), error = %e, "Cannot claim a place in the job.");
                false
            }
        }
    }

    async fn get(&self, job: &str) -> Result<Option<Arc<JobContext>>, JobError> {
        if let Some(ctx) = self.cached(job) {
            return Ok(Some(ctx));
        }
        let _one_at_a_time = self.loading.lock().await;
        if let Some(ctx) = self.cached(job) {
            return Ok(Some(ctx));
        }
        let ctx = self.load(job).await?;
        if let Some(ctx) = &ctx {
            self.contexts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(job.to_owned(), ctx.clone());
        }
        Ok(ctx)
    }
}

/// Follows a job's state in the ledger: stops its running attempts on this node as soon as
/// it no longer runs, takes its finalization over when whoever held it is gone, fails it
/// when a stop rule says so (every node that serves the job watches them, so the job ends
/// whichever nodes are left), keeps its overview and flushes its logs now and then, and
/// uploads them at the end.
async fn watch_job(
    fleet: Fleet,
    ctx: Arc<JobContext>,
    node: String,
    stop: CancellationToken,
    held: Arc<Mutex<HashMap<String, NodeJob>>>,
) {
    let age =
        Duration::from_secs_f64((super::record::unix_now() - ctx.job.submitted_at()).max(0.0));
    let ledger = fleet.ledger.clone();
    let mut rules = StopRules::new(ctx.job.spec(), age);
    let mut seen: Option<(JobState, Option<u64>)> = None;
    let mut place_renewed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                if ctx.has_place() {
                    let _ = fleet.registry.release_place(ctx.job.id(), &node).await;
                }
                return;
            }
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
        if ctx.has_place() && place_renewed.elapsed() >= BEAT_TTL / 3 {
            place_renewed = tokio::time::Instant::now();
            renew_place(&fleet, &ctx, &node).await;
        }
        ctx.logs.flush();
        let status = match ledger.status(ctx.job.id()).await {
            Ok(Some(status)) => status,
            Ok(None) => continue,
            Err(e) => {
                warn!(job = %ctx.job.id(), error = %e, "Cannot read the job's state.");
                continue;
            }
        };
        note_changes(&ctx, &node, &mut seen, &status);
        if let Some(reason) = rules.check(&status, serving(&fleet, &status).await) {
            ctx.job.fail_or_warn(&reason, Some(&ctx.logs)).await;
            continue;
        }
        if !status.state.is_terminal() && ctx.job.spec().output.as_local().is_some() {
            // On a local output the log folder is the output's: the overview is in place.
            ctx.logs
                .write(logs::PROGRESS_OVERVIEW, &overview_text(&status));
        }
        match status.state {
            JobState::Finalizing => {
                // Whoever finalizes it may have died: take over once its claim runs out.
                ctx.stop.cancel();
                conclude(&*ledger, &ctx, status).await;
            }
            state if !state.accepts_work() => {
                ctx.stop.cancel();
                if state.is_terminal() {
                    ctx.monitor.stop().await;
                    ctx.logs.flush();
                    agent::outdir::sync_logged(&ctx).await;
                    upload_logs(&ctx, &node).await;
                    held.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(ctx.job.id());
                    return;
                }
            }
            _ => {}
        }
    }
}

/// Renews this node's place in the job while it serves it; a place lost (this node was
/// unreachable longer than its lease, and another took the place) is given up here too.
async fn renew_place(fleet: &Fleet, ctx: &JobContext, node: &str) {
    let renewed = fleet
        .registry
        .claim_place(ctx.job.id(), node, ctx.job.spec().node_count, BEAT_TTL)
        .await;
    match renewed {
        Ok(true) => {}
        Ok(false) => {
            warn!(job = %ctx.job.id(), node, "This node lost its place in the job to another.");
            ctx.set_place(false);
        }
        Err(e) => {
            warn!(job = %ctx.job.id(), error = %e, "Cannot renew this node's place in the job.")
        }
    }
}

/// Notes in `sys/master_role.txt` what changed since the watcher last looked: the job
/// followed, its mini-batches all created, its finalization, its end.
fn note_changes(
    ctx: &JobContext,
    node: &str,
    seen: &mut Option<(JobState, Option<u64>)>,
    status: &Status,
) {
    let master = |line: &str| ctx.logs.log(logs::MASTER_ROLE, line);
    let (state, total) = seen.get_or_insert_with(|| {
        master(&format!(
            "Job {} followed by node {node}: input {}, output {}; {} created so far.",
            ctx.job.id(),
            input_name(ctx.job.spec()),
            ctx.job.spec().output,
            status.created
        ));
        (JobState::Running, None)
    });
    if total.is_none()
        && let Some(all) = status.total
    {
        master(&format!("All {all} mini-batches created; total sealed."));
        *total = Some(all);
    }
    if *state != status.state {
        match status.state {
            JobState::Finalizing => master("Every mini-batch is done; finalizing."),
            _ => note_end(ctx, status),
        }
        *state = status.state;
    }
}

/// Notes in `sys/master_role.txt` how the job ended, once per node: by its watcher, or
/// as the worker stops when the job ended after the watcher last looked.
fn note_end(ctx: &JobContext, status: &Status) {
    if status.state.is_terminal() && ctx.first_end_noted() {
        let reason = status.reason.as_deref().map(|r| format!(": {r}"));
        let line = format!(
            "Job {} ended {}{}.",
            ctx.job.id(),
            status.state,
            reason.unwrap_or_default()
        );
        ctx.logs.log(logs::MASTER_ROLE, &line);
    }
}

fn input_name(spec: &fleetrun_config::JobSpec) -> String {
    spec.input.location().to_string()
}

/// Copies this node's log files of a job whose output is on S3 under `<output>/logs/`.
async fn upload_logs(ctx: &JobContext, node: &str) {
    // Local outputs hold the logs already; a node that wrote none has nothing to send.
    if ctx.job.spec().output.as_local().is_some() || !ctx.logs.dir().is_dir() {
        return;
    }
    let logs = LocalStorage::new(ctx.logs.dir());
    let mut listing = logs.list("");
    while let Some(object) = listing.next().await {
        let copied = match object {
            Ok(object) => match logs.get(&object.key).await {
                Ok(body) => {
                    ctx.job
                        .output()
                        .put(&format!("logs/{}", object.key), body)
                        .await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = copied {
            warn!(job = %ctx.job.id(), node, error = %e, "Cannot upload a log file.");
        }
    }
}
