//! A job's seats on a node: how many of the node's slots may run a runner of the job at once
//! (the job's `process_count_per_node`, capped by the worker's `--max-processes`), and which
//! slots consume at all.
//!
//! A slot holds a seat from the moment it starts a runner for the job until that runner is
//! gone. Slots beyond the largest seat count of the jobs the node serves take no work (only
//! slot 0 consumes while the node knows no job), so a pool running one job has exactly that
//! job's process count of runners per node, and no slot takes mini-batches it would have to
//! hand back. When jobs of different sizes share a node, a slot that finds its job's seats
//! taken hands the mini-batch back.

use std::sync::{Arc, Mutex};

use super::JobContext;

/// The seats of one job on one node.
#[derive(Debug)]
pub struct Seats {
    cap: usize,
    taken: Mutex<usize>,
}

/// One slot's seat in a job; given back when dropped.
#[derive(Debug)]
pub struct Seat(Arc<Seats>);

impl Seats {
    pub fn new(cap: usize) -> Arc<Seats> {
        Arc::new(Seats {
            cap: cap.max(1),
            taken: Mutex::new(0),
        })
    }

    /// How many runners of the job this node runs at most.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A seat, if one is free.
    pub fn take(self: &Arc<Self>) -> Option<Seat> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        (*taken < self.cap).then(|| {
            *taken += 1;
            Seat(self.clone())
        })
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut taken = self.0.taken.lock().unwrap_or_else(|p| p.into_inner());
        *taken -= 1;
    }
}

/// The jobs a node's slots have met, and how many slots should consume for them.
#[derive(Default)]
pub(super) struct Wanted {
    jobs: Mutex<Vec<Arc<JobContext>>>,
    changed: tokio::sync::Notify,
}

impl Wanted {
    /// Notes a job met by a slot (again); wakes the slots waiting to consume if it wants more.
    pub(super) fn note(&self, ctx: &Arc<JobContext>) {
        let before = self.slots();
        {
            let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            if !jobs.iter().any(|j| Arc::ptr_eq(j, ctx)) {
                jobs.push(ctx.clone());
            }
        }
        if self.slots() > before {
            self.changed.notify_waiters();
        }
    }

    /// How many slots consume: the largest seat count of the running jobs this node holds a
    /// place in, at least one (to meet new jobs).
    pub(super) fn slots(&self) -> usize {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.retain(|j| !j.stop.is_cancelled());
        jobs.iter()
            .filter(|j| j.has_place())
            .map(|j| j.seats.cap())
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// Resolves when more slots may be wanted.
    pub(super) async fn changed(&self) {
        self.changed.notified().await
    }

    /// Wakes the waiting slots (a place was won).
    pub(super) fn wake(&self) {
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seats_run_out_at_the_cap_and_come_back() {
        let seats = Seats::new(2);
        let a = seats.take().unwrap();
        let _b = seats.take().unwrap();
        assert!(seats.take().is_none());
        drop(a);
        assert!(seats.take().is_some());
        assert_eq!(Seats::new(0).cap(), 1);
    }
}
