//! Conformance suites: the behaviour every implementation of a seam must show.
//!
//! Each suite is a set of `pub async fn` cases taking a fresh backend, and a macro that turns
//! them into `#[tokio::test]`s for one implementation:
//!
//! ```ignore
//! fleetrun_common::queue_conformance!(memory, |opts| async move {
//!     std::sync::Arc::new(MemoryQueue::new(opts)) as std::sync::Arc<dyn Queue>
//! });
//! ```
//!
//! The embedded implementations run them in this crate's tests; the distributed ones run the
//! very same cases against real servers.

pub mod events;
pub mod ledger;
pub mod queue;
pub mod registry;
pub mod storage;

/// A short random string for test-scoped names (queues, key prefixes, jobs).
pub fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// Waits, polling, until `done` holds; panics after 10 s. For what a backend does on its
/// own time (keys expiring).
pub async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
