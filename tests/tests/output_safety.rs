//! `fleetrun run` on output folders that already hold things, interrupted by signals and
//! kills: it never deletes or overwrites what it did not write, a killed re-run leaves the
//! previous output whole, a folder in use is refused, and a signal ends the job with its
//! result written and nothing left behind.

use std::process::{Child, Output, Stdio};
use std::time::Duration;

use fleetrun_tests::{
    JobDir, RUN_LIMIT, code, exit_within, expected_lines, wait_for, wait_with_output_within,
};

/// Returns each file's content.
const ECHO: &str = "def run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n";

/// Returns each file's content, slowly, and says it has started.
const SLOW: &str = r#"
import os, time

def run(mini_batch):
    open(os.environ["STARTED"], "w").close()
    time.sleep(0.5)
    return [open(p).read() for p in mini_batch]
"#;

fn spawn(job: &JobDir, tmp: &std::path::Path) -> Child {
    job.command(&[])
        .env("TMPDIR", tmp)
        .env("STARTED", job.path("started"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fleetrun starts")
}

fn wait_started(job: &JobDir) {
    wait_for("run() to start", Duration::from_secs(30), || {
        job.path("started").exists()
    });
}

/// Output parts written so far, over every job.
fn parts_written(job: &JobDir) -> usize {
    let Ok(jobs) = std::fs::read_dir(job.path("out/_parts")) else {
        return 0;
    };
    jobs.flatten()
        .filter_map(|j| std::fs::read_dir(j.path()).ok())
        .map(|parts| parts.count())
        .sum()
}

fn send(child: &Child, signal: i32) {
    // SAFETY: a signal to a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

fn scratch_left(tmp: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fleetrun-"))
        .collect()
}

#[test]
fn a_users_logs_folder_in_the_output_folder_is_refused_and_kept() {
    let job = JobDir::new(ECHO, "");
    job.inputs(3);
    std::fs::create_dir_all(job.path("out/logs")).unwrap();
    std::fs::write(job.path("out/logs/notes.txt"), "mine").unwrap();
    let out = job.run(&[]);
    assert_eq!(code(&out), 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("logs"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(job.path("out/logs/notes.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn an_output_file_named_like_the_entry_script_is_refused() {
    let job = JobDir::new(ECHO, "append_row_file_name = \"score.py\"");
    job.inputs(3);
    // The output folder is the job's own folder, where the script is.
    let toml = std::fs::read_to_string(job.path("job.toml")).unwrap();
    std::fs::write(
        job.path("job.toml"),
        toml.replace("path = \"out\"", "path = \".\""),
    )
    .unwrap();
    let out = job.run(&[]);
    assert_eq!(code(&out), 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("score.py"), "{stderr}");
    assert_eq!(std::fs::read_to_string(job.path("score.py")).unwrap(), ECHO);
}

#[test]
fn a_rerun_killed_midway_leaves_the_previous_output_whole() {
    let job = JobDir::new(SLOW, "mini_batch_size = 1\nprocess_count_per_node = 1");
    job.inputs(20);
    let tmp = tempfile::tempdir().unwrap();
    let first = wait_with_output_within(spawn(&job, tmp.path()), RUN_LIMIT);
    assert_eq!(code(&first), 0);
    let before = std::fs::read(job.path("out/parallel_run_step.txt")).unwrap();
    assert_eq!(job.output_lines(), expected_lines(20, |_| false));

    std::fs::remove_file(job.path("started")).unwrap();
    let mut again = spawn(&job, tmp.path());
    wait_for("a part to be written", Duration::from_secs(30), || {
        parts_written(&job) > 0
    });
    send(&again, libc::SIGKILL);
    exit_within(&mut again, RUN_LIMIT);
    assert_eq!(
        std::fs::read(job.path("out/parallel_run_step.txt")).unwrap(),
        before,
        "the previous output is untouched"
    );
    // The killed run's scratch is swept by the next run, which completes.
    let third = wait_with_output_within(spawn(&job, tmp.path()), RUN_LIMIT);
    assert_eq!(code(&third), 0);
    assert_eq!(scratch_left(tmp.path()), Vec::<String>::new());
    assert!(
        !job.path("out/_parts").exists(),
        "the killed run's parts are removed by the next run"
    );
    assert_eq!(job.output_lines(), expected_lines(20, |_| false));
}

#[test]
fn a_second_run_on_a_folder_in_use_is_refused_at_once() {
    let job = JobDir::new(SLOW, "mini_batch_size = 1\nprocess_count_per_node = 1");
    job.inputs(10);
    let tmp = tempfile::tempdir().unwrap();
    let mut first = spawn(&job, tmp.path());
    wait_started(&job);
    let second = job.run(&[]);
    assert_ne!(code(&second), 0);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&*job.path("out").to_string_lossy()),
        "{stderr}"
    );
    assert!(first.try_wait().unwrap().is_none(), "the first run goes on");
    let first = wait_with_output_within(first, RUN_LIMIT);
    assert_eq!(code(&first), 0);
    assert_eq!(job.output_lines(), expected_lines(10, |_| false));
}

/// A run of 40 slow mini-batches sent `signal` once its first `run()` has started: the job,
/// the run's output and its `TMPDIR`.
fn signaled_midway(signal: i32) -> (JobDir, Output, tempfile::TempDir) {
    let job = JobDir::new(SLOW, "mini_batch_size = 1\nprocess_count_per_node = 1");
    job.inputs(40);
    let tmp = tempfile::tempdir().unwrap();
    let child = spawn(&job, tmp.path());
    wait_started(&job);
    send(&child, signal);
    let out = wait_with_output_within(child, RUN_LIMIT);
    (job, out, tmp)
}

#[test]
fn sigterm_cancels_the_job_writes_its_result_and_leaves_no_scratch() {
    let (job, out, tmp) = signaled_midway(libc::SIGTERM);
    assert_eq!(code(&out), 143);
    let result = job.log("job_result.txt");
    assert!(result.contains("Result: Canceled"), "{result}");
    assert!(result.contains("SIGTERM"), "{result}");
    let overview = job.log("job_progress_overview.txt");
    assert!(overview.contains("Result: Canceled"), "{overview}");
    assert!(!job.path("out/parallel_run_step.txt").exists());
    assert!(!job.path("out/_parts").exists());
    assert_eq!(scratch_left(tmp.path()), Vec::<String>::new());
}

#[test]
fn sigint_cancels_the_job_with_exit_130() {
    let (job, out, _tmp) = signaled_midway(libc::SIGINT);
    assert_eq!(code(&out), 130);
    assert!(job.log("job_result.txt").contains("SIGINT"));
}
