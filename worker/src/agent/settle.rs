//! What an attempt's outcome makes of its mini-batch, decided by pure functions a unit test
//! calls without a runtime: a `run()` that returned is finished (its result and what its
//! return counts, see `returns`); a failed attempt is tried again while attempts remain, then
//! isolated or failed whole.

use super::returns::{self, Judged};

/// Deliveries of a mini-batch lost with a worker or its broker connection (beyond the
/// attempts its script may spend) before it is failed: infrastructure faults spend none of
/// the script's `run_max_try` attempts, and have this bound of their own. The broker's own
/// limit ([`crate::job::POOL_DELIVERY_LIMIT`]) stands above both for `run_max_try` up to 80.
pub const LOST_LIMIT: u32 = 20;

/// Whether a delivery numbered `attempt` has come back more often than the script's attempts
/// and [`LOST_LIMIT`] allow: it is failed untried.
pub(super) fn lost_too_often(attempt: u32, spec: &fleetrun_config::JobSpec) -> bool {
    attempt > spec.run_max_try + LOST_LIMIT
}

/// The job's rules a failed attempt is settled by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    /// The job's `run_max_try`: the attempts the script may spend on a mini-batch.
    pub(super) run_max_try: u32,
    /// The mini-batch is isolated once its attempts are spent (see `isolate::isolates`).
    pub(super) isolates: bool,
    /// The job no longer takes work.
    pub(super) stopped: bool,
}

/// What becomes of a mini-batch whose attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterFailure {
    /// The job no longer runs: the message is dropped.
    Drop,
    /// Attempts remain: it goes back to the queue, this attempt spent.
    Retry,
    /// Its attempts are spent: its failed items are isolated.
    Isolate,
    /// Its attempts are spent: it fails whole.
    FailWhole,
}

/// Settles failed attempt number `attempt` under `limits`.
pub(super) fn after_failure(attempt: u32, limits: Limits) -> AfterFailure {
    if limits.stopped {
        AfterFailure::Drop
    } else if attempt < limits.run_max_try {
        AfterFailure::Retry
    } else if limits.isolates {
        AfterFailure::Isolate
    } else {
        AfterFailure::FailWhole
    }
}

/// A mini-batch whose `run()` returned, as its report and its results tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Returned {
    /// Its report row's result: `succeeded`, or `partial` when the return was short.
    pub(super) result: &'static str,
    pub(super) judged: Judged,
    /// For a short return, the cause each of its items is listed in `failed_items.csv`
    /// with (which of them failed is not known).
    pub(super) short_cause: Option<String>,
}

/// Settles a `run()` that returned `returned` elements for `items` items, under the job's
/// `error_threshold`.
pub(super) fn returned(returned: u64, items: u64, error_threshold: i64) -> Returned {
    let judged = returns::judge(returned, items, error_threshold);
    let short_cause = (judged.outcome.failed > 0).then(|| returns::short_cause(returned, items));
    let result = if judged.outcome.batch_failed {
        "partial"
    } else {
        "succeeded"
    };
    Returned {
        result,
        judged,
        short_cause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        run_max_try: 3,
        isolates: false,
        stopped: false,
    };

    #[test]
    fn a_failed_attempt_is_retried_while_attempts_remain() {
        assert_eq!(after_failure(1, LIMITS), AfterFailure::Retry);
        assert_eq!(after_failure(2, LIMITS), AfterFailure::Retry);
        assert_eq!(after_failure(3, LIMITS), AfterFailure::FailWhole);
    }

    #[test]
    fn spent_attempts_isolate_where_the_job_isolates() {
        let isolating = Limits {
            isolates: true,
            ..LIMITS
        };
        assert_eq!(after_failure(2, isolating), AfterFailure::Retry);
        assert_eq!(after_failure(3, isolating), AfterFailure::Isolate);
        assert_eq!(after_failure(4, isolating), AfterFailure::Isolate);
    }

    #[test]
    fn a_stopped_job_drops_whatever_attempts_remain() {
        let stopped = Limits {
            stopped: true,
            isolates: true,
            ..LIMITS
        };
        for attempt in [1, 3, 5] {
            assert_eq!(after_failure(attempt, stopped), AfterFailure::Drop);
        }
    }

    #[test]
    fn a_full_return_succeeds_and_lists_no_item() {
        let full = returned(5, 5, 0);
        assert_eq!(full.result, "succeeded");
        assert_eq!(full.judged.outcome.succeeded, 5);
        assert_eq!(full.short_cause, None);
    }

    #[test]
    fn a_short_return_is_partial_and_lists_every_item_when_checked() {
        let short = returned(3, 5, 0);
        assert_eq!(short.result, "partial");
        assert_eq!(short.judged.outcome.failed, 2);
        assert_eq!(
            short.short_cause.as_deref(),
            Some(
                "run() returned 3 elements for 5 items; 2 of them failed (which ones is not known)"
            )
        );
        let unchecked = returned(3, 5, -1);
        assert_eq!(unchecked.result, "succeeded");
        assert_eq!(unchecked.short_cause, None);
    }
}
