//! An Azure ML v2 pipeline YAML run as it is (`fleetrun run pipeline.yml`): a many-models
//! parallel job over an MLTable folder, partitioned by two keys, whose script saves one
//! model file per partition into a named output and returns `[]`, with
//! `error_threshold: -1` and a `mini_batch_error_threshold` below the partition count, and
//! a ParallelRunStep setting in its arguments.

use std::fs;
use std::process::Command;

use fleetrun_tests::{RUN_LIMIT, bin, code, command, output_within};

const PIPELINE: &str = r#"
type: pipeline
jobs:
  make_table:
    type: command
    command: python make.py
  train_each:
    type: parallel
    compute: azureml:somewhere
    inputs:
      sales:
        type: mltable
        path: ${{parent.jobs.make_table.outputs.table}}
      target: "Units"
    outputs:
      models:
        type: uri_folder
    partition_keys:
      - Shop
      - Kind
    error_threshold: -1
    mini_batch_error_threshold: 2
    input_data: ${{inputs.sales}}
    max_concurrency_per_instance: 2
    retry_settings:
      max_retries: 1
      timeout: 60
    task:
      type: run_function
      code: ./src
      entry_script: train.py
      environment:
        image: some/image
      program_arguments: >-
        --target ${{inputs.target}}
        --models ${{outputs.models}}
        --resource_monitor_interval 0
"#;

/// Saves each partition's total of the target under `<models>/<Shop>/<Kind>/total.txt`,
/// the path built from the context's values, and returns nothing.
const TRAIN: &str = r#"
import argparse
import os

def init():
    global args
    parser = argparse.ArgumentParser()
    parser.add_argument("--target")
    parser.add_argument("--models")
    args, _ = parser.parse_known_args()

def run(frame, mini_batch_context):
    values = mini_batch_context.partition_key_value
    folder = os.path.join(args.models, *[str(v) for v in values.values()])
    os.makedirs(folder, exist_ok=True)
    kinds = " ".join(type(v).__name__ for v in values.values())
    with open(os.path.join(folder, "total.txt"), "w") as f:
        f.write(f"{int(frame[args.target].sum())} {kinds}\n")
    return []
"#;

#[test]
fn a_many_models_pipeline_yaml_runs_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = |rel: &str| dir.path().join(rel);
    fs::create_dir_all(path("src")).unwrap();
    fs::write(path("src/train.py"), TRAIN).unwrap();
    fs::write(path("pipeline.yml"), PIPELINE).unwrap();
    fs::create_dir_all(path("table")).unwrap();
    fs::write(
        path("table/MLTable"),
        "paths:\n  - file: ./sales.csv\ntransformations:\n  - read_delimited:\n      delimiter: ','\n      header: all_files_same_headers\n",
    )
    .unwrap();
    // 4 shops × 2 kinds = 8 partitions, more than mini_batch_error_threshold.
    let mut csv = String::from("Week,Shop,Kind,Units\n");
    let mut totals = std::collections::BTreeMap::new();
    for week in 0..10 {
        for shop in [1000, 1001, 1002, 1003] {
            for kind in ["tropicana", "dominicks"] {
                let units = week * 3 + shop % 7;
                csv.push_str(&format!("{week},{shop},{kind},{units}\n"));
                *totals.entry((shop, kind)).or_insert(0) += units;
            }
        }
    }
    fs::write(path("table/sales.csv"), csv).unwrap();

    let mut cmd = Command::new(bin("fleetrun"));
    cmd.arg("run")
        .arg(path("pipeline.yml"))
        .args(["--quiet", "--set", "inputs.sales=table"])
        .env_remove("VIRTUAL_ENV");
    let out = output_within(&mut cmd, RUN_LIMIT);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(code(&out), 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("80 items succeeded, 0 failed"), "{stdout}");
    assert!(
        stderr
            .contains("jobs.train_each.compute, jobs.train_each.task.environment have no meaning"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "resource_monitor_interval = 0, from --resource_monitor_interval in arguments"
        ),
        "{stderr}"
    );
    // The monitor's folders are not written; the runners' times (the results') are.
    let perf: Vec<_> = fs::read_dir(path("out/logs/perf"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        perf,
        ["runners.csv"],
        "the argument's setting was taken: {perf:?}"
    );
    for ((shop, kind), total) in totals {
        let model = path(&format!("out/models/{shop}/{kind}/total.txt"));
        let text =
            fs::read_to_string(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
        assert_eq!(text, format!("{total} int str\n"), "{}", model.display());
    }
    // `${{outputs.models}}` is a named output: each runner wrote into a folder of its own,
    // and fleetrun delivered the files, recording them as its own.
    let record = fs::read_to_string(path("out/models/.fleetrun/outputs.json")).unwrap();
    assert!(record.contains("\"1000/dominicks/total.txt\""), "{record}");
}

/// A prediction job whose `append_row_to` output is a file on an Azure datastore.
const TO_AZURE: &str = r#"
type: pipeline
jobs:
  predict:
    type: parallel
    inputs:
      data:
        type: uri_folder
        path: ./data
    outputs:
      scores:
        type: uri_file
        path: azureml://datastores/${{default_datastore}}/paths/${{name}}/scores.csv
        mode: rw_mount
    input_data: ${{inputs.data}}
    mini_batch_size: "1"
    task:
      type: run_function
      code: ./src
      entry_script: score.py
      append_row_to: ${{outputs.scores}}
"#;

/// An `azureml://` output cannot be written here: `run`, `submit` and `convert` refuse it
/// before anything runs, on one line naming the output and the `--set` that gives it, and
/// nothing is written in its stead; given with `--set`, the job writes that file.
#[test]
fn an_azureml_output_is_refused_until_given_with_set() {
    let dir = tempfile::tempdir().unwrap();
    let path = |rel: &str| dir.path().join(rel);
    fs::create_dir_all(path("src")).unwrap();
    fs::write(
        path("src/score.py"),
        "import os\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    )
    .unwrap();
    fs::create_dir_all(path("data")).unwrap();
    fs::write(path("data/a.txt"), "a\n").unwrap();
    fs::write(path("pipeline.yml"), TO_AZURE).unwrap();
    let yml = path("pipeline.yml");
    let expected = format!(
        "error: {}: jobs.predict.outputs.scores.path: azureml://datastores/${{{{default_datastore}}}}/paths/${{{{name}}}}/scores.csv cannot be reached here; give the output's file with --set outputs.scores=PATH (such as out/scores.csv)\n",
        yml.display()
    );
    for verb in ["run", "submit", "convert"] {
        let mut cmd = command("fleetrun");
        cmd.arg(verb).arg(&yml);
        let out = output_within(&mut cmd, RUN_LIMIT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{verb}: {stderr}");
        assert_eq!(stderr, expected, "{verb}");
        assert!(out.stdout.is_empty(), "{verb}");
        assert!(!path("out").exists(), "{verb} wrote nothing in its stead");
    }

    let mut cmd = command("fleetrun");
    cmd.arg("run")
        .arg(&yml)
        .args(["--quiet", "--set", "outputs.scores=results/scores.csv"]);
    let out = output_within(&mut cmd, RUN_LIMIT);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        fs::read_to_string(path("results/scores.csv")).unwrap(),
        "a.txt\n"
    );
}
