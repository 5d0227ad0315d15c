//! The job registry conformance suite.

use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use crate::ledger::{FaultNote, JobRegistry, LedgerError};
use crate::storage::Fault;

const HOUR: Duration = Duration::from_secs(3600);

/// Generates one `#[tokio::test]` per case for the registry built by `$make`, an async
/// closure returning an empty `Arc<dyn JobRegistry>`.
#[macro_export]
macro_rules! registry_conformance {
    ($make:expr) => {
        $crate::registry_conformance!(@cases $make;
            a_record_is_written_once, jobs_are_listed_oldest_first,
            unfinished_jobs_are_the_pools_until_retired, init_failures_are_counted_per_job,
            a_retired_job_is_forgotten_in_its_time, a_pools_nodes_are_counted_while_they_beat,
            a_jobs_places_go_to_node_count_nodes_at_once, a_reopened_job_is_unfinished_again,
            a_pool_is_known_from_its_first_beat_or_job, a_jobs_followers_are_those_not_gone,
            a_nodes_fault_notes_fade_in_their_time);
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testing::registry::$case($make).await;
            }
        )*
    };
}

pub async fn a_record_is_written_once<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    r.register("j", "p", b"first").await.unwrap();
    assert!(matches!(
        r.register("j", "p", b"second").await,
        Err(LedgerError::JobExists(job)) if job == "j"
    ));
    assert_eq!(r.record("j").await.unwrap().as_deref(), Some(&b"first"[..]));
    assert_eq!(r.record("unknown").await.unwrap(), None);
}

pub async fn jobs_are_listed_oldest_first<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    assert!(r.jobs().await.unwrap().is_empty());
    for (job, pool) in [("c", "p"), ("a", "q"), ("b", "p")] {
        r.register(job, pool, b"{}").await.unwrap();
    }
    assert_eq!(r.jobs().await.unwrap(), ["c", "a", "b"]);
}

pub async fn unfinished_jobs_are_the_pools_until_retired<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    for (job, pool) in [("c", "p"), ("a", "q"), ("b", "p")] {
        r.register(job, pool, b"{}").await.unwrap();
    }
    assert_eq!(r.unfinished("p").await.unwrap(), ["c", "b"]);
    assert_eq!(r.unfinished("q").await.unwrap(), ["a"]);
    assert!(r.unfinished("other").await.unwrap().is_empty());

    r.retire("c", "p", HOUR).await.unwrap();
    r.retire("c", "p", HOUR).await.unwrap();
    // Another pool's job is not this pool's to retire.
    r.retire("a", "p", HOUR).await.unwrap();
    assert_eq!(r.unfinished("p").await.unwrap(), ["b"]);
    assert_eq!(r.unfinished("q").await.unwrap(), ["a"]);
    // A retired job keeps its record and its place among all jobs until its time.
    assert_eq!(r.jobs().await.unwrap(), ["c", "a", "b"]);
    assert!(r.record("c").await.unwrap().is_some());
}

pub async fn init_failures_are_counted_per_job<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    r.register("j", "p", b"{}").await.unwrap();
    r.register("k", "p", b"{}").await.unwrap();
    assert_eq!(r.init_failures("j").await.unwrap(), 0);
    assert_eq!(r.add_init_failure("j").await.unwrap(), 1);
    assert_eq!(r.add_init_failure("j").await.unwrap(), 2);
    assert_eq!(r.add_init_failure("k").await.unwrap(), 1);
    assert_eq!(r.init_failures("j").await.unwrap(), 2);
    assert_eq!(r.init_failures("unknown").await.unwrap(), 0);
}

pub async fn a_retired_job_is_forgotten_in_its_time<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    r.register("j", "p", b"{}").await.unwrap();
    r.register("k", "p", b"{}").await.unwrap();
    r.register("x", "q", b"{}").await.unwrap();
    r.add_init_failure("j").await.unwrap();
    r.note_listing("j", "cafe").await.unwrap();
    let keep = Duration::from_secs(1);
    r.retire("j", "p", keep).await.unwrap();
    // Another pool's job is not this pool's to retire.
    r.retire("x", "p", keep).await.unwrap();
    assert_eq!(r.unfinished("p").await.unwrap(), ["k"]);
    // A late init failure goes with the job.
    r.add_init_failure("j").await.unwrap();
    assert!(r.record("j").await.unwrap().is_some(), "kept for its time");
    super::eventually("the retired job to be forgotten", || async {
        r.record("j").await.unwrap().is_none()
    })
    .await;
    assert_eq!(r.jobs().await.unwrap(), ["k", "x"]);
    assert_eq!(r.init_failures("j").await.unwrap(), 0);
    assert_eq!(r.listing("j").await.unwrap(), None);
    assert!(r.record("k").await.unwrap().is_some());
    assert!(r.record("x").await.unwrap().is_some());
    assert_eq!(r.unfinished("q").await.unwrap(), ["x"]);
}

/// A node counts for its pool while its last beat lasts; pools are apart.
pub async fn a_pools_nodes_are_counted_while_they_beat<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    assert_eq!(r.nodes("p").await.unwrap(), 0);
    r.beat("p", "a", HOUR).await.unwrap();
    r.beat("p", "b", Duration::from_millis(300)).await.unwrap();
    // A node that beats again counts once.
    r.beat("p", "a", HOUR).await.unwrap();
    r.beat("q", "c", HOUR).await.unwrap();
    assert_eq!(r.nodes("p").await.unwrap(), 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(r.nodes("p").await.unwrap(), 1, "b's beat ran out");
    assert_eq!(r.nodes("q").await.unwrap(), 1);
}

/// A job's `node_count` places: held by that many nodes at once, renewed by their holders,
/// taken over once a holder's time runs out or it gives its place up; jobs are apart.
pub async fn a_jobs_places_go_to_node_count_nodes_at_once<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    r.register("j", "p", b"{}").await.unwrap();
    r.register("k", "p", b"{}").await.unwrap();
    let short = Duration::from_millis(300);
    assert!(r.claim_place("j", "a", 1, short).await.unwrap());
    assert!(
        !r.claim_place("j", "b", 1, HOUR).await.unwrap(),
        "one place, a's"
    );
    assert!(
        r.claim_place("j", "a", 1, short).await.unwrap(),
        "a renews its own"
    );
    assert!(
        r.claim_place("k", "b", 1, HOUR).await.unwrap(),
        "another job's place"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        r.claim_place("j", "b", 1, HOUR).await.unwrap(),
        "a's ran out"
    );
    assert!(!r.claim_place("j", "a", 1, HOUR).await.unwrap());
    r.release_place("j", "b").await.unwrap();
    assert!(
        r.claim_place("j", "a", 1, HOUR).await.unwrap(),
        "b gave it up"
    );
    // Two places: two nodes.
    assert!(r.claim_place("k", "a", 2, HOUR).await.unwrap());
    assert!(!r.claim_place("k", "c", 2, HOUR).await.unwrap());
}

/// A job's followers: noted and renewed by each, gone when one lets the job go or its time
/// runs out; jobs are apart.
pub async fn a_jobs_followers_are_those_not_gone<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    r.register("j", "p", b"{}").await.unwrap();
    r.register("k", "p", b"{}").await.unwrap();
    assert!(r.followers("j").await.unwrap().is_empty());
    let short = Duration::from_millis(300);
    r.follow("j", "b", HOUR).await.unwrap();
    r.follow("j", "a", short).await.unwrap();
    r.follow("j", "a", short).await.unwrap();
    r.follow("k", "c", HOUR).await.unwrap();
    assert_eq!(r.followers("j").await.unwrap(), ["a", "b"]);
    r.let_go("j", "b").await.unwrap();
    assert_eq!(r.followers("j").await.unwrap(), ["a"]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        r.followers("j").await.unwrap().is_empty(),
        "a's time ran out"
    );
    assert_eq!(r.followers("k").await.unwrap(), ["c"], "another job's");
    r.let_go("k", "unknown").await.unwrap();
}

/// A retired job reopened is its pool's again, in its first place, kept past the time it
/// was retired for, with its init failures counted from 0.
pub async fn a_reopened_job_is_unfinished_again<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    assert!(!r.reopen("unknown", "p").await.unwrap());
    r.register("j", "p", b"{}").await.unwrap();
    r.register("k", "p", b"{}").await.unwrap();
    r.add_init_failure("j").await.unwrap();
    assert_eq!(r.listing("j").await.unwrap(), None);
    r.note_listing("j", "cafe").await.unwrap();
    r.note_listing("unknown", "cafe").await.unwrap();
    assert_eq!(r.listing("unknown").await.unwrap(), None);
    let keep = Duration::from_millis(500);
    r.retire("j", "p", keep).await.unwrap();
    assert_eq!(r.unfinished("p").await.unwrap(), ["k"]);
    assert!(r.reopen("j", "p").await.unwrap());
    assert_eq!(r.unfinished("p").await.unwrap(), ["j", "k"]);
    assert_eq!(r.init_failures("j").await.unwrap(), 0);
    tokio::time::sleep(keep * 2).await;
    assert!(r.record("j").await.unwrap().is_some(), "no longer retired");
    assert_eq!(r.listing("j").await.unwrap().as_deref(), Some("cafe"));
    assert_eq!(r.jobs().await.unwrap(), ["j", "k"]);
    // Retired again when it ends again.
    r.retire("j", "p", HOUR).await.unwrap();
    assert_eq!(r.unfinished("p").await.unwrap(), ["k"]);
}

/// A pool is known from its first node's beat on (or its first job's registration), and
/// stays known when no node is left.
pub async fn a_pool_is_known_from_its_first_beat_or_job<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    assert!(r.pools().await.unwrap().is_empty());
    r.beat("gpu", "a", Duration::from_millis(100))
        .await
        .unwrap();
    r.beat("cpu", "b", HOUR).await.unwrap();
    r.beat("cpu", "b", HOUR).await.unwrap();
    assert_eq!(r.pools().await.unwrap(), ["cpu", "gpu"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r.nodes("gpu").await.unwrap(), 0);
    assert_eq!(r.pools().await.unwrap(), ["cpu", "gpu"]);
    // A job registered to a pool no node has beaten for makes it known too.
    r.register("j", "new", b"{}").await.unwrap();
    assert_eq!(r.pools().await.unwrap(), ["cpu", "gpu", "new"]);
}

/// A node's fault note of a kind replaces its last one of that kind, is listed newest first
/// with its age, and fades in its time; pools are apart.
pub async fn a_nodes_fault_notes_fade_in_their_time<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn JobRegistry>>,
{
    let r = make().await;
    assert!(r.faults("p").await.unwrap().is_empty());
    let short = Duration::from_millis(300);
    r.note_fault("p", "a", Fault::Throttled, HOUR)
        .await
        .unwrap();
    r.note_fault("p", "b", Fault::Unreachable, short)
        .await
        .unwrap();
    r.note_fault("q", "c", Fault::ServerError, HOUR)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Noted again: one note, and the newest.
    r.note_fault("p", "a", Fault::Throttled, HOUR)
        .await
        .unwrap();
    let kinds = |notes: &[FaultNote]| -> Vec<(String, Fault)> {
        notes.iter().map(|n| (n.node.clone(), n.fault)).collect()
    };
    let notes = r.faults("p").await.unwrap();
    assert_eq!(
        kinds(&notes),
        [
            ("a".to_owned(), Fault::Throttled),
            ("b".to_owned(), Fault::Unreachable)
        ]
    );
    assert!(notes[0].age < Duration::from_millis(50), "{notes:?}");
    assert!(notes[1].age >= Duration::from_millis(40), "{notes:?}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let notes = r.faults("p").await.unwrap();
    assert_eq!(
        kinds(&notes),
        [("a".to_owned(), Fault::Throttled)],
        "b's faded"
    );
    assert!(notes[0].age >= Duration::from_millis(300), "{notes:?}");
    assert_eq!(
        kinds(&r.faults("q").await.unwrap()),
        [("c".to_owned(), Fault::ServerError)]
    );
}
