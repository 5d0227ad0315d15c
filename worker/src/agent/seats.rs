//! A job's seats on a node: how many of the node's slots may run a runner of the job at once
//! (the job's `process_count_per_node`, capped by the worker's `--max-processes`).
//!
//! A slot holds a seat from the moment it starts a runner for the job until that runner is
//! gone. The node's share (`share`) gives a job no more slots than its seats, so a pool
//! running one job has exactly that job's process count of runners per node; a slot that
//! still finds its job's seats taken (a runner of the slot's last share not yet stopped)
//! hands the mini-batch back.

use std::sync::{Arc, Mutex};

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
