//! Why a mini-batch's inputs were not staged: an item's failure, or the node's (kept apart
//! from `stage` so that `tabular`, which stages chunks, and `stage` both read it).

use fleetrun_common::storage::StorageError;

use crate::scratch::FolderError;

/// Why a mini-batch's inputs were not staged: an item's failure, or the node's.
#[derive(Debug, thiserror::Error)]
pub(super) enum StageError {
    /// An input object cannot be read (missing, refused, not a valid key) or cannot be a
    /// file under its key: the attempt fails, as the item's failure.
    #[error(transparent)]
    Input(StorageError),
    /// The storage did not answer within its client's retries (throttled, failing,
    /// unreachable): the infrastructure's fault, not the item's; the mini-batch goes back
    /// untried.
    #[error(transparent)]
    Unavailable(StorageError),
    /// The node's staging folder cannot take the copies: a system error, not the item's.
    #[error(transparent)]
    Scratch(#[from] FolderError),
    /// Staging took longer than the job's `task_overhead_timeout` (seconds): the attempt
    /// fails, as a `run()` that overran would.
    #[error("staging the inputs took longer than task_overhead_timeout ({0} s)")]
    Overran(u64),
}

impl From<StorageError> for StageError {
    fn from(e: StorageError) -> StageError {
        if e.is_transient() {
            StageError::Unavailable(e)
        } else {
            StageError::Input(e)
        }
    }
}
