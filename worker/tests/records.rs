//! What the job's records say of a mini-batch: only what is so.

use std::sync::Arc;

use fleetrun_common::ledger::{JobState, Limits, Outcome};
use fleetrun_common::storage::LocalStorage;
use fleetrun_common::wire::MiniBatch;
use fleetrun_worker::agent::{JobContext, record_failed_batch};
use fleetrun_worker::job::{Fleet, Job};
use fleetrun_worker::logs::{self, JobLogs};

/// One node of a job: its own writer of the job's parts, the shared ledger and output.
fn node(dir: &std::path::Path, fleet: &Fleet, name: &str) -> JobContext {
    let job_file = dir.join("job.toml");
    std::fs::write(
        &job_file,
        "name = \"records\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\nrun_max_try = 1\n[input]\nfiles = \"data\"\n[output]\npath = \"out\"\n",
    )
    .unwrap();
    std::fs::write(dir.join("score.py"), "def run(b): return b\n").unwrap();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let spec = fleetrun_config::load(&job_file, &[]).unwrap();
    let output = Arc::new(LocalStorage::new(dir.join("out")));
    let job = Job::new("j", spec, 0.0, fleet, output, name);
    JobContext::new(
        job,
        Arc::new(LocalStorage::new(dir.join("data"))),
        Arc::new(JobLogs::for_node(dir.join("out/logs"), name)),
    )
}

/// An embedded fleet: the ledger is what these tests look at.
fn embedded() -> Fleet {
    Fleet::embedded("p")
}

/// `failed_items.csv` is one file for the job, whichever nodes failed its mini-batches, in
/// mini-batch order. A mini-batch that succeeded, whose acknowledgement was lost, comes back
/// past its attempts on another node: recording it failed changes nothing, and its items are
/// not listed as failed.
#[tokio::test]
async fn failed_items_are_one_file_that_never_lists_a_mini_batch_that_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = embedded();
    fleet.ledger.create("j", Limits::NONE).await.unwrap();
    let (n1, n2) = (
        node(dir.path(), &fleet, "n1"),
        node(dir.path(), &fleet, "n2"),
    );
    let succeeded = Outcome {
        succeeded: 1,
        failed: 0,
        batch_failed: false,
    };
    let part = n1
        .job
        .parts()
        .put(0, bytes::Bytes::from_static(b"a\n"))
        .await
        .unwrap();
    n1.job
        .record(0, succeeded, Some(&part), None)
        .await
        .unwrap();

    let lost = "all 1 attempts were lost with the process or worker that held them";
    let done = MiniBatch::new("j", 0, vec!["a.txt".to_owned()]);
    let recorded = record_failed_batch(&n2, &done, 2, lost, None)
        .await
        .unwrap();
    assert!(!recorded.first);
    assert_eq!(recorded.status.items_failed, 0);
    let later = MiniBatch::new("j", 2, vec!["c, d.txt".to_owned()]);
    assert!(
        record_failed_batch(&n1, &later, 1, "raised\nand more", None)
            .await
            .unwrap()
            .first
    );
    let never = MiniBatch::new("j", 1, vec!["b.txt".to_owned()]);
    assert!(
        record_failed_batch(&n2, &never, 2, lost, None)
            .await
            .unwrap()
            .first
    );

    let sealed = n1.job.seal(3).await.unwrap();
    assert_eq!(sealed.status.state, JobState::Finalizing);
    assert_eq!(
        n2.job.finish(&*n2.input, || async { true }).await,
        JobState::Completed
    );
    let out = dir.path().join("out");
    assert_eq!(
        std::fs::read_to_string(out.join("parallel_run_step.txt")).unwrap(),
        "a\n"
    );
    let failed = std::fs::read_to_string(out.join("logs").join(logs::FAILED_ITEMS_CSV)).unwrap();
    assert_eq!(
        failed,
        format!(
            "{}\nb.txt,1,2,{lost}\n\"c, d.txt\",2,1,raised\n",
            logs::FAILED_ITEMS_HEADER
        )
    );
    assert!(!out.join("_parts").join("j").exists(), "the parts stay");
}

/// A job that ends without completing lists the failed items counted so far; one whose
/// mini-batches all succeeded has no `failed_items.csv`.
#[tokio::test]
async fn failed_items_are_written_when_a_job_fails_and_only_when_some_failed() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = embedded();
    fleet.ledger.create("j", Limits::NONE).await.unwrap();
    let n1 = node(dir.path(), &fleet, "n1");
    let failed_file = dir.path().join("out/logs").join(logs::FAILED_ITEMS_CSV);

    n1.job.cancel("nothing failed").await.unwrap();
    assert!(!failed_file.exists());

    let dir = tempfile::tempdir().unwrap();
    let fleet = embedded();
    fleet.ledger.create("j", Limits::NONE).await.unwrap();
    let n1 = node(dir.path(), &fleet, "n1");
    let batch = MiniBatch::new("j", 0, vec!["a.txt".to_owned()]);
    record_failed_batch(&n1, &batch, 3, "raised", None)
        .await
        .unwrap();
    n1.job.fail("stalled", None).await.unwrap();
    let failed_file = dir.path().join("out/logs").join(logs::FAILED_ITEMS_CSV);
    assert_eq!(
        std::fs::read_to_string(failed_file).unwrap(),
        format!("{}\na.txt,0,3,raised\n", logs::FAILED_ITEMS_HEADER)
    );
}
