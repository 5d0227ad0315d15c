//! The one way a job's mini-batches reach the queue, whatever input cut them (files,
//! partitioned files, a list of items, tabular chunks): [`Publisher`] numbers them in order,
//! adds each to the listing's digest ([`Produced::made`]), and keeps a window of publishes
//! awaiting their confirmation, counting what the queue confirmed.

use fleetrun_common::queue::{Queue, QueueError};
use fleetrun_common::wire::MiniBatch;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};

use crate::partition::Produced;

/// Publishes awaiting their confirmation at once.
const PUBLISH_WINDOW: usize = 64;

/// Where a job's mini-batches go, in the order they are made. Publishes in flight together
/// keep their order once the job's lane is open (`Queue::open_lane`).
pub struct Publisher<'a> {
    job: &'a str,
    queue: &'a dyn Queue,
    produced: &'a Produced,
    index: u64,
    /// Each publish in flight, answering the items it carries once confirmed.
    in_flight: FuturesOrdered<BoxFuture<'a, Result<u64, QueueError>>>,
}

impl<'a> Publisher<'a> {
    pub fn new(job: &'a str, queue: &'a dyn Queue, produced: &'a Produced) -> Publisher<'a> {
        Publisher {
            job,
            queue,
            produced,
            index: 0,
            in_flight: FuturesOrdered::new(),
        }
    }

    /// The job the mini-batches are of.
    pub fn job(&self) -> &'a str {
        self.job
    }

    /// The index the next mini-batch takes: mini-batches are numbered from 0 in the order
    /// they are made.
    pub fn next_index(&self) -> u64 {
        self.index
    }

    /// Publishes `batch` (numbered [`Publisher::next_index`]), which carries `items` items (or
    /// rows), counted once the queue confirms it. Waits only when the window is full.
    pub async fn publish(&mut self, batch: MiniBatch, items: u64) -> Result<(), QueueError> {
        debug_assert_eq!(
            batch.index, self.index,
            "mini-batches are published in order"
        );
        self.produced.made(&batch);
        let body = batch.encode();
        let (queue, job) = (self.queue, self.job);
        self.in_flight
            .push_back(async move { queue.publish(job, body).await.map(|()| items) }.boxed());
        self.index += 1;
        while let Some(Some(published)) = self.in_flight.next().now_or_never() {
            self.produced.confirmed(published?);
        }
        if self.in_flight.len() >= PUBLISH_WINDOW
            && let Some(published) = self.in_flight.next().await
        {
            self.produced.confirmed(published?);
        }
        Ok(())
    }

    /// Waits for every publish in flight; returns the number of mini-batches published.
    pub async fn finish(mut self) -> Result<u64, QueueError> {
        while let Some(published) = self.in_flight.next().await {
            self.produced.confirmed(published?);
        }
        Ok(self.index)
    }
}
