#![cfg(feature = "services")]
//! `RedisLedger` and `RedisRegistry` against a real Redis: the ledger and registry
//! conformance suites, and what only a server brings: dropped connections, lost replies, keys
//! shared by many jobs.
//!
//! Each test keeps its keys under a random prefix. The tests that disturb every client of
//! their server (`CLIENT KILL`, `CLIENT PAUSE`) run on a Redis of their own, so no other test
//! is disturbed.

use fleetrun_common::tls::Tls;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetrun_common::ledger::redis::RedisLedger;
use fleetrun_common::ledger::{JobState, Ledger, LedgerError, Limits, Outcome};
use fleetrun_common::testing::random_suffix;
use fleetrun_tests::services::redis_url;
use fleetrun_tests::{PrivateRedis, output_within, wait_for};

fleetrun_common::ledger_conformance!(|| async {
    Arc::new(
        RedisLedger::connect(
            &redis_url(),
            &format!("test-{}", random_suffix()),
            &Tls::default(),
        )
        .await
        .unwrap(),
    ) as Arc<dyn Ledger>
});

mod registry {
    use super::*;
    use fleetrun_common::ledger::{JobRegistry, RedisRegistry};

    fleetrun_common::registry_conformance!(|| async {
        Arc::new(
            RedisRegistry::connect(
                &redis_url(),
                &format!("test-{}", random_suffix()),
                &Tls::default(),
            )
            .await
            .unwrap(),
        ) as Arc<dyn JobRegistry>
    });
}

const OK: Outcome = Outcome {
    succeeded: 10,
    failed: 0,
    batch_failed: false,
};

const FAILED: Outcome = Outcome {
    succeeded: 0,
    failed: 1,
    batch_failed: true,
};

async fn ledger(url: &str) -> RedisLedger {
    RedisLedger::connect(url, &format!("test-{}", random_suffix()), &Tls::default())
        .await
        .unwrap()
}

/// Runs `redis-cli` against the server at `url` and returns what it printed.
fn redis_cli(url: &str, args: &[&str]) -> String {
    let out = output_within(
        Command::new("redis-cli").arg("-u").arg(url).args(args),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && !stdout.starts_with("ERR"),
        "redis-cli {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_dropped_connection() {
    let redis = PrivateRedis::start();
    let l = ledger(&redis.url()).await;
    let j = "job-1";
    l.create(j, Limits::NONE).await.unwrap();
    l.record(j, 0, OK, None).await.unwrap();

    let killed = redis_cli(&redis.url(), &["CLIENT", "KILL", "TYPE", "normal"]);
    let killed: u64 = killed.trim().parse().expect("CLIENT KILL answers a count");
    assert!(killed >= 1, "the ledger's connection was killed");

    let r = l
        .record(j, 1, OK, None)
        .await
        .expect("the record is retried");
    assert!(r.first);
    let again = l.record(j, 1, OK, None).await.unwrap();
    assert!(!again.first);
    let s = l.status(j).await.unwrap().unwrap();
    assert_eq!((s.done, s.items_succeeded), (2, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_survives_a_dropped_connection() {
    use fleetrun_common::ledger::{JobRegistry, RedisRegistry};
    let redis = PrivateRedis::start();
    let r = RedisRegistry::connect(
        &redis.url(),
        &format!("test-{}", random_suffix()),
        &Tls::default(),
    )
    .await
    .unwrap();
    r.register("j", "p", b"record").await.unwrap();

    let killed = redis_cli(&redis.url(), &["CLIENT", "KILL", "TYPE", "normal"]);
    let killed: u64 = killed.trim().parse().expect("CLIENT KILL answers a count");
    assert!(killed >= 1, "the registry's connection was killed");

    assert_eq!(
        r.record("j").await.expect("the read is retried").as_deref(),
        Some(&b"record"[..])
    );
    r.register("k", "p", b"other").await.unwrap();
    assert_eq!(r.unfinished("p").await.unwrap(), ["j", "k"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_keep_to_their_own_hash_tagged_keys() {
    let prefix = format!("test-{}", random_suffix());
    let l = RedisLedger::connect(&redis_url(), &prefix, &Tls::default())
        .await
        .unwrap();
    let strict = Limits {
        error_threshold: 0,
        ..Limits::NONE
    };
    l.create("a", strict).await.unwrap();
    l.create("b", Limits::NONE).await.unwrap();

    let a = l.record("a", 0, FAILED, None).await.unwrap();
    assert_eq!(a.status.state, JobState::Failed);
    let b = l.record("b", 0, FAILED, None).await.unwrap();
    assert!(
        b.first,
        "the same index in another job is another mini-batch"
    );
    assert_eq!(b.status.state, JobState::Running);
    let b = l.seal("b", 1).await.unwrap();
    assert_eq!(b.status.state, JobState::Finalizing);

    let a = l.status("a").await.unwrap().unwrap();
    assert_eq!((a.state, a.total, a.done), (JobState::Failed, None, 1));
    assert!(a.reason.unwrap().starts_with("error_threshold exceeded"));

    let mut keys: Vec<String> = redis_cli(
        &redis_url(),
        &["--scan", "--pattern", &format!("{prefix}:*")],
    )
    .lines()
    .map(str::to_owned)
    .collect();
    keys.sort();
    let expected: Vec<String> = ["a", "b"]
        .iter()
        .flat_map(|j| ["done", "failed", "state"].map(|k| format!("{prefix}:job:{{{j}}}:{k}")))
        .collect();
    assert_eq!(keys, expected);
}

/// The server runs the calls but their replies come too late (the server holds them past
/// the client's 10 s response timeout): the retries must neither count a mini-batch twice nor
/// lose the transition the first attempt made, nor find their own job "already created".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_whose_replies_were_lost_answer_as_the_first_time() {
    let redis = PrivateRedis::start();
    let l = ledger(&redis.url()).await;
    l.create("sealed", Limits::NONE).await.unwrap();
    l.seal("sealed", 1).await.unwrap();
    l.create("running", Limits::NONE).await.unwrap();

    redis_cli(&redis.url(), &["CLIENT", "PAUSE", "12000", "WRITE"]);
    let start = Instant::now();
    let (recorded, created, moved) = tokio::join!(
        l.record("sealed", 0, OK, None),
        l.create("new", Limits::NONE),
        l.transition(
            "running",
            &[JobState::Running],
            JobState::Canceled,
            Some("by user")
        ),
    );
    assert!(
        start.elapsed() >= Duration::from_secs(10),
        "the calls waited out the pause"
    );

    let r = recorded.unwrap();
    assert!(r.first, "the retry answers as the first attempt");
    assert!(r.transitioned, "the retry keeps the transition it made");
    assert_eq!((r.status.state, r.status.done), (JobState::Finalizing, 1));
    let again = l.record("sealed", 0, OK, None).await.unwrap();
    assert!(!again.first && !again.transitioned);
    assert_eq!(again.status.items_succeeded, 10);

    created.expect("a retried create is not its own duplicate");
    assert!(matches!(
        l.create("new", Limits::NONE).await,
        Err(LedgerError::JobExists(_))
    ));

    let (moved, s) = moved.unwrap();
    assert!(moved, "the retried transition reports its move");
    assert_eq!(
        (s.state, s.reason.as_deref()),
        (JobState::Canceled, Some("by user"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_keep_ledgers_apart() {
    let l = ledger(&redis_url()).await;
    let other = ledger(&redis_url()).await;
    l.create("j", Limits::NONE).await.unwrap();
    other.create("j", Limits::NONE).await.unwrap();
    l.record("j", 0, OK, None).await.unwrap();
    assert_eq!(other.status("j").await.unwrap().unwrap().done, 0);
    assert!(matches!(
        l.create("j", Limits::NONE).await,
        Err(LedgerError::JobExists(_))
    ));
}

/// A recording the server acknowledged is kept however the server dies: the fleet's Redis
/// (`deploy/redis/redis.conf`), on a disk whose syncs are slow as a busy disk's are, killed
/// with SIGKILL while recordings are in flight and started again on its append-only file,
/// still holds every recording it acknowledged. A worker acknowledges a mini-batch's message
/// once its recording is acknowledged, so a recording lost here is a mini-batch counted
/// nowhere, and its job never ends (docs/chaos.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_recording_survives_the_server_killed() {
    let mut redis = PrivateRedis::on_slow_disk(Duration::from_millis(1500));
    let l = Arc::new(ledger(&redis.url()).await);
    let j = "job-1";
    l.create(j, Limits::NONE).await.unwrap();
    const WRITERS: u64 = 8;
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (l, acknowledged) = (l.clone(), acknowledged.clone());
            tokio::spawn(async move {
                for n in 0.. {
                    let index = n * WRITERS + w;
                    let part = format!("part-{index}");
                    if l.record(j, index, OK, Some(&part)).await.is_err() {
                        return;
                    }
                    acknowledged.lock().unwrap().push(index);
                }
            })
        })
        .collect();
    // Recordings go on for two seconds, twice `everysec`'s interval, so that the server
    // dies with a sync under way, as it may at any instant on a busy disk.
    let writing = Instant::now();
    let deadline = writing + Duration::from_secs(60);
    while acknowledged.lock().unwrap().len() < WRITERS as usize
        || writing.elapsed() < Duration::from_secs(2)
    {
        assert!(Instant::now() < deadline, "no recordings acknowledged");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Killed with recordings in flight: what it had acknowledged until now must stay.
    tokio::task::block_in_place(|| redis.kill());
    let acked = acknowledged.lock().unwrap().clone();
    for writer in writers {
        writer.abort();
        let _ = writer.await;
    }
    tokio::task::block_in_place(|| redis.start_again());

    let end = acked.iter().max().unwrap() + 1;
    let parts = l.parts(j, 0..end).await.unwrap();
    let lost: Vec<u64> = acked
        .iter()
        .copied()
        .filter(|&i| parts[i as usize].is_none())
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged recordings lost, among them {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(10)]
    );
    let s = l.status(j).await.unwrap().expect("the job is kept");
    assert!(s.done >= acked.len() as u64, "{s:?}");
}

/// With a replica, a recording is believed once the replica has it (`WAIT`), and recordings
/// made at once share one `WAIT`: eight writers' 160 recordings cost far fewer `WAIT`s than
/// 160, and the replica holds every one of them when the last is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recordings_made_at_once_share_one_wait_for_the_replica() {
    let primary = PrivateRedis::start();
    let replica = PrivateRedis::replica_of(primary.port());
    // The replica has synced; the primary counts it (`ROLE`) once it is online there too.
    wait_for(
        "the primary to count its replica",
        Duration::from_secs(30),
        || {
            primary
                .query(&["INFO", "replication"])
                .contains("state=online")
        },
    );
    let prefix = format!("test-{}", random_suffix());
    let l = Arc::new(
        RedisLedger::connect(&primary.url(), &prefix, &Tls::default())
            .await
            .unwrap(),
    );
    let j = "job-1";
    l.create(j, Limits::NONE).await.unwrap();
    redis_cli(&primary.url(), &["CONFIG", "RESETSTAT"]);
    const WRITERS: u64 = 8;
    const EACH: u64 = 20;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let l = l.clone();
            tokio::spawn(async move {
                for n in 0..EACH {
                    l.record(j, n * WRITERS + w, OK, None).await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let stats = redis_cli(&primary.url(), &["INFO", "commandstats"]);
    let waits: u64 = stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or_else(|| panic!("no WAIT was sent:\n{stats}"));
    let recordings = WRITERS * EACH;
    assert!(
        waits * 2 <= recordings,
        "{waits} WAITs for {recordings} recordings made eight at a time"
    );
    // Read from the replica alone: every acknowledged recording is there.
    let on_replica = RedisLedger::connect(&replica.url(), &prefix, &Tls::default())
        .await
        .unwrap();
    let s = on_replica
        .status(j)
        .await
        .unwrap()
        .expect("the job is on the replica");
    assert_eq!(s.done, recordings, "{s:?}");
}
