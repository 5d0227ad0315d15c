//! The jobs a node serves: a job's record turned into what the node needs to run it (its
//! code and side inputs staged, its storages opened, its seats and place), loaded once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use fleetrun_config::Location;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::code::stage_code;
use super::driver::StopRules;
use super::error::JobError;
use super::leases::{BEAT_TTL, FOLLOW_TTL};
use super::lifecycle::Job;
use super::node_job::NodeJob;
use super::record::JobRecord;
use super::settings::{Fleet, open_input, open_storage};
use super::side::{Held, stage_side};
use super::watch::watch_job;
use crate::agent::{self, JobContext, Jobs};
use crate::logs::JobLogs;
use crate::parts;
use crate::worker_config::WorkerConfig;

pub(super) struct FleetJobs {
    pub(super) fleet: Fleet,
    pub(super) config: WorkerConfig,
    pub(super) contexts: Mutex<HashMap<String, Arc<JobContext>>>,
    /// What each job this node serves holds on it until the job ends here: its side inputs
    /// and models in the cache, its runners' working folders.
    pub(super) held: Arc<Mutex<HashMap<String, NodeJob>>>,
    /// The stop rules of the pool's Running jobs this node does not serve (none of their
    /// mini-batches reached it): a job whose submitter died before publishing anything is
    /// watched too.
    pub(super) unserved: Mutex<HashMap<String, StopRules>>,
    /// One job is loaded at a time, so slots asking for the same new job load it once.
    pub(super) loading: tokio::sync::Mutex<()>,
    pub(super) stop: CancellationToken,
    /// Told when a job of the pool starts or ends (see `serve::follow_changes`).
    pub(super) changed: tokio::sync::Notify,
}

impl FleetJobs {
    pub(super) fn cached(&self, job: &str) -> Option<Arc<JobContext>> {
        self.contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(job)
            .cloned()
    }

    pub(super) fn all(&self) -> Vec<Arc<JobContext>> {
        self.contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Loads the job for its `run` at least (the ledger's, when it is further on).
    async fn load(&self, job: &str, run: u32) -> Result<Option<Arc<JobContext>>, JobError> {
        let Some(bytes) = self.fleet.registry.record(job).await? else {
            return Ok(None);
        };
        // Noted before the job's state is read: a job that ends after that read is waited
        // for by whoever waits for its end, and one that ended before it gets no writes.
        let node = &self.config.node_id;
        if let Err(e) = self.fleet.registry.follow(job, node, FOLLOW_TTL).await {
            warn!(job, error = %e, "Cannot note that this node follows the job.");
        }
        let status = self.fleet.ledger.status(job).await?;
        let ended = status.as_ref().is_some_and(|s| s.state.is_terminal());
        let run = match status {
            Some(status) => status.run.max(run),
            None => run,
        };
        let record = JobRecord::decode(&bytes)?;
        let cache = &self.config.cache_dir;
        let mut held = Held::default();
        let spec = stage_code(record.spec, cache, &self.fleet.s3, &mut held).await?;
        let spec = match stage_side(spec.clone(), cache, &self.fleet.s3, &mut held).await {
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
                spec
            }
        };
        if let Err(e) = held.evict_others(cache).await {
            warn!(job, error = %e, "Cannot evict unused entries from the node's cache.");
        }
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
        if ended {
            // Its end may have been waited for already: this node writes nothing for it.
            logs.close();
        }
        let processes = job_processes(&self.config, &spec);
        let writer = parts::writer_name(&self.config.node_id);
        let work = agent::workdir::job_work_dir(&self.config.cache_dir, job, &self.config.node_id);
        let named = agent::named::NamedOutputs::open(&spec, work, &self.fleet.s3).await?;
        let handle = Job::new(job, spec, record.submitted_at, &self.fleet, output, &writer);
        let ctx = Arc::new(
            JobContext::new(handle, input, logs)
                .with_named(named)
                // `fleetrun run` is the job's one node; fleet nodes take one of its places.
                .with_seats(processes, !self.config.sole_node)
                .for_run(run)
                .counted_in(self.config.metrics.clone()),
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
pub(super) fn job_processes(config: &WorkerConfig, spec: &fleetrun_config::JobSpec) -> usize {
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
    async fn live(&self) -> Result<Vec<String>, JobError> {
        Ok(self.fleet.registry.unfinished(&self.fleet.pool).await?)
    }

    async fn changed(&self) {
        self.changed.notified().await;
    }

    async fn claim_place(&self, ctx: &JobContext) -> bool {
        if ctx.node.has_place() {
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
                ctx.node.set_place(held);
                held
            }
            Err(e) => {
                warn!(job = %ctx.job.id(), error = %e, "Cannot claim a place in the job.");
                false
            }
        }
    }

    async fn get(&self, job: &str) -> Result<Option<Arc<JobContext>>, JobError> {
        self.get_for_run(job, 0).await
    }

    async fn get_for_run(&self, job: &str, run: u32) -> Result<Option<Arc<JobContext>>, JobError> {
        let current = |ctx: &Arc<JobContext>| ctx.run() >= run;
        if let Some(ctx) = self.cached(job).filter(current) {
            return Ok(Some(ctx));
        }
        let _one_at_a_time = self.loading.lock().await;
        if let Some(ctx) = self.cached(job).filter(current) {
            return Ok(Some(ctx));
        }
        if let Some(earlier) = self.cached(job) {
            info!(job = %job, run, "The job was resumed: serving its new run.");
            earlier.stop.cancel();
        }
        let ctx = self.load(job, run).await?;
        if let Some(ctx) = &ctx {
            self.contexts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(job.to_owned(), ctx.clone());
        }
        Ok(ctx)
    }
}
