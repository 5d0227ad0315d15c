//! What the job's records say of a mini-batch: only what is so.

use std::sync::Arc;

use fleetrun_common::ledger::{Ledger, Limits, MemoryLedger, Outcome};
use fleetrun_common::storage::LocalStorage;
use fleetrun_common::wire::MiniBatch;
use fleetrun_worker::agent::{JobContext, record_failed_batch};
use fleetrun_worker::job::Job;
use fleetrun_worker::logs::{self, JobLogs};
use fleetrun_worker::parts;

/// A mini-batch that succeeded, whose acknowledgement was lost, comes back past its
/// attempts: recording it failed changes nothing, and its items are not listed as failed.
/// One never recorded before is listed.
#[tokio::test]
async fn a_mini_batch_that_succeeded_is_never_listed_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let job_file = dir.path().join("job.toml");
    std::fs::write(
        &job_file,
        "name = \"records\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\nrun_max_try = 1\n[input]\nfiles = \"data\"\n[output]\npath = \"out\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("score.py"), "def run(b): return b\n").unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let spec = fleetrun_config::load(&job_file, &[]).unwrap();
    let ledger = Arc::new(MemoryLedger::new());
    ledger.create("j", Limits::NONE).await.unwrap();
    let succeeded = Outcome {
        succeeded: 1,
        failed: 0,
        batch_failed: false,
    };
    ledger.record("j", 0, succeeded, Some("p0")).await.unwrap();

    let output: Arc<LocalStorage> = Arc::new(LocalStorage::new(dir.path().join("out")));
    let logs_dir = dir.path().join("out/logs");
    let job = Job::new("j", spec, 0.0, ledger.clone(), output.clone());
    let ctx = JobContext::new(
        job,
        Arc::new(LocalStorage::new(dir.path().join("data"))),
        parts::for_job(output, "j", "n"),
        Arc::new(JobLogs::new(&logs_dir)),
    );
    let lost = "all 1 attempts were lost with the process or worker that held them";
    let done = MiniBatch::new("j", 0, vec!["a.txt".to_owned()]);
    let recorded = record_failed_batch(&ctx, &done, 2, lost).await.unwrap();
    assert!(!recorded.first);
    assert_eq!(recorded.status.items_failed, 0);
    let never = MiniBatch::new("j", 1, vec!["b.txt".to_owned()]);
    let recorded = record_failed_batch(&ctx, &never, 2, lost).await.unwrap();
    assert!(recorded.first);
    ctx.logs.flush();

    let failed = std::fs::read_to_string(logs_dir.join(logs::FAILED_ITEMS_CSV)).unwrap();
    let items: Vec<&str> = failed.lines().skip(1).collect();
    assert_eq!(items, [format!("b.txt,1,2,{lost}")]);
}
