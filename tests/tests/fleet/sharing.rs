//! Jobs of one pool share its runners: a small job submitted behind a large one runs beside
//! it instead of after it, and a job of a higher priority is served first.

use super::*;

/// A script whose every mini-batch takes `seconds`.
fn slow(seconds: f64) -> String {
    format!(
        "import time\ndef run(mini_batch):\n    time.sleep({seconds})\n    return [open(p).read() for p in mini_batch]\n"
    )
}

impl Fleet {
    /// Submits `job` under `id` without waiting for it (`submit` returns once published).
    fn submit_as(&self, job: &Path, id: &str) {
        let out = self.submit(job, &["--job-id", id]);
        assert_eq!(code(&out), 0, "submit {id}");
    }

    /// Each of the pool's jobs' state and mini-batches done (completed or failed), from one
    /// `fleetrun jobs --json`: one moment for all of them.
    fn progress(&self) -> std::collections::HashMap<String, (String, u64)> {
        let (code, out, _) = self.fleetrun(&["jobs", "--json"]);
        assert_eq!(code, 0, "fleetrun jobs");
        let jobs: Vec<serde_json::Value> =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        jobs.iter()
            .map(|job| {
                let counts = &job["counts"];
                let done = counts["completed_mini_batches"].as_u64().unwrap()
                    + counts["failed_mini_batches"].as_u64().unwrap();
                let state = job["state"].as_str().unwrap().to_owned();
                (job["job_id"].as_str().unwrap().to_owned(), (state, done))
            })
            .collect()
    }

    /// One job's state and mini-batches done (`("", 0)` before it is listed).
    fn progress_of(&self, id: &str) -> (String, u64) {
        self.progress().remove(id).unwrap_or_default()
    }
}

/// Issue #15's case: on a busy pool (one worker, two runners), a 5-mini-batch job submitted
/// while a 200-mini-batch one runs is done while most of the large one still waits, and
/// both outputs are whole.
#[test]
fn a_small_job_behind_a_large_one_finishes_long_before_it() {
    // Half a second a mini-batch: a runner started for the second job (a new Python, its
    // `init()`) on a busy machine costs the first job a few mini-batches, not dozens.
    let mut fleet = Fleet::new(&slow(0.5));
    fleet.inputs(200);
    fleet.worker("w1", 2);
    let bucket = fleet.bucket.clone();
    let settings = "mini_batch_size = 1\nprocess_count_per_node = 2";
    let large = fleet.job(
        settings,
        &format!("s3://{bucket}/in"),
        &format!("s3://{bucket}/large"),
    );
    // 5 mini-batches of 20 files: the first 100 inputs.
    let small = fleet.job(
        "mini_batch_size = 20\nprocess_count_per_node = 2",
        &format!("s3://{bucket}/in/g00"),
        &format!("s3://{bucket}/small"),
    );
    let (large_id, small_id) = (
        format!("large-{}", random_suffix()),
        format!("small-{}", random_suffix()),
    );
    fleet.submit_as(&large, &large_id);
    wait_for(
        "the large job to be under way",
        Duration::from_secs(60),
        || fleet.progress_of(&large_id).1 >= 4,
    );
    fleet.submit_as(&small, &small_id);
    let mut large_then = (String::new(), 0);
    wait_for("the small job to complete", Duration::from_secs(60), || {
        let mut jobs = fleet.progress();
        large_then = jobs.remove(&large_id).unwrap_or_default();
        jobs.remove(&small_id)
            .is_some_and(|(state, _)| state == "Completed")
    });
    // First in, first out, the small job could not even start before the large one ended.
    let (state, done) = large_then;
    assert_eq!(state, "Running", "the large job is still running");
    assert!(
        done <= 150,
        "the small job ended with only {} of the large one's 200 mini-batches left",
        200 - done
    );
    wait_for(
        "the large job to complete",
        Duration::from_secs(120),
        || fleet.progress_of(&large_id).0 == "Completed",
    );
    assert_eq!(
        lines(&fleet.output("small/parallel_run_step.txt")),
        expected_lines(100, |_| false)
    );
    assert_eq!(
        lines(&fleet.output("large/parallel_run_step.txt")),
        expected_lines(200, |_| false)
    );
}

/// A job of a higher priority submitted while another runs gets the runners as they come
/// free: once it has started, the other job runs next to nothing until it completes.
#[test]
fn a_job_of_a_higher_priority_is_served_first() {
    // Half a second a mini-batch: a runner started for the second job (a new Python, its
    // `init()`) on a busy machine costs the first job a few mini-batches, not dozens.
    let mut fleet = Fleet::new(&slow(0.5));
    fleet.inputs(200);
    fleet.worker("w1", 2);
    let bucket = fleet.bucket.clone();
    let low = fleet.job(
        "mini_batch_size = 1\nprocess_count_per_node = 2",
        &format!("s3://{bucket}/in"),
        &format!("s3://{bucket}/low"),
    );
    let urgent = fleet.job(
        "mini_batch_size = 1\nprocess_count_per_node = 2\npriority = 9",
        &format!("s3://{bucket}/in/g01"),
        &format!("s3://{bucket}/urgent"),
    );
    let (low_id, urgent_id) = (
        format!("low-{}", random_suffix()),
        format!("urgent-{}", random_suffix()),
    );
    fleet.submit_as(&low, &low_id);
    wait_for(
        "the low job to be under way",
        Duration::from_secs(60),
        || fleet.progress_of(&low_id).1 >= 4,
    );
    fleet.submit_as(&urgent, &urgent_id);
    let mut low_before = 0;
    wait_for("the urgent job to start", Duration::from_secs(60), || {
        let mut jobs = fleet.progress();
        low_before = jobs.remove(&low_id).unwrap_or_default().1;
        jobs.remove(&urgent_id).is_some_and(|(_, done)| done >= 2)
    });
    let mut low_then = (String::new(), 0);
    wait_for(
        "the urgent job to complete",
        Duration::from_secs(90),
        || {
            let mut jobs = fleet.progress();
            low_then = jobs.remove(&low_id).unwrap_or_default();
            jobs.remove(&urgent_id)
                .is_some_and(|(state, _)| state == "Completed")
        },
    );
    // First in, first out, the urgent job would have waited for the low one to end.
    let (low_state, low_then) = low_then;
    assert_eq!(low_state, "Running", "the low job is still running");
    // Sharing evenly, the low job would run about as many mini-batches as the urgent one's
    // other 98 meanwhile; served second, only what its runners held when they moved and
    // what they ran until the next share (a second or so).
    assert!(
        low_then - low_before < 40,
        "the low job ran {} mini-batches while the urgent one waited",
        low_then - low_before
    );
    assert_eq!(
        lines(&fleet.output("urgent/parallel_run_step.txt")),
        (100..200).map(|i| format!("f{i:04}")).collect::<Vec<_>>()
    );
}
