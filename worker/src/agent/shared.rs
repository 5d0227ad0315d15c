//! What a node's slots share: the agent, the names and GPUs handed to runners, and which job
//! each slot consumes for.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use super::setup::Agent;
use super::share::Share;
use crate::gpu::GpuPool;

/// What a node's slots share.
pub(super) struct Shared {
    pub(super) agent: Agent,
    pub(super) next_process: AtomicU32,
    pub(super) gpus: Arc<GpuPool>,
    /// Held while a start takes its name and its GPU, so that process names and GPU indexes
    /// are handed out in the same order.
    pub(super) starting: std::sync::Mutex<()>,
    /// Which job each slot consumes for.
    pub(super) share: Share,
}

impl Shared {
    /// The next process's name (`processNNN`, never reused) and its GPU.
    pub(super) fn next_start(&self) -> (String, Option<crate::gpu::GpuLease>) {
        let _in_order = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        let number = self
            .next_process
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (format!("process{number:03}"), self.gpus.acquire())
    }
}
