//! The script's world on `fleetrun run`: a ParallelRunStep entry script (its EntryScript,
//! argparse on a side input, `Model.get_model_path`, relative paths, its logs) runs unchanged
//! from any folder, and a partitioned file input reaches `run(mini_batch, context)`.

use std::collections::BTreeSet;
use std::fs;

use fleetrun_tests::{JobDir, RUN_LIMIT, code, output_within};

/// Written for ParallelRunStep: nothing in it knows fleetrun.
const PRS_SCRIPT: &str = r#"
import argparse
import logging
import os
import warnings

from azureml_user.parallel_run import EntryScript
from azureml.core import Model


def init():
    global labels, vocab, weights, notes, writable
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels", required=True)
    parser.add_argument("--vocab", required=True)
    args, _unknown = parser.parse_known_args()
    labels = open(args.labels).read().split()
    writable = bool(os.stat(args.labels).st_mode & 0o222)
    vocab = open(args.vocab).read().strip()
    weights = open(os.path.join(Model.get_model_path("digits"), "weights.txt")).read().strip()
    notes = open("notes/extra.txt").read().strip()
    EntryScript().logger.info("loaded %d labels", len(labels))
    logging.info("root logger says hello")
    warnings.warn("a deprecated thing")


def run(mini_batch):
    es = EntryScript()
    with open(os.path.join(es.output_dir, es.agent_name + ".summary.txt"), "a") as f:
        f.write("%d\n" % len(mini_batch))
    logging.getLogger(__name__).info("scored %d", len(mini_batch))
    return ["%s,%s,%s,%s,%s,%s" % (os.path.basename(p), labels[0], vocab, weights, notes, writable)
            for p in mini_batch]
"#;

#[test]
fn a_parallel_run_step_script_runs_unchanged_from_another_folder() {
    let job = JobDir::new("", "");
    job.inputs(12);
    for (rel, text) in [
        ("code/score.py", PRS_SCRIPT),
        ("code/vocab.txt", "v1\n"),
        ("code/notes/extra.txt", "noted\n"),
        ("ref/labels.txt", "cat\ndog\n"),
        ("models/digits/weights.txt", "w42\n"),
    ] {
        let path = job.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    fs::write(
        job.path("job.toml"),
        r#"
name = "prs"
source_directory = "code"
entry_script = "score.py"
output_action = "append_row"
mini_batch_size = 5
process_count_per_node = 1
arguments = ["--labels", "${{side_inputs.labels}}", "--vocab", "vocab.txt", "--extra", "x"]

[input]
files = "data"

[output]
path = "out"

[side_inputs]
labels = "ref/labels.txt"

[models]
digits = "models/digits"
"#,
    )
    .unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut cmd = job.command(&[]);
    cmd.current_dir(elsewhere.path());
    let out = output_within(&mut cmd, RUN_LIMIT);
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(code(&out), 0, "{}", job.log("user/error.txt"));

    let lines: BTreeSet<String> = fs::read_to_string(job.path("out/parallel_run_step.txt"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: BTreeSet<String> = (0..12)
        .map(|i| format!("f{i:04}.txt,cat,v1,w42,noted,False"))
        .collect();
    assert_eq!(lines, expected);

    // CONTRACT.md §7: the logger, the root logger and warnings, output_dir.
    let entry_log = job.log("user/entry_script_log/0/process000.log.txt");
    assert!(entry_log.contains("|loaded 2 labels"), "{entry_log}");
    let stdout = job.log("user/stdout/0/process000.stdout.txt");
    assert!(
        stdout.contains("|INFO|") && stdout.contains("|root|root logger says hello"),
        "{stdout}"
    );
    assert!(
        stdout.contains("UserWarning: a deprecated thing"),
        "{stdout}"
    );
    assert!(stdout.contains("|score|scored 5"), "{stdout}");
    assert_eq!(
        fs::read_to_string(job.path("out/process000.summary.txt")).unwrap(),
        "5\n5\n2\n"
    );
    // The user's files are as they were, the working folders and the cache gone with the run.
    assert_eq!(
        fs::read_to_string(job.path("ref/labels.txt")).unwrap(),
        "cat\ndog\n"
    );
    assert!(fs::read_dir(elsewhere.path()).unwrap().next().is_none());
}

#[test]
fn partitioned_files_reach_a_two_parameter_run_with_their_values() {
    let script = r#"
import os

def run(mini_batch, mini_batch_context):
    values = mini_batch_context.partition_key_value
    return ["%s,%s,%s,%d,%s" % (os.path.relpath(p, mini_batch_context.dataset),
                                values["user"], values["genres"],
                                mini_batch_context.minibatch_index, len(mini_batch))
            for p in mini_batch]
"#;
    let job = JobDir::new(
        script,
        "partition_keys = [\"user\", \"genres\"]\npartition_format = \"{user}/{genres}/{name}.txt\"\nmini_batch_size = 1",
    );
    let files = [
        "ann/jazz/a.txt",
        "ann/jazz/b.txt",
        "ann/rock/c.txt",
        "bob/jazz/d.txt",
        "bob/jazz/e.txt",
        "bob/jazz/f.txt",
    ];
    for rel in files {
        let path = job.path(&format!("data/{rel}"));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, rel).unwrap();
    }
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", job.log("user/error.txt"));
    let lines = job.output_lines();
    // partition_keys override mini_batch_size: one mini-batch per (user, genres).
    assert_eq!(
        lines,
        [
            "ann/jazz/a.txt,ann,jazz,0,2",
            "ann/jazz/b.txt,ann,jazz,0,2",
            "ann/rock/c.txt,ann,rock,1,1",
            "bob/jazz/d.txt,bob,jazz,2,3",
            "bob/jazz/e.txt,bob,jazz,2,3",
            "bob/jazz/f.txt,bob,jazz,2,3",
        ]
    );
}

#[test]
fn a_file_off_the_partition_format_fails_the_job_naming_it() {
    let job = JobDir::new(
        "def run(b, c):\n    return b\n",
        "partition_keys = [\"user\"]\npartition_format = \"{user}/{name}.txt\"",
    );
    fs::create_dir_all(job.path("data/ann")).unwrap();
    for rel in ["ann/a.txt", "README.md"] {
        fs::write(job.path(&format!("data/{rel}")), "x").unwrap();
    }
    let out = job.run(&[]);
    assert_eq!(code(&out), 42);
    let result = job.log("job_result.txt");
    assert!(
        result.contains("\"README.md\" does not match \"{user}/{name}.txt\""),
        "{result}"
    );
}
