//! The events conformance suite: what a follower of the job events hears.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::events::{Counts, Events, JobEvent};
use crate::ledger::JobState;

/// Long enough for any real broker on loopback to deliver; only reached when a case fails.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long a case waits to be sure nothing more arrives.
const QUIET: Duration = Duration::from_millis(300);

/// Generates one `#[tokio::test]` per case for the events built by `$make`, an async closure
/// returning `Arc<dyn Events>`: each call a handle of its own (a connection) on the same
/// events.
#[macro_export]
macro_rules! events_conformance {
    ($make:expr) => {
        $crate::events_conformance!(@cases $make;
            a_follower_hears_each_event_published_after_it_followed_once,
            every_follower_hears_every_event);
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testing::events::$case($make).await;
            }
        )*
    };
}

/// An event of `job`'s moving to `state`.
pub fn event(job: &str, state: JobState) -> JobEvent {
    JobEvent {
        job_id: job.to_owned(),
        name: "conformance".to_owned(),
        pool: "conformance".to_owned(),
        state,
        counts: Counts {
            total_mini_batches: None,
            completed_mini_batches: 0,
            failed_mini_batches: 0,
            succeeded_items: 0,
            failed_items: 0,
        },
        cause: None,
        output: "out".to_owned(),
        time: 0.0,
        manifest: None,
    }
}

/// The states of `job`'s events `follower` hears until it has heard `count` of them; events
/// of other jobs (other cases share the broker) are passed over.
async fn heard(
    follower: &mut broadcast::Receiver<JobEvent>,
    job: &str,
    count: usize,
) -> Vec<JobState> {
    let mut states = Vec::new();
    while states.len() < count {
        let event = tokio::time::timeout(PATIENCE, follower.recv())
            .await
            .unwrap_or_else(|_| panic!("heard only {states:?} of {job}"))
            .expect("follow");
        if event.job_id == job {
            states.push(event.state);
        }
    }
    states
}

async fn nothing_more(follower: &mut broadcast::Receiver<JobEvent>, job: &str) {
    let more = async {
        loop {
            match follower.recv().await {
                Ok(event) if event.job_id == job => return event,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    };
    if let Ok(event) = tokio::time::timeout(QUIET, more).await {
        panic!("heard once more: {event:?}");
    }
}

fn a_job() -> String {
    format!("job-{}", super::random_suffix())
}

/// A follower hears what another handle publishes after it followed, in order, each once;
/// nothing of what was published before.
pub async fn a_follower_hears_each_event_published_after_it_followed_once<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Events>>,
{
    let (publisher, follower) = (make().await, make().await);
    let job = a_job();
    publisher
        .publish(&event(&job, JobState::Running))
        .await
        .unwrap();
    let mut follower = follower.follow().await.unwrap();
    let states = [JobState::Finalizing, JobState::Completed];
    for state in states {
        publisher.publish(&event(&job, state)).await.unwrap();
    }
    assert_eq!(heard(&mut follower, &job, 2).await, states);
    nothing_more(&mut follower, &job).await;
}

/// Two followers, each on a handle of its own, both hear every event.
pub async fn every_follower_hears_every_event<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Events>>,
{
    let publisher = make().await;
    let mut first = make().await.follow().await.unwrap();
    let mut second = make().await.follow().await.unwrap();
    let job = a_job();
    publisher
        .publish(&event(&job, JobState::Canceled))
        .await
        .unwrap();
    assert_eq!(heard(&mut first, &job, 1).await, [JobState::Canceled]);
    assert_eq!(heard(&mut second, &job, 1).await, [JobState::Canceled]);
}
