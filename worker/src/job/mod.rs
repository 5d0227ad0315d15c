//! Serving a pool's jobs on a fleet: RabbitMQ for mini-batches, Redis for the ledger and the
//! job registry, S3 (or a shared folder) for data.
//!
//! Everything a worker needs to serve a job it has never seen is in the registry's
//! [`JobRecord`]: the validated spec and, when the job's code was shipped, where it is. A
//! worker stages the code once per job into its cache, opens the job's storages, and serves
//! the job like any other until the ledger says it no longer runs.
//!
//! # Layout
//!
//! - `driver`: a job's stop rules, watched by every node that serves it and by a waiting
//!   submitter.
//! - `settings`: where the fleet's services are, connecting to them, a worker's settings.
//! - `record`: the job record kept in the registry.
//! - `code`: shipping a job's code to S3 and staging it on a worker.
//! - `side`: staging a job's side inputs and models into the node's cache, shared by jobs.
//! - `serve`: a node's composition root: the agent, its events, the pool's beat.
//! - `load`: a job's record turned into what a node needs to run it.
//! - `watch`: watching one job a node serves, in the ledger.
//! - `leases`: how long a node's beat and its note that it follows a job last.
//! - `node_job`: what a job holds on a node while the node serves it.
//! - `adopt`: the pool's jobs no node looks after: orphans, unserved jobs, given-up ones.
//! - `lifecycle`: the [`Job`] handle, the one mover of a job's state and writer of its
//!   result files.
//! - `notify`: a job's webhook (`notify_url`), signed, retried, in the background.
//! - `results`: what a job tells its user: its overview while it runs, its result when it
//!   ends.
//! - `manifest`: a job's manifest, `logs/manifest.json`: what ran, over what, what it
//!   produced, signed.
//! - `finalize`: concluding a job: its finalization, its result, failing it.
//! - `dead_letters`: dead-lettered mini-batches, recorded against their job.

mod adopt;
mod code;
mod dead_letters;
mod driver;
mod error;
mod finalize;
mod leases;
mod lifecycle;
mod load;
pub mod manifest;
mod node_job;
pub mod notify;
mod record;
mod results;
mod serve;
mod settings;
mod side;
mod watch;

pub use crate::worker_config::WorkerConfig;
pub use code::{CODE_PREFIX, code_digest, ship_code};
pub use driver::{Ending, INIT_FAILURE_GRACE, Stop, StopRules, init_failures_fail_job};
pub use error::{JobError, SettingsError};
pub use finalize::conclude;
pub use lifecycle::{Job, output_location};
pub use record::{JobRecord, Publication, unix_now};
pub use results::{RUNNERS_CSV, overview_text, result_text, time_line};
pub use serve::serve;
pub use settings::{
    DEFAULT_POOL, Fleet, FleetArgs, KEEP_ENDED_JOBS, KEY_PREFIX, NewPool, POOL_DELIVERY_LIMIT,
    open_input, open_storage, tabular_root,
};
pub use side::{SHIPPED_PREFIX, SIDE_DIR, UNUSED_CAP_VAR, evict, ship_side};
pub use watch::serving;
