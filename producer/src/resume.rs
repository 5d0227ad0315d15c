//! Continuing a run: what a run was made of (its fingerprint), to tell whether the work a
//! journal kept is the work asked for now, and the queue a resumed run publishes to, which
//! leaves out the mini-batches already done.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use fleetrun_common::queue::{Consumer, Depth, Queue, QueueError};
use fleetrun_common::storage::s3::S3Settings;
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::JobSpec;
use fleetrun_worker::job;
use futures::TryStreamExt;
use sha2::{Digest, Sha256};

/// The parts of a fingerprint, as a refusal names them.
pub const JOB_FILE: &str = "the job's settings";
pub const CODE: &str = "the script's code";
pub const INPUT: &str = "the input listing";

/// Why a fingerprint was not taken.
#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    #[error(transparent)]
    Code(#[from] job::JobError),
    #[error("listing the input: {0}")]
    Input(#[from] fleetrun_common::storage::StorageError),
}

/// What a job run is made of: its settings, its script's code and its input listing (the
/// objects' keys), each a SHA-256.
pub async fn fingerprint(spec: &JobSpec) -> Result<BTreeMap<String, String>, FingerprintError> {
    let settings = serde_json::to_vec(spec).expect("a job always encodes");
    let mut parts = BTreeMap::from([(JOB_FILE.to_owned(), hex(Sha256::digest(&settings)))]);
    if let Some(code) = job::code_digest(spec)? {
        parts.insert(CODE.to_owned(), code);
    }
    let input = job::open_input(spec, &S3Settings::default()).await?;
    // Keys alone: a local folder lists them without a `stat` per file, which on a large
    // input would cost the run more than its own listing.
    let mut listing = Sha256::new();
    let mut keys = input.list_keys("");
    while let Some(key) = keys.try_next().await? {
        listing.update(key.as_bytes());
        listing.update([0]);
    }
    parts.insert(INPUT.to_owned(), hex(listing.finalize()));
    Ok(parts)
}

/// What differs between a run's fingerprint and another's, by name.
pub fn changed(before: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    let names: std::collections::BTreeSet<&String> = before.keys().chain(now.keys()).collect();
    names
        .into_iter()
        .filter(|name| before.get(*name) != now.get(*name))
        .cloned()
        .collect()
}

fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A queue that publishes only the mini-batches not already `done`: those a resumed job kept
/// are counted as published, and never run again. The others go out marked with the job's
/// `run` (the ledger's `Status::run`; 0 leaves them as they are).
pub struct Unfinished {
    pub queue: std::sync::Arc<dyn Queue>,
    pub done: HashSet<u64>,
    pub run: u32,
}

#[async_trait]
impl Queue for Unfinished {
    async fn publish(&self, body: Vec<u8>) -> Result<(), QueueError> {
        match MiniBatch::decode(&body) {
            Ok(batch) if self.done.contains(&batch.index) => Ok(()),
            Ok(batch) if self.run > 0 => {
                let batch = MiniBatch {
                    run: self.run,
                    ..batch
                };
                self.queue.publish(batch.encode()).await
            }
            _ => self.queue.publish(body).await,
        }
    }

    async fn consume(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        self.queue.consume(prefetch).await
    }

    async fn consume_dead(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        self.queue.consume_dead(prefetch).await
    }

    async fn depth(&self) -> Result<Depth, QueueError> {
        self.queue.depth().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_changed_is_named() {
        let before = BTreeMap::from([
            (JOB_FILE.to_owned(), "a".to_owned()),
            (INPUT.to_owned(), "b".to_owned()),
        ]);
        let mut now = before.clone();
        assert!(changed(&before, &now).is_empty());
        now.insert(INPUT.to_owned(), "c".to_owned());
        now.insert(CODE.to_owned(), "d".to_owned());
        assert_eq!(changed(&before, &now), [INPUT, CODE]);
    }
}
