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
    /// Told whenever a seat is given back.
    freed: tokio::sync::Notify,
    /// Set once the node lets the job go: no seat is taken after.
    closed: std::sync::atomic::AtomicBool,
}

/// One slot's seat in a job; given back when dropped.
#[derive(Debug)]
pub struct Seat(Arc<Seats>);

impl Seats {
    pub fn new(cap: usize) -> Arc<Seats> {
        Arc::new(Seats {
            cap: cap.max(1),
            taken: Mutex::new(0),
            freed: tokio::sync::Notify::new(),
            closed: Default::default(),
        })
    }

    /// How many runners of the job this node runs at most.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A seat, if one is free (none once the seats are closed).
    pub fn take(self: &Arc<Self>) -> Option<Seat> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let closed = self.closed.load(std::sync::atomic::Ordering::Relaxed);
        (*taken < self.cap && !closed).then(|| {
            *taken += 1;
            Seat(self.clone())
        })
    }

    /// Closes the seats, then waits until every seat taken is given back: the job's runners
    /// on this node have all ended, and none starts again.
    pub async fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if *self.taken.lock().unwrap_or_else(|p| p.into_inner()) == 0 {
                return;
            }
            freed.await;
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut taken = self.0.taken.lock().unwrap_or_else(|p| p.into_inner());
        *taken -= 1;
        self.0.freed.notify_waiters();
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

    /// Closing waits for the seats taken and gives none after.
    #[tokio::test(start_paused = true)]
    async fn closed_seats_wait_for_those_taken_and_give_none() {
        let seats = Seats::new(2);
        let a = seats.take().unwrap();
        let closing = tokio::spawn({
            let seats = seats.clone();
            async move { seats.close().await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!closing.is_finished(), "a seat is still taken");
        assert!(seats.take().is_none(), "closed");
        drop(a);
        tokio::time::timeout(std::time::Duration::from_secs(1), closing)
            .await
            .expect("closed once the seat came back")
            .unwrap();
    }
}
