//! Sharing a node's slots among the jobs of its pool.
//!
//! Each job's mini-batches wait in a lane of their own (see `fleetrun_common::queue`), and
//! each slot consumes from one lane at a time: the one this module gives it. Every second,
//! whenever a job of its pool starts or ends (the job events the node follows), and whenever
//! asked, the node looks at its pool's unfinished jobs (each one's priority, its
//! seats on the node, the mini-batches waiting in its lane, whether it is still being
//! published) and shares its slots out again:
//!
//! 1. the jobs with work waiting, highest priority first, one slot each in turn (oldest job
//!    first), each up to its seats on the node and to what it has waiting;
//! 2. slots left over stay with the jobs they serve (a job whose last mini-batches are
//!    running keeps its runners), up to their seats;
//! 3. a slot keeps its job whenever the new share allows it, so a runner (and its `init()`)
//!    is replaced only when another job is owed the slot; a slot with no job takes no work.
//!
//! Every node shares its own slots this way, so over a fleet each job of the highest
//! priority with work gets about an equal part of the runners, and a small job submitted
//! behind a large one starts at once instead of after it (within a second when its event
//! is missed).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{Agent, is_stopped};

/// How often a node shares its slots out again.
pub const SHARE_PERIOD: Duration = Duration::from_secs(1);

/// The job each slot consumes for (`None`: it takes no work).
pub type Assignment = Vec<Option<Arc<str>>>;

/// What one job asks of this node's slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub job: Arc<str>,
    /// 0 to 9; higher first.
    pub priority: u8,
    /// Its seats on this node: the most slots it may have.
    pub cap: usize,
    /// Mini-batches waiting in its lane.
    pub ready: u64,
    /// Still being published: more work is coming even while none waits.
    pub publishing: bool,
}

impl Demand {
    fn wants_work(&self) -> bool {
        self.ready > 0 || self.publishing
    }
}

/// The next share of `current.len()` slots among `jobs` (oldest first), as the module says.
pub fn assign(current: &[Option<Arc<str>>], jobs: &[Demand]) -> Assignment {
    let slots = current.len();
    let held: Vec<usize> = jobs
        .iter()
        .map(|d| current.iter().flatten().filter(|j| **j == d.job).count())
        .collect();
    // Priority first, then age (the order given): the order every pass walks the jobs in.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&j| std::cmp::Reverse(jobs[j].priority));

    let mut target = vec![0usize; jobs.len()];
    let mut left = slots;
    // 1. Jobs with work, tier by tier, one slot each in turn.
    let mut tier_start = 0;
    while tier_start < order.len() && left > 0 {
        let priority = jobs[order[tier_start]].priority;
        let tier_end = order[tier_start..]
            .iter()
            .position(|&j| jobs[j].priority != priority)
            .map_or(order.len(), |n| tier_start + n);
        let wanted = |j: usize| {
            let d = &jobs[j];
            if d.publishing {
                // Its work is on its way: its seats, or runners started ahead of it (and
                // warmed) would stop only to start again a second later.
                return d.cap;
            }
            if !d.wants_work() {
                return 0;
            }
            let waiting = usize::try_from(d.ready).unwrap_or(usize::MAX);
            d.cap.min(held[j].saturating_add(waiting))
        };
        loop {
            let mut gave = false;
            for &j in &order[tier_start..tier_end] {
                if left > 0 && target[j] < wanted(j) {
                    target[j] += 1;
                    left -= 1;
                    gave = true;
                }
            }
            if !gave || left == 0 {
                break;
            }
        }
        tier_start = tier_end;
    }
    // 2. What is left stays with the jobs that hold it.
    for &j in &order {
        let keep = held[j].min(jobs[j].cap).saturating_sub(target[j]).min(left);
        target[j] += keep;
        left -= keep;
    }
    // 3. Slots keep their job where they may; the others go to the jobs still owed one.
    let mut next: Assignment = vec![None; slots];
    let mut given = vec![0usize; jobs.len()];
    for (slot, job) in current.iter().enumerate() {
        let Some(j) = job
            .as_ref()
            .and_then(|job| jobs.iter().position(|d| d.job == *job))
        else {
            continue;
        };
        if given[j] < target[j] {
            given[j] += 1;
            next[slot] = Some(jobs[j].job.clone());
        }
    }
    for slot in next.iter_mut().filter(|s| s.is_none()) {
        if let Some(&j) = order.iter().find(|&&j| given[j] < target[j]) {
            given[j] += 1;
            *slot = Some(jobs[j].job.clone());
        }
    }
    next
}

/// The node's current share, read by its slots.
pub(super) struct Share {
    assignment: watch::Sender<Assignment>,
    /// Asks for a new share now.
    wake: Notify,
}

impl Share {
    pub(super) fn new(slots: usize) -> Share {
        Share {
            assignment: watch::Sender::new(vec![None; slots]),
            wake: Notify::new(),
        }
    }

    /// Follows the share: a slot reads its job from it and waits on its changes.
    pub(super) fn watch(&self) -> watch::Receiver<Assignment> {
        self.assignment.subscribe()
    }

    /// The job the share gives slot `index`.
    pub(super) fn job_of(&self, index: usize) -> Option<Arc<str>> {
        self.assignment.borrow().get(index).cloned().flatten()
    }

    /// Shares the slots out again at once (a job this node serves stopped, or won a place).
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Shares the node's slots out once, now.
    pub(super) async fn share(&self, agent: &Agent) {
        let jobs = demands(agent).await;
        let current = self.assignment.borrow().clone();
        let next = assign(&current, &jobs);
        if next != current {
            debug!(share = ?next, "Slots shared out again.");
            self.assignment.send_replace(next);
        }
    }

    /// Shares the node's slots out every [`SHARE_PERIOD`], when woken, and when the pool's
    /// jobs changed ([`super::Jobs::changed`]), until `stop`.
    pub(super) async fn keep(&self, agent: &Agent, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SHARE_PERIOD) => {}
                _ = self.wake.notified() => {}
                _ = agent.jobs.changed() => {}
            }
            self.share(agent).await;
        }
    }
}

/// What each unfinished job of the pool asks of this node, oldest first. A job that has
/// ended, that this node gave up on, or whose place this node cannot take asks nothing.
async fn demands(agent: &Agent) -> Vec<Demand> {
    let live = match agent.jobs.live().await {
        Ok(live) => live,
        Err(e) => {
            warn!(error = %e, "Cannot list the pool's jobs; the slots keep their share.");
            return Vec::new();
        }
    };
    let mut demands = Vec::with_capacity(live.len());
    for job in live {
        let status = match agent.ledger.status(&job).await {
            Ok(Some(status)) => status,
            Ok(None) => continue,
            Err(e) => {
                warn!(job = %job, error = %e, "Cannot read the job's state; it gets no slot this time.");
                continue;
            }
        };
        if is_stopped(status.state) {
            continue;
        }
        let ctx = match agent.jobs.get_for_run(&job, status.run).await {
            Ok(Some(ctx)) => ctx,
            Ok(None) => continue,
            Err(e) => {
                warn!(job = %job, error = %e, "Cannot load the job; it gets no slot this time.");
                continue;
            }
        };
        if ctx.stop.is_cancelled() || ctx.node.gave_up.load(std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        let ready = match agent.queue.ready(&job).await {
            Ok(ready) => ready,
            Err(e) => {
                warn!(job = %job, error = %e, "Cannot count the job's waiting mini-batches.");
                0
            }
        };
        let demand = Demand {
            job: job.as_str().into(),
            priority: ctx.job.spec().priority,
            cap: ctx.node.seats.cap(),
            ready,
            publishing: status.total.is_none(),
        };
        if demand.wants_work() && !ctx.node.has_place() && !agent.jobs.claim_place(&ctx).await {
            // The job's node_count nodes are others.
            continue;
        }
        demands.push(demand);
    }
    demands
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, priority: u8, cap: usize, ready: u64) -> Demand {
        Demand {
            job: name.into(),
            priority,
            cap,
            ready,
            publishing: false,
        }
    }

    fn names(assignment: &Assignment) -> Vec<&str> {
        assignment
            .iter()
            .map(|j| j.as_deref().unwrap_or("-"))
            .collect()
    }

    fn slots(names: &[&str]) -> Assignment {
        names
            .iter()
            .map(|n| (*n != "-").then(|| Arc::from(*n)))
            .collect()
    }

    #[test]
    fn one_job_takes_the_slots_its_seats_allow() {
        let next = assign(&slots(&["-", "-", "-"]), &[job("a", 0, 2, 100)]);
        assert_eq!(names(&next), ["a", "a", "-"]);
        let next = assign(&slots(&["-", "-", "-"]), &[job("a", 0, 3, 100)]);
        assert_eq!(names(&next), ["a", "a", "a"]);
    }

    #[test]
    fn a_new_job_gets_its_share_from_a_running_one() {
        // "a" holds every slot; "b" arrives with work: it is owed a share at once, and "a"
        // keeps the slots it is not giving up (the lowest-numbered stay put).
        let next = assign(
            &slots(&["a", "a", "a", "a"]),
            &[job("a", 0, 4, 200), job("b", 0, 4, 5)],
        );
        assert_eq!(names(&next), ["a", "a", "b", "b"]);
        // Three slots: the older job gets the odd one.
        let next = assign(
            &slots(&["a", "a", "a"]),
            &[job("a", 0, 3, 200), job("b", 0, 3, 5)],
        );
        assert_eq!(names(&next), ["a", "a", "b"]);
    }

    #[test]
    fn a_job_gets_no_more_slots_than_it_has_work_for() {
        let next = assign(
            &slots(&["a", "a", "a", "a"]),
            &[job("a", 0, 4, 200), job("b", 0, 4, 1)],
        );
        assert_eq!(names(&next), ["a", "a", "a", "b"]);
    }

    #[test]
    fn a_job_with_nothing_waiting_keeps_its_slots_until_another_needs_them() {
        // The tail of a job: nothing waits, its runners finish what they hold.
        let next = assign(&slots(&["a", "a", "-"]), &[job("a", 0, 3, 0)]);
        assert_eq!(names(&next), ["a", "a", "-"]);
        // Another job with work takes them over.
        let next = assign(
            &slots(&["a", "a", "-"]),
            &[job("a", 0, 3, 0), job("b", 0, 3, 10)],
        );
        assert_eq!(names(&next), ["b", "b", "b"]);
    }

    #[test]
    fn a_job_still_being_published_gets_its_seats_before_any_work_waits() {
        let mut starting = job("a", 0, 2, 0);
        starting.publishing = true;
        let next = assign(&slots(&["a", "a", "-"]), std::slice::from_ref(&starting));
        assert_eq!(names(&next), ["a", "a", "-"]);
        let next = assign(&slots(&["-", "-", "-"]), &[starting]);
        assert_eq!(names(&next), ["a", "a", "-"]);
    }

    #[test]
    fn higher_priority_jobs_are_served_first() {
        let next = assign(
            &slots(&["a", "a", "a", "a"]),
            &[job("a", 0, 4, 200), job("urgent", 5, 3, 50)],
        );
        assert_eq!(names(&next), ["a", "urgent", "urgent", "urgent"]);
        // Without work, a high priority holds nothing back from a lower one.
        let next = assign(
            &slots(&["urgent", "urgent", "a", "a"]),
            &[job("a", 0, 4, 200), job("urgent", 5, 4, 0)],
        );
        assert_eq!(names(&next), ["a", "a", "a", "a"]);
    }

    #[test]
    fn an_ended_job_frees_its_slots() {
        let next = assign(&slots(&["gone", "b"]), &[job("b", 0, 2, 4)]);
        assert_eq!(names(&next), ["b", "b"]);
        let next = assign(&slots(&["gone", "gone"]), &[]);
        assert_eq!(names(&next), ["-", "-"]);
    }
}
