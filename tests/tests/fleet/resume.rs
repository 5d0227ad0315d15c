//! `fleetrun resume`: a fleet job that was canceled or failed continues under its id, keeps
//! every mini-batch it recorded whole and runs only the rest. `fleetrun retry`: a new job
//! over exactly the items a job failed.

use super::*;

impl Fleet {
    /// `fleetrun ARGS` to its end: its exit code, stdout and stderr.
    pub(super) fn fleetrun(&self, args: &[&str]) -> (i32, String, String) {
        let mut cmd = command("fleetrun");
        self.env(&mut cmd);
        let out = output_within(cmd.args(args), RUN_LIMIT);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        eprintln!(
            "--- fleetrun {args:?}: exit {}\n{stdout}{stderr}",
            code(&out)
        );
        (code(&out), stdout, stderr)
    }

    /// The job's `status --json`.
    pub(super) fn status_json(&self, job: &str) -> serde_json::Value {
        let (_, out, _) = self.fleetrun(&["status", job, "--json"]);
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    }

    /// Waits until no message of the pool is ready or held by a worker.
    fn queue_drained(&self) {
        let queue = self.queue();
        wait_for("the queue to be drained", Duration::from_secs(60), || {
            let d = self.pool_depth(&queue);
            d.ready == 0 && d.unacked == Some(0)
        });
    }
}

/// A script that notes in `seen.txt` every file it is given, then sleeps a little.
fn noting_script(dir: &Path) -> String {
    let seen = dir.join("seen.txt");
    format!(
        "import time\nSEEN = {seen:?}\n\ndef run(mini_batch):\n    names = [open(p).read() for p in mini_batch]\n    with open(SEEN, 'a') as f:\n        f.write(''.join(n + '\\n' for n in names))\n    time.sleep(0.05)\n    return names\n"
    )
}

fn seen(fleet: &Fleet) -> Vec<String> {
    let text = std::fs::read_to_string(fleet.path("seen.txt")).unwrap_or_default();
    text.lines().map(str::to_owned).collect()
}

/// A job canceled part way, then resumed, completes: every line once and in order, and the
/// resumed run runs only the mini-batches the first did not record (a worker that served
/// the canceled run serves the resumed one). A completed job is not resumed again.
#[test]
fn a_canceled_fleet_job_finishes_with_resume() {
    let mut fleet = Fleet::new("");
    // The script notes what it ran beside the fleet's files.
    std::fs::write(fleet.path("code/score.py"), noting_script(&fleet.path(""))).unwrap();
    fleet.inputs(200);
    fleet.worker("w1", 2);
    let job = fleet.s3_job("mini_batch_size = 2\nrun_max_try = 1");
    let id = format!("resumed-{}", random_suffix());
    let (submitted, _, _) =
        fleet.fleetrun(&["submit", job.to_str().unwrap(), "--job-id", &id, "--quiet"]);
    assert_eq!(submitted, 0);
    wait_for(
        "a third of the job to be done",
        Duration::from_secs(120),
        || fleet.status_json(&id)["counts"]["completed_mini_batches"].as_u64() >= Some(30),
    );
    let (canceled, _, _) = fleet.fleetrun(&["cancel", &id]);
    assert_eq!(canceled, 0);
    let done_at_cancel = fleet.status_json(&id)["counts"]["completed_mini_batches"]
        .as_u64()
        .unwrap();
    assert!(done_at_cancel < 100, "the job ended before its cancel");
    fleet.queue_drained();
    let seen_before = seen(&fleet).len();

    let (resumed, _, stderr) = fleet.fleetrun(&["resume", &id, "--wait", "--quiet"]);
    assert_eq!(resumed, 0, "{stderr}");
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(200, |_| false)
    );
    let shown = fleet.status_json(&id);
    assert_eq!(shown["state"], "Completed");
    assert_eq!(shown["counts"]["succeeded_items"], 200);
    // Only what the first run did not record ran again: the mini-batches the cancel
    // stopped in flight among them.
    let ran_again = seen(&fleet).len() - seen_before;
    assert!(
        ran_again <= 2 * (100 - done_at_cancel) as usize,
        "{ran_again} files ran again; {done_at_cancel} of 100 mini-batches were done"
    );
    let (again, _, stderr) = fleet.fleetrun(&["resume", &id]);
    assert_eq!(again, 2, "a completed job is not resumed");
    assert!(stderr.contains("is Completed"), "{stderr}");
}

/// A job failed on its `error_threshold` resumes once the cause is gone: the failed
/// mini-batch runs again, the others stay done, and the last run's `failed_items.csv` goes.
/// A resume whose input is listed otherwise than the job's was is refused, naming the
/// listing, unless `--force`.
#[test]
fn a_failed_fleet_job_resumes_once_its_cause_is_gone() {
    let marker = tempfile::NamedTempFile::new().unwrap();
    let script = format!(
        "import os\nMARKER = {:?}\n\ndef run(mini_batch):\n    names = [open(p).read() for p in mini_batch]\n    if 'f0042' in names and os.path.exists(MARKER):\n        raise ValueError('f0042 is not ready')\n    return names\n",
        marker.path()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(100);
    fleet.worker("w1", 1);
    let job = fleet.s3_job("mini_batch_size = 5\nrun_max_try = 1\nerror_threshold = 0");
    let id = format!("failed-{}", random_suffix());
    let job = job.to_str().unwrap();
    let (failed, _, _) = fleet.fleetrun(&["submit", job, "--job-id", &id, "--wait", "--quiet"]);
    assert_eq!(failed, 42);
    let failed_items =
        String::from_utf8_lossy(&fleet.output("out/logs/failed_items.csv")).into_owned();
    assert!(failed_items.contains("f0042"), "{failed_items}");

    // A file more in the input: the job's mini-batches would be cut otherwise.
    let extra = fleet.storage("in");
    fleet
        .runtime
        .block_on(extra.put("g00/f0042b.txt", Bytes::from("extra")))
        .unwrap();
    let (refused, _, stderr) = fleet.fleetrun(&["resume", &id]);
    assert_eq!(refused, 2);
    assert!(stderr.contains("the input listing changed"), "{stderr}");
    assert_eq!(fleet.status_json(&id)["state"], "Failed", "left as it was");
    fleet
        .runtime
        .block_on(extra.delete_prefix("g00/f0042b.txt"))
        .unwrap();

    marker.close().unwrap();
    let (resumed, _, stderr) = fleet.fleetrun(&["resume", &id, "--wait", "--quiet"]);
    assert_eq!(resumed, 0, "{stderr}");
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(100, |_| false)
    );
    let shown = fleet.status_json(&id);
    assert_eq!(
        (
            &shown["counts"]["succeeded_items"],
            &shown["counts"]["failed_items"]
        ),
        (&serde_json::json!(100), &serde_json::json!(0))
    );
    let s3 = fleet.storage("out");
    let left = fleet.runtime.block_on(s3.get("logs/failed_items.csv"));
    assert!(left.is_err(), "the last run's failed_items.csv is gone");
}

/// `fleetrun retry`: a new job over exactly the items a job failed, with its settings and
/// code, its output in the job's `retries/<id>/`; a job with no failed item is not retried.
#[test]
fn retry_runs_a_new_job_over_exactly_the_failed_items() {
    let marker = tempfile::NamedTempFile::new().unwrap();
    let script = format!(
        "import os\nMARKER = {:?}\n\ndef run(mini_batch):\n    names = [open(p).read() for p in mini_batch]\n    if os.path.exists(MARKER) and {{'f0042', 'f0077'}}.intersection(names):\n        raise ValueError('not ready')\n    return names\n",
        marker.path()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(100);
    fleet.worker("w1", 1);
    let job = fleet.s3_job("mini_batch_size = 10\nrun_max_try = 1\nerror_threshold = -1");
    let id = format!("first-{}", random_suffix());
    let job = job.to_str().unwrap();
    let (done, _, _) = fleet.fleetrun(&["submit", job, "--job-id", &id, "--wait", "--quiet"]);
    assert_eq!(done, 0);
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(100, |i| i == 42 || i == 77)
    );

    marker.close().unwrap();
    let retry = format!("retry-{}", random_suffix());
    let (retried, out, stderr) =
        fleet.fleetrun(&["retry", &id, "--job-id", &retry, "--wait", "--quiet"]);
    assert_eq!(retried, 0, "{stderr}");
    assert_eq!(out.lines().next(), Some(retry.as_str()));
    assert_eq!(
        lines(&fleet.output(&format!("out/retries/{retry}/parallel_run_step.txt"))),
        ["f0042", "f0077"]
    );
    let shown = fleet.status_json(&retry);
    assert_eq!(shown["counts"]["succeeded_items"], 2);
    assert_eq!(shown["counts"]["total_mini_batches"], 1);

    let (refused, _, stderr) = fleet.fleetrun(&["retry", &retry]);
    assert_eq!(refused, 2);
    assert!(stderr.contains("it has no failed items"), "{stderr}");
    let (unknown, _, stderr) = fleet.fleetrun(&["retry", "no-such-job"]);
    assert_eq!(unknown, 2);
    assert!(stderr.contains("does not know job no-such-job"), "{stderr}");
}
