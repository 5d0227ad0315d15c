//! The ledger conformance suite.

use std::future::Future;
use std::sync::Arc;

use crate::ledger::{
    Forgot, InFlight, JobState, Ledger, LedgerError, Limits, Outcome, RunnerId, RunnerTimes,
    Started,
};

/// Generates one `#[tokio::test]` per case for the ledger built by `$make`, an async closure
/// returning `Arc<dyn Ledger>`.
#[macro_export]
macro_rules! ledger_conformance {
    ($make:expr) => {
        $crate::ledger_conformance!(@cases $make;
            record_is_idempotent, completes_when_sealed_and_all_done,
            seal_after_last_record_completes, empty_job_completes_on_seal,
            error_threshold_fails_once_exceeded, minus_one_ignores_failures,
            failed_batch_count_and_percent, transition_only_from_allowed_states,
            concurrent_records_count_once, unknown_job_is_an_error,
            parts_are_the_first_recordings, part_bytes_are_kept_within_a_budget_until_forgotten,
            finalization_is_claimed_by_one_until_its_lease_ends,
            publication_is_claimed_by_one_until_sealed,
            an_ended_job_is_forgotten_in_its_time_once_retired,
            creation_and_start_are_noted, a_holder_not_let_go_is_told_to_the_next,
            report_rows_are_kept_in_order, the_last_move_is_timed,
            only_charged_attempts_are_spent, a_stopped_job_reopens_keeping_what_was_done,
            a_reopened_job_of_all_done_finalizes, a_failure_is_forgotten_to_run_again,
            an_expired_job_ends_and_reopens_for_the_rest,
            runner_times_add_up_and_go_with_the_job,
            a_reopened_job_keeps_its_runner_times_past_its_retirement);
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testing::ledger::$case($make).await;
            }
        )*
    };
}

fn job() -> String {
    format!("job-{}", super::random_suffix())
}

const OK: Outcome = Outcome {
    succeeded: 10,
    failed: 0,
    batch_failed: false,
};

fn failed(items: u64) -> Outcome {
    Outcome {
        succeeded: 0,
        failed: items,
        batch_failed: true,
    }
}

pub async fn record_is_idempotent<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(
        &j,
        Limits {
            error_threshold: 100,
            ..Limits::NONE
        },
    )
    .await
    .unwrap();
    let r = l.record(&j, 0, failed(3), None).await.unwrap();
    assert!(r.first);
    let again = l.record(&j, 0, failed(3), None).await.unwrap();
    assert!(!again.first);
    assert!(!again.transitioned);
    assert_eq!(
        (
            again.status.done,
            again.status.items_failed,
            again.status.batches_failed
        ),
        (1, 3, 1)
    );
}

pub async fn completes_when_sealed_and_all_done<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    let sealed = l.seal(&j, 2).await.unwrap();
    assert!(!sealed.transitioned);
    assert_eq!(sealed.status.total, Some(2));
    let r = l.record(&j, 1, OK, None).await.unwrap();
    assert_eq!(r.status.state, JobState::Running);
    let r = l.record(&j, 0, OK, None).await.unwrap();
    assert!(r.transitioned);
    assert_eq!(r.status.state, JobState::Finalizing);
    assert_eq!(r.status.items_succeeded, 20);
    // A late duplicate neither moves the state nor claims the transition again.
    let dup = l.record(&j, 0, OK, None).await.unwrap();
    assert!(!dup.transitioned);
    let (moved, s) = l
        .transition(&j, &[JobState::Finalizing], JobState::Completed, None)
        .await
        .unwrap();
    assert!(moved);
    assert_eq!(s.state, JobState::Completed);
}

pub async fn seal_after_last_record_completes<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.record(&j, 0, OK, None).await.unwrap();
    let r = l.seal(&j, 1).await.unwrap();
    assert!(r.transitioned);
    assert_eq!(r.status.state, JobState::Finalizing);
    let again = l.seal(&j, 1).await.unwrap();
    assert!(!again.first && !again.transitioned);
}

pub async fn empty_job_completes_on_seal<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    let r = l.seal(&j, 0).await.unwrap();
    assert!(r.transitioned);
    assert_eq!(r.status.state, JobState::Finalizing);
}

pub async fn error_threshold_fails_once_exceeded<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(
        &j,
        Limits {
            error_threshold: 5,
            ..Limits::NONE
        },
    )
    .await
    .unwrap();
    let r = l.record(&j, 0, failed(5), None).await.unwrap();
    assert_eq!(
        r.status.state,
        JobState::Running,
        "5 failures do not exceed a threshold of 5"
    );
    let r = l.record(&j, 1, failed(1), None).await.unwrap();
    assert!(r.transitioned);
    assert_eq!(r.status.state, JobState::Failed);
    let reason = r.status.reason.expect("a failed job says why");
    assert!(
        reason.contains("error_threshold") && reason.contains('6'),
        "{reason}"
    );
    // Once failed, more outcomes are still counted but the state stays.
    let r = l.record(&j, 2, OK, None).await.unwrap();
    assert!(r.first && !r.transitioned);
    assert_eq!(r.status.state, JobState::Failed);
    let sealed = l.seal(&j, 3).await.unwrap();
    assert_eq!(sealed.status.state, JobState::Failed);
}

pub async fn minus_one_ignores_failures<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.seal(&j, 2).await.unwrap();
    l.record(&j, 0, failed(1_000), None).await.unwrap();
    let r = l.record(&j, 1, failed(1_000), None).await.unwrap();
    assert_eq!(r.status.state, JobState::Finalizing);
    assert_eq!(r.status.items_failed, 2_000);
}

pub async fn failed_batch_count_and_percent<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(
        &j,
        Limits {
            allowed_failed_count: Some(1),
            ..Limits::NONE
        },
    )
    .await
    .unwrap();
    assert_eq!(
        l.record(&j, 0, failed(1), None).await.unwrap().status.state,
        JobState::Running
    );
    let r = l.record(&j, 1, failed(1), None).await.unwrap();
    assert_eq!(r.status.state, JobState::Failed);
    assert!(r.status.reason.unwrap().contains("allowed_failed_count"));

    // 1 of 4 mini-batches is 25%: over a 20% limit, judged once the total is sealed.
    let j = job();
    l.create(
        &j,
        Limits {
            allowed_failed_percent: 20.0,
            ..Limits::NONE
        },
    )
    .await
    .unwrap();
    assert_eq!(
        l.record(&j, 0, failed(1), None).await.unwrap().status.state,
        JobState::Running
    );
    let r = l.seal(&j, 4).await.unwrap();
    assert!(r.transitioned);
    assert_eq!(r.status.state, JobState::Failed);
    assert!(r.status.reason.unwrap().contains("allowed_failed_percent"));
}

pub async fn transition_only_from_allowed_states<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    let (moved, s) = l
        .transition(
            &j,
            &[JobState::Running],
            JobState::Canceled,
            Some("by user"),
        )
        .await
        .unwrap();
    assert!(moved);
    assert_eq!(s.reason.as_deref(), Some("by user"));
    let (moved, s) = l
        .transition(&j, &[JobState::Running], JobState::Failed, Some("late"))
        .await
        .unwrap();
    assert!(!moved);
    assert_eq!(s.state, JobState::Canceled);
    assert_eq!(
        l.status(&j).await.unwrap().unwrap().state,
        JobState::Canceled
    );
}

/// Many workers recording the same mini-batches at once count each exactly once and see
/// exactly one transition.
pub async fn concurrent_records_count_once<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.seal(&j, 50).await.unwrap();
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let (l, j) = (l.clone(), j.clone());
        tasks.push(tokio::spawn(async move {
            let mut transitions = 0;
            for i in 0..50u64 {
                let index = (i + worker * 13) % 50;
                let r = l
                    .record(
                        &j,
                        index,
                        Outcome {
                            succeeded: 2,
                            failed: 1,
                            batch_failed: true,
                        },
                        None,
                    )
                    .await
                    .unwrap();
                transitions += u32::from(r.transitioned);
            }
            transitions
        }));
    }
    let mut transitions = 0;
    for t in tasks {
        transitions += t.await.unwrap();
    }
    assert_eq!(transitions, 1);
    let s = l.status(&j).await.unwrap().unwrap();
    assert_eq!(
        (s.done, s.items_succeeded, s.items_failed, s.batches_failed),
        (50, 100, 50, 50)
    );
    assert_eq!(s.state, JobState::Finalizing);
}

pub async fn unknown_job_is_an_error<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    assert!(l.status(&j).await.unwrap().is_none());
    assert!(l.record(&j, 0, OK, None).await.is_err());
    l.create(&j, Limits::NONE).await.unwrap();
    assert!(
        l.create(&j, Limits::NONE).await.is_err(),
        "a job id is entered once"
    );
}

pub async fn parts_are_the_first_recordings<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.record(&j, 0, OK, Some("seg-a@0+12")).await.unwrap();
    // A redelivered mini-batch's second part is not the one that was counted.
    let again = l.record(&j, 0, OK, Some("seg-b@40+12")).await.unwrap();
    assert!(!again.first);
    l.record(&j, 1, failed(10), None).await.unwrap();
    l.record(&j, 3, OK, Some("0000000003.n1")).await.unwrap();
    assert_eq!(
        l.parts(&j, 0..5).await.unwrap(),
        [
            Some("seg-a@0+12".to_owned()),
            None,
            None,
            Some("0000000003.n1".to_owned()),
            None
        ]
    );
    assert_eq!(
        l.parts(&j, 3..4).await.unwrap(),
        [Some("0000000003.n1".to_owned())]
    );
    assert!(l.parts(&j, 2..2).await.unwrap().is_empty());
}

/// The bytes of parts a job keeps in its references count against its budget, over
/// several calls; a Completed job's references are forgotten.
pub async fn part_bytes_are_kept_within_a_budget_until_forgotten<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    assert!(l.reserve_part_bytes(&j, 60, 100).await.unwrap());
    assert!(l.reserve_part_bytes(&j, 40, 100).await.unwrap());
    assert!(!l.reserve_part_bytes(&j, 1, 100).await.unwrap());
    // Once over, the job stays over.
    assert!(!l.reserve_part_bytes(&j, 0, 100).await.unwrap());
    let other = job();
    l.create(&other, Limits::NONE).await.unwrap();
    assert!(l.reserve_part_bytes(&other, 100, 100).await.unwrap());
    assert!(matches!(
        l.reserve_part_bytes("no-such-job", 1, 100).await,
        Err(LedgerError::UnknownJob(_))
    ));

    l.record(&j, 0, OK, Some("~cm93cwo=")).await.unwrap();
    l.record(&other, 0, OK, Some("p0")).await.unwrap();
    l.forget_parts(&j).await.unwrap();
    assert!(matches!(
        l.parts(&j, 0..1).await,
        Err(LedgerError::PartsForgotten(_))
    ));
    assert_eq!(l.parts(&other, 0..1).await.unwrap(), [Some("p0".into())]);
    assert_eq!(l.status(&j).await.unwrap().unwrap().done, 1);
}

/// The two leases a job has: who finalizes it, who publishes it.
#[derive(Clone, Copy)]
enum Lease {
    Finalization,
    Publication,
}

async fn claim(l: &dyn Ledger, j: &str, lease: Lease, owner: &str, ms: u64) -> bool {
    let time = std::time::Duration::from_millis(ms);
    match lease {
        Lease::Finalization => l.claim_finalization(j, owner, time).await,
        Lease::Publication => l.claim_publication(j, owner, time).await,
    }
    .unwrap()
}

/// `lease` of a job that may be claimed: "a" holds it and renews it, "b" is refused until
/// "a" stops renewing and its lease runs out, then "b" holds it.
async fn held_by_one_until_it_runs_out(l: &dyn Ledger, j: &str, lease: Lease) {
    const LONG: u64 = 60_000;
    assert!(claim(l, j, lease, "a", LONG).await);
    assert!(!claim(l, j, lease, "b", LONG).await);
    assert!(claim(l, j, lease, "a", 1).await, "the holder renews");
    // "a" stopped renewing; its lease runs out and "b" takes over.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !claim(l, j, lease, "b", LONG).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never ran out"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(!claim(l, j, lease, "a", LONG).await);
}

pub async fn finalization_is_claimed_by_one_until_its_lease_ends<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    assert!(
        !claim(&*l, &j, Lease::Finalization, "a", 60_000).await,
        "only a Finalizing job is claimed"
    );
    l.seal(&j, 1).await.unwrap();
    l.record(&j, 0, OK, None).await.unwrap();
    held_by_one_until_it_runs_out(&*l, &j, Lease::Finalization).await;
    l.transition(&j, &[JobState::Finalizing], JobState::Completed, None)
        .await
        .unwrap();
    assert!(!claim(&*l, &j, Lease::Finalization, "b", 60_000).await);
}

pub async fn publication_is_claimed_by_one_until_sealed<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    let long = std::time::Duration::from_secs(60);
    assert!(l.claim_publication(&j, "a", long).await.is_err());
    l.create(&j, Limits::NONE).await.unwrap();
    held_by_one_until_it_runs_out(&*l, &j, Lease::Publication).await;
    l.seal(&j, 1).await.unwrap();
    assert!(
        !claim(&*l, &j, Lease::Publication, "b", 60_000).await,
        "a sealed job is published whole"
    );
    let ended = job();
    l.create(&ended, Limits::NONE).await.unwrap();
    l.transition(&ended, &[JobState::Running], JobState::Canceled, None)
        .await
        .unwrap();
    assert!(!claim(&*l, &ended, Lease::Publication, "a", 60_000).await);
}

pub async fn an_ended_job_is_forgotten_in_its_time_once_retired<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.seal(&j, 3).await.unwrap();
    l.record(&j, 0, OK, None).await.unwrap();
    let keep = std::time::Duration::from_secs(1);
    assert!(!l.retire(&j, keep).await.unwrap(), "a running job stays");
    l.transition(&j, &[JobState::Running], JobState::Canceled, None)
        .await
        .unwrap();
    assert!(l.retire(&j, keep).await.unwrap());
    assert!(l.status(&j).await.unwrap().is_some(), "kept for its time");
    // A late recording (a run that ended after the job did) goes with the job.
    l.record(&j, 1, OK, Some("late-part")).await.unwrap();
    super::eventually("the retired job to be forgotten", || async {
        l.status(&j).await.unwrap().is_none()
    })
    .await;
    // Forgotten whole: no part is left, and a later recording finds no job.
    let parts = l.parts(&j, 0..3).await;
    assert!(
        parts
            .as_ref()
            .map_or(true, |p| p.iter().all(Option::is_none)),
        "{parts:?}"
    );
    assert!(matches!(
        l.record(&j, 2, OK, None).await,
        Err(LedgerError::UnknownJob(_))
    ));
    assert!(matches!(
        l.retire("never-entered", keep).await,
        Err(LedgerError::UnknownJob(_))
    ));
}

/// What the stop rules watch: the producer's count only grows, and a start is remembered.
pub async fn creation_and_start_are_noted<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    let fresh = l.status(&j).await.unwrap().unwrap();
    assert_eq!((fresh.created, fresh.started), (0, false));
    l.created(&j, 5).await.unwrap();
    // A producer that starts over (a second submit of the same job) never moves it back.
    l.created(&j, 2).await.unwrap();
    l.started(&j).await.unwrap();
    l.started(&j).await.unwrap();
    let s = l.status(&j).await.unwrap().unwrap();
    assert_eq!((s.created, s.started), (5, true));
    assert_eq!(s.state, JobState::Running);
    let unknown = job();
    assert!(matches!(
        l.created(&unknown, 1).await,
        Err(LedgerError::UnknownJob(_))
    ));
    assert!(matches!(
        l.started(&unknown).await,
        Err(LedgerError::UnknownJob(_))
    ));
    assert!(l.status(&unknown).await.unwrap().is_none());
}

/// Who runs each mini-batch: the next holder of a mini-batch hears of one that ended with no
/// word (lost with its worker), never of itself, of one that ended, or of one recorded.
pub async fn a_holder_not_let_go_is_told_to_the_next<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    assert!(matches!(
        l.attempt_started(&j, 0, "w1/1").await,
        Err(LedgerError::UnknownJob(_))
    ));
    l.create(&j, Limits::NONE).await.unwrap();
    assert_eq!(l.attempt_started(&j, 0, "w1/1").await.unwrap().lost, None);
    assert_eq!(
        l.attempt_started(&j, 0, "w1/1").await.unwrap().lost,
        None,
        "itself again"
    );
    assert_eq!(
        l.attempt_started(&j, 0, "w2/2")
            .await
            .unwrap()
            .lost
            .as_deref(),
        Some("w1/1"),
        "lost with w1"
    );
    let ended = l
        .attempt_ended(&j, 0, Some("row 0 w2"), true)
        .await
        .unwrap();
    assert_eq!(ended.as_deref(), Some("w2/2"));
    assert_eq!(
        l.attempt_started(&j, 0, "w3/3").await.unwrap().lost,
        None,
        "w2's ended"
    );
    l.record(&j, 0, OK, None).await.unwrap();
    assert_eq!(
        l.attempt_ended(&j, 0, None, false).await.unwrap(),
        None,
        "a recording forgets it"
    );
    // Mini-batches are held apart.
    assert_eq!(l.attempt_started(&j, 1, "w1/4").await.unwrap().lost, None);
    assert_eq!(l.attempt_started(&j, 2, "w2/5").await.unwrap().lost, None);
    assert_eq!(
        l.in_flight(&j).await.unwrap(),
        [in_flight(1, "w1/4", 0), in_flight(2, "w2/5", 0)]
    );
    let ended = l
        .attempt_ended(&j, 1, Some("row 1 w1"), false)
        .await
        .unwrap();
    assert_eq!(ended.as_deref(), Some("w1/4"));
    assert_eq!(
        l.in_flight(&j).await.unwrap(),
        [in_flight(2, "w2/5", 0)],
        "what ended or was recorded is not in flight"
    );
    assert!(matches!(
        l.in_flight(&job()).await,
        Err(LedgerError::UnknownJob(_))
    ));
}

fn in_flight(index: u64, holder: &str, spent: u32) -> InFlight {
    InFlight {
        index,
        holder: holder.to_owned(),
        spent,
    }
}

/// The attempts a mini-batch spent: only those ended as the script's fault count, once per
/// call, each mini-batch apart; a lost attempt (never ended) or a recording spends none.
pub async fn only_charged_attempts_are_spent<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    let spent = |started: Started| started.spent;
    assert_eq!(spent(l.attempt_started(&j, 0, "a").await.unwrap()), 0);
    l.attempt_ended(&j, 0, Some("raised"), true).await.unwrap();
    assert_eq!(spent(l.attempt_started(&j, 0, "b").await.unwrap()), 1);
    // b is lost with its worker: c finds it, and nothing more spent.
    let c = l.attempt_started(&j, 0, "c").await.unwrap();
    assert_eq!((c.lost.as_deref(), c.spent), (Some("b"), 1));
    assert_eq!(l.in_flight(&j).await.unwrap(), [in_flight(0, "c", 1)]);
    // Handed back for the node's own trouble: not the script's.
    l.attempt_ended(&j, 0, Some("part write failed"), false)
        .await
        .unwrap();
    l.attempt_ended(&j, 0, None, true).await.unwrap();
    assert_eq!(spent(l.attempt_started(&j, 0, "d").await.unwrap()), 2);
    assert_eq!(spent(l.attempt_started(&j, 1, "e").await.unwrap()), 0);
}

/// The job's report rows are kept in the order they came, each once, and read back a part
/// at a time.
pub async fn report_rows_are_kept_in_order<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    assert!(l.report(&j, "row").await.is_err(), "an unknown job");
    l.create(&j, Limits::NONE).await.unwrap();
    assert_eq!(
        l.report_rows(&j, 0, 10).await.unwrap(),
        Vec::<String>::new()
    );
    l.attempt_ended(&j, 3, Some("a"), true).await.unwrap();
    l.report(&j, "b").await.unwrap();
    l.attempt_ended(&j, 1, None, false).await.unwrap();
    l.attempt_ended(&j, 1, Some("c"), true).await.unwrap();
    // The attempt a recording ends keeps its row, and so does a second run's.
    assert_eq!(l.attempt_started(&j, 1, "w1/1").await.unwrap().lost, None);
    let recorded = l.record_attempt(&j, 1, OK, None, Some("d")).await.unwrap();
    assert!(recorded.first);
    let again = l.record_attempt(&j, 1, OK, None, Some("e")).await.unwrap();
    assert!(!again.first);
    l.record(&j, 2, OK, None).await.unwrap();
    assert_eq!(
        l.attempt_ended(&j, 1, None, false).await.unwrap(),
        None,
        "recorded"
    );
    assert_eq!(
        l.report_rows(&j, 0, 10).await.unwrap(),
        ["a", "b", "c", "d", "e"]
    );
    assert_eq!(l.report_rows(&j, 1, 1).await.unwrap(), ["b"]);
    assert_eq!(l.report_rows(&j, 5, 5).await.unwrap(), Vec::<String>::new());
    assert_eq!(l.report_rows(&j, 0, 0).await.unwrap(), Vec::<String>::new());
}

/// `updated_at` says when the job last moved: entered, a mini-batch recorded for the first
/// time, a change of state; a repeated recording is no move.
pub async fn the_last_move_is_timed<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    let before = crate::ledger::unix_now() - 1.0;
    l.create(&j, Limits::NONE).await.unwrap();
    let at = |s: crate::ledger::Status| s.updated_at.expect("updated_at");
    let entered = at(l.status(&j).await.unwrap().unwrap());
    assert!(entered >= before, "{entered} < {before}");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let recorded = at(l.record(&j, 0, OK, None).await.unwrap().status);
    assert!(recorded > entered, "{recorded} <= {entered}");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let again = at(l.record(&j, 0, OK, None).await.unwrap().status);
    assert_eq!(again, recorded, "a repeat is no move");
    let (_, canceled) = l
        .transition(&j, &[JobState::Running], JobState::Canceled, None)
        .await
        .unwrap();
    assert!(at(canceled) > recorded);
}

/// A job that failed on a limit reopens in its next run: what was recorded whole stays
/// done, with its part and counts; a failed mini-batch (whole or in part) is forgotten, to
/// run again, and so are every holder and spent attempt, the reason, and a retirement.
pub async fn a_stopped_job_reopens_keeping_what_was_done<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    assert!(matches!(
        l.reopen(&j).await,
        Err(LedgerError::UnknownJob(_))
    ));
    let limits = Limits {
        error_threshold: 2,
        ..Limits::NONE
    };
    l.create(&j, limits).await.unwrap();
    assert!(matches!(
        l.reopen(&j).await,
        Err(LedgerError::NotResumable {
            state: JobState::Running,
            ..
        })
    ));
    l.seal(&j, 5).await.unwrap();
    l.record(&j, 0, OK, Some("p0")).await.unwrap();
    let isolated = Outcome {
        succeeded: 9,
        failed: 1,
        batch_failed: false,
    };
    l.record(&j, 1, isolated, Some("p1")).await.unwrap();
    l.attempt_started(&j, 2, "w1/a").await.unwrap();
    l.attempt_ended(&j, 3, Some("raised"), true).await.unwrap();
    l.attempt_started(&j, 3, "w1/b").await.unwrap();
    let failed = l.record(&j, 4, failed(10), Some("p4")).await.unwrap();
    assert_eq!(failed.status.state, JobState::Failed);
    assert!(failed.status.reason.is_some());
    let keep = std::time::Duration::from_millis(300);
    assert!(l.retire(&j, keep).await.unwrap());

    let reopened = l.reopen(&j).await.unwrap();
    assert_eq!(reopened.done, [0]);
    assert!(!reopened.recorded.transitioned);
    let s = reopened.recorded.status;
    assert_eq!(
        (s.state, s.run, s.done, s.total, s.reason),
        (JobState::Running, 1, 1, Some(5), None)
    );
    assert_eq!(
        (s.items_succeeded, s.items_failed, s.batches_failed),
        (10, 0, 0)
    );
    assert_eq!(l.status(&j).await.unwrap().unwrap().run, 1);
    assert_eq!(
        l.parts(&j, 0..5).await.unwrap(),
        [Some("p0".to_owned()), None, None, None, None]
    );
    assert_eq!(l.in_flight(&j).await.unwrap(), []);
    let started = l.attempt_started(&j, 3, "w2/a").await.unwrap();
    assert_eq!((started.lost, started.spent), (None, 0));
    // Once only: the job runs again.
    assert!(matches!(
        l.reopen(&j).await,
        Err(LedgerError::NotResumable {
            state: JobState::Running,
            ..
        })
    ));
    // The retirement is lifted: the job outlives the time it was kept for.
    tokio::time::sleep(keep * 2).await;
    assert!(l.status(&j).await.unwrap().is_some());
    // The first recording of a forgotten mini-batch counts again; the kept one does not.
    assert!(!l.record(&j, 0, OK, Some("again")).await.unwrap().first);
    for index in 1..4 {
        assert!(l.record(&j, index, OK, None).await.unwrap().first);
    }
    let last = l.record(&j, 4, OK, Some("p4-again")).await.unwrap();
    assert!(last.transitioned);
    assert_eq!(last.status.state, JobState::Finalizing);
    assert_eq!(
        (
            last.status.done,
            last.status.items_succeeded,
            last.status.items_failed
        ),
        (5, 50, 0)
    );
    assert_eq!(
        l.parts(&j, 0..5).await.unwrap()[..],
        [
            Some("p0".to_owned()),
            None,
            None,
            None,
            Some("p4-again".to_owned())
        ]
    );
}

/// A canceled job whose every mini-batch of its sealed total was done reopens straight to
/// Finalizing, and its reopener owns the finalization.
pub async fn a_reopened_job_of_all_done_finalizes<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.record(&j, 0, OK, None).await.unwrap();
    l.transition(
        &j,
        &[JobState::Running],
        JobState::Canceled,
        Some("by hand"),
    )
    .await
    .unwrap();
    l.seal(&j, 1).await.unwrap();
    assert_eq!(
        l.status(&j).await.unwrap().unwrap().state,
        JobState::Canceled
    );
    let reopened = l.reopen(&j).await.unwrap();
    assert!(reopened.recorded.transitioned);
    assert_eq!(reopened.recorded.status.state, JobState::Finalizing);
    assert_eq!(reopened.done, [0]);
    assert!(matches!(
        l.reopen(&j).await,
        Err(LedgerError::NotResumable {
            state: JobState::Finalizing,
            ..
        })
    ));
}

/// A Running job's failed mini-batch is taken back (a dead letter replayed): no longer done,
/// its counts, part and spent attempts gone, so its next recording is a first one. Nothing
/// else is: one recorded without failure, one not recorded, any of a job that is not
/// Running.
pub async fn a_failure_is_forgotten_to_run_again<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    let limits = Limits {
        error_threshold: 100,
        ..Limits::NONE
    };
    l.create(&j, limits).await.unwrap();
    l.attempt_started(&j, 0, "a").await.unwrap();
    l.attempt_ended(&j, 0, Some("raised"), true).await.unwrap();
    l.record(&j, 0, failed(3), Some("!f0")).await.unwrap();
    l.record(&j, 1, OK, Some("p1")).await.unwrap();
    l.seal(&j, 3).await.unwrap();
    assert_eq!(l.forget_failure(&j, 1).await.unwrap(), Forgot::NotFailed);
    assert_eq!(l.forget_failure(&j, 2).await.unwrap(), Forgot::NotRecorded);

    let Forgot::Forgotten(status) = l.forget_failure(&j, 0).await.unwrap() else {
        panic!("mini-batch 0's failure was not forgotten");
    };
    assert_eq!(status.state, JobState::Running);
    assert_eq!(
        (
            status.done,
            status.items_succeeded,
            status.items_failed,
            status.batches_failed
        ),
        (1, 10, 0, 0)
    );
    assert_eq!(l.status(&j).await.unwrap(), Some(status));
    assert_eq!(l.parts(&j, 0..2).await.unwrap(), [None, Some("p1".into())]);
    assert_eq!(l.forget_failure(&j, 0).await.unwrap(), Forgot::NotRecorded);
    // A fresh budget: no attempt spent, and its next recording counts.
    assert_eq!(l.attempt_started(&j, 0, "b").await.unwrap().spent, 0);
    let again = l.record(&j, 0, OK, Some("p0")).await.unwrap();
    assert!(again.first);
    assert_eq!(l.parts(&j, 0..1).await.unwrap(), [Some("p0".into())]);

    let last = l.record(&j, 2, failed(1), None).await.unwrap();
    assert_eq!(last.status.state, JobState::Finalizing);
    assert_eq!(
        l.forget_failure(&j, 2).await.unwrap(),
        Forgot::NotRunning(JobState::Finalizing)
    );
    assert!(matches!(
        l.forget_failure("no-such-job", 0).await,
        Err(LedgerError::UnknownJob(_))
    ));
}

/// A Running job whose deadline passed moves to Expired, once: an ended state no other move
/// leaves, keeping what was done. A resume reopens it for the rest only.
pub async fn an_expired_job_ends_and_reopens_for_the_rest<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.seal(&j, 4).await.unwrap();
    l.record(&j, 0, OK, Some("p0")).await.unwrap();
    l.record(&j, 2, OK, Some("p2")).await.unwrap();
    let (moved, s) = l
        .transition(
            &j,
            &[JobState::Running],
            JobState::Expired,
            Some("deadline passed"),
        )
        .await
        .unwrap();
    assert!(moved);
    assert_eq!(
        (s.state, s.done, s.reason.as_deref()),
        (JobState::Expired, 2, Some("deadline passed"))
    );
    assert!(s.state.is_terminal() && !s.state.accepts_work());
    assert_eq!(
        l.recorded(&j, 0..5).await.unwrap(),
        [true, false, true, false, false]
    );
    // Whoever else watched the deadline, or would fail or cancel it, moves nothing.
    for to in [JobState::Expired, JobState::Failed, JobState::Canceled] {
        let (moved, s) = l
            .transition(&j, &[JobState::Running], to, Some("late"))
            .await
            .unwrap();
        assert!(!moved, "{to}");
        assert_eq!(s.state, JobState::Expired);
    }
    assert_eq!(
        JobState::parse(JobState::Expired.as_str()),
        Some(JobState::Expired)
    );
    let reopened = l.reopen(&j).await.unwrap();
    assert!(!reopened.recorded.transitioned);
    let mut done = reopened.done.clone();
    done.sort_unstable();
    assert_eq!(done, [0, 2]);
    let s = reopened.recorded.status;
    assert_eq!(
        (s.state, s.run, s.done, s.reason),
        (JobState::Running, 1, 2, None)
    );
    assert_eq!(
        l.parts(&j, 0..4).await.unwrap(),
        [Some("p0".to_owned()), None, Some("p2".to_owned()), None]
    );
    l.record(&j, 1, OK, None).await.unwrap();
    let last = l.record(&j, 3, OK, None).await.unwrap();
    assert!(last.transitioned);
    assert_eq!(last.status.state, JobState::Finalizing);
}

/// Each runner's seconds by phase add up over flushes, apart from other runners', and go
/// with the job when it is retired.
pub async fn runner_times_add_up_and_go_with_the_job<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    assert!(l.runner_times(&j).await.unwrap().is_empty());
    let runner = |node: &str, gpu: &str| RunnerId {
        node: node.into(),
        runner: "process001".into(),
        gpu: gpu.into(),
    };
    let (a, b) = (runner("node-a", "0"), runner("node-b", ""));
    let first = RunnerTimes {
        init_s: 1.5,
        run_s: 2.0,
        input_wait_s: 0.25,
        idle_s: 0.0,
        ..Default::default()
    };
    l.add_runner_times(&j, &a, &first).await.unwrap();
    l.add_runner_times(
        &j,
        &a,
        &RunnerTimes {
            run_s: 3.0,
            idle_s: 0.5,
            gpu_samples: 2.0,
            gpu_util_sum: 150.0,
            gpu_mem_peak_mib: 1024.0,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    l.add_runner_times(
        &j,
        &b,
        &RunnerTimes {
            input_wait_s: 4.0,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let times = l.runner_times(&j).await.unwrap();
    assert_eq!(times.len(), 2, "{times:?}");
    let of = |id: &RunnerId| times.iter().find(|(r, _)| r == id).unwrap().1;
    let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
    let ta = of(&a);
    assert!(close(ta.init_s, 1.5) && close(ta.run_s, 5.0), "{ta:?}");
    assert!(
        close(ta.input_wait_s, 0.25) && close(ta.idle_s, 0.5),
        "{ta:?}"
    );
    // The GPU's measures are kept beside the seconds, and are none of them.
    assert_eq!(
        (ta.gpu_utilization_pct(), ta.gpu_memory_peak_mib()),
        (Some(75.0), Some(1024.0)),
        "{ta:?}"
    );
    assert!(close(ta.total(), 7.25), "{ta:?}");
    let tb = of(&b);
    assert!(
        close(tb.input_wait_s, 4.0) && close(tb.total(), 4.0),
        "{tb:?}"
    );
    assert!(matches!(
        l.add_runner_times("never-entered", &a, &first).await,
        Err(LedgerError::UnknownJob(_))
    ));
    l.transition(&j, &[JobState::Running], JobState::Canceled, None)
        .await
        .unwrap();
    assert!(
        l.retire(&j, std::time::Duration::from_millis(300))
            .await
            .unwrap()
    );
    // A late flush (a runner that let the job go after it ended) goes with the job too.
    l.add_runner_times(&j, &b, &first).await.unwrap();
    super::eventually("the retired job to be forgotten", || async {
        l.status(&j).await.unwrap().is_none()
    })
    .await;
    let left = l.runner_times(&j).await;
    assert!(left.as_ref().map_or(true, Vec::is_empty), "{left:?}");
}

/// A job retired when it ended and then resumed is not forgotten while it runs again: its
/// state and its runner times alike outlive the retirement's time.
pub async fn a_reopened_job_keeps_its_runner_times_past_its_retirement<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Ledger>>,
{
    let l = make().await;
    let j = job();
    l.create(&j, Limits::NONE).await.unwrap();
    l.seal(&j, 2).await.unwrap();
    let runner = RunnerId {
        node: "node-a".into(),
        runner: "process001".into(),
        gpu: String::new(),
    };
    let times = RunnerTimes {
        run_s: 2.0,
        ..Default::default()
    };
    l.add_runner_times(&j, &runner, &times).await.unwrap();
    l.transition(&j, &[JobState::Running], JobState::Canceled, None)
        .await
        .unwrap();
    let keep = std::time::Duration::from_millis(300);
    assert!(l.retire(&j, keep).await.unwrap());
    l.reopen(&j).await.unwrap();
    // Past the retirement's time: what it would have forgotten is still there.
    tokio::time::sleep(3 * keep).await;
    assert!(
        l.status(&j).await.unwrap().is_some(),
        "the reopened job is kept"
    );
    let kept = l.runner_times(&j).await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!((kept[0].1.run_s - 2.0).abs() < 1e-9, "{kept:?}");
}
