//! What operators and autoscalers read of a fleet: `fleetrun serve --metrics-addr`'s series
//! (each job's seconds of work left among them).

use super::*;

/// A script whose every mini-batch takes a third of a second.
const SLOW_ECHO: &str = "import time\ndef run(mini_batch):\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n";

/// `fleetrun submit JOB --wait --job-id ID`, running while the test goes on.
fn spawn_submit_as(fleet: &Fleet, job: &Path, id: &str) -> KillOnDrop {
    let mut cmd = command("fleetrun");
    fleet.env(&mut cmd);
    KillOnDrop(
        cmd.arg("submit")
            .arg(job)
            .args(["--quiet", "--wait", "--job-id", id])
            .spawn()
            .unwrap(),
    )
}

/// While a job runs, `serve`'s `/metrics` gives its expected seconds of work left (and the
/// pool's sum, and the runners serving it); once it completed, no work is left, no job is
/// active and its counts are its final ones.
#[test]
fn serve_exports_each_jobs_seconds_of_work_left() {
    let mut fleet = Fleet::new(SLOW_ECHO);
    fleet.inputs(40);
    let (_serve, urls) = fleet.serve_with("t0ken", &["--metrics-addr", "127.0.0.1:0"]);
    let metrics = urls[1].clone();
    let pool = fleet.pool.clone();
    let (status, content_type, text) = http_get(&fleet, &metrics);
    assert_eq!(status, 200, "{text}");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    // No job yet: the pool's series are there, at 0.
    let pool_left = format!("fleetrun_pool_work_seconds_left{{pool=\"{pool}\"}}");
    let pool_active = format!("fleetrun_pool_jobs_active{{pool=\"{pool}\"}}");
    assert_eq!(sample(&text, &pool_left), Some(0.0), "{text}");
    assert_eq!(sample(&text, &pool_active), Some(0.0), "{text}");

    fleet.worker("w1", 2);
    let id = format!("left-{}", random_suffix());
    let job = fleet.s3_job("mini_batch_size = 1");
    let mut submit = spawn_submit_as(&fleet, &job, &id);
    let labels = format!("job_id=\"{id}\",pool=\"{pool}\"");
    let job_left = format!("fleetrun_job_work_seconds_left{{{labels}}}");
    let serving = format!("fleetrun_job_runners_serving{{{labels}}}");
    let mut seen = String::new();
    wait_for(
        "the running job's work left and its runners",
        Duration::from_secs(60),
        || {
            seen = http_get(&fleet, &metrics).2;
            sample(&seen, &job_left).is_some_and(|s| s > 0.0)
                && sample(&seen, &serving).is_some_and(|r| r >= 1.0)
        },
    );
    let value = |series: &str| sample(&seen, series);
    assert_eq!(value(&pool_left), value(&job_left), "{seen}");
    assert_eq!(value(&pool_active), Some(1.0), "{seen}");
    let running = format!("fleetrun_job_state{{{labels},state=\"Running\"}}");
    assert_eq!(value(&running), Some(1.0), "{seen}");
    let left = value(&format!("fleetrun_job_mini_batches_left{{{labels}}}")).unwrap();
    assert!(left > 0.0 && left <= 40.0, "{seen}");

    let done = format!("fleetrun_job_mini_batches{{{labels},status=\"done\"}}");
    let all = format!("fleetrun_job_mini_batches{{{labels},status=\"all\"}}");
    assert_eq!(value(&all), Some(40.0), "{seen}");
    assert!(value(&done).unwrap() < 40.0, "{seen}");

    assert!(submit.exit_within(RUN_LIMIT).success());
    // Once the job ended: no work left in the pool, no job active; the job's series go
    // once the workers retire it, and until then say it completed with nothing left.
    wait_for(
        "the pool to have no active job",
        Duration::from_secs(30),
        || {
            seen = http_get(&fleet, &metrics).2;
            sample(&seen, &pool_active) == Some(0.0)
        },
    );
    let value = |series: &str| sample(&seen, series);
    assert_eq!(value(&pool_left), Some(0.0), "{seen}");
    if value(&job_left).is_some() {
        assert_eq!(value(&job_left), Some(0.0), "{seen}");
        let completed = format!("fleetrun_job_state{{{labels},state=\"Completed\"}}");
        assert_eq!(value(&completed), Some(1.0), "{seen}");
        assert_eq!(value(&done), Some(40.0), "{seen}");
    }
}
