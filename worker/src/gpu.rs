//! GPU assignment (CONTRACT.md §3): each runner process gets one unique GPU index in
//! `CUDA_VISIBLE_DEVICES` while indexes last; the others get none. A process that stops
//! releases its index and the next process started takes the lowest free one.

use std::sync::{Arc, Mutex};

/// The variable a configured GPU count is read from, and the one that tells the script how
/// many GPUs its node has.
pub const GPU_COUNT_VAR: &str = "FLEETRUN_GPU_COUNT";

/// This node's GPUs: `$FLEETRUN_GPU_COUNT` when set, else the NVIDIA devices present
/// (`/dev/nvidia0`, `/dev/nvidia1`, …); 0 without drivers.
pub fn detect_gpus() -> usize {
    if let Some(n) = std::env::var(GPU_COUNT_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return n;
    }
    let Ok(entries) = std::fs::read_dir("/dev") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count()
}

/// The free and taken GPU indexes of a node.
#[derive(Debug)]
pub struct GpuPool {
    taken: Mutex<Vec<bool>>,
}

/// One process's GPU; the index goes back to the pool when this is dropped.
#[derive(Debug)]
pub struct GpuLease {
    pool: Arc<GpuPool>,
    index: usize,
}

impl GpuPool {
    pub fn new(count: usize) -> Arc<GpuPool> {
        Arc::new(GpuPool {
            taken: Mutex::new(vec![false; count]),
        })
    }

    pub fn count(&self) -> usize {
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The lowest free index, or `None` when every GPU is taken.
    pub fn acquire(self: &Arc<Self>) -> Option<GpuLease> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let index = taken.iter().position(|t| !t)?;
        taken[index] = true;
        Some(GpuLease {
            pool: self.clone(),
            index,
        })
    }
}

impl GpuLease {
    pub fn index(&self) -> usize {
        self.index
    }
}

impl Drop for GpuLease {
    fn drop(&mut self) {
        let mut taken = self.pool.taken.lock().unwrap_or_else(|p| p.into_inner());
        taken[self.index] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_processes_than_gpus_leaves_the_rest_without() {
        let pool = GpuPool::new(2);
        let p0 = pool.acquire().unwrap();
        let p1 = pool.acquire().unwrap();
        assert_eq!((p0.index(), p1.index()), (0, 1));
        assert!(pool.acquire().is_none(), "process 2 gets no GPU");
        assert!(pool.acquire().is_none(), "process 3 gets no GPU");
    }

    #[test]
    fn a_stopped_process_frees_its_index_for_the_next() {
        let pool = GpuPool::new(2);
        let p0 = pool.acquire().unwrap();
        let _p1 = pool.acquire().unwrap();
        drop(p0); // process 0 dies
        assert_eq!(pool.acquire().unwrap().index(), 0, "process 4 gets index 0");
    }

    #[test]
    fn no_gpus_means_no_leases() {
        assert!(GpuPool::new(0).acquire().is_none());
    }
}
