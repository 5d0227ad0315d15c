//! `fleetrun run` end to end: real runner processes embedding Python, the embedded queue and
//! ledger, a local folder.

use std::time::Duration;

use fleetrun_tests::{
    JobDir, KillOnDrop, POISONED, RUN_LIMIT, assert_failed_alone, code, command, exit_within,
    expected_lines, output_within, pyenv_python, wait_for,
};

/// Returns each file's content; prints and logs so the log layout can be checked.
const ECHO: &str = r#"
from azureml_user.parallel_run import EntryScript

def init():
    EntryScript().logger.info("init in %s", EntryScript().agent_name)

def run(mini_batch):
    print("batch of", len(mini_batch))
    return [open(p).read() for p in mini_batch]
"#;

#[test]
fn completes_with_every_line_once_in_input_order() {
    let job = JobDir::new(ECHO, "mini_batch_size = 7\nprocess_count_per_node = 2");
    job.inputs(250);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines(), expected_lines(250, |_| false));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("completed") && stdout.contains("250 items succeeded"),
        "{stdout}"
    );
    assert!(job.log("job_result.txt").contains("Result: Completed"));
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert_eq!(
        report.lines().count(),
        1 + 36,
        "a header and one row per mini-batch"
    );
    // The script's prints and its EntryScript logger land in the per-process files: one
    // print per mini-batch, and an init line from each process that ran one (the other may
    // still have been in init when the job ended).
    let stdout = process_logs(&job, "stdout", "stdout.txt");
    let prints = |text: &str| text.matches("batch of").count();
    assert_eq!(
        stdout.iter().map(|(_, text)| prints(text)).sum::<usize>(),
        36
    );
    let entry_logs = process_logs(&job, "entry_script_log", "log.txt");
    for (process, _) in stdout.iter().filter(|(_, text)| prints(text) > 0) {
        let log = entry_logs.iter().find(|(p, _)| p == process);
        assert!(
            log.is_some_and(|(_, text)| text.contains(&format!("init in {process}"))),
            "{process}'s init line: {entry_logs:?}"
        );
    }
    assert!(
        !job.path("out/_parts").exists(),
        "parts are removed once joined"
    );
}

/// The per-process files `out/logs/user/<folder>/0/<process>.<suffix>`: process name and text.
fn process_logs(job: &JobDir, folder: &str, suffix: &str) -> Vec<(String, String)> {
    std::fs::read_dir(job.path(&format!("out/logs/user/{folder}/0")))
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let process = name.strip_suffix(&format!(".{suffix}")).unwrap().to_owned();
            (process, std::fs::read_to_string(&path).unwrap())
        })
        .collect()
}

#[test]
fn same_input_gives_the_same_file_byte_for_byte() {
    let job = JobDir::new(ECHO, "mini_batch_size = 3");
    job.inputs(100);
    assert_eq!(code(&job.run(&["--set", "process_count_per_node=1"])), 0);
    let first = std::fs::read(job.path("out/parallel_run_step.txt")).unwrap();
    assert_eq!(code(&job.run(&["--set", "process_count_per_node=3"])), 0);
    let second = std::fs::read(job.path("out/parallel_run_step.txt")).unwrap();
    assert_eq!(first, second);
}

/// `node_count` is the fleet's: `fleetrun run` says it runs the job as one node, and runs it.
#[test]
fn node_count_above_one_is_noted_by_run() {
    let job = JobDir::new(ECHO, "node_count = 2");
    job.inputs(3);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("node_count = 2: `fleetrun run` runs the job on this machine alone"),
        "{stderr}"
    );
    assert_eq!(job.output_lines(), expected_lines(3, |_| false));
}

/// An input that lists no file is most often a wrong path: refused in one line naming it,
/// before anything is written; asked for, it completes with an empty output file.
#[test]
fn empty_input_is_refused_unless_asked_for() {
    let job = JobDir::new(ECHO, "");
    let out = job.run(&[]);
    assert_eq!(code(&out), 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let data = job.path("data");
    assert!(
        stderr.contains(&format!("input.files: {} lists no file", data.display())),
        "{stderr}"
    );
    assert!(!job.path("out").exists());

    let out = job.run(&["--allow-empty-input"]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        std::fs::read(job.path("out/parallel_run_step.txt")).unwrap(),
        b""
    );
}

#[test]
fn summary_only_writes_no_output_file_and_counts() {
    let job = JobDir::new(ECHO, "");
    job.inputs(30);
    let out = job.run(&["--set", "output_action=\"summary_only\""]);
    assert_eq!(code(&out), 0);
    assert!(!job.path("out/parallel_run_step.txt").exists());
    assert!(String::from_utf8_lossy(&out.stdout).contains("30 items succeeded"));
}

/// A script raising on some files: with one file per mini-batch, exactly the other files'
/// lines come out, and each bad file counts one failed item after its attempts.
#[test]
fn raising_files_fail_alone_and_are_counted() {
    let script = r#"
def run(mini_batch):
    out = []
    for p in mini_batch:
        text = open(p).read()
        if text.endswith("3"):
            raise ValueError("cannot score " + text)
        out.append(text)
    return out
"#;
    let job = JobDir::new(
        script,
        "mini_batch_size = 1\nrun_max_try = 2\nerror_threshold = -1",
    );
    job.inputs(40);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    let bad = |i: usize| i % 10 == 3;
    assert_eq!(job.output_lines(), expected_lines(40, bad));
    assert!(String::from_utf8_lossy(&out.stdout).contains("36 items succeeded, 4 failed"));
    let failed = job.log("failed_items.csv");
    assert_eq!(failed.lines().count(), 1 + 4, "{failed}");
    assert!(failed.contains("g00/f0013.txt") && failed.contains("ValueError: cannot score f0013"));
    let tracebacks = job.log("user/error.txt");
    assert_eq!(
        tracebacks.lines().count(),
        8,
        "two attempts for each of four files"
    );
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert_eq!(report.lines().filter(|l| l.contains(",raised,")).count(), 8);
}

/// Raises for the mini-batch holding any of three poison files, and records every call.
const POISON: &str = r#"
import os, sys

POISON = {"f0017", "f0333", "f0998"}

def run(mini_batch):
    names = [open(p).read() for p in mini_batch]
    with open(os.environ["CALLS"], "a") as calls:
        calls.write(f"{len(names)}\n")
    bad = POISON.intersection(names)
    if bad:
        raise ValueError("poison " + min(bad))
    return names
"#;

/// Three poison files among a thousand, in mini-batches of ten, cost only themselves: the
/// output holds the other 997 lines in input order, `failed_items.csv` names exactly the
/// three with their own errors, and the extra `run()` calls stay within `2⌈log₂ 10⌉` for
/// each poisoned mini-batch.
#[test]
fn three_poison_files_among_a_thousand_cost_only_themselves() {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let settings = format!(
        "mini_batch_size = 10\nrun_max_try = 2\nerror_threshold = -1\nenvironment_variables = {{ CALLS = \"{}\" }}",
        calls.path().display()
    );
    let job = JobDir::new(POISON, &settings);
    job.inputs(1000);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        job.output_lines(),
        expected_lines(1000, |i| POISONED.contains(&i))
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("997 items succeeded, 3 failed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_failed_alone(&job.log("failed_items.csv"), &POISONED);
    let calls = std::fs::read_to_string(calls.path()).unwrap();
    // 100 mini-batches, 3 of them tried twice whole, then at most 8 isolation runs each.
    let count = calls.lines().count();
    assert!(
        (100 + 3 + 3 * 2..=100 + 3 + 3 * 8).contains(&count),
        "{count} calls"
    );
}

/// Raises a PyTorch-style CUDA out-of-memory error (a `RuntimeError` subclass named as
/// torch's) whenever a mini-batch holds more than three files, or holds the file `$ALONE`;
/// records the size of every call.
const OUT_OF_MEMORY: &str = r#"
import os

class OutOfMemoryError(RuntimeError):
    pass

# What `torch.cuda.OutOfMemoryError` reads as, without torch.
OutOfMemoryError.__module__ = "torch.cuda"

ALONE = os.environ.get("ALONE")

def run(mini_batch):
    names = [open(p).read() for p in mini_batch]
    with open(os.environ["CALLS"], "a") as calls:
        calls.write(f"{len(names)}\n")
    if len(names) > 3 or ALONE in names:
        raise OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)"
        )
    return names
"#;

/// A job whose `run()` runs out of GPU memory above three files, in mini-batches of ten.
fn out_of_memory_job(calls: &std::path::Path, alone: Option<&str>) -> JobDir {
    let alone = alone.map_or_else(String::new, |a| format!(", ALONE = \"{a}\""));
    let settings = format!(
        "mini_batch_size = 10\nprocess_count_per_node = 1\nenvironment_variables = {{ CALLS = \"{}\"{alone} }}",
        calls.display()
    );
    JobDir::new(OUT_OF_MEMORY, &settings)
}

/// Issue #31's out-of-memory case: 200 files, `mini_batch_size = 10`, a `run()` that runs out
/// of GPU memory above 3 items. The job completes with every line once and nothing failed;
/// no attempt is spent (so no mini-batch tries its full size `run_max_try` times), and the
/// node remembers the size that fits: `run()` is handed at most 300 items in all (1,000
/// before), the report shows the size settling at 3, and the runs out of memory are
/// counted apart from the script's errors.
#[test]
fn out_of_gpu_memory_splits_mini_batches_to_the_size_that_fits() {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let job = out_of_memory_job(calls.path(), None);
    job.inputs(200);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(job.output_lines(), expected_lines(200, |_| false));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("200 items succeeded, 0 failed"), "{stdout}");
    let sizes: Vec<usize> = std::fs::read_to_string(calls.path())
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let handed: usize = sizes.iter().sum();
    eprintln!("run() was handed {handed} items in {} calls", sizes.len());
    assert!(handed <= 300, "run() was handed {handed} items: {sizes:?}");
    assert_full_size_only_before_the_first_piece(&sizes);
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    let rows = |result: &str| {
        let column = format!(",{result},");
        report.lines().filter(|l| l.contains(&column)).count()
    };
    assert_eq!(rows("raised"), 0, "{report}");
    let ran_out = rows("out_of_gpu_memory");
    assert_eq!(
        ran_out,
        sizes.iter().filter(|s| **s > 3).count(),
        "{report}"
    );
    // Every mini-batch ran in pieces (one row each), the last ones at the size that fits.
    let split: Vec<&str> = report.lines().filter(|l| l.contains(",split,")).collect();
    assert_eq!(split.len(), 20, "{report}");
    assert!(
        split[10..]
            .iter()
            .all(|row| row.contains("in pieces of at most 3 items")),
        "{report}"
    );
    let result = job.log("job_result.txt");
    assert!(
        result.contains(&format!(
            "Out of GPU memory: {ran_out} run() calls (not script errors); 20 mini-batches ran in pieces, the last in pieces of at most 3 items"
        )),
        "{result}"
    );
    assert!(job.log("job_error.txt").starts_with("Script errors: 0\n"));
    assert!(
        !job.path("out/logs/failed_items.csv").exists(),
        "no item failed"
    );
}

/// An item that runs out of GPU memory alone fails as such, and is the only one charged.
#[test]
fn an_item_that_runs_out_of_gpu_memory_alone_is_the_only_failure() {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let job = out_of_memory_job(calls.path(), Some("f0042"));
    job.inputs(60);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(job.output_lines(), expected_lines(60, |i| i == 42));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("59 items succeeded, 1 failed"), "{stdout}");
    let failed = job.log("failed_items.csv");
    let listed: Vec<&str> = failed.lines().skip(1).collect();
    assert_eq!(listed.len(), 1, "{failed}");
    assert!(
        listed[0].contains("/f0042.txt,4,1,out of GPU memory alone: torch.cuda.OutOfMemoryError: CUDA out of memory."),
        "{failed}"
    );
    // The item's mini-batch spent no attempt: none was tried again whole.
    let sizes: Vec<usize> = std::fs::read_to_string(calls.path())
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_full_size_only_before_the_first_piece(&sizes);
}

/// The full size of ten runs only before the first smaller call: those already sent to
/// the runner when the first one ran out; after it the node remembers the size that fits.
fn assert_full_size_only_before_the_first_piece(sizes: &[usize]) {
    let first_piece = sizes.iter().position(|s| *s < 10).unwrap();
    assert!(
        !sizes[first_piece..].contains(&10),
        "the full size ran after the node learned a smaller one: {sizes:?}"
    );
}

/// `isolate_failures = false` keeps ParallelRunStep's behaviour: the poisoned mini-batches
/// fail whole.
#[test]
fn without_isolation_a_poison_file_fails_its_whole_mini_batch() {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let settings = format!(
        "mini_batch_size = 10\nerror_threshold = -1\nisolate_failures = false\nenvironment_variables = {{ CALLS = \"{}\" }}",
        calls.path().display()
    );
    let job = JobDir::new(POISON, &settings);
    job.inputs(100);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        job.output_lines(),
        expected_lines(100, |i| (10..20).contains(&i))
    );
    assert_eq!(job.log("failed_items.csv").lines().count(), 1 + 10);
}

/// CONTRACT §1: with an `error_threshold` to check, a short return's gap is failed items,
/// and the mini-batch's items are all in `failed_items.csv`.
#[test]
fn fewer_returned_elements_are_failed_items() {
    let script = "def run(mini_batch):\n    return [open(p).read() for p in mini_batch][1:]\n";
    let job = JobDir::new(script, "mini_batch_size = 5\nerror_threshold = 10");
    job.inputs(20);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines().len(), 16);
    assert!(String::from_utf8_lossy(&out.stdout).contains("16 items succeeded, 4 failed"));
    let failed = job.log("failed_items.csv");
    assert_eq!(failed.lines().count(), 1 + 20, "{failed}");
    assert!(
        failed.contains("run() returned 4 elements for 5 items; 1 of them failed"),
        "{failed}"
    );
}

/// CONTRACT §1: `error_threshold = -1` does not check returns: a `run()` returning `[]` (a
/// many-models script that saved its models) completes with nothing failed, whatever
/// `allowed_failed_count`.
#[test]
fn empty_returns_under_error_threshold_minus_one_complete_with_nothing_failed() {
    let script = "def run(mini_batch):\n    return []\n";
    let job = JobDir::new(
        script,
        "mini_batch_size = 2\nerror_threshold = -1\nallowed_failed_count = 5",
    );
    job.inputs(20);
    let out = job.run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{stdout}");
    assert!(stdout.contains("20 items succeeded, 0 failed"), "{stdout}");
    assert!(!job.path("out/logs/failed_items.csv").exists());
}

#[test]
fn threshold_aborts_the_job_with_exit_42_and_says_why() {
    let script = "def run(mini_batch):\n    raise RuntimeError('model exploded')\n";
    let job = JobDir::new(
        script,
        "mini_batch_size = 2\nrun_max_try = 1\nerror_threshold = 3\nprocess_count_per_node = 2",
    );
    job.inputs(400);
    let out = job.run(&[]);
    assert_eq!(code(&out), 42);
    let result = job.log("job_result.txt");
    assert!(result.contains("Result: Failed"), "{result}");
    assert!(result.contains("error_threshold exceeded"), "{result}");
    // It stopped promptly: far from all 200 mini-batches ran.
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert!(
        report.lines().count() < 50,
        "{} mini-batches ran after the threshold",
        report.lines().count()
    );
    assert!(!job.path("out/parallel_run_step.txt").exists());
}

#[test]
fn minus_one_threshold_completes_despite_failures() {
    let script = "def run(mini_batch):\n    raise RuntimeError('always')\n";
    let job = JobDir::new(script, "run_max_try = 1\nerror_threshold = -1");
    job.inputs(25);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert!(job.output_lines().is_empty());
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 items succeeded, 25 failed"));
}

/// A run() that hangs is killed at run_invocation_timeout and its mini-batch retried.
#[test]
fn hanging_run_is_killed_at_the_timeout_and_retried() {
    let script = r#"
import os, time
def run(mini_batch):
    marker = os.path.join(os.path.dirname(__file__), "hung-once")
    if any(p.endswith("f0005.txt") for p in mini_batch) and not os.path.exists(marker):
        open(marker, "w").close()
        while True:
            time.sleep(0.05)
    return [open(p).read() for p in mini_batch]
"#;
    let job = JobDir::new(
        script,
        "mini_batch_size = 2\nrun_invocation_timeout = 2\nrun_max_try = 2",
    );
    job.inputs(12);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines(), expected_lines(12, |_| false));
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert!(
        report.lines().any(|l| l.starts_with("2,1,timeout,")),
        "{report}"
    );
    assert!(
        report.lines().any(|l| l.starts_with("2,2,succeeded,")),
        "{report}"
    );
    assert!(
        job.log("sys/node/0/_main.txt")
            .contains("run_invocation_timeout")
    );
}

/// A runner holds a short run's reply back while it has its next mini-batch in hand, but
/// never behind a run that takes long. The first mini-batch runs while the next two reach
/// the runner together; the second's reply is held, and the third waits, inside run(),
/// until the agent has logged the second completed (it fails after 20 s otherwise).
#[test]
fn a_reply_is_not_held_behind_a_long_run() {
    let script = r#"
import os, time
LOG = os.path.join(os.path.dirname(__file__), "out", "logs", "sys", "node", "0")
def completed(index):
    for name in os.listdir(LOG) if os.path.isdir(LOG) else []:
        if name.startswith("process"):
            with open(os.path.join(LOG, name)) as f:
                if f"mini-batch {index} completed" in f.read():
                    return True
    return False
def run(mini_batch):
    if any(p.endswith("f0000.txt") for p in mini_batch):
        time.sleep(0.5)
    if any(p.endswith("f0002.txt") for p in mini_batch):
        deadline = time.monotonic() + 20
        while not completed(1):
            if time.monotonic() > deadline:
                raise RuntimeError("mini-batch 1 was never recorded while this one ran")
            time.sleep(0.01)
    return [open(p).read() for p in mini_batch]
"#;
    let job = JobDir::new(
        script,
        "mini_batch_size = 1\nprocess_count_per_node = 1\nrun_max_try = 1\nerror_threshold = 0",
    );
    job.inputs(3);
    let out = job.run(&["--processes", "1"]);
    assert_eq!(code(&out), 0, "{}", job.log("sys/node/0/_main.txt"));
    assert_eq!(job.output_lines(), expected_lines(3, |_| false));
}

/// A runner killed with SIGKILL in the middle of a mini-batch: the attempt fails, a new
/// process takes over, and every line is in the output exactly once.
#[test]
fn runner_killed_mid_mini_batch_loses_and_duplicates_nothing() {
    let script = r#"
import os, time
HERE = os.path.dirname(__file__)
def run(mini_batch):
    rows = [open(p).read() for p in mini_batch]
    if any(p.endswith("f0042.txt") for p in mini_batch) and not os.path.exists(os.path.join(HERE, "killed")):
        # Rows are computed; wait here to be killed from outside.
        with open(os.path.join(HERE, "victim.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(HERE, "victim.tmp"), os.path.join(HERE, "victim"))
        while True:
            time.sleep(0.05)
    return rows
"#;
    let job = JobDir::new(
        script,
        "mini_batch_size = 5\nprocess_count_per_node = 2\nrun_max_try = 3",
    );
    job.inputs(100);
    let mut child = job.command(&[]).spawn().unwrap();
    let victim = job.path("victim");
    wait_for(
        "the runner to reach the mini-batch",
        Duration::from_secs(60),
        || victim.exists(),
    );
    let pid: i32 = std::fs::read_to_string(&victim)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::write(job.path("killed"), "").unwrap();
    // SAFETY: kill(2) on a pid we just read; a real SIGKILL to a real runner.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = exit_within(&mut child, RUN_LIMIT);
    assert_eq!(status.code(), Some(0));
    assert_eq!(job.output_lines(), expected_lines(100, |_| false));
    assert!(
        job.log("sys/node/0/_main.txt")
            .contains("exits with returncode -9.")
    );
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert!(
        report.lines().any(|l| l.starts_with("8,1,died,")),
        "{report}"
    );
}

/// A script that sends itself SIGSEGV dies of it, as under `python3`: the attempt fails as a
/// dead process the first time, and the other mini-batches go on.
#[test]
fn sigsegv_in_run_fails_the_attempt_as_a_dead_process_the_first_time() {
    let script = r#"
import os, signal
def run(mini_batch):
    if any(p.endswith("f0002.txt") for p in mini_batch):
        os.kill(os.getpid(), signal.SIGSEGV)
    return [open(p).read() for p in mini_batch]
"#;
    let job = JobDir::new(
        script,
        "mini_batch_size = 1\nrun_max_try = 1\nerror_threshold = -1\nprocess_count_per_node = 1",
    );
    job.inputs(5);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines(), expected_lines(5, |i| i == 2));
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert!(
        report.lines().any(|l| l.starts_with("2,1,died,")),
        "{report}"
    );
    let failed = job.log("failed_items.csv");
    assert!(
        failed.contains("f0002.txt") && failed.contains("returncode -11"),
        "{failed}"
    );
}

/// A runner that dies while it holds replies back is charged the mini-batch it died in,
/// not the ones whose replies it held: those ran, and run again with their attempt not
/// spent. `init()` takes long, so the slot holds all five mini-batches when it sends the
/// first; mini-batch 0 takes long, so the ones after it reach the runner together; 0's or
/// 1's reply is held while 2 runs, and 2 kills the runner. Which replies the runner reads
/// together is the kernel's timing: a run in which none was held proves nothing, so the job
/// runs again, a bounded number of times, until one was.
#[test]
fn a_runner_dying_with_replies_held_is_charged_only_what_it_died_in() {
    let script = r#"
import os, signal, time
def init():
    time.sleep(0.3)
def run(mini_batch):
    if any(p.endswith("f0000.txt") for p in mini_batch):
        time.sleep(0.3)
    if any(p.endswith("f0002.txt") for p in mini_batch):
        os.kill(os.getpid(), signal.SIGSEGV)
    return [open(p).read() for p in mini_batch]
"#;
    for _ in 0..5 {
        let job = JobDir::new(
            script,
            "mini_batch_size = 1\nrun_max_try = 1\nerror_threshold = -1\nprocess_count_per_node = 1",
        );
        job.inputs(5);
        let out = job.run(&["--processes", "1"]);
        assert_eq!(code(&out), 0, "{}", job.log("sys/node/0/_main.txt"));
        assert_eq!(job.output_lines(), expected_lines(5, |i| i == 2));
        let report = job.log("sys/job_report/processed_mini-batches.csv");
        let rows = |text: &str| report.lines().filter(|l| l.contains(text)).count();
        assert_eq!(rows(",died,"), 1, "{report}");
        assert_eq!(rows("2,1,died,"), 1, "{report}");
        let lost: Vec<&str> = report.lines().filter(|l| l.contains(",lost,")).collect();
        assert!(lost.len() <= 1, "{report}");
        if let Some(lost) = lost.first() {
            // It ran again, with the same attempt number, and succeeded.
            let again = lost.replace(",lost,", ",succeeded,");
            let again = &again[..again.find(",succeeded,").unwrap() + 11];
            assert!(
                lost.starts_with("0,1,") || lost.starts_with("1,1,"),
                "{report}"
            );
            assert_eq!(rows(again), 1, "{report}");
            return;
        }
    }
    panic!("in 5 runs, the runner never held a reply when it died");
}

#[test]
fn sys_exit_in_run_fails_the_attempt_not_the_runner() {
    let script = r#"
import sys
def run(mini_batch):
    if any(p.endswith("f0001.txt") for p in mini_batch):
        sys.exit(3)
    return [open(p).read() for p in mini_batch]
"#;
    let job = JobDir::new(
        script,
        "mini_batch_size = 1\nrun_max_try = 2\nerror_threshold = 1\nprocess_count_per_node = 1",
    );
    job.inputs(5);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines(), expected_lines(5, |i| i == 1));
    // One process served it all: SystemExit did not take the runner down.
    assert_eq!(
        std::fs::read_dir(job.path("out/logs/user/stdout/0"))
            .unwrap()
            .count(),
        1
    );
}

/// The node starts no process once 3 × process_count_per_node = 6 init failures are in
/// (CONTRACT §5 rule 1), and the job fails: 6 inits fail, or 7 when the other process was
/// already starting again as the sixth failure came.
#[test]
fn init_that_always_fails_fails_the_job() {
    let script =
        "def init():\n    raise ImportError('no model file')\n\ndef run(mb):\n    return mb\n";
    let job = JobDir::new(script, "process_count_per_node = 2");
    job.inputs(10);
    let out = job.run(&[]);
    assert_eq!(code(&out), 42);
    let result = job.log("job_result.txt");
    assert!(result.contains("ImportError: no model file"), "{result}");
    let errors = job.log("user/error.txt");
    let inits = errors.lines().filter(|l| l.contains(" init: ")).count();
    assert!((6..=7).contains(&inits), "{inits} init failures:\n{errors}");
}

/// Returns, per file, the Python's `major.minor` and the file's content.
const PYTHON_VERSION: &str = r#"
import sys

def run(mini_batch):
    return ["%d.%d %s" % (sys.version_info[0], sys.version_info[1], open(p).read()) for p in mini_batch]
"#;

/// The job's `environment` picks the Python, whatever its minor version: pyenv's 3.10, 3.11
/// and 3.12 interpreters, and a virtualenv made from 3.12 with `python -m venv`.
#[test]
fn scripts_run_under_the_python_of_their_environment_3_10_3_11_and_3_12() {
    let venv = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(pyenv_python("3.12"))
        .args(["-m", "venv", "--without-pip"])
        .arg(venv.path())
        .status()
        .unwrap();
    assert!(status.success());
    let environments = [
        ("3.10", pyenv_python("3.10")),
        ("3.11", pyenv_python("3.11")),
        ("3.12", pyenv_python("3.12")),
        ("3.12", venv.path().to_owned()),
    ];
    for (minor, environment) in environments {
        let job = JobDir::new(
            PYTHON_VERSION,
            &format!(
                "mini_batch_size = 2\nprocess_count_per_node = 2\nenvironment = \"{}\"",
                environment.display()
            ),
        );
        job.inputs(5);
        assert_eq!(code(&job.run(&[])), 0, "{}", environment.display());
        let expected: Vec<String> = (0..5).map(|i| format!("{minor} f{i:04}")).collect();
        assert_eq!(job.output_lines(), expected, "{}", environment.display());
        let main = job.log("sys/node/0/_main.txt");
        assert!(
            main.contains(&format!("The job's runners run Python {minor}.")),
            "{main}"
        );
    }
}

/// A Python fleetrun cannot run is refused once, before any runner starts, naming the
/// versions it can: no init failure is counted or retried, and the job fails at once.
#[test]
fn an_unserved_python_is_refused_once_before_any_runner_starts() {
    let python = pyenv_python("3.8");
    let job = JobDir::new(
        PYTHON_VERSION,
        &format!(
            "process_count_per_node = 2\nenvironment = \"{}\"",
            python.display()
        ),
    );
    job.inputs(5);
    let started = std::time::Instant::now();
    let out = job.run(&[]);
    assert_eq!(code(&out), 42);
    assert!(started.elapsed() < Duration::from_secs(30));
    let refusal = "is Python 3.8.";
    let served = "which fleetrun cannot run; it runs CPython 3.9, 3.10, 3.11, 3.12, 3.13";
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(refusal) && stdout.contains(served),
        "{stdout}"
    );
    let result = job.log("job_result.txt");
    assert!(
        result.contains(refusal) && result.contains(served),
        "{result}"
    );
    let main = job.log("sys/node/0/_main.txt");
    assert_eq!(main.matches("Giving up on job").count(), 1, "{main}");
    assert!(
        !main.contains("started") && !main.contains("failed to start"),
        "no runner starts: {main}"
    );
    assert!(!job.path("out/logs/user/error.txt").exists());
}

#[test]
fn arguments_and_environment_variables_reach_the_script() {
    let script = r#"
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--tag")
args, _ = parser.parse_known_args()
def run(mini_batch):
    return [args.tag + ":" + os.environ["COLOUR"] + ":" + open(p).read() for p in mini_batch]
"#;
    let job = JobDir::new(
        script,
        "arguments = [\"--tag\", \"t1\"]\nenvironment_variables = { COLOUR = \"blue\" }",
    );
    job.inputs(3);
    assert_eq!(code(&job.run(&[])), 0);
    assert_eq!(
        job.output_lines(),
        ["t1:blue:f0000", "t1:blue:f0001", "t1:blue:f0002"]
    );
}

/// `fleetrun run`'s runners get its environment less fleetrun's credentials, unless the job
/// names one in `pass_environment`; the job's own `environment_variables` are set.
#[test]
fn runners_get_no_credential_the_job_does_not_name() {
    let script = r#"
import os
def run(mini_batch):
    names = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FLEETRUN_REDIS_URL", "COLOUR"]
    return [":".join(os.environ.get(n, "-") for n in names)]
"#;
    let job = JobDir::new(
        script,
        "pass_environment = [\"AWS_ACCESS_KEY_ID\"]\nenvironment_variables = { COLOUR = \"blue\" }",
    );
    job.inputs(1);
    let mut cmd = job.command(&[]);
    cmd.env("AWS_ACCESS_KEY_ID", "key-id")
        .env("AWS_SECRET_ACCESS_KEY", "secret-key")
        .env("FLEETRUN_REDIS_URL", "redis://:secret@127.0.0.1:1/");
    let out = output_within(&mut cmd, RUN_LIMIT);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(job.output_lines(), ["key-id:-:-:blue"]);
}

/// Without a terminal, progress comes as plain lines on stderr (the first one at once), and
/// `--quiet` turns it off.
#[test]
fn progress_is_plain_lines_when_not_on_a_terminal() {
    let script = "import time\ndef run(mini_batch):\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n";
    let job = JobDir::new(script, "mini_batch_size = 2\nprocess_count_per_node = 1");
    job.inputs(6);
    let mut cmd = fleetrun_tests::command("fleetrun");
    cmd.arg("run").arg(job.path("job.toml"));
    let out = output_within(&mut cmd, RUN_LIMIT);
    assert_eq!(code(&out), 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("[e2e] "))
        .unwrap_or_else(|| panic!("no progress line in {stderr:?}"));
    assert!(
        line.contains("items") && line.contains("mini-batches"),
        "{line}"
    );
    let quiet = job.run(&[]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("[e2e] "));
}

/// Notes each `run()` call (the run's tag from the environment and the mini-batch's first
/// file) and takes a little time.
const NOTES_CALLS: &str = r#"
import os, time

def run(mini_batch):
    with open(os.environ["CALLS"], "a") as calls:
        calls.write(os.environ["RUN_TAG"] + " " + os.path.basename(mini_batch[0]) + "\n")
    time.sleep(0.05)
    return [open(p).read() for p in mini_batch]
"#;

/// The `run()` calls of the run tagged `tag`.
fn calls_of(calls: &std::path::Path, tag: &str) -> usize {
    std::fs::read_to_string(calls)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("{tag} ")))
        .count()
}

/// A job over 1,000 files in mini-batches of 10 whose `run()` notes its calls in `calls`.
fn resumable_job(calls: &std::path::Path) -> JobDir {
    let settings = format!(
        "mini_batch_size = 10\nprocess_count_per_node = 2\nenvironment_variables = {{ CALLS = \"{}\" }}",
        calls.display()
    );
    let job = JobDir::new(NOTES_CALLS, &settings);
    job.inputs(1000);
    job
}

/// `fleetrun run` killed with SIGKILL at about 40%, then run again with `--resume`:
/// the job completes with every line once, in input order, and the script of the second run
/// sees only what the first had not recorded (at most the runs then in flight again).
#[test]
fn a_run_killed_at_40_percent_resumes_where_it_stood() {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let job = resumable_job(calls.path());
    let mut first = KillOnDrop(job.command(&[]).env("RUN_TAG", "first").spawn().unwrap());
    wait_for(
        "40% of the mini-batches to run",
        Duration::from_secs(120),
        || calls_of(calls.path(), "first") >= 40,
    );
    first.0.kill().unwrap(); // SIGKILL
    first.0.wait().unwrap();
    let before = calls_of(calls.path(), "first");
    assert!(before < 90, "killed well before the end: {before} calls");

    let out = output_within(
        job.command(&["--resume"]).env("RUN_TAG", "second"),
        RUN_LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(job.output_lines(), expected_lines(1000, |_| false));
    let again = calls_of(calls.path(), "second");
    // Two runners: each had at most one mini-batch running and one returned but not yet
    // recorded when the run was killed.
    assert!(
        again <= 100 - before + 4,
        "the resumed run ran {again} mini-batches; {before} had started before"
    );
    eprintln!("first run: {before} calls; resumed: {again}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("1000 items succeeded"));
}

/// The mini-batches a killed run's journal recorded, with their parts' references.
fn journaled_parts(job: &JobDir) -> std::collections::BTreeMap<u64, String> {
    let journal = std::fs::read_to_string(job.path("out/.fleetrun/journal")).unwrap();
    journal
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|entry| Some((entry["i"].as_u64()?, entry["p"].as_str()?.to_owned())))
        .collect()
}

/// A killed run whose kept rows were edited since: `--resume` checks each kept mini-batch's
/// part against the digest recorded with it, runs again exactly the one whose rows changed,
/// says which, and the output holds what the script returns.
#[test]
fn a_resume_runs_again_exactly_the_kept_mini_batch_whose_rows_changed() {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let job = resumable_job(calls.path());
    let mut first = KillOnDrop(job.command(&[]).env("RUN_TAG", "first").spawn().unwrap());
    wait_for(
        "30% of the mini-batches to run",
        Duration::from_secs(120),
        || calls_of(calls.path(), "first") >= 30,
    );
    first.0.kill().unwrap(); // SIGKILL
    first.0.wait().unwrap();
    let kept = journaled_parts(&job);
    assert!(kept.len() >= 10, "{kept:?}");
    // Edit one kept mini-batch's rows in its segment, in place: same length, one byte.
    let (&edited, reference) = kept.iter().nth(5).unwrap();
    let (segment, span) = reference.split_once('@').unwrap();
    let offset: u64 = span.split('+').next().unwrap().parse().unwrap();
    let segments = std::fs::read_dir(job.path("out/_parts"))
        .unwrap()
        .map(|e| e.unwrap().path().join(segment))
        .find(|p| p.exists())
        .expect("the segment of the edited part");
    let mut bytes = std::fs::read(&segments).unwrap();
    bytes[offset as usize] = b'X';
    std::fs::write(&segments, bytes).unwrap();

    let out = output_within(
        job.command(&["--resume"]).env("RUN_TAG", "second"),
        RUN_LIMIT,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert_eq!(job.output_lines(), expected_lines(1000, |_| false));
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("kept rows changed or went missing")
                && l.ends_with(&format!(" mini_batches={edited}"))),
        "{stderr}"
    );
    // Of the mini-batches the first run kept, the second ran the edited one alone.
    let calls = std::fs::read_to_string(calls.path()).unwrap();
    let again: Vec<u64> = calls
        .lines()
        .filter_map(|l| l.strip_prefix("second f"))
        .map(|file| file.trim_end_matches(".txt").parse::<u64>().unwrap() / 10)
        .filter(|index| kept.contains_key(index))
        .collect();
    assert_eq!(again, [edited], "{calls}");
}

/// A run interrupted by SIGINT resumes too; a resume is refused, naming what changed, when
/// the input changed since, and goes ahead with `--force`; a run without `--resume` starts
/// from the start.
#[test]
fn a_resume_is_refused_when_the_input_changed_unless_forced() {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let job = resumable_job(calls.path());
    let mut first = KillOnDrop(job.command(&[]).env("RUN_TAG", "first").spawn().unwrap());
    wait_for(
        "a few mini-batches to run",
        Duration::from_secs(120),
        || calls_of(calls.path(), "first") >= 10,
    );
    unsafe { libc::kill(first.0.id() as i32, libc::SIGINT) };
    assert_eq!(first.exit_within(RUN_LIMIT).code(), Some(130));

    // A file before the others: every mini-batch the first run cut holds others now.
    std::fs::write(job.path("data/a00-new.txt"), "new").unwrap();
    let refused = output_within(
        job.command(&["--resume"]).env("RUN_TAG", "refused"),
        RUN_LIMIT,
    );
    assert_eq!(code(&refused), 2);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("the input listing changed since it ran"),
        "{said}"
    );
    assert_eq!(calls_of(calls.path(), "refused"), 0);

    let forced = output_within(
        job.command(&["--resume", "--force"])
            .env("RUN_TAG", "forced"),
        RUN_LIMIT,
    );
    assert_eq!(
        code(&forced),
        0,
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    // Nothing the first run recorded is cut the same now: all of it runs again, once.
    let mut expected = vec!["new".to_owned()];
    expected.extend(expected_lines(1000, |_| false));
    assert_eq!(job.output_lines(), expected);
    assert_eq!(calls_of(calls.path(), "forced"), 101);

    let fresh = output_within(
        job.command(&["--resume"]).env("RUN_TAG", "fresh"),
        RUN_LIMIT,
    );
    assert_eq!(code(&fresh), 0);
    assert_eq!(
        calls_of(calls.path(), "fresh"),
        101,
        "a completed run leaves nothing to resume"
    );
}

/// A memory cgroup of the test's own with a limit (v2 where the host delegates the memory
/// controller, else v1), removed when dropped.
struct MemoryCgroup {
    dir: std::path::PathBuf,
}

impl MemoryCgroup {
    fn new(limit: u64) -> MemoryCgroup {
        let name = format!("fleetrun-test-{}", std::process::id());
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"));
        let (dir, limit_file) = if v2 {
            (format!("/sys/fs/cgroup/{name}"), "memory.max")
        } else {
            (
                format!("/sys/fs/cgroup/memory/{name}"),
                "memory.limit_in_bytes",
            )
        };
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot make the cgroup {}: {e}", dir.display()));
        std::fs::write(dir.join(limit_file), limit.to_string()).unwrap();
        MemoryCgroup { dir }
    }

    /// `cmd`, started inside the cgroup.
    fn wrap(&self, cmd: &std::process::Command) -> std::process::Command {
        let mut inside = std::process::Command::new("sh");
        inside
            .arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(self.dir.join("cgroup.procs"))
            .arg(cmd.get_program())
            .args(cmd.get_args());
        if let Some(dir) = cmd.get_current_dir() {
            inside.current_dir(dir);
        }
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => inside.env(key, value),
                None => inside.env_remove(key),
            };
        }
        inside
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once every process in it has ended.
        let _ = fleetrun_tests::poll(Duration::from_secs(10), || {
            std::fs::remove_dir(&self.dir).is_ok()
        });
    }
}

/// A runner killed by the kernel's OOM killer is named as such: the item it ran fails with
/// that cause and the cgroup's limit, its attempt's result is `out_of_memory`, and the others
/// complete.
#[test]
fn a_runner_killed_for_memory_is_named_so() {
    let job = JobDir::new(
        "import os\n\ndef run(mini_batch):\n    if any('f0001' in p for p in mini_batch):\n        hog = ' ' * (1 << 31)\n    return [os.path.basename(p) for p in mini_batch]\n",
        "mini_batch_size = 1\nrun_max_try = 1\nerror_threshold = -1\nprocess_count_per_node = 1",
    );
    job.inputs(4);
    let cgroup = MemoryCgroup::new(256 << 20);
    let out = output_within(&mut cgroup.wrap(&job.command(&[])), RUN_LIMIT);
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines(), ["f0000.txt", "f0002.txt", "f0003.txt"]);
    let failed = job.log("failed_items.csv");
    assert!(
        failed.contains("f0001.txt")
            && failed
                .contains("killed by the kernel's out-of-memory killer (memory limit 256 MiB)"),
        "{failed}"
    );
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert!(report.contains("out_of_memory"), "{report}");
    assert!(!report.contains(",died,"), "{report}");
}

/// `fleetrun run --deadline`: a run still going at its deadline ends Expired (exit 44), its
/// output holding every finished mini-batch's rows once, in input order, the others listed
/// in `unfinished_mini_batches.csv`, and `fleetrun verify` accepts it.
#[test]
fn a_run_past_its_deadline_expires_with_what_it_finished() {
    let script = "import time\n\ndef run(mini_batch):\n    time.sleep(1)\n    return [open(p).read() for p in mini_batch]\n";
    let job = JobDir::new(script, "mini_batch_size = 2\nprocess_count_per_node = 1");
    job.inputs(30);
    let out = output_within(&mut job.command(&["--deadline", "5s"]), RUN_LIMIT);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        44,
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unfinished: std::collections::BTreeSet<usize> =
        std::fs::read_to_string(job.path("out/logs/unfinished_mini_batches.csv"))
            .unwrap()
            .lines()
            .skip(1)
            .map(|index| index.parse().unwrap())
            .collect();
    // 15 mini-batches of a second each on one runner: the last is left.
    assert!(unfinished.contains(&14), "{unfinished:?}");
    let finished: Vec<String> = expected_lines(30, |i| unfinished.contains(&(i / 2)));
    assert_eq!(job.output_lines(), finished);
    let verified = output_within(
        command("fleetrun").arg("verify").arg(job.path("out")),
        RUN_LIMIT,
    );
    let said = String::from_utf8_lossy(&verified.stdout);
    assert_eq!(code(&verified), 0, "{said}");
    assert!(said.contains("unfinished"), "{said}");
}

/// Sleeps known times: 1 s in `init()`, 0.2 s in each `run()`.
const TIMED: &str = r#"
import time

def init():
    time.sleep(1.0)

def run(mini_batch):
    time.sleep(0.2)
    return [open(p).read() for p in mini_batch]
"#;

/// A job whose script sleeps known times in `init()` and `run()` reports where its runner's
/// time went: `job_result.txt`'s line and `logs/perf/runners.csv`, within 10% of the
/// sleeps (init also holds the process's and the interpreter's start).
#[test]
fn the_runners_time_splits_into_init_run_input_wait_and_idle() {
    let job = JobDir::new(TIMED, "mini_batch_size = 1\nprocess_count_per_node = 1");
    job.inputs(20);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    let result = job.log("job_result.txt");
    let line = result
        .lines()
        .find(|l| l.starts_with("Runners busy "))
        .unwrap_or_else(|| panic!("no time line in:\n{result}"));
    assert!(line.contains("(1 runner, "), "{line}");
    let csv = job.log("perf/runners.csv");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "node,runner,gpu,init_s,run_s,input_wait_s,idle_s,total_s,gpu_util_mean_pct,gpu_mem_peak_mib"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 1, "one runner: {csv}");
    assert_eq!(rows[0][8..], ["", ""], "no GPU, nothing read of one: {csv}");
    assert!(!result.contains("GPU use"), "{result}");
    let seconds = |i: usize| rows[0][i].parse::<f64>().unwrap();
    let (init, run, wait, idle, total) =
        (seconds(3), seconds(4), seconds(5), seconds(6), seconds(7));
    let within = |got: f64, want: f64| (got - want).abs() <= 0.1 * want;
    assert!(within(run, 4.0), "run() 20 × 0.2 s: {csv}");
    assert!(
        (1.0..=1.6).contains(&init),
        "init() 1 s and the start: {csv}"
    );
    assert!(wait < 0.1 * total && idle < 0.2 * total, "{csv}");
    // The line's shares are of the same seconds.
    let share = |name: &str| -> f64 {
        let at = line
            .find(name)
            .unwrap_or_else(|| panic!("{name} in {line}"))
            + name.len();
        line[at..]
            .split('%')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert!(
        (share("compute ") - 100.0 * run / total).abs() <= 1.0,
        "{line} {csv}"
    );
    assert!(
        (share("init ") - 100.0 * init / total).abs() <= 1.0,
        "{line} {csv}"
    );
}
