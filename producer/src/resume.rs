//! Continuing a run: what a run was made of (its fingerprint), to tell whether the work a
//! journal kept is the work asked for now, and the queue a resumed run publishes to, which
//! leaves out the mini-batches already done.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use fleetrun_common::ledger::journal::{Cut, Entry};
use fleetrun_common::queue::{Consumer, DeadLetterHold, Depth, Queue, QueueError};
use fleetrun_common::storage::s3::S3Settings;
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::JobSpec;
use fleetrun_worker::job;
use fleetrun_worker::parts::{self, Parts};
use tokio_util::sync::CancellationToken;

use crate::partition::Produced;

pub use fleetrun_worker::job::manifest::{CODE, INPUT, JOB_FILE};

/// Why a fingerprint was not taken, or the input not cut again.
#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    #[error(transparent)]
    Code(#[from] job::JobError),
    #[error("listing the input: {0}")]
    Input(#[from] fleetrun_common::storage::StorageError),
    #[error(transparent)]
    Cut(#[from] crate::partition::PartitionError),
}

/// What a job run is made of ([`job::manifest::fingerprint`]). Its input is told by how the
/// run cut it ([`same_cut`]), from the run's own listing.
pub fn fingerprint(spec: &JobSpec) -> Result<BTreeMap<String, String>, FingerprintError> {
    Ok(job::manifest::fingerprint(spec)?)
}

/// How the input is cut now against the last run's `cuts`.
#[derive(Debug, PartialEq, Eq)]
pub enum CutNow {
    /// The first `.0` mini-batches are cut as they were (the furthest cut the last run
    /// noted): its recordings of those can be kept, the others run again.
    Same(u64),
    /// A mini-batch the last run cut holds other items now, or the whole input is cut
    /// otherwise than when the last run cut all of it: only the first `same` mini-batches
    /// (up to the last cut that is still the same) are as they were.
    Changed { same: u64 },
}

/// Cuts `spec`'s input again (onto no queue) and compares it with the last run's `cuts`.
pub async fn same_cut(spec: &JobSpec, job: &str, cuts: &[Cut]) -> Result<CutNow, FingerprintError> {
    let now = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let produced = {
        let now = now.clone();
        Produced::noting_cuts(move |cut| now.lock().unwrap_or_else(|p| p.into_inner()).push(cut))
    };
    let input = job::open_input(spec, &S3Settings::default()).await?;
    let never = CancellationToken::new();
    let total = crate::fleet::cut(
        spec,
        &*input,
        None,
        job,
        &crate::fleet::Discard,
        &produced,
        &never,
    )
    .await?;
    produced.finished(total);
    let now = std::mem::take(&mut *now.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(compare_cuts(cuts, &now))
}

/// [`same_cut`]'s judgement of the last run's cuts `before` against `now`'s.
fn compare_cuts(before: &[Cut], now: &[Cut]) -> CutNow {
    let same = |old: &Cut| {
        now.iter().any(|cut| {
            cut.batches == old.batches && cut.listing == old.listing && (cut.whole || !old.whole)
        })
    };
    let mut before: Vec<&Cut> = before.iter().collect();
    before.sort_by_key(|cut| cut.batches);
    let mut through = 0;
    for old in before {
        if !same(old) {
            return CutNow::Changed { same: through };
        }
        through = old.batches;
    }
    CutNow::Same(through)
}

/// What differs between a run's fingerprint and another's, by name (the input is compared
/// by its cut, not here: an older journal's header may still name it).
pub fn changed(before: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    let names: std::collections::BTreeSet<&String> = before.keys().chain(now.keys()).collect();
    names
        .into_iter()
        .filter(|name| name.as_str() != INPUT && before.get(*name) != now.get(*name))
        .cloned()
        .collect()
}

/// The recordings of a job's last run that a resumed run keeps: those whose stored parts
/// still read as they were written ([`parts::check_kept`]). A mini-batch whose rows were
/// edited, cut short or removed since is left out, so it runs again, and is named.
pub async fn kept_intact(parts: &dyn Parts, job: &str, entries: Vec<Entry>) -> Vec<Entry> {
    let mut kept = Vec::with_capacity(entries.len());
    let mut again = Vec::new();
    for entry in entries {
        let checked = match &entry.part {
            Some(reference) => parts::check_kept(parts, reference).await,
            None => Ok(()),
        };
        match checked {
            Ok(()) => kept.push(entry),
            Err(e) => {
                tracing::debug!(job = %job, mini_batch = entry.index, error = %e, "A kept part does not read as written.");
                again.push(entry.index.to_string());
            }
        }
    }
    if !again.is_empty() {
        let list = again.join(", ");
        tracing::warn!(job = %job, mini_batches = %list, "Resuming: these mini-batches' kept rows changed or went missing since they were recorded; they run again.");
    }
    kept
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
    async fn open_lane(&self, lane: &str) -> Result<(), QueueError> {
        self.queue.open_lane(lane).await
    }

    async fn publish(&self, lane: &str, body: Vec<u8>) -> Result<(), QueueError> {
        match MiniBatch::decode(&body) {
            Ok(batch) if self.done.contains(&batch.index) => Ok(()),
            Ok(batch) if self.run > 0 => {
                let batch = MiniBatch {
                    run: self.run,
                    ..batch
                };
                self.queue.publish(lane, batch.encode()).await
            }
            _ => self.queue.publish(lane, body).await,
        }
    }

    async fn consume(&self, lane: &str, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        self.queue.consume(lane, prefetch).await
    }

    async fn consume_dead(&self, prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        self.queue.consume_dead(prefetch).await
    }

    async fn ready(&self, lane: &str) -> Result<u64, QueueError> {
        self.queue.ready(lane).await
    }

    async fn depth(&self, lanes: &[String]) -> Result<Depth, QueueError> {
        self.queue.depth(lanes).await
    }

    async fn close_lane(&self, lane: &str) -> Result<(), QueueError> {
        self.queue.close_lane(lane).await
    }

    async fn hold_dead(&self, limit: usize) -> Result<Box<dyn DeadLetterHold>, QueueError> {
        self.queue.hold_dead(limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(batches: u64, listing: &str, whole: bool) -> Cut {
        Cut {
            batches,
            listing: listing.into(),
            whole,
        }
    }

    #[test]
    fn a_cut_is_kept_as_far_as_it_is_the_same() {
        let now = [cut(16, "a", false), cut(32, "b", false), cut(40, "c", true)];
        assert_eq!(compare_cuts(&[], &now), CutNow::Same(0));
        assert_eq!(compare_cuts(&now[..2], &now), CutNow::Same(32));
        assert_eq!(compare_cuts(&now, &now), CutNow::Same(40));
        // A file added before what the last run cut moves every mini-batch after it.
        let moved = [cut(16, "a", false), cut(32, "x", false)];
        assert_eq!(compare_cuts(&moved, &now), CutNow::Changed { same: 16 });
        // The whole input then is the whole input now, not a part of it.
        let whole = [cut(32, "b", true)];
        assert_eq!(compare_cuts(&whole, &now), CutNow::Changed { same: 0 });
        let longer = [cut(48, "d", false)];
        assert_eq!(compare_cuts(&longer, &now), CutNow::Changed { same: 0 });
    }

    #[test]
    fn what_changed_is_named() {
        let before = BTreeMap::from([
            (JOB_FILE.to_owned(), "a".to_owned()),
            (INPUT.to_owned(), "b".to_owned()),
        ]);
        let mut now = before.clone();
        assert!(changed(&before, &now).is_empty());
        now.insert(JOB_FILE.to_owned(), "c".to_owned());
        now.insert(CODE.to_owned(), "d".to_owned());
        // The input is told by its cut, not by a header (an older journal's names it).
        now.remove(INPUT);
        assert_eq!(changed(&before, &now), [JOB_FILE, CODE]);
    }
}
