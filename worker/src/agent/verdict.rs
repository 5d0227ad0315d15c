//! A slot's verdict on a delivery ([`Verdict`]), decided once by its attempt and carried out
//! by the slot: settle it, finish it, isolate its mini-batch, or run it again.

use std::sync::Arc;

use fleetrun_common::queue::{Delivery, Disposition};
use fleetrun_common::wire::MiniBatch;

use super::JobContext;
use super::finish::Finish;

/// What to do with a delivery, decided once.
pub(super) enum Verdict {
    Settle(Disposition),
    /// The job no longer runs: drop the message.
    Drop,
    /// `run()` succeeded: store the part and record the outcome, then settle with what that
    /// gives ([`Finish::settle`]). Done in the background, so the runner gets its next
    /// mini-batch at once.
    Finish(Box<Finish>),
    /// The mini-batch failed its attempts, or runs out of GPU memory: run it in pieces
    /// (isolating its failed items, or at the size that fits) once the runner has nothing
    /// else queued.
    Isolate(Box<Isolation>),
    /// The mini-batch ran, but its reply was lost with its runner, which died in `culprit`,
    /// sent after it (settled first, as its verdict says): it runs again first, on the
    /// slot's next runner, its attempt not spent.
    Again {
        batch: Box<MiniBatch>,
        culprit: Box<(Delivery, Verdict)>,
    },
}

/// A mini-batch to run in pieces, once its slot's runner has nothing else queued.
pub(super) struct Isolation {
    pub(super) ctx: Arc<JobContext>,
    pub(super) batch: MiniBatch,
    /// The attempts it spent whole (for [`Why::Failed`]), or the delivery's number.
    pub(super) attempts: u32,
    pub(super) why: Why,
}

/// Why a mini-batch runs in pieces: one mechanism, two causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// It failed its attempts: a piece that fails is halved, down to the items that fail
    /// alone.
    Failed,
    /// It does not fit the GPU's memory: it runs in pieces of the size that fits, a piece
    /// that runs out is halved and the node keeps the smaller size. This is its attempt,
    /// spent only if a piece fails otherwise.
    OutOfMemory,
}

/// Whether a mini-batch can run in pieces: it holds several files. A tabular mini-batch (its
/// rows are not the script's items one by one) and a partition (`run()` is meant to see it
/// whole) run whole.
pub(super) fn divisible(batch: &MiniBatch) -> bool {
    batch.items.len() > 1 && batch.chunks.is_empty() && batch.partition.is_none()
}

/// Whether a mini-batch that failed its attempts is isolated rather than failed whole: the
/// job isolates, and the mini-batch is [`divisible`].
pub(super) fn isolates(ctx: &JobContext, batch: &MiniBatch) -> bool {
    ctx.job.spec().isolate_failures && divisible(batch)
}

/// Whether a mini-batch starts in pieces: it is [`divisible`] and larger than the size that
/// fits the GPU's memory on this node.
pub(super) fn splits(ctx: &JobContext, batch: &MiniBatch) -> bool {
    divisible(batch) && ctx.node.fit.splits(batch.items.len())
}
