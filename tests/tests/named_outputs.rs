//! Named outputs (`[outputs]`, `${{outputs.name}}`) in `fleetrun run`: every file the script
//! writes there reaches the named folder whole, what fleetrun did not write there is kept, and
//! files left in working folders are kept in the logs, with a word.

use fleetrun_tests::{JobDir, code};

/// Writes one file per mini-batch into its named output, in two pieces with a pause between
/// (a copy taken mid-write would be half a file), a file of a name the user already has
/// there, and a scratch file in its working folder.
const WRITES_MODELS: &str = r#"
import os
import sys
import time

models = sys.argv[sys.argv.index("--models") + 1]

def run(mini_batch):
    first = os.path.basename(mini_batch[0])
    with open(os.path.join(models, "model-" + first), "w") as f:
        f.write("head:" + first + ";")
        f.flush()
        time.sleep(0.05)
        f.write("tail:" + ",".join(os.path.basename(p) for p in mini_batch) + "\n")
    with open(os.path.join(models, "taken.txt"), "w") as f:
        f.write("the script's\n")
    with open("scratch-" + first, "w") as f:
        f.write("left behind\n")
    return [os.path.basename(p) for p in mini_batch]
"#;

const SETTINGS: &str = "mini_batch_size = 3\nprocess_count_per_node = 2\n\
     arguments = [\"--models\", \"${{outputs.models}}\"]\n\
     [outputs]\nmodels = \"models\"\n";

fn model_files(job: &JobDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(job.path("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("model-"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_file_written_to_a_named_output_lands_there_whole() {
    let job = JobDir::new(WRITES_MODELS, SETTINGS);
    job.inputs(30);
    std::fs::create_dir_all(job.path("models")).unwrap();
    std::fs::write(job.path("models/keep.txt"), "mine\n").unwrap();
    std::fs::write(job.path("models/taken.txt"), "the user's\n").unwrap();
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);

    // One file per mini-batch, each whole: its head and the names of its three files.
    let expected: Vec<String> = (0..10)
        .map(|b| format!("model-f{:04}.txt", b * 3))
        .collect();
    assert_eq!(model_files(&job), expected);
    for b in 0..10 {
        let first = format!("f{:04}.txt", b * 3);
        let names: Vec<String> = (0..3).map(|i| format!("f{:04}.txt", b * 3 + i)).collect();
        assert_eq!(
            std::fs::read_to_string(job.path(&format!("models/model-{first}"))).unwrap(),
            format!("head:{first};tail:{}\n", names.join(","))
        );
    }
    // What fleetrun did not write is kept as it was; the script's file of that name is in
    // the logs, and the node's log says so.
    assert_eq!(
        std::fs::read_to_string(job.path("models/keep.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(job.path("models/taken.txt")).unwrap(),
        "the user's\n"
    );
    let main = job.log("sys/node/0/_main.txt");
    assert!(
        main.contains("outputs.models: taken.txt from process") && main.contains("not delivered"),
        "{main}"
    );
    let kept_outputs = job.path("out/logs/user/outputs/models/0");
    let kept: Vec<_> = std::fs::read_dir(&kept_outputs)
        .unwrap()
        .map(|e| e.unwrap().path().join("taken.txt"))
        .filter(|p| p.exists())
        .collect();
    assert!(!kept.is_empty(), "the script's taken.txt is kept");
    assert_eq!(std::fs::read_to_string(&kept[0]).unwrap(), "the script's\n");
    // No copy was left half-way.
    let leftovers: Vec<_> = std::fs::read_dir(job.path("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The scratch files left in the working folders are kept in the logs, counted.
    assert!(
        main.contains(
            "10 files the script left in its working folders were kept in logs/user/working_dir/0/"
        ),
        "{main}"
    );
    let mut scratch = Vec::new();
    for process in std::fs::read_dir(job.path("out/logs/user/working_dir/0")).unwrap() {
        for file in std::fs::read_dir(process.unwrap().path()).unwrap() {
            scratch.push(file.unwrap().file_name().to_string_lossy().into_owned());
        }
    }
    scratch.sort();
    let expected: Vec<String> = (0..10)
        .map(|b| format!("scratch-f{:04}.txt", b * 3))
        .collect();
    assert_eq!(scratch, expected);

    // A re-run replaces what fleetrun delivered before, and still not the user's files.
    std::fs::write(job.path("data/g00/f0000.txt"), "changed").unwrap();
    let again = job.run(&[]);
    assert_eq!(code(&again), 0);
    assert_eq!(
        model_files(&job),
        (0..10)
            .map(|b| format!("model-f{:04}.txt", b * 3))
            .collect::<Vec<_>>()
    );
    let main = job.log("sys/node/0/_main.txt");
    assert!(!main.contains("model-f0000.txt from"), "{main}");
    assert_eq!(
        std::fs::read_to_string(job.path("models/taken.txt")).unwrap(),
        "the user's\n"
    );
}

/// Writes `result.txt` into its named output, saying which attempt wrote it; the first
/// attempt (no marker beside the input folder yet) then overruns `run_invocation_timeout`
/// and is killed.
const KILLED_FIRST: &str = r#"
import os
import sys
import time

out = sys.argv[sys.argv.index("--out") + 1]

def run(mini_batch):
    marker = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(mini_batch[0]))), "marker")
    first = not os.path.exists(marker)
    with open(os.path.join(out, "result.txt"), "w") as f:
        f.write("attempt %s pid %d\n" % ("1 (killed)" if first else "2 (succeeded)", os.getpid()))
    if first:
        open(marker, "w").close()
        time.sleep(60)
    return [os.path.basename(p) for p in mini_batch]
"#;

/// A killed attempt's named-output file is never delivered over its successful retry's: the
/// named output holds the retry's file, and the killed runner's is kept in the logs, counted.
#[test]
fn a_killed_attempts_file_never_replaces_its_retrys() {
    let job = JobDir::new(
        KILLED_FIRST,
        "mini_batch_size = 4\nrun_invocation_timeout = 2\nrun_max_try = 3\n\
         process_count_per_node = 1\narguments = [\"--out\", \"${{outputs.o}}\"]\n\
         [outputs]\no = \"named\"\n",
    );
    job.inputs(4);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert!(
        report.contains(",timeout,"),
        "the first attempt was killed:\n{report}"
    );

    let delivered = std::fs::read_to_string(job.path("named/result.txt")).unwrap();
    assert!(
        delivered.starts_with("attempt 2 (succeeded)"),
        "{delivered}"
    );
    let main = job.log("sys/node/0/_main.txt");
    assert!(!main.contains("the last writer of a name wins"), "{main}");
    assert!(
        main.contains(
            "1 named-output files of process000 are not delivered: mini-batch 0's attempt 1"
        ),
        "{main}"
    );
    assert!(
        main.contains(
            "1 named-output files that were not delivered were kept in logs/user/outputs/"
        ),
        "{main}"
    );
    let kept = job.log("user/outputs/o/0/process000/result.txt");
    assert!(kept.starts_with("attempt 1 (killed)"), "{kept}");
}

/// An attempt that raised: what it wrote to the named output is not delivered unless a later
/// mini-batch of the runner writes it again; the rest is kept in the logs.
#[test]
fn an_attempt_that_raised_delivers_nothing_it_wrote() {
    let script = r#"
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]

def run(mini_batch):
    marker = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(mini_batch[0]))), "marker")
    with open(os.path.join(out, "result.txt"), "w") as f:
        f.write("attempt %d\n" % (2 if os.path.exists(marker) else 1))
    if not os.path.exists(marker):
        open(marker, "w").close()
        with open(os.path.join(out, "partial.txt"), "w") as f:
            f.write("half")
        raise RuntimeError("first attempt fails")
    return [os.path.basename(p) for p in mini_batch]
"#;
    let job = JobDir::new(
        script,
        "mini_batch_size = 4\nrun_max_try = 3\nprocess_count_per_node = 1\n\
         arguments = [\"--out\", \"${{outputs.o}}\"]\n[outputs]\no = \"named\"\n",
    );
    job.inputs(4);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(job.path("named/result.txt")).unwrap(),
        "attempt 2\n"
    );
    assert!(!job.path("named/partial.txt").exists(), "never delivered");
    assert_eq!(job.log("user/outputs/o/0/process000/partial.txt"), "half");
}

/// Each attempt counts itself in the job's folder, lists what it finds in its named output,
/// and saves into a fresh `model/` folder there, as `mlflow.save_model` does (it refuses a
/// folder that exists and is not empty); the first two attempts raise after writing.
const SAVES_INTO_A_FRESH_FOLDER: &str = r#"
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]

def run(mini_batch):
    job = os.path.dirname(os.path.dirname(os.path.dirname(mini_batch[0])))
    attempt = len([n for n in os.listdir(job) if n.startswith("attempt-")]) + 1
    open(os.path.join(job, "attempt-%d" % attempt), "w").close()
    found = sorted(
        os.path.relpath(os.path.join(d, n), out)
        for d, dirs, files in os.walk(out)
        for n in dirs + files
    )
    model = os.path.join(out, "model")
    os.makedirs(model)
    if attempt < 3:
        with open(os.path.join(model, "part%d.bin" % attempt), "w") as f:
            f.write("half of attempt %d" % attempt)
        raise RuntimeError("attempt %d fails after writing" % attempt)
    with open(os.path.join(model, "model.bin"), "w") as f:
        f.write("attempt %d found %r" % (attempt, found))
    return [os.path.basename(p) for p in mini_batch]
"#;

/// A retry on the same runner finds its named-output folder without what the failed attempts
/// left there: their files are moved to the logs before it runs (each counted once), and
/// the retry's save into the same path succeeds.
#[test]
fn a_retry_never_finds_what_a_failed_attempt_left() {
    let job = JobDir::new(
        SAVES_INTO_A_FRESH_FOLDER,
        "mini_batch_size = 1\nrun_max_try = 3\nprocess_count_per_node = 1\n\
         arguments = [\"--out\", \"${{outputs.o}}\"]\n[outputs]\no = \"named\"\n",
    );
    job.inputs(1);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", job.log("user/error.txt"));
    assert_eq!(
        std::fs::read_to_string(job.path("named/model/model.bin")).unwrap(),
        "attempt 3 found []"
    );
    for attempt in [1, 2] {
        let part = format!("model/part{attempt}.bin");
        assert!(
            !job.path(&format!("named/{part}")).exists(),
            "never delivered"
        );
        assert_eq!(
            job.log(&format!("user/outputs/o/0/process000/{part}")),
            format!("half of attempt {attempt}")
        );
    }
    // Each failed attempt's files are withheld once: the second attempt's count is its own.
    let main = job.log("sys/node/0/_main.txt");
    for attempt in [1, 2] {
        let line = format!(
            "1 named-output files of process000 are not delivered: mini-batch 0's attempt {attempt},"
        );
        assert!(main.contains(&line), "{line:?} not in:\n{main}");
    }
    assert!(
        main.contains(
            "2 named-output files that were not delivered were kept in logs/user/outputs/"
        ),
        "{main}"
    );
}
