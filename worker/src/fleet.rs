//! Serving a pool's jobs on a fleet: RabbitMQ for mini-batches, Redis for the ledger and the
//! job registry, S3 (or a shared folder) for data.
//!
//! Everything a worker needs to serve a job it has never seen is in the registry's
//! [`JobRecord`]: the validated spec and, when the job's code was shipped, where it is. A
//! worker stages the code once per job into its cache, opens the job's storages, and serves
//! the job like any other until the ledger says it no longer runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use fleetrun_common::ledger::redis::RedisLedger;
use fleetrun_common::ledger::{JobRegistry, JobState, Ledger, LedgerError, RedisRegistry, Status};
use fleetrun_common::queue::amqp::AmqpQueue;
use fleetrun_common::queue::{Disposition, Queue, QueueOptions};
use fleetrun_common::storage::s3::{S3Settings, S3Storage};
use fleetrun_common::storage::{LocalStorage, Storage, StorageError, check_key, join_key};
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::{JobSpec, Location};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::agent::{self, Agent, AgentConfig, AgentEvent, JobContext, Jobs};
use crate::logs::JobLogs;
use crate::parts;

/// The pool both binaries use when none is named.
pub const DEFAULT_POOL: &str = "default";
/// The prefix of every Redis key fleetrun writes.
pub const KEY_PREFIX: &str = "fleetrun";
/// Deliveries of one message before the broker dead-letters it: a backstop above any
/// `run_max_try` (at most 100), since workers record a mini-batch failed themselves once its
/// attempts are spent.
pub const POOL_DELIVERY_LIMIT: u32 = 101;
/// Where shipped code lives, under the job's output location.
pub const CODE_PREFIX: &str = "_fleetrun/code";
/// How often a worker re-reads the state of each job it serves.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long a finalization claim lasts unless renewed (every third of it): a worker that
/// dies while finalizing is replaced, this long after, by another that served the job.
const FINALIZE_LEASE: Duration = Duration::from_secs(10);
/// How often a worker looks over its pool's unfinished jobs for one nobody looks after.
const ADOPT_EVERY: Duration = FINALIZE_LEASE;
/// How long Redis keeps an ended job (its counts for `fleetrun status`, its record).
pub const KEEP_ENDED_JOBS: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where the fleet's services are. Flags win over the environment, which wins over the
/// config file (`$FLEETRUN_CONFIG`, else `~/.config/fleetrun/fleet.toml`).
#[derive(Debug, Clone, Default, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetArgs {
    /// RabbitMQ URL, e.g. amqp://guest:guest@127.0.0.1:5672/%2f
    #[arg(long, env = "FLEETRUN_AMQP_URL")]
    pub amqp_url: Option<String>,
    /// RabbitMQ management API URL (for the unacknowledged count), e.g. http://guest:guest@127.0.0.1:15672
    #[arg(long, env = "FLEETRUN_AMQP_MANAGEMENT_URL")]
    pub amqp_management_url: Option<String>,
    /// Redis URL, e.g. redis://127.0.0.1:6379/
    #[arg(long, env = "FLEETRUN_REDIS_URL")]
    pub redis_url: Option<String>,
    /// The worker pool (its queue is `fleetrun.<pool>.batches`).
    #[arg(long, env = "FLEETRUN_POOL")]
    pub pool: Option<String>,
    /// S3 endpoint for S3-compatible servers (else AWS_ENDPOINT_URL, else AWS).
    #[arg(long, env = "FLEETRUN_S3_ENDPOINT_URL")]
    pub s3_endpoint_url: Option<String>,
    /// Address buckets by path (default: on whenever a custom endpoint is set).
    #[arg(long, env = "FLEETRUN_S3_FORCE_PATH_STYLE")]
    pub s3_force_path_style: Option<bool>,
}

impl FleetArgs {
    /// Fills what flags and environment left unset from the config file.
    pub fn resolve(self) -> Result<FleetArgs, String> {
        let path = std::env::var_os("FLEETRUN_CONFIG")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| Path::new(&h).join(".config/fleetrun/fleet.toml"))
            });
        let file = match path {
            Some(p) if p.is_file() => {
                let text =
                    std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                toml::from_str::<FleetArgs>(&text).map_err(|e| format!("{}: {e}", p.display()))?
            }
            _ => FleetArgs::default(),
        };
        Ok(FleetArgs {
            amqp_url: self.amqp_url.or(file.amqp_url),
            amqp_management_url: self.amqp_management_url.or(file.amqp_management_url),
            redis_url: self.redis_url.or(file.redis_url),
            pool: self.pool.or(file.pool),
            s3_endpoint_url: self.s3_endpoint_url.or(file.s3_endpoint_url),
            s3_force_path_style: self.s3_force_path_style.or(file.s3_force_path_style),
        })
    }

    pub fn pool(&self) -> &str {
        self.pool.as_deref().unwrap_or(DEFAULT_POOL)
    }

    pub fn s3(&self) -> S3Settings {
        S3Settings {
            endpoint_url: self.s3_endpoint_url.clone(),
            force_path_style: self.s3_force_path_style,
            ..S3Settings::default()
        }
    }
}

/// The connected seams of a fleet.
#[derive(Clone)]
pub struct Fleet {
    pub queue: Arc<dyn Queue>,
    pub ledger: Arc<dyn Ledger>,
    pub registry: Arc<dyn JobRegistry>,
    pub s3: S3Settings,
    pub pool: String,
}

impl Fleet {
    pub async fn connect(args: &FleetArgs) -> Result<Fleet, String> {
        let amqp = args.amqp_url.as_deref().ok_or(
            "no RabbitMQ URL: set FLEETRUN_AMQP_URL, --amqp-url or amqp_url in the config file",
        )?;
        let redis = args.redis_url.as_deref().ok_or(
            "no Redis URL: set FLEETRUN_REDIS_URL, --redis-url or redis_url in the config file",
        )?;
        let pool = args.pool().to_owned();
        let options = QueueOptions {
            delivery_limit: Some(POOL_DELIVERY_LIMIT),
        };
        let queue = AmqpQueue::connect(amqp, &pool, options, args.amqp_management_url.as_deref())
            .await
            .map_err(|e| format!("RabbitMQ at {amqp}: {e}"))?;
        let ledger = RedisLedger::connect(redis, KEY_PREFIX)
            .await
            .map_err(|e| format!("Redis at {redis}: {e}"))?;
        let registry = RedisRegistry::connect(redis, KEY_PREFIX)
            .await
            .map_err(|e| format!("Redis at {redis}: {e}"))?;
        Ok(Fleet {
            queue: Arc::new(queue),
            ledger: Arc::new(ledger),
            registry: Arc::new(registry),
            s3: args.s3(),
            pool,
        })
    }
}

/// What the registry holds for a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    pub spec: JobSpec,
    /// Seconds since the Unix epoch.
    pub submitted_at: f64,
    /// The pool that serves it.
    pub pool: String,
}

impl JobRecord {
    pub fn new(spec: JobSpec, pool: &str) -> JobRecord {
        JobRecord {
            spec,
            submitted_at: unix_now(),
            pool: pool.to_owned(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a job record always encodes")
    }

    pub fn decode(bytes: &[u8]) -> Result<JobRecord, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("job record does not decode: {e}"))
    }
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Storage for a location: a local folder or an S3 prefix.
pub async fn open_storage(
    location: &Location,
    s3: &S3Settings,
) -> Result<Arc<dyn Storage>, StorageError> {
    Ok(match location {
        Location::Local(path) => Arc::new(LocalStorage::new(path)),
        Location::S3 { bucket, prefix } => Arc::new(S3Storage::new(bucket, prefix, s3).await?),
    })
}

/// Ships a job's code to its output storage when the output is on S3 (workers elsewhere
/// cannot read the submitter's disk): the source directory (or the entry script alone)
/// goes under `_fleetrun/code/<sha256>/`, and the spec is rewritten to point there.
/// Content-addressed: the same code is stored once, whatever number of jobs run it.
pub async fn ship_code(mut spec: JobSpec, s3: &S3Settings) -> Result<JobSpec, String> {
    let Location::S3 { bucket, prefix } = &spec.output else {
        return Ok(spec);
    };
    let Location::Local(entry) = &spec.entry_script else {
        return Ok(spec);
    };
    let (root, files) = match &spec.source_directory {
        Some(Location::Local(dir)) => (
            dir.clone(),
            list_code(dir).map_err(|e| format!("{}: {e}", dir.display()))?,
        ),
        Some(Location::S3 { .. }) => return Ok(spec),
        None => {
            let dir = entry.parent().unwrap_or(Path::new("/")).to_path_buf();
            let name = entry
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (dir, vec![name])
        }
    };
    let rel_entry = entry
        .strip_prefix(&root)
        .map_err(|_| {
            format!(
                "entry_script {} is not inside source_directory {}",
                entry.display(),
                root.display()
            )
        })?
        .to_string_lossy()
        .replace('\\', "/");
    let mut hasher = Sha256::new();
    let mut contents = Vec::with_capacity(files.len());
    for rel in &files {
        let body = std::fs::read(root.join(rel)).map_err(|e| format!("{rel}: {e}"))?;
        hasher.update(rel.as_bytes());
        hasher.update([0]);
        hasher.update((body.len() as u64).to_be_bytes());
        hasher.update(&body);
        contents.push(body);
    }
    let hash = format!("{:x}", hasher.finalize());
    let code_prefix = join_key(&join_key(prefix, CODE_PREFIX), &hash);
    let storage = S3Storage::new(bucket, &code_prefix, s3)
        .await
        .map_err(|e| e.to_string())?;
    for (rel, body) in files.iter().zip(contents) {
        storage
            .put(rel, Bytes::from(body))
            .await
            .map_err(|e| format!("shipping {rel}: {e}"))?;
    }
    spec.entry_script = Location::S3 {
        bucket: bucket.clone(),
        prefix: join_key(&code_prefix, &rel_entry),
    };
    spec.source_directory = Some(Location::S3 {
        bucket: bucket.clone(),
        prefix: code_prefix,
    });
    Ok(spec)
}

/// The files of a source directory, relative, in a stable order; caches and virtualenvs
/// are left behind.
fn list_code(dir: &Path) -> std::io::Result<Vec<String>> {
    const SKIP: [&str; 5] = ["__pycache__", ".git", ".venv", "venv", ".mypy_cache"];
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if SKIP.contains(&name.as_str()) {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Brings shipped code to this machine (once per code hash) and points the spec at it.
async fn stage_code(mut spec: JobSpec, cache: &Path, s3: &S3Settings) -> Result<JobSpec, String> {
    let (
        Location::S3 {
            bucket,
            prefix: entry_key,
        },
        Some(Location::S3 {
            prefix: root_key, ..
        }),
    ) = (&spec.entry_script, &spec.source_directory)
    else {
        return Ok(spec);
    };
    let hash = root_key.rsplit('/').next().unwrap_or_default();
    let local_root = cache.join("code").join(hash);
    let rel_entry = entry_key
        .strip_prefix(root_key.as_str())
        .unwrap_or(entry_key)
        .trim_start_matches('/');
    if !local_root.join(".complete").exists() {
        let storage = S3Storage::new(bucket, root_key, s3)
            .await
            .map_err(|e| e.to_string())?;
        let partial = cache
            .join("code")
            .join(format!("{hash}.partial-{}", std::process::id()));
        let objects: Vec<_> = storage
            .list("")
            .try_collect()
            .await
            .map_err(|e| e.to_string())?;
        for object in objects {
            // An object key never names a path outside the staging folder.
            check_key(&object.key).map_err(|e| e.to_string())?;
            let body = storage.get(&object.key).await.map_err(|e| e.to_string())?;
            let path = partial.join(&object.key);
            tokio::fs::create_dir_all(path.parent().unwrap_or(&partial))
                .await
                .map_err(|e| e.to_string())?;
            tokio::fs::write(&path, &body)
                .await
                .map_err(|e| e.to_string())?;
        }
        tokio::fs::write(partial.join(".complete"), b"")
            .await
            .map_err(|e| e.to_string())?;
        if tokio::fs::rename(&partial, &local_root).await.is_err() {
            // Another slot staged it first.
            let _ = tokio::fs::remove_dir_all(&partial).await;
        }
    }
    spec.entry_script = Location::Local(local_root.join(rel_entry));
    spec.source_directory = Some(Location::Local(local_root));
    Ok(spec)
}

/// How a worker node runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub node_id: String,
    pub processes: usize,
    pub prefetch: u16,
    pub runner_exe: PathBuf,
    /// Staged code, inputs and (for S3 outputs) logs before upload.
    pub cache_dir: PathBuf,
    /// GPUs on this node.
    pub gpus: usize,
}

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
                staging_dir: config.cache_dir.join("staging"),
                warm_job: None,
                gpus: config.gpus,
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
    // The agent is gone, and with it the events' sender: the finisher ends once it has
    // finalized a job this node saw complete (nobody else would), unless told to stop now.
    tokio::select! {
        _ = &mut finisher => {}
        _ = abort.cancelled() => finisher.abort(),
    }
    for ctx in jobs.all() {
        ctx.logs.flush();
        upload_logs(&ctx, &config.node_id).await;
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
            if ctx.spec.node_count <= 1 {
                fail_job(
                    fleet,
                    &ctx,
                    &format!("no runner process could start: {reason}"),
                )
                .await;
            } else {
                warn!(job = %job, node, "This node gave up on the job; other nodes keep serving it.");
                let processes = ctx
                    .spec
                    .process_count_per_node
                    .unwrap_or(jobs.config.processes as u32);
                tokio::spawn(recheck_given_up(fleet.clone(), ctx, processes, reason));
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
                check_init_failures(fleet, &ctx, processes, failures, &last).await;
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
    let Some(age) = job_age(&fleet, &ctx.id).await else {
        return;
    };
    let spec = &ctx.spec;
    let rule_2 = gave_up + agent::INIT_FAILURE_GRACE.saturating_sub(age) + Duration::from_secs(1);
    let timeout = spec.run_invocation_timeout;
    let stalled =
        gave_up + Duration::from_secs(3 * timeout + 30 + u64::from(spec.run_max_try) * timeout + 5);
    let mut checks = [rule_2, stalled];
    checks.sort();
    for at in checks {
        tokio::time::sleep_until(at).await;
        let Ok(Some(status)) = fleet.ledger.status(&ctx.id).await else {
            continue;
        };
        if status.state != JobState::Running {
            return;
        }
        if let Ok(failures) = fleet.registry.init_failures(&ctx.id).await
            && check_init_failures(&fleet, &ctx, processes, failures, &reason).await
        {
            return;
        }
        if at == stalled && status.done == 0 {
            let waited = gave_up.elapsed().as_secs();
            let why = format!(
                "no mini-batch has ended on any node {waited}s after this one gave up on the job: {reason}"
            );
            fail_job(&fleet, &ctx, &why).await;
            return;
        }
    }
}

/// Fails a Running job and writes its result, if this call moved it.
async fn fail_job(fleet: &Fleet, ctx: &JobContext, reason: &str) {
    if let Ok((true, status)) = fleet
        .ledger
        .transition(
            &ctx.id,
            &[JobState::Running],
            JobState::Failed,
            Some(reason),
        )
        .await
    {
        info!(job = %ctx.id, "Job ended: {reason}.");
        write_job_result(ctx, &status).await;
    }
}

/// How long ago the job was submitted, from its record.
async fn job_age(fleet: &Fleet, job: &str) -> Option<Duration> {
    let bytes = fleet.registry.record(job).await.ok()??;
    let record = JobRecord::decode(&bytes).ok()?;
    Some(Duration::from_secs_f64(
        (unix_now() - record.submitted_at).max(0.0),
    ))
}

/// Fails the job if its init failures over all nodes break CONTRACT §5 rule 2; `detail`
/// ends the reason. True if the rule fails the job.
async fn check_init_failures(
    fleet: &Fleet,
    ctx: &JobContext,
    processes: u32,
    failures: u64,
    detail: &str,
) -> bool {
    let Some(age) = job_age(fleet, &ctx.id).await else {
        return false;
    };
    let Some(reason) = agent::init_failures_fail_job(ctx.spec.node_count, processes, failures, age)
    else {
        return false;
    };
    fail_job(fleet, ctx, &format!("{reason}; {detail}")).await;
    true
}

/// Concludes a job whose state a recording just moved (the caller saw `transitioned`), or
/// one found Finalizing: finalizes it if every mini-batch is done and this node can claim
/// the finalization, then writes `logs/job_result.txt`. Returns `Finalizing` when another
/// node holds the claim (and writes nothing).
pub async fn conclude(ledger: &dyn Ledger, ctx: &JobContext, status: Status) -> JobState {
    let state = if status.state == JobState::Finalizing {
        match finalize_claimed(ledger, ctx).await {
            // Another node holds the claim, or took it over while this one worked.
            None | Some(JobState::Finalizing) => return JobState::Finalizing,
            Some(state) => state,
        }
    } else {
        status.state
    };
    let status = ledger
        .status(&ctx.id)
        .await
        .ok()
        .flatten()
        .unwrap_or(status);
    info!(job = %ctx.id, state = %state, "Job ended.");
    write_job_result(ctx, &status).await;
    state
}

/// Finalizes the job if this node can claim it, renewing the claim while it works; `None`
/// if another node holds it (or this node is at it already).
async fn finalize_claimed(ledger: &dyn Ledger, ctx: &JobContext) -> Option<JobState> {
    if ctx.finalizing.swap(true, Ordering::Relaxed) {
        return None;
    }
    let claim = || ledger.claim_finalization(&ctx.id, &ctx.finalizer, FINALIZE_LEASE);
    let state = if claim().await.unwrap_or(false) {
        let finalize = finalize_job(ledger, ctx);
        tokio::pin!(finalize);
        Some(loop {
            tokio::select! {
                state = &mut finalize => break state,
                _ = tokio::time::sleep(FINALIZE_LEASE / 3) => {
                    if let Err(e) = claim().await {
                        warn!(job = %ctx.id, error = %e, "Cannot renew the finalization claim.");
                    }
                }
            }
        })
    } else {
        None
    };
    ctx.finalizing.store(false, Ordering::Relaxed);
    state
}

/// Joins the parts and completes the job; for the holder of the finalization claim, who
/// alone may fail the job over an output it could not write. The parts are removed only
/// once the job is Completed, so a finalizer that took over from a stalled one never finds
/// them gone.
async fn finalize_job(ledger: &dyn Ledger, ctx: &JobContext) -> JobState {
    let still_held = || async {
        ledger
            .claim_finalization(&ctx.id, &ctx.finalizer, FINALIZE_LEASE)
            .await
            .unwrap_or(false)
    };
    parts::finish_job(
        ledger,
        &ctx.id,
        &ctx.spec,
        &*ctx.output,
        &*ctx.parts,
        still_held,
    )
    .await
}

/// Writes `logs/job_result.txt` into the job's output.
pub async fn write_job_result(ctx: &JobContext, status: &Status) {
    let mut text = format!(
        "Job: {}\nResult: {}\nMini-batches: {} processed of {}\nItems: {} succeeded, {} failed (error_threshold {})\nMini-batches failed: {}\n",
        ctx.id,
        status.state,
        status.done,
        status
            .total
            .map_or_else(|| "?".to_owned(), |t| t.to_string()),
        status.items_succeeded,
        status.items_failed,
        ctx.spec.error_threshold,
        status.batches_failed,
    );
    if let Some(reason) = &status.reason {
        text.push_str(&format!("Cause: {reason}\n"));
    }
    if let Err(e) = ctx
        .output
        .put("logs/job_result.txt", Bytes::from(text))
        .await
    {
        warn!(job = %ctx.id, error = %e, "Cannot write job_result.txt.");
    }
}

/// Dead-lettered mini-batches count as failed in their job's ledger, so a crash loop can
/// neither stall a job nor hide from its error count. Messages that do not decode stay in
/// the dead-letter queue for operators: this consumer holds them unacknowledged.
async fn record_dead_letters(fleet: Fleet, jobs: Arc<FleetJobs>, drain: CancellationToken) {
    const HOLD: u16 = 1_000;
    let mut consumer = match fleet.queue.consume_dead(HOLD).await {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "Cannot consume the dead-letter queue.");
            return;
        }
    };
    let mut held = Vec::new();
    loop {
        let delivery = tokio::select! {
            _ = drain.cancelled() => return,
            d = consumer.next() => d,
        };
        let delivery = match delivery {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "Reading the dead-letter queue failed; retrying.");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Ok(batch) = MiniBatch::decode(&delivery.body) else {
            held.push(delivery);
            continue;
        };
        let reason = delivery
            .dead_reason
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let disposition = match jobs.get(&batch.job).await {
            Ok(Some(ctx)) => {
                let cause = format!("dead-lettered by the broker ({reason})");
                match agent::record_failed_batch(
                    &*fleet.ledger,
                    &ctx,
                    &batch,
                    delivery.attempt,
                    &cause,
                )
                .await
                {
                    Ok(recorded) => {
                        if recorded.transitioned {
                            conclude(&*fleet.ledger, &ctx, recorded.status).await;
                        }
                        Disposition::Ack
                    }
                    Err(_) => Disposition::Requeue,
                }
            }
            // A job this pool does not know: keep it for operators.
            _ => {
                held.push(delivery);
                continue;
            }
        };
        let _ = delivery.settle(disposition).await;
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

async fn adopt_once(fleet: &Fleet, jobs: &FleetJobs) -> Result<(), String> {
    let pool = &fleet.pool;
    for job in fleet
        .registry
        .unfinished(pool)
        .await
        .map_err(|e| e.to_string())?
    {
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
            fleet.ledger.retire(job, KEEP_ENDED_JOBS).await?;
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

struct FleetJobs {
    fleet: Fleet,
    config: WorkerConfig,
    contexts: Mutex<HashMap<String, Arc<JobContext>>>,
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

    async fn load(&self, job: &str) -> Result<Option<Arc<JobContext>>, String> {
        let Some(bytes) = self
            .fleet
            .registry
            .record(job)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let record = JobRecord::decode(&bytes)?;
        let spec = stage_code(record.spec, &self.config.cache_dir, &self.fleet.s3).await?;
        let fleetrun_config::Input::Files(input_location) = &spec.input;
        let input = open_storage(input_location, &self.fleet.s3)
            .await
            .map_err(|e| e.to_string())?;
        let output = open_storage(&spec.output, &self.fleet.s3)
            .await
            .map_err(|e| e.to_string())?;
        let log_dir = match &spec.output {
            Location::Local(dir) => dir.join("logs"),
            Location::S3 { .. } => self.config.cache_dir.join("jobs").join(job).join("logs"),
        };
        let logs = Arc::new(JobLogs::for_node(log_dir, &self.config.node_id));
        let parts = parts::for_job(
            output.clone(),
            job,
            &parts::writer_name(&self.config.node_id),
        );
        let ctx = Arc::new(JobContext::new(
            job.to_owned(),
            spec,
            input,
            output,
            parts,
            logs,
        ));
        tokio::spawn(watch_job(
            self.fleet.ledger.clone(),
            ctx.clone(),
            self.config.node_id.clone(),
            self.stop.clone(),
        ));
        Ok(Some(ctx))
    }
}

#[async_trait]
impl Jobs for FleetJobs {
    async fn get(&self, job: &str) -> Result<Option<Arc<JobContext>>, String> {
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
/// it no longer runs, flushes its logs now and then, and uploads them at the end.
async fn watch_job(
    ledger: Arc<dyn Ledger>,
    ctx: Arc<JobContext>,
    node: String,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
        ctx.logs.flush();
        match ledger.status(&ctx.id).await {
            Ok(Some(status)) if status.state == JobState::Finalizing => {
                // Whoever finalizes it may have died: take over once its claim runs out.
                ctx.stop.cancel();
                conclude(&*ledger, &ctx, status).await;
            }
            Ok(Some(status)) if !status.state.accepts_work() => {
                ctx.stop.cancel();
                if status.state.is_terminal() {
                    ctx.logs.flush();
                    upload_logs(&ctx, &node).await;
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => warn!(job = %ctx.id, error = %e, "Cannot read the job's state."),
        }
    }
}

/// Copies this node's log files of a job whose output is on S3 under `<output>/logs/`.
async fn upload_logs(ctx: &JobContext, node: &str) {
    // Local outputs hold the logs already; a node that wrote none has nothing to send.
    if ctx.spec.output.as_local().is_some() || !ctx.logs.dir().is_dir() {
        return;
    }
    let logs = LocalStorage::new(ctx.logs.dir());
    let mut listing = logs.list("");
    while let Some(object) = listing.next().await {
        let copied = match object {
            Ok(object) => match logs.get(&object.key).await {
                Ok(body) => ctx.output.put(&format!("logs/{}", object.key), body).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = copied {
            warn!(job = %ctx.id, node, error = %e, "Cannot upload a log file.");
        }
    }
}
