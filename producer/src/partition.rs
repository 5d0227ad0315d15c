//! Partitioning a file input into mini-batches, streamed: each mini-batch is published as
//! soon as its files are listed, so memory holds one mini-batch whatever the input's size.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use fleetrun_common::ledger::journal::Cut;
use fleetrun_common::queue::QueueError;
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_common::wire::MiniBatch;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::publisher::Publisher;

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// A file of a partitioned input whose path does not have `partition_format`'s shape.
    #[error(
        "partition_format: the input file {key:?} does not match {format:?}; move it out of the input or widen the format"
    )]
    Unmatched { key: String, format: String },
    #[error("listing the input failed: {0}")]
    List(#[from] StorageError),
    #[error("publishing a mini-batch failed: {0}")]
    Publish(#[from] QueueError),
    #[error(transparent)]
    Tabular(#[from] crate::tabular::TabularError),
}

/// Item slots reserved ahead for a mini-batch: `mini_batch_size` is the user's number, and
/// reserving 10¹⁰ slots would abort the producer before the first file is listed.
const ITEMS_RESERVED: usize = 1024;

/// Mini-batches cut between two notes of how far the input is cut ([`Produced::noting_cuts`]).
pub const CUT_EVERY: u64 = 16;

/// Where a producer notes how far it has cut the input (a local run's journal).
type CutNote = Box<dyn Fn(Cut) + Send + Sync>;

/// Counts of what the queue has confirmed, readable while the producer runs, and what was
/// cut.
#[derive(Default)]
pub struct Produced {
    pub mini_batches: AtomicU64,
    pub items: AtomicU64,
    /// Every mini-batch made, in order, as a SHA-256 of what it holds (its index, items,
    /// partition values and chunks): the input's listing as the job cut it, to tell whether
    /// a job resumed later would be cut the same.
    listing: Mutex<Sha256>,
    /// Mini-batches made so far.
    made: AtomicU64,
    /// The last cut at a multiple of [`CUT_EVERY`] mini-batches.
    last_cut: Mutex<Option<Cut>>,
    /// Told the listing's digest every [`CUT_EVERY`] mini-batches, at `cut_at` mini-batches
    /// and at the end.
    cut_note: Option<CutNote>,
    cut_at: Option<u64>,
}

impl Produced {
    /// Notes how far the input is cut, and its digest so far, every [`CUT_EVERY`]
    /// mini-batches made and once the whole input is ([`Produced::finished`]).
    pub fn noting_cuts(note: impl Fn(Cut) + Send + Sync + 'static) -> Produced {
        Produced {
            cut_note: Some(Box::new(note)),
            ..Produced::default()
        }
    }

    /// [`Produced::noting_cuts`], noting the cut at `batches` mini-batches too (to compare
    /// with a cut noted there by [`Produced::cut_now`]).
    pub fn noting_cuts_at(batches: u64, note: impl Fn(Cut) + Send + Sync + 'static) -> Produced {
        Produced {
            cut_at: Some(batches),
            ..Produced::noting_cuts(note)
        }
    }

    pub(crate) fn confirmed(&self, items: u64) {
        self.mini_batches.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(items, Ordering::Relaxed);
    }

    /// Adds a mini-batch made (in index order) to the listing's digest.
    pub(crate) fn made(&self, batch: &MiniBatch) {
        let mut listing = self.listing.lock().unwrap_or_else(|p| p.into_inner());
        listing.update(batch.index.to_le_bytes());
        for item in &batch.items {
            listing.update(item.as_bytes());
            listing.update([0]);
        }
        for (name, value) in batch.partition.iter().flat_map(|p| &p.0) {
            listing.update(name.as_bytes());
            listing.update([1]);
            listing.update(value.as_bytes());
            listing.update([0]);
        }
        for chunk in &batch.chunks {
            listing.update(chunk.key.as_bytes());
            listing.update([0]);
            listing.update(chunk.size.to_le_bytes());
            for [start, end] in &chunk.ranges {
                listing.update(start.to_le_bytes());
                listing.update(end.to_le_bytes());
            }
        }
        let made = batch.index + 1;
        self.made.store(made, Ordering::Relaxed);
        let every = made.is_multiple_of(CUT_EVERY);
        if every || self.cut_at == Some(made) {
            let cut = Cut {
                batches: made,
                listing: hex(&listing),
                whole: false,
            };
            if let Some(note) = &self.cut_note {
                note(cut.clone());
            }
            if every {
                *self.last_cut.lock().unwrap_or_else(|p| p.into_inner()) = Some(cut);
            }
        }
    }

    /// The cut of every mini-batch made so far (at least all those published).
    pub(crate) fn cut_now(&self) -> Cut {
        let listing = self.listing.lock().unwrap_or_else(|p| p.into_inner());
        Cut {
            batches: self.made.load(Ordering::Relaxed),
            listing: hex(&listing),
            whole: false,
        }
    }

    /// The last cut at a multiple of [`CUT_EVERY`] mini-batches made, if any: how far the
    /// input is cut, for one who notes it while the input is still being cut.
    pub(crate) fn last_cut(&self) -> Option<Cut> {
        self.last_cut
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The digest of the whole input's cut into `total` mini-batches, noted as such.
    pub(crate) fn finished(&self, total: u64) -> String {
        let listing = hex(&self.listing.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(note) = &self.cut_note {
            note(Cut {
                batches: total,
                listing: listing.clone(),
                whole: true,
            });
        }
        listing
    }
}

/// A digest so far, in hex.
fn hex(listing: &Sha256) -> String {
    listing
        .clone()
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Lists `prefix` of `input` in key order and publishes mini-batches of `size` files, until
/// the listing ends or `stop` is cancelled (the job no longer runs).
pub async fn publish_files(
    input: &dyn Storage,
    prefix: &str,
    size: usize,
    publisher: &mut Publisher<'_>,
    stop: &CancellationToken,
) -> Result<(), PartitionError> {
    let size = size.max(1);
    // Keys alone: a local folder then reads no file's metadata.
    let mut listing = input.list_keys(prefix);
    let reserve = size.min(ITEMS_RESERVED);
    let mut items = Vec::with_capacity(reserve);
    while !stop.is_cancelled() {
        let next = listing.next().await.transpose()?;
        let exhausted = next.is_none();
        if let Some(mut listed) = next {
            // The key relative to the input, cut in place: no copy per item.
            let cut = listed.len()
                - listed
                    .strip_prefix(prefix)
                    .unwrap_or(&listed)
                    .trim_start_matches('/')
                    .len();
            listed.drain(..cut);
            items.push(listed);
            if items.len() < size {
                continue;
            }
        }
        if !items.is_empty() {
            let count = items.len() as u64;
            let items = std::mem::replace(&mut items, Vec::with_capacity(reserve));
            let batch = MiniBatch::new(publisher.job(), publisher.next_index(), items);
            publisher.publish(batch, count).await?;
        }
        if exhausted {
            break;
        }
    }
    Ok(())
}

/// Publishes `items` (keys relative to the input) in mini-batches of `size`, in their order,
/// until they end or `stop`: a job over a list of the input's files.
pub async fn publish_items(
    items: &[String],
    size: usize,
    publisher: &mut Publisher<'_>,
    stop: &CancellationToken,
) -> Result<(), PartitionError> {
    for chunk in items.chunks(size.max(1)) {
        if stop.is_cancelled() {
            break;
        }
        let batch = MiniBatch::new(publisher.job(), publisher.next_index(), chunk.to_vec());
        publisher.publish(batch, chunk.len() as u64).await?;
    }
    Ok(())
}

/// Publishes a file input partitioned by the path parts `keys` of `format` (validated with
/// the job file): each mini-batch holds the files of one combination of the keys' values, in
/// the order of those values, then of the keys. The whole listing is read before the first
/// mini-batch is published (files of one value need not be listed together), so memory
/// holds the input's keys. A file whose path does not match the format fails the job
/// before anything is published: none is silently left out.
pub async fn publish_partitioned_files(
    input: &dyn Storage,
    format: &str,
    keys: &[String],
    publisher: &mut Publisher<'_>,
    stop: &CancellationToken,
) -> Result<(), PartitionError> {
    let parsed =
        fleetrun_config::PartitionFormat::parse(format).map_err(|_| PartitionError::Unmatched {
            key: String::new(),
            format: format.to_owned(),
        })?;
    let mut groups: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    let mut listing = input.list_keys("");
    while let Some(key) = listing.next().await.transpose()? {
        let Some(values) = parsed.matches(&key) else {
            return Err(PartitionError::Unmatched {
                key,
                format: format.to_owned(),
            });
        };
        let group = keys
            .iter()
            .map(|k| values.get(k).cloned().unwrap_or_default())
            .collect();
        groups.entry(group).or_default().push(key);
    }
    for (values, items) in groups {
        if stop.is_cancelled() {
            break;
        }
        let count = items.len() as u64;
        let mut batch = MiniBatch::new(publisher.job(), publisher.next_index(), items);
        batch.partition = Some(keys.iter().cloned().zip(values).collect());
        publisher.publish(batch, count).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use fleetrun_common::queue::{Disposition, MemoryQueue, Queue, QueueOptions};
    use fleetrun_common::storage::LocalStorage;

    use super::*;

    async fn drain(queue: &MemoryQueue, n: u64) -> Vec<MiniBatch> {
        let mut consumer = queue.consume("j", 100).await.unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            let d = consumer.next().await.unwrap();
            out.push(MiniBatch::decode(&d.body).unwrap());
            d.settle(Disposition::Ack).await.unwrap();
        }
        assert_eq!(queue.ready("j").await.unwrap(), 0);
        out
    }

    /// Publishes the files of `storage` under `prefix` as job `j`'s mini-batches of `size`.
    async fn publish(
        storage: &LocalStorage,
        prefix: &str,
        size: usize,
        queue: &MemoryQueue,
        produced: &Produced,
    ) -> u64 {
        let mut publisher = Publisher::new("j", queue, produced);
        let stop = CancellationToken::new();
        publish_files(storage, prefix, size, &mut publisher, &stop)
            .await
            .unwrap();
        publisher.finish().await.unwrap()
    }

    #[tokio::test]
    async fn chunks_files_recursively_in_key_order() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::new(dir.path());
        for key in ["b/2", "a/1", "a/3", "c", "a/2"] {
            storage.put(key, Bytes::from_static(b"x")).await.unwrap();
        }
        let queue = MemoryQueue::new(QueueOptions::default());
        let produced = Produced::default();
        let total = publish(&storage, "", 2, &queue, &produced).await;
        assert_eq!(total, 3);
        assert_eq!(produced.items.load(Ordering::Relaxed), 5);
        let batches = drain(&queue, 3).await;
        let items: Vec<Vec<String>> = batches.iter().map(|b| b.items.clone()).collect();
        assert_eq!(items, [vec!["a/1", "a/2"], vec!["a/3", "b/2"], vec!["c"]]);
        assert_eq!(
            batches.iter().map(|b| b.index).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    /// `mini_batch_size` is the user's number: a huge one makes one mini-batch of what there
    /// is, not an allocation of its size.
    #[tokio::test]
    async fn a_huge_mini_batch_size_makes_one_mini_batch() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::new(dir.path());
        for key in ["a", "b", "c"] {
            storage.put(key, Bytes::from_static(b"x")).await.unwrap();
        }
        for size in [10_000_000_000, usize::MAX] {
            let queue = MemoryQueue::new(QueueOptions::default());
            let total = publish(&storage, "", size, &queue, &Produced::default()).await;
            assert_eq!(total, 1);
            assert_eq!(drain(&queue, 1).await[0].items, ["a", "b", "c"]);
        }
    }

    /// Under a prefix, items are the keys relative to it, cut in place.
    #[tokio::test]
    async fn items_under_a_prefix_are_relative_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::new(dir.path());
        for key in ["in/a", "in/d/b", "other"] {
            storage.put(key, Bytes::from_static(b"x")).await.unwrap();
        }
        let queue = MemoryQueue::new(QueueOptions::default());
        let total = publish(&storage, "in/", 10, &queue, &Produced::default()).await;
        assert_eq!(total, 1);
        assert_eq!(drain(&queue, 1).await[0].items, ["a", "d/b"]);
    }

    #[tokio::test]
    async fn empty_input_makes_no_mini_batch() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::new(dir.path());
        let queue = MemoryQueue::new(QueueOptions::default());
        let total = publish(&storage, "", 10, &queue, &Produced::default()).await;
        assert_eq!(total, 0);
    }

    /// The producer waits on a bounded queue instead of buffering the whole input.
    #[tokio::test]
    async fn publishing_waits_for_a_bounded_queue() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::new(dir.path());
        for i in 0..50 {
            storage
                .put(&format!("f{i:03}"), Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        let queue = Arc::new(MemoryQueue::bounded(QueueOptions::default(), 3));
        let produced = Arc::new(Produced::default());
        let task = {
            let (queue, produced) = (queue.clone(), produced.clone());
            tokio::spawn(async move {
                let mut publisher = Publisher::new("j", &*queue, &produced);
                let (input, stop) = (LocalStorage::new(dir.path()), CancellationToken::new());
                publish_files(&input, "", 1, &mut publisher, &stop).await?;
                Ok::<_, PartitionError>(publisher.finish().await?)
            })
        };
        let mut consumer = queue.consume("j", 1).await.unwrap();
        let first = consumer.next().await.unwrap();
        // With one message out and three waiting, the producer cannot be far ahead.
        tokio::task::yield_now().await;
        assert!(produced.mini_batches.load(Ordering::Relaxed) <= 5);
        first.settle(Disposition::Ack).await.unwrap();
        for _ in 1..50 {
            consumer
                .next()
                .await
                .unwrap()
                .settle(Disposition::Ack)
                .await
                .unwrap();
        }
        assert_eq!(task.await.unwrap().unwrap(), 50);
    }

    #[tokio::test]
    async fn a_partitioned_file_input_makes_one_mini_batch_per_key_combination() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalStorage::new(dir.path());
        for key in [
            "ann/jazz/a.txt",
            "bob/jazz/b.txt",
            "ann/rock/c.txt",
            "ann/jazz/d.txt",
            "bob/jazz/e.txt",
        ] {
            storage.put(key, Bytes::from_static(b"x")).await.unwrap();
        }
        let queue = MemoryQueue::new(QueueOptions::default());
        let keys = ["user".to_owned(), "genres".to_owned()];
        let produced = Produced::default();
        let mut publisher = Publisher::new("j", &queue, &produced);
        let stop = CancellationToken::new();
        publish_partitioned_files(&storage, FORMAT, &keys, &mut publisher, &stop)
            .await
            .unwrap();
        let total = publisher.finish().await.unwrap();
        assert_eq!(total, 3);
        let batches = drain(&queue, 3).await;
        type Seen = (Vec<String>, Vec<(String, String)>);
        let seen: Vec<Seen> = batches
            .iter()
            .map(|b| (b.items.clone(), b.partition.clone().unwrap().0))
            .collect();
        // In the order of `partition_keys`, not of the names.
        let kv = |u: &str, g: &str| {
            vec![
                ("user".to_owned(), u.to_owned()),
                ("genres".to_owned(), g.to_owned()),
            ]
        };
        assert_eq!(
            seen,
            [
                (
                    strings(&["ann/jazz/a.txt", "ann/jazz/d.txt"]),
                    kv("ann", "jazz")
                ),
                (strings(&["ann/rock/c.txt"]), kv("ann", "rock")),
                (
                    strings(&["bob/jazz/b.txt", "bob/jazz/e.txt"]),
                    kv("bob", "jazz")
                ),
            ]
        );

        // A file that does not match fails before anything is published.
        storage
            .put("README.md", Bytes::from_static(b"x"))
            .await
            .unwrap();
        let queue = MemoryQueue::new(QueueOptions::default());
        let mut publisher = Publisher::new("j", &queue, &produced);
        let e = publish_partitioned_files(&storage, FORMAT, &keys, &mut publisher, &stop)
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("\"README.md\" does not match"),
            "{e}"
        );
        assert_eq!(queue.ready("j").await.unwrap(), 0);
    }

    const FORMAT: &str = "{user}/{genres}/{name}.txt";

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }
}
