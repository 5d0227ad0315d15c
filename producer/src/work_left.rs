//! A job's expected seconds of work left: the autoscaling signal `fleetrun serve` exports
//! (`fleetrun_job_work_seconds_left`).
//!
//! A queue's length says how many mini-batches wait, not how long they take: a pool with
//! 8 mini-batches of 10 minutes each needs more workers than one with 800 of 50 ms. The
//! signal is the backlog (mini-batches not yet recorded, those in flight included) times a
//! mini-batch's time, shared among the runners that serve the job:
//!
//! `backlog × mini-batch seconds ÷ serving runners`
//!
//! which is the backlog divided by the job's recent rate (mini-batches per second over the
//! last window of scrapes, see [`crate::pace`]), since that rate is the serving runners
//! divided by a mini-batch's time. Without a recent rate it is, in order: the job's rate
//! over its life (its [`JobSummary::eta_seconds`]); else, before the first mini-batch is
//! recorded or once the job stopped moving, the oldest attempt in flight's age (at least
//! [`UNMEASURED_MINI_BATCH_SECONDS`]) per mini-batch, over the runners holding one (at
//! least one). Only a Running job has work left; a Finalizing job's is its finalizer's,
//! which a draining worker finishes.

use fleetrun_common::ledger::JobState;
use fleetrun_worker::agent::HeldAttempt;

use crate::summary::JobSummary;

/// What a mini-batch is taken to cost, in seconds of one runner, before any was measured.
pub const UNMEASURED_MINI_BATCH_SECONDS: f64 = 1.0;

/// What a job has left to do, and who does it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkLeft {
    /// Mini-batches not yet recorded (in flight, queued, and not yet published).
    pub mini_batches: u64,
    /// Runner processes holding one of its mini-batches.
    pub runners: u64,
    /// Expected seconds until the last one is recorded, at the job's pace.
    pub seconds: f64,
}

impl WorkLeft {
    /// The work left of the job `summary` shows at `now` (seconds since the Unix epoch):
    /// `created` mini-batches published so far, `recent_batches_per_second` its rate over
    /// the last window (when it moved in it), `in_flight` its attempts under way.
    pub fn of(
        summary: &JobSummary,
        created: u64,
        recent_batches_per_second: Option<f64>,
        in_flight: &[HeldAttempt],
        now: f64,
    ) -> WorkLeft {
        let counts = &summary.counts;
        let runners = in_flight.len() as u64;
        if summary.state != JobState::Running {
            return WorkLeft {
                mini_batches: 0,
                runners,
                seconds: 0.0,
            };
        }
        let known = counts.total_mini_batches.unwrap_or(created);
        let mini_batches = known
            .saturating_sub(counts.completed_mini_batches)
            .max(runners);
        let backlog = mini_batches as f64;
        let seconds = match (recent_batches_per_second, summary.eta_seconds) {
            _ if mini_batches == 0 => 0.0,
            (Some(rate), _) if rate > 0.0 => backlog / rate,
            (_, Some(eta)) if counts.total_mini_batches.is_some() => eta,
            _ => {
                let oldest = in_flight
                    .iter()
                    .filter_map(|h| h.since)
                    .map(|since| now - since)
                    .fold(UNMEASURED_MINI_BATCH_SECONDS, f64::max);
                backlog * oldest / runners.max(1) as f64
            }
        };
        WorkLeft {
            mini_batches,
            runners,
            seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use fleetrun_common::events::Counts;

    use super::*;

    fn summary(state: JobState, total: Option<u64>, done: u64, eta: Option<f64>) -> JobSummary {
        JobSummary {
            job_id: "j".into(),
            name: "j".into(),
            pool: "default".into(),
            state,
            counts: Counts {
                total_mini_batches: total,
                completed_mini_batches: done,
                failed_mini_batches: 0,
                succeeded_items: done,
                failed_items: 0,
            },
            submitted_at: 1000.0,
            updated_at: Some(1000.0),
            items_per_second: 0.0,
            eta_seconds: eta,
            stalled_since: None,
            deadline_at: None,
            left_at_deadline: None,
            cause: None,
            output: "out".into(),
            failed_items: None,
            queue: None,
            manifest: None,
            storage_faults: Vec::new(),
            time: None,
        }
    }

    fn held(index: u64, since: f64) -> HeldAttempt {
        HeldAttempt {
            index,
            node: "n".into(),
            process: format!("process{index:03}"),
            attempt: 1,
            first: String::new(),
            since: Some(since),
        }
    }

    #[test]
    fn the_recent_rate_decides_when_the_job_moved_in_the_window() {
        let s = summary(JobState::Running, Some(100), 40, Some(999.0));
        let w = WorkLeft::of(&s, 100, Some(2.0), &[held(40, 1990.0)], 2000.0);
        assert_eq!((w.mini_batches, w.runners, w.seconds), (60, 1, 30.0));
    }

    #[test]
    fn without_a_recent_rate_the_rate_over_the_jobs_life_decides() {
        let s = summary(JobState::Running, Some(100), 40, Some(120.0));
        let w = WorkLeft::of(&s, 100, None, &[], 2000.0);
        assert_eq!((w.mini_batches, w.seconds), (60, 120.0));
    }

    #[test]
    fn before_anything_was_recorded_the_attempts_in_flight_are_the_measure() {
        // 10 mini-batches, 2 runners, the older attempt running for 30 s: each takes at
        // least 30 s, so 10 × 30 ÷ 2.
        let s = summary(JobState::Running, Some(10), 0, None);
        let in_flight = [held(0, 1970.0), held(1, 1990.0)];
        let w = WorkLeft::of(&s, 10, None, &in_flight, 2000.0);
        assert_eq!((w.mini_batches, w.runners, w.seconds), (10, 2, 150.0));
        // Nothing started yet (no worker): a second per mini-batch on one runner.
        let w = WorkLeft::of(&s, 10, None, &[], 2000.0);
        assert_eq!(w.seconds, 10.0 * UNMEASURED_MINI_BATCH_SECONDS);
    }

    #[test]
    fn while_the_input_is_listed_what_was_published_counts() {
        let s = summary(JobState::Running, None, 5, None);
        let w = WorkLeft::of(&s, 25, Some(4.0), &[], 2000.0);
        assert_eq!((w.mini_batches, w.seconds), (20, 5.0));
    }

    #[test]
    fn only_a_running_job_has_work_left() {
        for state in [
            JobState::Finalizing,
            JobState::Completed,
            JobState::Failed,
            JobState::Canceled,
            JobState::Expired,
        ] {
            let s = summary(state, Some(100), 40, None);
            let w = WorkLeft::of(&s, 100, Some(1.0), &[], 2000.0);
            assert_eq!((w.mini_batches, w.seconds), (0, 0.0), "{state}");
        }
    }
}
