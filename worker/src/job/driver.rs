//! A job's stop rules, for whoever watches the job: every node that serves it, `fleetrun
//! run` (the fleet in one process) and a submitter that waits. Any of them may fail the job
//! when a rule says so: the ledger's transition is atomic, so exactly one succeeds, and the
//! job never stays Running because the one process that would have noticed is gone.
//!
//! The rules read the ledger's counts and time them on the watcher's own monotonic clock (so
//! machines' clocks need not agree, and tests pause time). A watcher that joins late starts
//! its clocks late: it can only fail a job later than the rule says, never sooner.
//!
//! - `first_task_creation_timeout`: no runner has started any mini-batch that long after
//!   the job was submitted, and no node serves the pool. A job that waits behind others on a
//!   busy pool waits: its nodes are alive, and it starts when its turn comes.
//! - creation stopped: the job is not sealed, every mini-batch created so far is done, and
//!   no new one was created for `first_task_creation_timeout`: the submitter died while it
//!   published (submitting again with the same job id finishes it).
//! - `progress_update_timeout`: the job has started, work is outstanding, and no mini-batch
//!   was created or completed for that long.
//!
//! One more rule ends a job without failing it: `deadline`, the job's age past its
//! deadline (a resumed job has none), expires it ([`Ending::Expire`]).

use std::time::Duration;

use fleetrun_common::ledger::{JobState, Status};
use fleetrun_config::JobSpec;
use tokio::time::Instant;

/// How long a job runs before init failures across all its nodes can fail it.
pub const INIT_FAILURE_GRACE: Duration = Duration::from_secs(120);

/// Why the stop rules end a job, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub reason: String,
    pub ending: Ending,
}

/// How the stop rules end a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It fails.
    Fail,
    /// It fails, stalled with work outstanding: its cause names what is in flight
    /// ([`Job::stop_reason`](super::Job::stop_reason)).
    Stall,
    /// Its deadline passed: it expires, keeping what its finished mini-batches wrote.
    Expire,
}

impl Stop {
    fn because(reason: String) -> Stop {
        Stop {
            reason,
            ending: Ending::Fail,
        }
    }
}

/// One watcher's view of a job's progress, and the rules that fail a job that makes none.
#[derive(Debug)]
pub struct StopRules {
    first_task: Duration,
    progress: Duration,
    /// The job's deadline, from its submission.
    deadline: Option<Duration>,
    /// When this watcher first saw the job, and how old the job was then.
    seen: Instant,
    age_when_seen: Duration,
    /// The counts last seen to move, and when they did.
    last_counts: (u64, u64),
    last_change: Instant,
}

impl StopRules {
    /// Starts watching a job that is `age` old (from its record's submission time; zero when
    /// unknown).
    pub fn new(spec: &JobSpec, age: Duration) -> StopRules {
        let now = Instant::now();
        StopRules {
            first_task: Duration::from_secs(spec.first_task_creation_timeout),
            progress: Duration::from_secs(spec.progress_update_timeout),
            deadline: spec.deadline.map(Duration::from_secs),
            seen: now,
            age_when_seen: age,
            last_counts: (0, 0),
            last_change: now,
        }
    }

    /// The job's age by this watcher's clock.
    pub fn age(&self) -> Duration {
        self.age_when_seen + self.seen.elapsed()
    }

    /// Looks at the job's status now: the reason to end it, if a rule says so. `serving` is
    /// how many nodes serve the job's pool, when the caller could tell (it needs asking only
    /// while the job has not started).
    pub fn check(&mut self, status: &Status, serving: Option<u64>) -> Option<Stop> {
        let counts = (status.created, status.done);
        if counts != self.last_counts {
            self.last_counts = counts;
            self.last_change = Instant::now();
        }
        if status.state != JobState::Running {
            return None;
        }
        if let Some(deadline) = self.deadline
            && status.run == 0
            && self.age() >= deadline
        {
            let total = status
                .total
                .map_or_else(|| format!("{} created", status.created), |t| t.to_string());
            return Some(Stop {
                reason: format!(
                    "deadline passed: {}s after submission (deadline), {} of {total} mini-batches done",
                    deadline.as_secs(),
                    status.done
                ),
                ending: Ending::Expire,
            });
        }
        let still = self.last_change.elapsed();
        if !status.started && serving == Some(0) && self.age() >= self.first_task {
            return Some(Stop::because(format!(
                "no mini-batch was started within first_task_creation_timeout ({}s) and no worker serves the job's pool; {} created",
                self.first_task.as_secs(),
                status.created
            )));
        }
        let sealed = status.total.is_some();
        if !sealed && status.done >= status.created && still >= self.first_task {
            return Some(Stop::because(format!(
                "mini-batch creation stopped: none created for {}s (first_task_creation_timeout) after {}, and all of them are done; submit the job again with the same --job-id to finish it",
                self.first_task.as_secs(),
                status.created
            )));
        }
        let outstanding = status.total.is_none_or(|total| status.done < total);
        if status.started && outstanding && still >= self.progress {
            let reason = format!(
                "stalled: no mini-batch created or completed for {}s (progress_update_timeout); {} of {} done",
                self.progress.as_secs(),
                status.done,
                status
                    .total
                    .map_or_else(|| format!("{} created", status.created), |t| t.to_string())
            );
            return Some(Stop {
                reason,
                ending: Ending::Stall,
            });
        }
        None
    }
}

/// CONTRACT.md §5 rule 2: a job that has run longer than [`INIT_FAILURE_GRACE`] fails once
/// `2 × node_count × processes` runners have failed to start over the whole job. Returns
/// the reason to fail it with.
pub fn init_failures_fail_job(
    node_count: u32,
    processes: u32,
    failures: u64,
    age: Duration,
) -> Option<String> {
    let limit = 2 * u64::from(node_count.max(1)) * u64::from(processes.max(1));
    (age > INIT_FAILURE_GRACE && failures >= limit).then(|| {
        format!(
            "{failures} runner processes failed to start over the job (the limit is {limit}: 2 × node_count {node_count} × {processes} processes per node)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(first_task: u64, progress: u64) -> JobSpec {
        spec_with(first_task, progress, "")
    }

    fn spec_with(first_task: u64, progress: u64, more: &str) -> JobSpec {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.py"), "def run(b): return b\n").unwrap();
        std::fs::create_dir(dir.path().join("in")).unwrap();
        let toml = format!(
            "name = \"rules\"\nentry_script = \"s.py\"\noutput_action = \"append_row\"\nfirst_task_creation_timeout = {first_task}\nprogress_update_timeout = {progress}\n{more}[input]\nfiles = \"in\"\n[output]\npath = \"out\"\n"
        );
        let path = dir.path().join("job.toml");
        std::fs::write(&path, toml).unwrap();
        fleetrun_config::load(&path, &[]).unwrap()
    }

    fn status(created: u64, done: u64, total: Option<u64>, started: bool) -> Status {
        Status {
            created,
            done,
            total,
            started,
            ..Status::new()
        }
    }

    async fn advance(secs: u64) {
        tokio::time::advance(Duration::from_secs(secs)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_nobody_starts_fails_on_first_task_creation_timeout() {
        let mut rules = StopRules::new(&spec(60, 300), Duration::from_secs(10));
        let waiting = status(4, 0, Some(4), false);
        advance(49).await;
        assert_eq!(rules.check(&waiting, Some(0)), None);
        advance(1).await;
        let reason = rules
            .check(&waiting, Some(0))
            .expect("60s after submission")
            .reason;
        assert!(reason.contains("no worker serves"), "{reason}");
        assert!(
            reason.contains("first_task_creation_timeout (60s)"),
            "{reason}"
        );
        // Started in time: the rule is met for good.
        let mut rules = StopRules::new(&spec(60, 300), Duration::ZERO);
        advance(61).await;
        assert_eq!(rules.check(&status(4, 0, Some(4), true), Some(0)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_waiting_on_a_busy_pool_waits() {
        let mut rules = StopRules::new(&spec(60, 300), Duration::ZERO);
        let queued = status(4, 0, Some(4), false);
        advance(3600).await;
        // Nodes serve the pool (busy with other jobs), or the caller could not tell.
        assert_eq!(rules.check(&queued, Some(2)), None);
        assert_eq!(rules.check(&queued, None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_submitter_that_died_mid_publish_fails_the_job_on_first_task_creation_timeout() {
        let mut rules = StopRules::new(&spec(60, 300), Duration::ZERO);
        assert_eq!(rules.check(&status(3, 1, None, true), Some(1)), None);
        advance(50).await;
        // Work remains: the rule waits for it (progress is another rule's business).
        assert_eq!(rules.check(&status(3, 3, None, true), Some(1)), None);
        advance(59).await;
        assert_eq!(rules.check(&status(3, 3, None, true), Some(1)), None);
        advance(1).await;
        let reason = rules
            .check(&status(3, 3, None, true), Some(1))
            .expect("creation stopped")
            .reason;
        assert!(reason.contains("creation stopped"), "{reason}");
        assert!(reason.contains("--job-id"), "{reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn no_progress_for_progress_update_timeout_is_a_stall() {
        let mut rules = StopRules::new(&spec(600, 300), Duration::ZERO);
        let running = status(10, 4, Some(10), true);
        assert_eq!(rules.check(&running, Some(1)), None);
        advance(299).await;
        assert_eq!(rules.check(&running, Some(1)), None);
        // A completion restarts the clock.
        let moved = status(10, 5, Some(10), true);
        assert_eq!(rules.check(&moved, Some(1)), None);
        advance(299).await;
        assert_eq!(rules.check(&moved, Some(1)), None);
        advance(1).await;
        let stop = rules.check(&moved, Some(1)).expect("stalled");
        assert_eq!(stop.ending, Ending::Stall);
        let reason = stop.reason;
        assert!(reason.contains("progress_update_timeout"), "{reason}");
        assert!(reason.contains("5 of 10 done"), "{reason}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_that_no_longer_runs_or_has_nothing_outstanding_never_fails_here() {
        let mut rules = StopRules::new(&spec(1, 1), Duration::from_secs(3600));
        let finalizing = Status {
            state: JobState::Finalizing,
            ..status(2, 2, Some(2), true)
        };
        advance(10).await;
        assert_eq!(rules.check(&finalizing, Some(0)), None);
        let all_done_running = status(2, 2, Some(2), true);
        assert_eq!(rules.check(&all_done_running, Some(0)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_past_its_deadline_expires_before_any_other_rule() {
        // Submitted 5 s before this watcher saw it, with a deadline of 20 s.
        let expiring = spec_with(1, 1, "deadline = \"20s\"\n");
        let mut rules = StopRules::new(&expiring, Duration::from_secs(5));
        let running = status(10, 4, Some(10), true);
        assert_eq!(rules.check(&running, Some(1)), None);
        advance(14).await;
        // Stalled (progress_update_timeout 1 s), but the deadline has not passed: it fails.
        assert_eq!(
            rules.check(&running, Some(1)).unwrap().ending,
            Ending::Stall
        );
        advance(1).await;
        let stop = rules.check(&running, Some(1)).expect("past the deadline");
        assert_eq!(stop.ending, Ending::Expire);
        assert!(
            stop.reason.contains("20s after submission"),
            "{}",
            stop.reason
        );
        assert!(stop.reason.contains("4 of 10"), "{}", stop.reason);
        // Only a Running job expires; a resumed one has no deadline.
        let finalizing = Status {
            state: JobState::Finalizing,
            ..status(10, 10, Some(10), true)
        };
        assert_eq!(rules.check(&finalizing, Some(1)), None);
        let resumed = Status {
            run: 1,
            ..status(10, 4, Some(10), true)
        };
        let mut rules = StopRules::new(&spec_with(600, 600, "deadline = 20\n"), Duration::ZERO);
        advance(3600).await;
        assert_eq!(rules.check(&resumed, Some(1)), None);
        // A job without a deadline never expires.
        let mut rules = StopRules::new(&spec(600, 600), Duration::from_secs(86_400));
        assert_eq!(rules.check(&status(10, 4, Some(10), true), Some(1)), None);
    }

    #[test]
    fn init_failures_fail_a_job_at_twice_its_runners_once_it_has_run_two_minutes() {
        let late = INIT_FAILURE_GRACE + Duration::from_secs(1);
        // 2 nodes × 3 processes: the limit is 12.
        assert_eq!(init_failures_fail_job(2, 3, 11, late), None);
        let reason = init_failures_fail_job(2, 3, 12, late).expect("at the limit");
        assert!(
            reason.starts_with("12 runner processes failed to start"),
            "{reason}"
        );
        assert!(reason.contains("the limit is 12"), "{reason}");
        // Not before the job has run two minutes, however many.
        assert_eq!(init_failures_fail_job(2, 3, 100, INIT_FAILURE_GRACE), None);
    }
}
