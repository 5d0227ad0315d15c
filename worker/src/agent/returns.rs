//! What a `run()` that returned means for its mini-batch: the rule for short and empty
//! returns, as Azure ML applies it (contract §1, "What `run()` returns").
//!
//! Each returned element counts one item succeeded. With `error_threshold` at 0 or more,
//! fewer elements than items count the gap as failed items and the mini-batch as failed
//! (not retried). With `error_threshold = -1` returns are not checked: the mini-batch
//! succeeds whatever `run()` returned, as Azure ML's many-models samples (`return []`
//! after saving a model per partition) rely on.

use std::cmp::Ordering;

use fleetrun_common::ledger::Outcome;

/// A returned `run()`'s outcome, and the note its report row carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub outcome: Outcome,
    /// Empty when `run()` returned one element per item.
    pub note: String,
    /// The mini-batch returned more elements than items (kept, flagged).
    pub more: bool,
}

/// `returned` elements for `items` items, under the job's `error_threshold`.
pub fn judge(returned: u64, items: u64, error_threshold: i64) -> Judged {
    let checked = error_threshold >= 0;
    match returned.cmp(&items) {
        Ordering::Less if checked => Judged {
            outcome: Outcome {
                succeeded: returned,
                failed: items - returned,
                batch_failed: true,
            },
            note: format!("returned {returned} elements for {items} items"),
            more: false,
        },
        Ordering::Less => Judged {
            outcome: all_succeeded(items),
            note: format!(
                "returned {returned} elements for {items} items; not checked (error_threshold = -1)"
            ),
            more: false,
        },
        Ordering::Greater => Judged {
            outcome: all_succeeded(items),
            note: format!("returned MORE elements than items: {returned} for {items}"),
            more: true,
        },
        Ordering::Equal => Judged {
            outcome: all_succeeded(items),
            note: String::new(),
            more: false,
        },
    }
}

/// The cause `failed_items.csv` gives each item of a mini-batch that returned short: which
/// of its items failed is not known, so every one is listed.
pub fn short_cause(returned: u64, items: u64) -> String {
    format!(
        "run() returned {returned} elements for {items} items; {} of them failed (which ones is not known)",
        items - returned
    )
}

const fn all_succeeded(items: u64) -> Outcome {
    Outcome {
        succeeded: items,
        failed: 0,
        batch_failed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_return_fails_its_mini_batch_and_the_gap_when_checked() {
        let judged = judge(98, 100, 0);
        assert_eq!(
            judged.outcome,
            Outcome {
                succeeded: 98,
                failed: 2,
                batch_failed: true
            }
        );
        assert_eq!(judged.note, "returned 98 elements for 100 items");
        let empty = judge(0, 121, 5);
        assert_eq!(empty.outcome, Outcome::all_failed(121));
    }

    #[test]
    fn error_threshold_minus_one_does_not_check_returns() {
        for returned in [0, 1, 120] {
            let judged = judge(returned, 121, -1);
            assert_eq!(judged.outcome, all_succeeded(121), "{returned}");
            assert!(judged.note.contains("not checked"), "{}", judged.note);
        }
    }

    #[test]
    fn full_and_long_returns_succeed_whatever_the_threshold() {
        for threshold in [-1, 0, 10] {
            assert_eq!(
                judge(5, 5, threshold),
                Judged {
                    outcome: all_succeeded(5),
                    note: String::new(),
                    more: false,
                }
            );
            let more = judge(7, 5, threshold);
            assert_eq!(more.outcome, all_succeeded(5));
            assert!(more.more);
        }
    }

    #[test]
    fn the_short_cause_says_how_many_failed() {
        assert_eq!(
            short_cause(98, 100),
            "run() returned 98 elements for 100 items; 2 of them failed (which ones is not known)"
        );
    }
}
