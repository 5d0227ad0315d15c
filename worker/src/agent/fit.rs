//! The mini-batch size that fits a job's runners' GPU memory on this node ([`Fit`]): none
//! until a `run()` runs out of memory; then the size of the piece that ran out, halved,
//! down to the largest size that ran well. A mini-batch larger than the size is run in
//! pieces of it (see `isolate`), so the node's next mini-batches start at the size that
//! fits instead of running out again.
//!
//! A piece no larger than a size that ran well is halved for itself, the node's size left
//! alone: one item needing more memory than the others is likelier than a GPU that holds
//! less. A GPU that does hold less (a neighbour took memory) shows as [`DOUBTS`] such pieces
//! running out with none running well at the size in between: the size is halved then.
//!
//! The size grows back by one item after [`GROW_AFTER`] pieces in a row ran well at it (the
//! memory a script needs may depend on its items, and a neighbour may have left the GPU);
//! each time a grown size runs out again, the run of pieces needed before the next try
//! doubles, up to [`GROW_AFTER_MAX`], so a size that is at its limit is tried rarely.

use std::ops::Range;
use std::sync::Mutex;

/// Pieces in a row that ran well at the size before it grows by one item.
pub(super) const GROW_AFTER: u32 = 16;
/// The most pieces in a row ever asked for before the size grows.
pub(super) const GROW_AFTER_MAX: u32 = 1024;
/// Pieces no larger than a size that ran well that may run out, with none running well at
/// the size in between, before the size that ran well is no longer believed.
pub(super) const DOUBTS: u32 = 4;

/// The size that fits, as the pure rules keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sizes {
    /// The most items a piece holds; `None` while nothing ran out of memory.
    pub(super) size: Option<usize>,
    /// The largest piece that ran well, below any that ran out since.
    good: usize,
    /// Pieces in a row that ran well at `size`.
    streak: u32,
    /// Pieces in a row needed before `size` grows.
    grow_after: u32,
    /// Pieces no larger than `good` that ran out since one ran well at the size.
    doubts: u32,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            size: None,
            good: 0,
            streak: 0,
            grow_after: GROW_AFTER,
            doubts: 0,
        }
    }
}

impl Sizes {
    /// A piece of `items` items (more than one) ran out of memory: the size becomes half
    /// of it (rounded up), or the largest size that ran well when that is more, and always
    /// less than `items`; but a piece no larger than a size that ran well is only halved
    /// (see the module's docs). Returns the most items the piece's pieces hold (at least 1).
    pub(super) fn ran_out(&mut self, items: usize) -> usize {
        let below = items.saturating_sub(1).max(1);
        if self.good >= items {
            self.doubts += 1;
            if self.doubts < DOUBTS {
                return items.div_ceil(2).min(below);
            }
            // What ran well before does not now, again and again: the GPU holds less.
            self.good = 0;
            self.doubts = 0;
        }
        if self.good > 0 && self.good + 1 == items {
            // A grown size ran out: the next try waits twice as long.
            self.grow_after = (self.grow_after * 2).min(GROW_AFTER_MAX);
        }
        let size = items.div_ceil(2).max(self.good).min(below);
        self.size = Some(self.size.map_or(size, |s| s.min(size).max(1)));
        if self.size.is_some_and(|s| s < self.good) {
            self.good = 0;
        }
        self.streak = 0;
        self.size.unwrap_or(1)
    }

    /// A piece of `items` items ran well: after [`Sizes::grow_after`] of them in a row at
    /// the size, it grows by one item.
    pub(super) fn ran_well(&mut self, items: usize) {
        let Some(size) = self.size else {
            return;
        };
        self.good = self.good.max(items.min(size));
        if items < size {
            return;
        }
        self.doubts = 0;
        self.streak += 1;
        if self.streak >= self.grow_after {
            self.size = Some(size + 1);
            self.streak = 0;
        }
    }
}

/// The size that fits on this node, shared by the job's slots (see the module's docs).
#[derive(Debug, Default)]
pub struct Fit(Mutex<Sizes>);

impl Fit {
    /// The most items a piece holds; `None` while nothing ran out of memory.
    pub fn size(&self) -> Option<usize> {
        self.lock().size
    }

    /// Whether a mini-batch of `items` items is run in pieces.
    pub(super) fn splits(&self, items: usize) -> bool {
        self.size().is_some_and(|size| items > size)
    }

    /// See [`Sizes::ran_out`].
    pub(super) fn ran_out(&self, items: usize) -> usize {
        self.lock().ran_out(items)
    }

    /// See [`Sizes::ran_well`].
    pub(super) fn ran_well(&self, items: usize) {
        self.lock().ran_well(items);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sizes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `items` (a range of a mini-batch's items) cut after its first `size` (at least one):
/// the piece to run, and the rest.
pub(super) fn cut(items: Range<usize>, size: usize) -> [Range<usize>; 2] {
    let middle = (items.start + size.max(1)).min(items.end);
    [items.start..middle, middle..items.end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_halves_down_to_what_ran_well() {
        let mut sizes = Sizes::default();
        assert_eq!(sizes.size, None);
        assert_eq!(sizes.ran_out(10), 5);
        assert_eq!(sizes.ran_out(5), 3);
        sizes.ran_well(3);
        assert_eq!(sizes.size, Some(3));
        // A piece of 1 never runs out into a size of 0.
        assert_eq!(Sizes::default().ran_out(1), 1);
        assert_eq!(Sizes::default().ran_out(2), 1);
    }

    #[test]
    fn the_size_grows_back_slowly_and_a_failed_growth_slows_the_next() {
        let mut sizes = Sizes::default();
        sizes.ran_out(10);
        sizes.ran_out(5);
        // Smaller pieces (a mini-batch's last) neither count nor break the run.
        for _ in 0..GROW_AFTER - 1 {
            sizes.ran_well(3);
            sizes.ran_well(1);
        }
        assert_eq!(sizes.size, Some(3));
        sizes.ran_well(3);
        assert_eq!(sizes.size, Some(4));
        // 4 runs out: back to 3, the largest that ran well, not to half of 4.
        assert_eq!(sizes.ran_out(4), 3);
        for _ in 0..GROW_AFTER * 2 - 1 {
            sizes.ran_well(3);
        }
        assert_eq!(sizes.size, Some(3), "the next try waits twice as long");
        sizes.ran_well(3);
        assert_eq!(sizes.size, Some(4));
    }

    #[test]
    fn a_piece_at_a_size_that_ran_well_is_halved_for_itself() {
        let mut sizes = Sizes::default();
        sizes.ran_out(10);
        sizes.ran_well(5);
        // One large item: its piece is halved, the size stays.
        assert_eq!(sizes.ran_out(5), 3);
        assert_eq!(sizes.ran_out(3), 2);
        assert_eq!(sizes.size, Some(5));
        sizes.ran_well(5);
        assert_eq!(sizes.ran_out(5), 3);
        assert_eq!(
            sizes.size,
            Some(5),
            "a piece that ran well cleared the doubts"
        );
    }

    #[test]
    fn a_size_that_keeps_running_out_is_halved() {
        let mut sizes = Sizes::default();
        sizes.ran_out(10);
        sizes.ran_well(5);
        // Something else took the GPU's memory: 5 no longer fits, piece after piece.
        for _ in 1..DOUBTS {
            assert_eq!(sizes.ran_out(5), 3);
            assert_eq!(sizes.size, Some(5));
        }
        assert_eq!(sizes.ran_out(5), 3);
        assert_eq!(sizes.size, Some(3));
    }

    #[test]
    fn a_cut_takes_the_first_items_and_leaves_the_rest() {
        assert_eq!(cut(0..10, 3), [0..3, 3..10]);
        assert_eq!(cut(5..10, 5), [5..10, 10..10]);
        assert_eq!(cut(2..4, 0), [2..3, 3..4]);
    }
}
