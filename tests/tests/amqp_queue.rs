#![cfg(feature = "services")]
//! `AmqpQueue` against the RabbitMQ of `scripts/services.sh`: the queue conformance suite, and
//! what only a real broker does (a lost connection, dead-lettering, confirms under load).
//!
//! Every test declares its own pool (a random name), so tests never share queues.

use std::collections::HashSet;
use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fleetrun_common::queue::amqp::AmqpQueue;
use fleetrun_common::queue::{
    Consumer, DeadLetterHold, Delivery, Depth, Disposition, Queue, QueueError, QueueOptions,
};
use fleetrun_common::testing::random_suffix;
use fleetrun_common::tls::Tls;
use fleetrun_tests::services::amqp_url;
use fleetrun_tests::{PrivateRabbitMq, output_within};
use futures::StreamExt;

/// The RabbitMQ node `scripts/services.sh` starts, for `rabbitmqctl -n`.
const NODE: &str = "fleetrun@localhost";
const PATIENCE: Duration = Duration::from_secs(20);

fn management_url() -> String {
    std::env::var("FLEETRUN_TEST_AMQP_MANAGEMENT_URL")
        .unwrap_or_else(|_| "http://guest:guest@127.0.0.1:15673".to_owned())
}

/// The lane (a job's queue) the cases of this file use.
const LANE: &str = "t";

fn pool() -> String {
    format!("test-{}", random_suffix())
}

async fn queue(pool: &str, options: QueueOptions) -> AmqpQueue {
    AmqpQueue::connect(
        &amqp_url(),
        pool,
        options,
        Some(&management_url()),
        &Tls::default(),
    )
    .await
    .expect("connect to RabbitMQ (is scripts/services.sh start done?)")
}

mod conformance {
    use super::*;
    fleetrun_common::queue_conformance!(|opts| async move {
        let pool = pool();
        let queue = queue(&pool, opts).await;
        Arc::new(Scoped { queue, pool }) as Arc<dyn Queue>
    });
}

mod events_conformance {
    use fleetrun_common::events::Events;

    use super::*;

    /// Every case's handles connect for one pool: what they declare is the same each time.
    const POOL: &str = "events-conformance";

    fleetrun_common::events_conformance!(|| async {
        Arc::new(queue(POOL, QueueOptions::default()).await) as Arc<dyn Events>
    });
}

/// A queue that deletes its pool's queues when the case is done with it.
struct Scoped {
    queue: AmqpQueue,
    pool: String,
}

/// What `#[async_trait]` makes of an `async fn` (this crate does not depend on it).
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, QueueError>> + Send + 'a>>;

impl Queue for Scoped {
    fn open_lane<'s, 'l, 'f>(&'s self, lane: &'l str) -> BoxFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.queue.open_lane(lane)
    }

    fn publish<'s, 'l, 'f>(&'s self, lane: &'l str, body: Vec<u8>) -> BoxFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.queue.publish(lane, body)
    }

    fn consume<'s, 'l, 'f>(
        &'s self,
        lane: &'l str,
        prefetch: u16,
    ) -> BoxFuture<'f, Box<dyn Consumer>>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.queue.consume(lane, prefetch)
    }

    fn consume_dead<'s, 'f>(&'s self, prefetch: u16) -> BoxFuture<'f, Box<dyn Consumer>>
    where
        's: 'f,
        Self: 'f,
    {
        self.queue.consume_dead(prefetch)
    }

    fn ready<'s, 'l, 'f>(&'s self, lane: &'l str) -> BoxFuture<'f, u64>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.queue.ready(lane)
    }

    fn depth<'s, 'l, 'f>(&'s self, lanes: &'l [String]) -> BoxFuture<'f, Depth>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.queue.depth(lanes)
    }

    fn close_lane<'s, 'l, 'f>(&'s self, lane: &'l str) -> BoxFuture<'f, ()>
    where
        's: 'f,
        'l: 'f,
        Self: 'f,
    {
        self.queue.close_lane(lane)
    }

    fn hold_dead<'s, 'f>(&'s self, limit: usize) -> BoxFuture<'f, Box<dyn DeadLetterHold>>
    where
        's: 'f,
        Self: 'f,
    {
        self.queue.hold_dead(limit)
    }
}

impl Drop for Scoped {
    fn drop(&mut self) {
        delete_pool(&self.pool);
    }
}

async fn next(consumer: &mut Box<dyn Consumer>) -> Delivery {
    tokio::time::timeout(PATIENCE, consumer.next())
        .await
        .expect("no delivery in time")
        .expect("consume")
}

async fn nothing_more(consumer: &mut Box<dyn Consumer>) {
    if let Ok(d) = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await {
        panic!("unexpected delivery {d:?}");
    }
}

/// Polls the depth until `done` holds (the broker's figures settle asynchronously).
async fn wait_depth(q: &AmqpQueue, done: impl Fn(&Depth) -> bool) -> Depth {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let depth = q.depth(&[LANE.to_owned()]).await.unwrap();
        if done(&depth) {
            return depth;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "depth stayed {depth:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn rabbitmqctl(args: &[&str]) -> String {
    let out = output_within(
        Command::new("rabbitmqctl")
            .args(["-n", NODE, "--quiet"])
            .args(args),
        PATIENCE * 3,
    );
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Closes this queue's connection from the broker's side (only this one: tests run in
/// parallel, so `close_all_connections` would disturb the others).
fn close_connection(q: &AmqpQueue) {
    let listing = rabbitmqctl(&[
        "list_connections",
        "--no-table-headers",
        "pid",
        "client_properties",
    ]);
    let pids: Vec<&str> = listing
        .lines()
        .filter(|line| line.contains(q.connection_name()))
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(
        pids.len(),
        1,
        "one connection named {}: {listing}",
        q.connection_name()
    );
    rabbitmqctl(&["close_connection", pids[0], "test"]);
}

/// Deletes the test's queues and exchange through the management API (plain HTTP/1.1, so
/// the tests need no HTTP client).
fn delete_pool(pool: &str) {
    for path in [
        format!("queues/%2F/fleetrun.{pool}.job.{LANE}"),
        format!("queues/%2F/fleetrun.{pool}.job.job-a"),
        format!("queues/%2F/fleetrun.{pool}.job.job-b"),
        format!("queues/%2F/fleetrun.{pool}.dead"),
        format!("queues/%2F/fleetrun.{pool}.dead.inbox"),
        format!("exchanges/%2F/fleetrun.{pool}.dlx"),
    ] {
        if let Err(e) = management_delete(&path) {
            eprintln!("cleanup of {path}: {e}");
        }
    }
}

fn management_delete(path: &str) -> std::io::Result<()> {
    let url = management_url();
    let rest = url
        .strip_prefix("http://")
        .expect("an http:// management URL");
    let (userinfo, host) = rest
        .trim_end_matches('/')
        .split_once('@')
        .expect("user info");
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "DELETE /api/{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {}\r\nConnection: close\r\n\r\n",
        base64(userinfo.as_bytes())
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response.lines().next().unwrap_or_default();
    if status.contains(" 204") || status.contains(" 200") {
        Ok(())
    } else {
        Err(std::io::Error::other(status.to_owned()))
    }
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The broker drops the connection while a delivery is held: lapin reconnects and replays
/// the consumer, the message comes back as attempt 2 on the same consumer, and the held
/// delivery's late settlement is refused (`Ok(false)`), not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connection_redelivers_and_late_ack_is_refused() {
    let pool = pool();
    let q = queue(
        &pool,
        QueueOptions {
            delivery_limit: Some(5),
        },
    )
    .await;
    q.publish(LANE, b"held".to_vec()).await.unwrap();
    // Prefetch 2: the held delivery keeps its place until settled, even once its channel is
    // gone (as an agent's slot stays busy until its mini-batch ends).
    let mut c = q.consume(LANE, 2).await.unwrap();
    let held = next(&mut c).await;
    assert_eq!(held.attempt, 1);

    let q2 = q.clone();
    tokio::task::spawn_blocking(move || close_connection(&q2))
        .await
        .unwrap();

    let again = next(&mut c).await;
    assert_eq!(&again.body[..], b"held");
    assert_eq!(again.attempt, 2);
    assert!(
        !held.settle(Disposition::Ack).await.unwrap(),
        "late ack refused"
    );
    assert!(again.settle(Disposition::Ack).await.unwrap());
    nothing_more(&mut c).await;

    // Publishing works on the recovered connection.
    q.publish(LANE, b"after".to_vec()).await.unwrap();
    let d = next(&mut c).await;
    assert_eq!((&d.body[..], d.attempt), (&b"after"[..], 1));
    assert!(d.settle(Disposition::Ack).await.unwrap());
    drop(c);
    delete_pool(&pool);
}

/// A follower of the job events hears them again once its connection was lost and restored
/// (events published meanwhile may be missed: a worker's share period finds what they said).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_hears_events_again_after_its_connection_is_lost() {
    use fleetrun_common::events::Events;
    use fleetrun_common::ledger::JobState;
    use fleetrun_common::testing::events::event;

    // Two pools, so that only the follower's connection has its name.
    let (follower_pool, publisher_pool) = (pool(), pool());
    let follower = queue(&follower_pool, QueueOptions::default()).await;
    let publisher = queue(&publisher_pool, QueueOptions::default()).await;
    let mut heard = follower.follow().await.unwrap();
    let closed = follower.clone();
    tokio::task::spawn_blocking(move || close_connection(&closed))
        .await
        .unwrap();

    let job = format!("job-{}", random_suffix());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let hears_it = async {
        loop {
            match heard.recv().await {
                Ok(event) if event.job_id == job => return,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("the follower stopped: {e}"),
            }
        }
    };
    tokio::pin!(hears_it);
    loop {
        Events::publish(&publisher, &event(&job, JobState::Running))
            .await
            .unwrap();
        if tokio::time::timeout(Duration::from_millis(200), &mut hears_it)
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing heard after the connection came back"
        );
    }
    delete_pool(&follower_pool);
    delete_pool(&publisher_pool);
}

/// A body the agent cannot decode is dead-lettered at once: it lands in the dead queue with
/// reason `rejected`, counted by `depth().dead`, and a copy in the recorders' inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_body_is_dead_lettered_as_rejected() {
    let pool = pool();
    let q = queue(
        &pool,
        QueueOptions {
            delivery_limit: Some(3),
        },
    )
    .await;
    let garbage = vec![0xc1, 0xff, 0x00, b'x'];
    q.publish(LANE, garbage.clone()).await.unwrap();
    let mut c = q.consume(LANE, 1).await.unwrap();
    let d = next(&mut c).await;
    assert_eq!(d.attempt, 1);
    assert!(d.settle(Disposition::DeadLetter).await.unwrap());
    nothing_more(&mut c).await;

    let depth = wait_depth(&q, |d| d.dead == 1 && d.unacked == Some(0)).await;
    assert_eq!(depth.ready, 0);

    let mut dead = q.consume_dead(1).await.unwrap();
    let d = next(&mut dead).await;
    assert_eq!(&d.body[..], &garbage[..]);
    assert_eq!(d.dead_reason.as_deref(), Some("rejected"));
    // Anything but an ack leaves a dead letter in the dead-letter queue.
    assert!(d.settle(Disposition::DeadLetter).await.unwrap());
    let d = next(&mut dead).await;
    assert_eq!(d.dead_reason.as_deref(), Some("rejected"));
    assert!(d.settle(Disposition::Ack).await.unwrap());
    // The recorders' copy is gone; the dead-letter queue keeps the message for operators.
    wait_depth(&q, |d| d.dead == 1 && d.unacked == Some(0)).await;
    let mut hold = q.hold_dead(10).await.unwrap();
    assert_eq!(hold.letters().len(), 1);
    assert_eq!(&hold.letters()[0].body[..], &garbage[..]);
    hold.remove(0).await.unwrap();
    hold.release().await.unwrap();
    let empty = Depth {
        ready: 0,
        unacked: Some(0),
        dead: 0,
    };
    wait_depth(&q, |d| *d == empty).await;
    drop((c, dead));
    delete_pool(&pool);
}

/// 1,000 confirmed publishes (32 at a time on the shared channel), consumed with prefetch
/// 50: every message arrives exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_confirmed_messages_arrive_once() {
    const N: u32 = 1000;
    let pool = pool();
    let q = queue(
        &pool,
        QueueOptions {
            delivery_limit: Some(3),
        },
    )
    .await;
    let published: Vec<_> = futures::stream::iter(0..N)
        .map(|i| q.publish(LANE, i.to_be_bytes().to_vec()))
        .buffer_unordered(32)
        .collect()
        .await;
    for result in published {
        result.expect("publish confirmed");
    }
    assert_eq!(
        q.depth(&[LANE.to_owned()]).await.unwrap().ready,
        u64::from(N)
    );

    let mut c = q.consume(LANE, 50).await.unwrap();
    let mut seen = HashSet::new();
    for _ in 0..N {
        let d = next(&mut c).await;
        assert_eq!(d.attempt, 1);
        let i = u32::from_be_bytes(d.body[..].try_into().expect("4 bytes"));
        assert!(seen.insert(i), "message {i} delivered twice");
        assert!(d.settle(Disposition::Ack).await.unwrap());
    }
    nothing_more(&mut c).await;
    assert_eq!(seen.len(), N as usize);
    assert_eq!(q.depth(&[LANE.to_owned()]).await.unwrap().ready, 0);
    drop(c);
    delete_pool(&pool);
}

/// The broker ends a waiting consumer's subscription (here: its queue is deleted): `next`
/// reports an error, and the same consumer works again once the queue is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_survives_losing_its_subscription() {
    let pool = pool();
    let q = queue(&pool, QueueOptions::default()).await;
    let mut c = q.consume(LANE, 1).await.unwrap();
    let waiting = tokio::spawn(async move {
        let result = c.next().await;
        (c, result)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let batches = q.lane_name(LANE).to_owned();
    tokio::task::spawn_blocking(move || management_delete(&format!("queues/%2F/{batches}")))
        .await
        .unwrap()
        .expect("delete the queue");
    let (mut c, result) = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(result.is_err(), "the ended subscription is reported");

    // The queue comes back (any process connecting declares it) and gets a message.
    let q = queue(&pool, QueueOptions::default()).await;
    q.publish(LANE, b"back".to_vec()).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let d = loop {
        match tokio::time::timeout(PATIENCE, c.next())
            .await
            .expect("next returns")
        {
            Ok(d) => break d,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "still failing: {e}");
            }
        }
    };
    assert_eq!((&d.body[..], d.attempt), (&b"back"[..], 1));
    assert!(d.settle(Disposition::Ack).await.unwrap());
    drop(c);
    delete_pool(&pool);
}

/// A full queue refuses a publish (here: an operator's length limit of one, with the
/// queue's `reject-publish` overflow; a quorum queue without a leader refuses the same
/// way): the publish is retried, and lands once the queue has room again.
///
/// A quorum queue refuses once it is over its limit, and takes publishes again once it is
/// back under 80% of it: so two messages fill a limit of one, and both must go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_publish_is_retried_until_the_queue_takes_it() {
    let pool = pool();
    let q = queue(&pool, QueueOptions::default()).await;
    // The lane's queue exists once something consumes (or publishes to) it.
    drop(q.consume(LANE, 1).await.unwrap());
    let policy = format!("test-full-{pool}");
    let pattern = format!("^{}$", q.lane_name(LANE).replace('.', r"\."));
    rabbitmqctl(&[
        "set_policy",
        "--apply-to",
        "queues",
        &policy,
        &pattern,
        r#"{"max-length":1}"#,
    ]);
    wait_for_policy(&q.lane_name(LANE), &policy).await;

    for body in [b"a", b"b"] {
        q.publish(LANE, body.to_vec())
            .await
            .expect("not yet over the limit");
    }
    let publishing = tokio::spawn({
        let q = q.clone();
        async move { q.publish(LANE, b"c".to_vec()).await }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while q.refused_publishes() == 0 {
        if publishing.is_finished() {
            panic!("ended unrefused: {:?}", publishing.await);
        }
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut c = q.consume(LANE, 1).await.unwrap();
    for body in [b"a", b"b"] {
        let d = next(&mut c).await;
        assert_eq!(&d.body[..], body);
        assert!(d.settle(Disposition::Ack).await.unwrap());
    }
    tokio::time::timeout(PATIENCE, publishing)
        .await
        .expect("published once the queue had room")
        .unwrap()
        .expect("the retried publish is confirmed");
    let d = next(&mut c).await;
    assert_eq!((&d.body[..], d.attempt), (&b"c"[..], 1));
    assert!(d.settle(Disposition::Ack).await.unwrap());
    nothing_more(&mut c).await;

    rabbitmqctl(&["clear_policy", &policy]);
    drop(c);
    delete_pool(&pool);
}

/// Waits until the management API shows `policy` applied to `queue`.
async fn wait_for_policy(queue: &str, policy: &str) {
    let url = format!("{}/api/queues/%2F/{queue}", management_url());
    let client = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let shown: serde_json::Value = client
            .get(&url)
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            .json()
            .await
            .unwrap();
        if shown["policy"] == policy {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "policy {policy} not applied: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A broker under a resource alarm blocks publishing: the queue names the alarm while it
/// lasts (and logs it), and the publish that waited goes through once it clears. On a broker
/// of the test's own: the alarm would hold every other test's publishes.
#[tokio::test]
async fn a_broker_blocking_publishes_is_named_until_its_alarm_clears() {
    let broker = PrivateRabbitMq::start();
    let q = AmqpQueue::connect(
        &broker.url(),
        &pool(),
        QueueOptions::default(),
        None,
        &Tls::default(),
    )
    .await
    .expect("connect to the private broker");
    q.open_lane(LANE).await.unwrap();
    assert_eq!(q.blocked(), None);
    broker.disk_alarm(true);
    let publishing = tokio::spawn({
        let q = q.clone();
        async move { q.publish(LANE, b"waits".to_vec()).await }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let reason = loop {
        if let Some(reason) = q.blocked() {
            break reason;
        }
        assert!(!publishing.is_finished(), "published under a disk alarm");
        assert!(tokio::time::Instant::now() < deadline, "never said blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(reason.contains("disk"), "{reason}");
    broker.disk_alarm(false);
    tokio::time::timeout(PATIENCE, publishing)
        .await
        .expect("published once the alarm cleared")
        .unwrap()
        .expect("confirmed");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while q.blocked().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "still said blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut c = q.consume(LANE, 1).await.unwrap();
    let d = next(&mut c).await;
    assert_eq!(&d.body[..], b"waits");
    assert!(d.settle(Disposition::Ack).await.unwrap());
}

/// Closes this queue's connection from the broker's side if it has one now (a connection
/// being recovered has none for a moment); returns whether one was closed.
fn close_connection_if_open(q: &AmqpQueue) -> bool {
    let listing = rabbitmqctl(&[
        "list_connections",
        "--no-table-headers",
        "pid",
        "client_properties",
    ]);
    let pids: Vec<String> = listing
        .lines()
        .filter(|line| line.contains(q.connection_name()))
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    for pid in &pids {
        // Gone since it was listed: nothing to close.
        let _ = output_within(
            Command::new("rabbitmqctl").args([
                "-n",
                NODE,
                "--quiet",
                "close_connection",
                pid,
                "test",
            ]),
            PATIENCE * 3,
        );
    }
    !pids.is_empty()
}

/// The broker closes the connection again and again while consumers open, subscribe and
/// settle (as a broker does on an internal error, or an operator closing connections):
/// every message still arrives, and the consumer never stops for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_opening_while_the_connection_is_closed_again_and_again_get_every_message() {
    const MESSAGES: usize = 30;
    let pool = pool();
    let q = queue(
        &pool,
        QueueOptions {
            delivery_limit: Some(50),
        },
    )
    .await;
    for i in 0..MESSAGES {
        q.publish(LANE, format!("m{i}").into_bytes()).await.unwrap();
    }
    let closer = {
        let q = q.clone();
        tokio::task::spawn_blocking(move || {
            let mut closed = 0;
            for i in 0..8u64 {
                closed += usize::from(close_connection_if_open(&q));
                std::thread::sleep(Duration::from_millis(37 * (i % 5)));
            }
            closed
        })
    };
    let mut seen = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while seen.len() < MESSAGES {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the consumers stalled with {} of {MESSAGES} messages",
            seen.len()
        );
        let opened = tokio::time::timeout(Duration::from_secs(60), q.consume(LANE, 1)).await;
        let mut c = match opened.expect("opening a consumer returns") {
            Ok(c) => c,
            Err(e) => {
                eprintln!("open: {e}");
                continue;
            }
        };
        for _ in 0..3 {
            match tokio::time::timeout(Duration::from_secs(60), c.next())
                .await
                .expect("next returns")
            {
                Ok(d) => {
                    let body = String::from_utf8_lossy(&d.body).into_owned();
                    if d.settle(Disposition::Ack).await.unwrap_or(false) {
                        seen.insert(body);
                    }
                }
                Err(e) => eprintln!("next: {e}"),
            }
        }
    }
    let closed = closer.await.unwrap();
    assert!(closed >= 3, "the connection was closed {closed} times");
    delete_pool(&pool);
}

/// The broker's port in `amqp_url()`, and the URL with `port` in its place.
fn through(port: u16) -> (u16, String) {
    let url = amqp_url();
    let (head, rest) = url.rsplit_once('@').expect("user info in the AMQP URL");
    let (host_port, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, broker) = host_port.rsplit_once(':').expect("a port in the AMQP URL");
    (
        broker.parse().expect("a port"),
        format!("{head}@{host}:{port}/{path}"),
    )
}

/// The connection is lost and lapin's own recovery never completes (its new connection is
/// taken by a node that never answers, as a hung broker or a half-dead load balancer does):
/// the consumer gives that connection up, connects again once the broker answers, and gets
/// the next message; a publish on the same handle goes through too, and the handle's
/// follower of the job events hears them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_recovery_never_completes_is_replaced() {
    use fleetrun_common::events::Events;
    use fleetrun_common::ledger::JobState;
    use fleetrun_common::testing::events::event;

    let pool = pool();
    let (broker, _) = through(0);
    let relay = fleetrun_tests::relay::Relay::to(broker);
    let (_, url) = through(relay.port());
    let options = QueueOptions {
        delivery_limit: Some(5),
    };
    let q = AmqpQueue::connect(&url, &pool, options.clone(), None, &Tls::default())
        .await
        .unwrap();
    let direct = queue(&pool, options).await;
    let mut heard = q.follow().await.unwrap();
    Queue::publish(&direct, LANE, b"one".to_vec())
        .await
        .unwrap();
    let mut c = q.consume(LANE, 1).await.unwrap();
    let d = next(&mut c).await;
    assert!(d.settle(Disposition::Ack).await.unwrap());

    relay.swallow(true);
    relay.cut();
    // lapin's recovery dials again, into a node that never answers.
    tokio::time::sleep(Duration::from_secs(2)).await;
    relay.swallow(false);
    Queue::publish(&direct, LANE, b"two".to_vec())
        .await
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let d = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, c.next()).await {
            // Its acknowledgement written but lost with the cut connection: at least once,
            // it comes again.
            Ok(Ok(d)) if &d.body[..] == b"one" => {
                let _ = d.settle(Disposition::Ack).await;
            }
            Ok(Ok(d)) => break d,
            Ok(Err(e)) => eprintln!("next: {e}"),
            Err(_) => panic!("the consumer stalled on a connection that never recovers"),
        }
    };
    assert_eq!(&d.body[..], b"two");
    assert!(d.settle(Disposition::Ack).await.unwrap());
    tokio::time::timeout(
        Duration::from_secs(60),
        Queue::publish(&q, LANE, b"three".to_vec()),
    )
    .await
    .expect("a publish returns")
    .expect("a publish on the replaced connection");
    assert_eq!(&next(&mut c).await.body[..], b"three");

    let job = format!("job-{}", random_suffix());
    let hears_it = async {
        loop {
            match heard.recv().await {
                Ok(event) if event.job_id == job => return,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("the follower stopped: {e}"),
            }
        }
    };
    tokio::pin!(hears_it);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        Events::publish(&direct, &event(&job, JobState::Running))
            .await
            .unwrap();
        if tokio::time::timeout(Duration::from_millis(500), &mut hears_it)
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower heard nothing on the replaced connection"
        );
    }
    delete_pool(&pool);
}
