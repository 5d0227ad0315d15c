//! How a worker node runs: one configuration, read by the node's job handling (`job/`)
//! and its agent (`agent/`) alike.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a worker node runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This node's id in logs (`sys/node/<node_id>/…`).
    pub node_id: String,
    /// Runner slots (processes) on this node.
    pub processes: usize,
    /// Unsettled deliveries each slot may hold.
    pub prefetch: u16,
    pub runner_exe: PathBuf,
    /// Starts the runners ([`crate::process::ProcessLauncher`] but in flow tests).
    pub launcher: Arc<dyn crate::process::Launcher>,
    /// The node's cache: staged code, side inputs and models, inputs (`staging/`), runners'
    /// working folders and (for S3 outputs) logs before upload.
    pub cache_dir: PathBuf,
    /// GPUs on this node, handed to runners (CONTRACT.md §3).
    pub gpus: usize,
    /// Start every slot's runner for this job before taking work (`fleetrun run`).
    pub warm_job: Option<String>,
    /// This worker is the job's only node (`fleetrun run`): its log files take the names
    /// CONTRACT §7 gives them, with no node id in them.
    pub sole_node: bool,
    /// What the node counts, for `/metrics`.
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl WorkerConfig {
    /// Where inputs that are not local files are staged: `staging/` in the cache.
    pub fn staging_dir(&self) -> PathBuf {
        self.cache_dir.join("staging")
    }

    /// The node's cache folder: it holds the staging folder and the working folders.
    pub fn cache(&self) -> &Path {
        &self.cache_dir
    }
}
