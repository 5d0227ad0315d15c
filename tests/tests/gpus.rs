//! GPU assignment end to end (CONTRACT §3), through `FLEETRUN_GPU_COUNT`: what real runner
//! processes find in their environment.

use std::collections::BTreeMap;

use fleetrun_tests::{JobDir, code, expected_lines, output_within};

/// Each process writes down, in `init()`, its `CUDA_VISIBLE_DEVICES` and GPU counts;
/// process000 waits until all four first processes have, then kills itself in its first
/// `run()`.
const SCRIPT: &str = r#"
import os, time
SEEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen")
NAME = os.environ["FLEETRUN_PROCESS_NAME"]

def init():
    os.makedirs(SEEN, exist_ok=True)
    tmp = os.path.join(SEEN, NAME + ".tmp")
    with open(tmp, "w") as f:
        f.write("%s %s %s %s" % (
            os.environ.get("CUDA_VISIBLE_DEVICES", "none"),
            os.environ.get("AZ_BATCHAI_GPU_COUNT_FOUND", "unset"),
            os.environ.get("FLEETRUN_GPU_COUNT", "unset"),
            os.environ.get("FLEETRUN_RUNNERS_PER_GPU", "unset"),
        ))
    os.rename(tmp, os.path.join(SEEN, NAME))

def run(mini_batch):
    if NAME == "process000":
        deadline = time.time() + 60
        while time.time() < deadline:
            if len([n for n in os.listdir(SEEN) if not n.endswith(".tmp")]) >= 4:
                break
            time.sleep(0.02)
        os.kill(os.getpid(), 9)
    time.sleep(0.05)
    return [open(p).read() for p in mini_batch]
"#;

/// 2 GPUs, 4 processes: processes 0 and 1 get indexes 0 and 1 of their own, 2 and 3 share
/// them round-robin (never all GPUs); process 0 dies and the next process started, 4, gets
/// index 0 of its own. Every process has the node's GPU count in both variables, and is told
/// that two runners share each GPU (to take half its memory).
#[test]
fn two_gpus_four_processes_and_process_0_killed() {
    let job = JobDir::new(SCRIPT, "mini_batch_size = 1\nprocess_count_per_node = 4");
    job.inputs(60);
    let mut cmd = job.command(&[]);
    cmd.env("FLEETRUN_GPU_COUNT", "2")
        .env("CUDA_VISIBLE_DEVICES", "0,1");
    let out = output_within(&mut cmd, std::time::Duration::from_secs(240));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(job.output_lines(), expected_lines(60, |_| false));

    let seen: BTreeMap<String, String> = std::fs::read_dir(job.path("seen"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(e.path()).unwrap())
        })
        .collect();
    let first: Vec<(&str, &str)> = [
        "process000",
        "process001",
        "process002",
        "process003",
        "process004",
    ]
    .iter()
    .map(|p| (*p, seen.get(*p).map_or("missing", String::as_str)))
    .collect();
    assert_eq!(
        first,
        [
            ("process000", "0 2 2 2"),
            ("process001", "1 2 2 2"),
            ("process002", "0 2 2 2"),
            ("process003", "1 2 2 2"),
            ("process004", "0 2 2 2"),
        ],
        "{seen:?}"
    );
    let main = job.log("sys/node/0/_main.txt");
    assert!(main.contains("2 GPU(s) (FLEETRUN_GPU_COUNT=2)."), "{main}");
    assert!(
        main.contains("process000 exits with returncode -9."),
        "{main}"
    );
    for (process, gpu) in [
        ("process000", "GPU 0 (its own)"),
        ("process002", "GPU 0 (shared)"),
        ("process003", "GPU 1 (shared)"),
        ("process004", "GPU 0 (its own)"),
    ] {
        let started = main
            .lines()
            .find(|l| l.contains(&format!("{process} started: ")))
            .unwrap_or_else(|| panic!("{process} started: {main}"));
        assert!(started.ends_with(&format!(", {gpu}.")), "{started}");
    }
}

/// Writes down its `CUDA_VISIBLE_DEVICES` in `init()`; its first `run()` waits (at most a
/// minute) until both runners have, so both start; echoes.
const SEEN_DEVICES: &str = r#"
import os, time
SEEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen")
WAITED = False

def init():
    os.makedirs(SEEN, exist_ok=True)
    name = os.environ["FLEETRUN_PROCESS_NAME"]
    tmp = os.path.join(SEEN, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "none"))
    os.rename(tmp, os.path.join(SEEN, name))

def run(mini_batch):
    global WAITED
    deadline = time.time() + 60
    while not WAITED and time.time() < deadline:
        if len([n for n in os.listdir(SEEN) if not n.endswith(".tmp")]) >= 2:
            break
        time.sleep(0.02)
    WAITED = True
    return [open(p).read() for p in mini_batch]
"#;

/// A worker started with `CUDA_VISIBLE_DEVICES=2,3` hands its two runners 2 and 3, never a
/// GPU outside the mask, and counts two GPUs.
#[test]
fn an_inherited_mask_is_what_two_runners_are_handed() {
    let job = JobDir::new(
        SEEN_DEVICES,
        "mini_batch_size = 1\nprocess_count_per_node = 2",
    );
    job.inputs(20);
    let mut cmd = job.command(&[]);
    cmd.env_remove("FLEETRUN_GPU_COUNT")
        .env("CUDA_VISIBLE_DEVICES", "2,3");
    let out = output_within(&mut cmd, std::time::Duration::from_secs(240));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(job.output_lines(), expected_lines(20, |_| false));
    let seen = |process: &str| std::fs::read_to_string(job.path("seen").join(process)).ok();
    let main = job.log("sys/node/0/_main.txt");
    assert_eq!(seen("process000").as_deref(), Some("2"), "{main}");
    assert_eq!(seen("process001").as_deref(), Some("3"), "{main}");
    assert!(
        main.contains("2 GPU(s) (CUDA_VISIBLE_DEVICES=2,3)."),
        "{main}"
    );
}
