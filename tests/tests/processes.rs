//! The binaries as processes: what the script starts ends with its runner, flags are bounded,
//! and output meant for a person stays plain when a program reads it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleetrun_tests::{
    JobDir, KillOnDrop, RUN_LIMIT, ScriptProcesses, code, command, exit_within, expected_lines,
    kill, output_within, pids, wait_for, wait_with_output_within,
};

/// Starts `sleep 600` and records its pid beside the script.
const START_CHILD: &str = r#"
import os, subprocess
HERE = os.path.dirname(__file__)

def start_child():
    child = subprocess.Popen(["sleep", "600"])
    with open(os.path.join(HERE, "children.txt"), "a") as f:
        f.write(f"{child.pid}\n")
"#;

#[test]
fn processes_started_in_init_end_with_a_completed_job() {
    let script = format!(
        "{START_CHILD}
def init():
    start_child()

def run(mini_batch):
    return [open(p).read() for p in mini_batch]
"
    );
    let job = JobDir::new(&script, "mini_batch_size = 2\nprocess_count_per_node = 2");
    job.inputs(6);
    let out = job.run(&[]);
    let children = ScriptProcesses::read(&job.path("children.txt"));
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines(), expected_lines(6, |_| false));
    children.assert_all_gone();
}

/// The runner killed at `run_invocation_timeout` takes what its `run()` started with it,
/// while the job goes on with a new runner and completes.
#[test]
fn processes_started_in_a_hanging_run_end_with_its_runner() {
    let script = format!(
        "{START_CHILD}
import time

def run(mini_batch):
    marker = os.path.join(HERE, 'hung-once')
    if not os.path.exists(marker):
        open(marker, 'w').close()
        start_child()
        time.sleep(600)
    return [open(p).read() for p in mini_batch]
"
    );
    let job = JobDir::new(
        &script,
        "mini_batch_size = 2\nprocess_count_per_node = 1\nrun_invocation_timeout = 2\nrun_max_try = 2",
    );
    job.inputs(4);
    let out = job.run(&[]);
    let children = ScriptProcesses::read(&job.path("children.txt"));
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines(), expected_lines(4, |_| false));
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert!(report.contains(",timeout,"), "{report}");
    children.assert_all_gone();
}

/// `fleetrun run` killed outright (SIGKILL) while its script's child sleeps: the runner sees
/// its agent die and kills its process group, so neither the runner nor the child is left.
#[test]
fn a_run_killed_outright_leaves_no_process_of_its_script() {
    let script = format!(
        "{START_CHILD}
import time

def init():
    start_child()

def run(mini_batch):
    with open(os.path.join(HERE, 'children.txt'), 'a') as f:
        f.write(f'{{os.getpid()}}\\n')
    time.sleep(600)
"
    );
    let job = JobDir::new(&script, "process_count_per_node = 1");
    job.inputs(1);
    let mut run = KillOnDrop(
        job.command(&[])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(job.path("stderr.txt")).unwrap())
            .spawn()
            .unwrap(),
    );
    let children = job.path("children.txt");
    wait_for("the runner and its child to start", RUN_LIMIT, || {
        pids(&children).len() == 2
    });
    let processes = ScriptProcesses::read(&children);
    kill(&mut run.0);
    processes.assert_all_gone();
}

const ECHO: &str = "def run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n";

#[test]
fn processes_flags_are_bounded() {
    let job = JobDir::new(ECHO, "");
    job.inputs(1);
    for value in ["0", "1025"] {
        let out = output_within(&mut job.command(&["--processes", value]), RUN_LIMIT);
        assert_eq!(code(&out), 2, "fleetrun run --processes {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--processes") && stderr.contains("1..=1024"),
            "{stderr}"
        );
        assert!(!job.path("out").exists(), "nothing ran");

        let out = output_within(
            command("fleetrun-worker").env("FLEETRUN_PROCESSES", value),
            RUN_LIMIT,
        );
        assert_eq!(
            code(&out),
            2,
            "fleetrun-worker with FLEETRUN_PROCESSES={value}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--processes") && stderr.contains("1..=1024"),
            "{stderr}"
        );

        let out = output_within(
            command("fleetrun-worker").env("FLEETRUN_MAX_PROCESSES", value),
            RUN_LIMIT,
        );
        assert_eq!(code(&out), 2, "FLEETRUN_MAX_PROCESSES={value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--max-processes") && stderr.contains("1..=1024"),
            "{stderr}"
        );
    }
}

/// Asserts that logging reached stderr, written for a program: no ANSI escapes.
fn assert_plain_logs(stderr: &[u8], expected: &str) {
    let stderr = String::from_utf8_lossy(stderr);
    assert!(stderr.contains(expected), "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
}

#[test]
fn fleetrun_logs_to_a_pipe_without_colour() {
    let job = JobDir::new(
        "def run(mini_batch):\n    raise ValueError('no')\n",
        "run_max_try = 1\nerror_threshold = -1",
    );
    job.inputs(1);
    let out = output_within(
        job.command(&[])
            .env("FLEETRUN_LOG", "debug")
            .env_remove("NO_COLOR"),
        RUN_LIMIT,
    );
    assert_eq!(code(&out), 0);
    assert_plain_logs(&out.stderr, "DEBUG");
}

/// A worker starting removes the scratch folder a `kill -9`ed one left, logging it plainly to
/// a pipe, and touches nothing else, even when its settings then fail.
#[test]
fn worker_sweeps_stale_scratch_at_start_and_logs_without_colour() {
    let temp = tempfile::tempdir().unwrap();
    let gone_pid = {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        exit_within(&mut child, Duration::from_secs(10));
        pid
    };
    let stale = temp
        .path()
        .join(format!("fleetrun-worker-old-pid{gone_pid}-1"));
    std::fs::create_dir_all(stale.join("staging")).unwrap();
    let unrelated = temp.path().join(format!("other-pid{gone_pid}-1"));
    std::fs::create_dir(&unrelated).unwrap();
    let out = output_within(
        worker_without_settings(temp.path()).env("FLEETRUN_LOG", "info"),
        RUN_LIMIT,
    );
    assert_eq!(code(&out), 1, "no RabbitMQ URL");
    assert_plain_logs(&out.stderr, "Removed a stale scratch folder.");
    assert!(!stale.exists());
    assert!(unrelated.is_dir());
}

/// `fleetrun-worker` with no fleet settings at all, its temp dir and home in `dir`.
fn worker_without_settings(dir: &Path) -> Command {
    let mut cmd = command("fleetrun-worker");
    cmd.env("TMPDIR", dir)
        .env("HOME", dir)
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    cmd
}

/// `fleetrun run job.toml | head -1`: the report goes to a closed pipe; the job's exit code
/// stands and nothing panics.
#[test]
fn a_closed_stdout_ends_the_report_quietly() {
    let job = JobDir::new(ECHO, "");
    job.inputs(3);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = job
        .command(&[])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_with_output_within(child, RUN_LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(job.output_lines(), expected_lines(3, |_| false));
}
