//! What a job holds on a node while the node serves it.

use super::side::Held;

/// What a job holds on this node while it runs here; released when dropped.
pub(super) struct NodeJob {
    /// Its code's, side inputs' and models' cache entries.
    pub(super) _held: Held,
    /// Its runners' working folders, removed with it.
    pub(super) work: std::path::PathBuf,
}

impl Drop for NodeJob {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}
