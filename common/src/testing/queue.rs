//! The queue conformance suite.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::queue::{Disposition, Queue, QueueOptions};

/// Long enough for any real broker on loopback to deliver; only reached when a case fails.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long a case waits to be sure nothing more arrives.
const QUIET: Duration = Duration::from_millis(300);
/// The lane most cases use (a job's id).
const LANE: &str = "job-a";

fn lanes() -> Vec<String> {
    vec![LANE.to_owned()]
}

/// Generates one `#[tokio::test]` per case for the queue built by `$make`, an async closure
/// taking [`QueueOptions`] and returning `Arc<dyn Queue>`.
#[macro_export]
macro_rules! queue_conformance {
    ($make:expr) => {
        $crate::queue_conformance!(@cases $make;
            publish_then_consume_in_order, first_delivery_is_attempt_one,
            requeue_counts_an_attempt, return_costs_no_attempt, dropped_delivery_comes_back,
            delivery_limit_dead_letters, dead_letter_disposition_is_immediate,
            prefetch_bounds_unsettled, pause_gives_back_what_was_not_handed_out,
            a_next_dropped_midway_leaves_nothing_held,
            depth_counts_ready_and_unacked, lanes_are_apart, a_closed_lane_drops_what_it_held,
            an_open_lane_keeps_the_order_of_publishes_in_flight,
            dead_letters_stay_for_operators_in_order,
            a_hold_removes_what_it_chose_and_puts_back_the_rest);
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testing::queue::$case($make).await;
            }
        )*
    };
}

async fn next(consumer: &mut Box<dyn crate::queue::Consumer>) -> crate::queue::Delivery {
    tokio::time::timeout(PATIENCE, consumer.next())
        .await
        .expect("no delivery in time")
        .expect("consume")
}

async fn nothing_more(consumer: &mut Box<dyn crate::queue::Consumer>) {
    if let Ok(d) = tokio::time::timeout(QUIET, consumer.next()).await {
        panic!("unexpected delivery {:?}", d);
    }
}

pub async fn publish_then_consume_in_order<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    for i in 0..5u8 {
        q.publish(LANE, vec![i]).await.unwrap();
    }
    let mut c = q.consume(LANE, 10).await.unwrap();
    for i in 0..5u8 {
        let d = next(&mut c).await;
        assert_eq!(&d.body[..], &[i]);
        assert!(d.settle(Disposition::Ack).await.unwrap());
    }
    nothing_more(&mut c).await;
}

pub async fn first_delivery_is_attempt_one<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    q.publish(LANE, b"m".to_vec()).await.unwrap();
    let mut c = q.consume(LANE, 1).await.unwrap();
    let d = next(&mut c).await;
    assert_eq!(d.attempt, 1);
    assert!(d.dead_reason.is_none());
    d.settle(Disposition::Ack).await.unwrap();
}

pub async fn requeue_counts_an_attempt<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions {
        delivery_limit: Some(10),
    })
    .await;
    q.publish(LANE, b"m".to_vec()).await.unwrap();
    let mut c = q.consume(LANE, 1).await.unwrap();
    for attempt in 1..=3 {
        let d = next(&mut c).await;
        assert_eq!(d.attempt, attempt);
        assert!(d.settle(Disposition::Requeue).await.unwrap());
    }
    let d = next(&mut c).await;
    assert_eq!(d.attempt, 4);
    d.settle(Disposition::Ack).await.unwrap();
    nothing_more(&mut c).await;
}

/// A message given back untried comes back as the same attempt, however often, and never
/// reaches the delivery limit that way.
pub async fn return_costs_no_attempt<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions {
        delivery_limit: Some(2),
    })
    .await;
    q.publish(LANE, b"m".to_vec()).await.unwrap();
    let mut c = q.consume(LANE, 1).await.unwrap();
    let d = next(&mut c).await;
    assert!(d.settle(Disposition::Requeue).await.unwrap());
    for _ in 0..4 {
        let d = next(&mut c).await;
        assert_eq!((&d.body[..], d.attempt), (&b"m"[..], 2));
        assert!(d.settle(Disposition::Return).await.unwrap());
    }
    let d = next(&mut c).await;
    assert_eq!(d.attempt, 2);
    assert!(d.settle(Disposition::Ack).await.unwrap());
    nothing_more(&mut c).await;
    assert_eq!(q.depth(&lanes()).await.unwrap().dead, 0);
}

/// A consumer that dies holding a message (its delivery dropped, its channel gone) costs the
/// message an attempt, and the message comes back to another consumer.
pub async fn dropped_delivery_comes_back<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions {
        delivery_limit: Some(10),
    })
    .await;
    q.publish(LANE, b"m".to_vec()).await.unwrap();
    {
        let mut c = q.consume(LANE, 1).await.unwrap();
        let d = next(&mut c).await;
        assert_eq!(d.attempt, 1);
        drop(d);
        drop(c);
    }
    let mut c = q.consume(LANE, 1).await.unwrap();
    let d = next(&mut c).await;
    assert_eq!(&d.body[..], b"m");
    assert_eq!(d.attempt, 2);
    d.settle(Disposition::Ack).await.unwrap();
}

pub async fn delivery_limit_dead_letters<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    // A limit of 2 allows 3 deliveries; the third return dead-letters.
    let q = make(QueueOptions {
        delivery_limit: Some(2),
    })
    .await;
    q.publish(LANE, b"poison".to_vec()).await.unwrap();
    let mut c = q.consume(LANE, 1).await.unwrap();
    for attempt in 1..=3 {
        let d = next(&mut c).await;
        assert_eq!(d.attempt, attempt);
        d.settle(Disposition::Requeue).await.unwrap();
    }
    nothing_more(&mut c).await;
    let mut dead = q.consume_dead(1).await.unwrap();
    let d = next(&mut dead).await;
    assert_eq!(&d.body[..], b"poison");
    assert_eq!(d.dead_reason.as_deref(), Some("delivery_limit"));
    d.settle(Disposition::Ack).await.unwrap();
    // The recorders' copy is gone; the operators' stays, saying why and after how much.
    wait_dead(&*q, 1).await;
    let letters = q.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(&letters[0].body[..], b"poison");
    assert_eq!(letters[0].reason.as_deref(), Some("delivery_limit"));
    assert_eq!(letters[0].deliveries, Some(3));
}

/// Every dead letter stays in the dead-letter queue whatever the recorders do with their
/// copy: browsing it shows the oldest first, up to the limit, and leaves them all there.
pub async fn dead_letters_stay_for_operators_in_order<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions {
        delivery_limit: Some(5),
    })
    .await;
    dead_letter_three(&*q).await;
    let mut inbox = q.consume_dead(10).await.unwrap();
    for i in 0..3u8 {
        let d = next(&mut inbox).await;
        assert_eq!(d.body[0], i);
        d.settle(Disposition::Ack).await.unwrap();
    }
    nothing_more(&mut inbox).await;
    wait_dead(&*q, 3).await;
    for _ in 0..2 {
        let letters = q.dead_letters(10).await.unwrap();
        let bodies: Vec<u8> = letters.iter().map(|l| l.body[0]).collect();
        assert_eq!(bodies, [0, 1, 2]);
        assert!(
            letters
                .iter()
                .all(|l| l.reason.as_deref() == Some("rejected"))
        );
    }
    let first_two = q.dead_letters(2).await.unwrap();
    assert_eq!(
        first_two.iter().map(|l| l.body[0]).collect::<Vec<_>>(),
        [0, 1]
    );
    // A browsed letter goes back with a requeue, which a quorum queue's count shows a moment
    // later.
    wait_dead(&*q, 3).await;
}

/// A hold removes the dead letters it is told to, for good, and puts the others back in
/// their order; a hold dropped unreleased puts back all it did not remove.
pub async fn a_hold_removes_what_it_chose_and_puts_back_the_rest<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions {
        delivery_limit: Some(5),
    })
    .await;
    dead_letter_three(&*q).await;
    wait_dead(&*q, 3).await;
    let mut hold = q.hold_dead(10).await.unwrap();
    assert_eq!(hold.letters().len(), 3);
    hold.remove(1).await.unwrap();
    hold.release().await.unwrap();
    wait_dead(&*q, 2).await;
    let bodies: Vec<u8> = q
        .dead_letters(10)
        .await
        .unwrap()
        .iter()
        .map(|l| l.body[0])
        .collect();
    assert_eq!(bodies, [0, 2]);
    let mut hold = q.hold_dead(1).await.unwrap();
    assert_eq!(hold.letters()[0].body[0], 0);
    hold.remove(0).await.unwrap();
    drop(hold);
    wait_dead(&*q, 1).await;
    let left = q.dead_letters(10).await.unwrap();
    assert_eq!(left.iter().map(|l| l.body[0]).collect::<Vec<_>>(), [2]);
}

/// Publishes 0, 1, 2 and dead-letters each (reason `rejected`), in that order.
async fn dead_letter_three(q: &dyn Queue) {
    for i in 0..3u8 {
        q.publish(LANE, vec![i]).await.unwrap();
    }
    let mut c = q.consume(LANE, 1).await.unwrap();
    for i in 0..3u8 {
        let d = next(&mut c).await;
        assert_eq!(d.body[0], i);
        d.settle(Disposition::DeadLetter).await.unwrap();
    }
    nothing_more(&mut c).await;
}

/// Waits until the dead-letter queue holds `n` (a broker dead-letters on its own time).
async fn wait_dead(q: &dyn Queue, n: u64) {
    wait_for_depth(q, |depth| depth.dead == n).await;
}

pub async fn dead_letter_disposition_is_immediate<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions {
        delivery_limit: Some(5),
    })
    .await;
    q.publish(LANE, b"garbage".to_vec()).await.unwrap();
    let mut c = q.consume(LANE, 1).await.unwrap();
    next(&mut c)
        .await
        .settle(Disposition::DeadLetter)
        .await
        .unwrap();
    nothing_more(&mut c).await;
    let depth = q.depth(&lanes()).await.unwrap();
    assert_eq!((depth.ready, depth.dead), (0, 1));
    let mut dead = q.consume_dead(1).await.unwrap();
    let d = next(&mut dead).await;
    assert_eq!(d.dead_reason.as_deref(), Some("rejected"));
    d.settle(Disposition::Ack).await.unwrap();
}

pub async fn prefetch_bounds_unsettled<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    for i in 0..3u8 {
        q.publish(LANE, vec![i]).await.unwrap();
    }
    let mut c = q.consume(LANE, 2).await.unwrap();
    let a = next(&mut c).await;
    let b = next(&mut c).await;
    // A third delivery waits for a settlement.
    if tokio::time::timeout(QUIET, c.next()).await.is_ok() {
        panic!("prefetch of 2 delivered a third message");
    }
    a.settle(Disposition::Ack).await.unwrap();
    let third = next(&mut c).await;
    b.settle(Disposition::Ack).await.unwrap();
    third.settle(Disposition::Ack).await.unwrap();
}

/// A paused consumer holds nothing it did not hand out: what the queue pushed to it goes to
/// another consumer as the same attempt, and the paused one takes work again on `next`.
pub async fn pause_gives_back_what_was_not_handed_out<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    for i in 0..3u8 {
        q.publish(LANE, vec![i]).await.unwrap();
    }
    let mut paused = q.consume(LANE, 3).await.unwrap();
    let first = next(&mut paused).await;
    paused.pause().await.unwrap();
    let mut other = q.consume(LANE, 3).await.unwrap();
    let mut taken = Vec::new();
    for _ in 0..2 {
        let d = next(&mut other).await;
        assert_eq!(
            d.attempt, 1,
            "a message given back by a pause costs no attempt"
        );
        taken.push(d.body[0]);
        d.settle(Disposition::Ack).await.unwrap();
    }
    taken.sort_unstable();
    assert_eq!(taken, [1, 2]);
    // What was handed out before the pause is settled as usual.
    first.settle(Disposition::Ack).await.unwrap();
    other.pause().await.unwrap();
    q.publish(LANE, vec![3]).await.unwrap();
    let d = next(&mut paused).await;
    assert_eq!((d.body[0], d.attempt), (3, 1));
    d.settle(Disposition::Ack).await.unwrap();
    wait_depth(&*q, |ready, unacked| ready == 0 && unacked == 0).await;
}

/// A `next` dropped while it waits (a `select!` took another branch) leaves the consumer
/// holding nothing once it pauses: every message reaches another consumer, untried.
pub async fn a_next_dropped_midway_leaves_nothing_held<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    let mut dropping = q.consume(LANE, 3).await.unwrap();
    for _ in 0..3 {
        // Polled once, then dropped: whatever it had started is left midway.
        let _ = tokio::time::timeout(Duration::ZERO, dropping.next()).await;
    }
    for i in 0..3u8 {
        q.publish(LANE, vec![i]).await.unwrap();
    }
    dropping.pause().await.unwrap();
    let mut other = q.consume(LANE, 3).await.unwrap();
    let mut taken = Vec::new();
    for _ in 0..3 {
        let d = next(&mut other).await;
        assert_eq!(d.attempt, 1);
        taken.push(d.body[0]);
        d.settle(Disposition::Ack).await.unwrap();
    }
    taken.sort_unstable();
    assert_eq!(taken, [0, 1, 2]);
}

pub async fn depth_counts_ready_and_unacked<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    for i in 0..3u8 {
        q.publish(LANE, vec![i]).await.unwrap();
    }
    let mut c = q.consume(LANE, 1).await.unwrap();
    let d = next(&mut c).await;
    // One is held; a broker may already have pushed the next one to the consumer (it is
    // then unacknowledged too), but nothing is lost or counted twice.
    wait_depth(&*q, |ready, unacked| ready + unacked == 3 && unacked >= 1).await;
    d.settle(Disposition::Ack).await.unwrap();
    wait_depth(&*q, |ready, unacked| ready + unacked == 2).await;
}

/// Polls the depth until it meets `want(ready, unacked)`: management statistics of a
/// broker lag behind by design, so this is a wait on a condition, bounded by [`PATIENCE`].
async fn wait_depth(q: &dyn Queue, want: impl Fn(u64, u64) -> bool) {
    wait_for_depth(q, |depth| want(depth.ready, depth.unacked.unwrap_or(0))).await;
}

/// Polls the depth until it meets `want`, bounded by [`PATIENCE`].
async fn wait_for_depth(q: &dyn Queue, want: impl Fn(&crate::queue::Depth) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let depth = q.depth(&lanes()).await.unwrap();
        if want(&depth) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "depth stayed {depth:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each lane is a queue of its own: a consumer of one never sees another's messages, a
/// lane's ready count is its own, and the depth sums the lanes asked for.
pub async fn lanes_are_apart<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    assert_eq!(q.ready("job-never-seen").await.unwrap(), 0);
    for i in 0..3u8 {
        q.publish("job-a", vec![i]).await.unwrap();
    }
    q.publish("job-b", vec![10]).await.unwrap();
    assert_eq!(q.ready("job-a").await.unwrap(), 3);
    assert_eq!(q.ready("job-b").await.unwrap(), 1);
    let both = ["job-a".to_owned(), "job-b".to_owned()];
    assert_eq!(q.depth(&both).await.unwrap().ready, 4);
    let mut b = q.consume("job-b", 3).await.unwrap();
    let d = next(&mut b).await;
    assert_eq!(&d.body[..], &[10]);
    d.settle(Disposition::Ack).await.unwrap();
    nothing_more(&mut b).await;
    b.pause().await.unwrap();
    assert_eq!(q.ready("job-a").await.unwrap(), 3);
    let mut a = q.consume("job-a", 3).await.unwrap();
    for i in 0..3u8 {
        let d = next(&mut a).await;
        assert_eq!(&d.body[..], &[i]);
        d.settle(Disposition::Ack).await.unwrap();
    }
    wait_depth(&*q, |ready, unacked| ready == 0 && unacked == 0).await;
}

/// Closing a lane drops what waits in it; a later publish makes it again.
pub async fn a_closed_lane_drops_what_it_held<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    for i in 0..2u8 {
        q.publish(LANE, vec![i]).await.unwrap();
    }
    q.close_lane(LANE).await.unwrap();
    assert_eq!(q.ready(LANE).await.unwrap(), 0);
    q.close_lane("job-never-seen").await.unwrap();
    q.publish(LANE, vec![7]).await.unwrap();
    let mut c = q.consume(LANE, 3).await.unwrap();
    let d = next(&mut c).await;
    assert_eq!(&d.body[..], &[7]);
    d.settle(Disposition::Ack).await.unwrap();
    nothing_more(&mut c).await;
}

/// Publishes in flight together reach an opened lane in the order they were made (a
/// publisher pipelines its mini-batches).
pub async fn an_open_lane_keeps_the_order_of_publishes_in_flight<F, Fut>(make: F)
where
    F: Fn(QueueOptions) -> Fut,
    Fut: Future<Output = Arc<dyn Queue>>,
{
    let q = make(QueueOptions::default()).await;
    q.open_lane(LANE).await.unwrap();
    let publishes: futures::stream::FuturesOrdered<_> =
        (0..20u8).map(|i| q.publish(LANE, vec![i])).collect();
    let published: Vec<_> = futures::StreamExt::collect(publishes).await;
    assert!(published.iter().all(Result::is_ok), "{published:?}");
    let mut c = q.consume(LANE, 20).await.unwrap();
    for i in 0..20u8 {
        let d = next(&mut c).await;
        assert_eq!(&d.body[..], &[i]);
        d.settle(Disposition::Ack).await.unwrap();
    }
}
