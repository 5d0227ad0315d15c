//! Azure ML v2 YAML read as a job: every key of the parallel job reference mapped onto the
//! job file's keys, what has no meaning named, what cannot be reached given with `--set`.

use std::fs;
use std::path::Path;

use fleetrun_config::{Input, Location, MiniBatchSize, OutputAction, load_aml};

const PIPELINE: &str = r#"
$schema: https://example.invalid/pipelineJob.schema.json
type: pipeline
display_name: many stores
settings:
  default_compute: azureml:cluster
jobs:
  prepare:
    type: command
    command: python prep.py
  train_stores:
    type: parallel
    compute: azureml:cluster
    inputs:
      sales:
        type: mltable
        path: ${{parent.jobs.prepare.outputs.table}}
      target: "Units"
    outputs:
      models:
        type: uri_folder
    partition_keys:
      - Shop
      - Kind
    resources:
      instance_count: 3
    max_concurrency_per_instance: 2
    mini_batch_size: "64kb"
    error_threshold: -1
    mini_batch_error_threshold: 4
    logging_level: DEBUG
    retry_settings:
      max_retries: 2
      timeout: 90
    environment_variables:
      MODE: "fast"
    input_data: ${{inputs.sales}}
    task:
      type: run_function
      code: ./src
      entry_script: train.py
      environment:
        image: some/image
      program_arguments: >-
        --target ${{inputs.target}}
        --models ${{outputs.models}}
        --allowed_failed_percent 40
"#;

fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("src")).unwrap();
    fs::write(
        dir.path().join("src/train.py"),
        "def run(b, c):\n    return []\n",
    )
    .unwrap();
    fs::create_dir_all(dir.path().join("table")).unwrap();
    fs::write(
        dir.path().join("table/MLTable"),
        "paths:\n  - file: ./rows.csv\ntransformations:\n  - read_delimited:\n      delimiter: ','\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("table/rows.csv"),
        "Shop,Kind,Units\n1,a,3\n",
    )
    .unwrap();
    fs::write(dir.path().join("pipeline.yml"), PIPELINE).unwrap();
    dir
}

fn sets(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_pipelines_parallel_job_maps_onto_the_job_file() {
    let dir = folder();
    let yml = dir.path().join("pipeline.yml");
    let (spec, converted) = load_aml(
        &yml,
        None,
        &sets(&["inputs.sales=table", "run_invocation_timeout=100"]),
    )
    .unwrap();
    assert_eq!(spec.name, "train-stores");
    assert_eq!(
        spec.source_directory,
        Some(Location::Local(dir.path().join("src")))
    );
    let Input::Tabular(tabular) = &spec.input else {
        panic!("an mltable input is tabular: {:?}", spec.input)
    };
    assert_eq!(
        tabular.location,
        Location::Local(dir.path().join("table")),
        "the MLTable folder, read as its MLTable file says when the job is submitted"
    );
    assert_eq!(spec.mini_batch_size, MiniBatchSize::Bytes(64 * 1024));
    assert_eq!(spec.node_count, 3);
    assert_eq!(spec.process_count_per_node, Some(2));
    assert_eq!(spec.error_threshold, -1);
    assert_eq!(spec.allowed_failed_count, Some(4));
    assert_eq!(spec.run_max_try, 3, "two retries are three attempts");
    assert_eq!(spec.run_invocation_timeout, 100, "--set wins");
    assert_eq!(
        spec.partition_keys.as_deref(),
        Some(&["Shop".to_owned(), "Kind".to_owned()][..])
    );
    assert_eq!(spec.environment_variables["MODE"], "fast");
    assert_eq!(spec.output_action, OutputAction::SummaryOnly);
    assert_eq!(spec.output, Location::Local(dir.path().join("out")));
    // `${{outputs.models}}` is a named output: each runner gets a folder of its own there,
    // whose files reach `out/models`.
    assert_eq!(
        spec.arguments,
        [
            "--target",
            "Units",
            "--models",
            "${{outputs.models}}",
            "--allowed_failed_percent",
            "40"
        ]
    );
    assert_eq!(
        spec.outputs["models"],
        Location::Local(dir.path().join("out/models"))
    );
    assert_eq!(
        spec.allowed_failed_percent, 40.0,
        "a ParallelRunStep argument"
    );
    assert_eq!(
        converted.ignored,
        [
            "jobs.train_stores.compute",
            "jobs.train_stores.task.environment"
        ]
    );
    let warning = converted.warning().unwrap();
    assert!(warning.contains("--set environment="), "{warning}");
}

#[test]
fn what_the_yaml_cannot_reach_is_asked_for_by_name() {
    let dir = folder();
    let yml = dir.path().join("pipeline.yml");
    let err = load_aml(&yml, None, &[]).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: jobs.train_stores.inputs.sales.path: ${{{{parent.jobs.prepare.outputs.table}}}} cannot be reached here; give the input with --set inputs.sales=PATH",
            yml.display()
        )
    );
    let err = load_aml(&yml, Some("prepare"), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("no parallel job named \"prepare\" (parallel jobs: train_stores)"),
        "{err}"
    );
    let err = load_aml(
        &yml,
        None,
        &sets(&["inputs.sales=table", "outputs.nothing=x"]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.ends_with("--set outputs.nothing=…: the job has no outputs.nothing"),
        "{err}"
    );
}

#[test]
fn convert_prints_toml_naming_each_yaml_key() {
    let dir = folder();
    let text = fs::read_to_string(dir.path().join("pipeline.yml")).unwrap();
    let (converted, _) = fleetrun_config::aml::convert(
        &text,
        "pipeline.yml",
        dir.path(),
        None,
        &sets(&["inputs.sales=table"]),
    )
    .unwrap();
    let toml = converted.to_toml("pipeline.yml");
    for line in [
        "name = \"train-stores\"  # jobs.train_stores (the job's key)\n",
        "run_max_try = 3  # jobs.train_stores.retry_settings.max_retries\n",
        "allowed_failed_count = 4  # jobs.train_stores.mini_batch_error_threshold\n",
        "node_count = 3  # jobs.train_stores.resources.instance_count\n",
        "\n[input]\ntabular = \"table\"  # jobs.train_stores.inputs.sales.path\n",
        "\n[outputs]\nmodels = \"out/models\"  # jobs.train_stores.outputs.models\n",
        "\"${{outputs.models}}\"",
        "# allowed_failed_percent = 40, from --allowed_failed_percent in arguments (jobs.train_stores.task.program_arguments)\n",
    ] {
        assert!(toml.contains(line), "{line:?} not in:\n{toml}");
    }
    // The TOML is a job file that loads as the YAML does.
    fs::write(dir.path().join("job.toml"), &toml).unwrap();
    let from_toml = fleetrun_config::load(&dir.path().join("job.toml"), &[]).unwrap();
    let (from_yaml, _) = load_aml(
        &dir.path().join("pipeline.yml"),
        None,
        &sets(&["inputs.sales=table"]),
    )
    .unwrap();
    assert_eq!(from_toml, from_yaml);
}

#[test]
fn an_append_row_to_output_file_is_the_output_file() {
    let dir = folder();
    let text = PIPELINE.replace(
        "      program_arguments:",
        "      append_row_to: ${{outputs.models}}/scores.csv\n      program_arguments:",
    );
    fs::write(dir.path().join("p.yaml"), text).unwrap();
    let (spec, _) = load_aml(
        &dir.path().join("p.yaml"),
        Some("train_stores"),
        &sets(&["inputs.sales=table", "outputs.models=results"]),
    )
    .unwrap();
    assert_eq!(spec.output_action, OutputAction::AppendRow);
    assert_eq!(spec.output, Location::Local(dir.path().join("results")));
    assert_eq!(spec.append_row_file_name, "scores.csv");
    // `${{outputs.models}}` is the output folder, as on Azure ML.
    assert!(Path::new(&spec.arguments[3]).ends_with("results"));
}

#[test]
fn a_named_output_goes_where_set_outputs_says() {
    let dir = folder();
    let yml = dir.path().join("pipeline.yml");
    let (spec, _) = load_aml(
        &yml,
        None,
        &sets(&["inputs.sales=table", "outputs.models=s3://bucket/models/"]),
    )
    .unwrap();
    assert_eq!(
        spec.outputs["models"],
        Location::S3 {
            bucket: "bucket".into(),
            prefix: "models/".into()
        }
    );
    assert_eq!(spec.arguments[3], "${{outputs.models}}");
}

/// An input other than `input_data` that the arguments name (a model, reference files) is
/// a side input: staged whole on every node, its local path in the argument, as Azure
/// downloads or mounts it (a path relative to the YAML would not be found from the
/// runner's working folder).
#[test]
fn an_input_the_arguments_name_is_a_side_input() {
    let dir = folder();
    fs::create_dir_all(dir.path().join("model")).unwrap();
    fs::write(dir.path().join("model/MLmodel"), "flavors: {}\n").unwrap();
    let yml = dir.path().join("pipeline.yml");
    let with_model = PIPELINE
        .replace(
            "      target: \"Units\"\n",
            "      target: \"Units\"\n      score_model:\n        type: uri_folder\n        path: ./model\n        mode: download\n",
        )
        .replace(
            "--target ${{inputs.target}}",
            "--model ${{inputs.score_model}} --again ${{inputs.score_model}} --target ${{inputs.target}}",
        );
    fs::write(&yml, with_model).unwrap();
    let (spec, _) = load_aml(&yml, None, &sets(&["inputs.sales=table"])).unwrap();
    assert_eq!(
        spec.side_inputs.get("score_model"),
        Some(&Location::Local(dir.path().join("model")))
    );
    let model = "${{side_inputs.score_model}}";
    assert_eq!(
        spec.arguments[..5],
        ["--model", model, "--again", model, "--target"]
    );
}

/// An output at an `azureml://` path (as Azure's samples give one) cannot be written here:
/// it is refused, naming the output and the `--set` that gives it, never replaced by a folder
/// under `out/` (which would also lose the file's name); given, it is where `--set` says.
#[test]
fn an_azureml_output_is_refused_until_given_with_set() {
    let dir = folder();
    let yml = dir.path().join("p.yml");
    let uri = "azureml://datastores/${{default_datastore}}/paths/${{name}}/scores.csv";
    let text = PIPELINE
        .replace(
            "      models:\n        type: uri_folder\n",
            &format!(
                "      models:\n        type: uri_folder\n      scores:\n        type: uri_file\n        path: {uri}\n        mode: rw_mount\n"
            ),
        )
        .replace(
            "      program_arguments:",
            "      append_row_to: ${{outputs.scores}}\n      program_arguments:",
        );
    fs::write(&yml, text).unwrap();
    let err = load_aml(&yml, None, &sets(&["inputs.sales=table"]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "{}: jobs.train_stores.outputs.scores.path: {uri} cannot be reached here; give the output's file with --set outputs.scores=PATH (such as out/scores.csv)",
            yml.display()
        )
    );
    // `fleetrun convert` refuses it alike.
    let converted = fleetrun_config::aml::convert(
        &fs::read_to_string(&yml).unwrap(),
        "p.yml",
        dir.path(),
        None,
        &sets(&["inputs.sales=table"]),
    );
    assert!(converted.is_err(), "{converted:?}");

    let (spec, _) = load_aml(
        &yml,
        None,
        &sets(&["inputs.sales=table", "outputs.scores=results/scores.csv"]),
    )
    .unwrap();
    assert_eq!(spec.output_action, OutputAction::AppendRow);
    assert_eq!(spec.output, Location::Local(dir.path().join("results")));
    assert_eq!(spec.append_row_file_name, "scores.csv");
}

/// A named output's own path: used when fleetrun can reach it, refused when it cannot, read
/// from the pipeline when the job's output is the pipeline's (`${{parent.outputs.x}}`).
#[test]
fn a_named_outputs_own_path_is_used_or_asked_for() {
    let dir = folder();
    let yml = dir.path().join("p.yml");
    let with_path = |path: &str| {
        PIPELINE.replace(
            "      models:\n        type: uri_folder\n",
            &format!("      models:\n        type: uri_folder\n        path: {path}\n"),
        )
    };
    fs::write(&yml, with_path("./trained")).unwrap();
    let (spec, _) = load_aml(&yml, None, &sets(&["inputs.sales=table"])).unwrap();
    assert_eq!(
        spec.outputs["models"],
        Location::Local(dir.path().join("trained"))
    );

    fs::write(&yml, with_path("azureml://datastores/blobs/paths/models")).unwrap();
    let err = load_aml(&yml, None, &sets(&["inputs.sales=table"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with(
            "jobs.train_stores.outputs.models.path: azureml://datastores/blobs/paths/models cannot be reached here; give the output with --set outputs.models=PATH"
        ),
        "{err}"
    );

    let bound = PIPELINE
        .replace(
            "      models:\n        type: uri_folder\n",
            "      models: ${{parent.outputs.trained}}\n",
        )
        .replace(
            "display_name: many stores\n",
            "display_name: many stores\noutputs:\n  trained:\n    type: uri_folder\n    path: wasbs://models@account.blob.core.windows.net/trained\n",
        );
    fs::write(&yml, bound).unwrap();
    let err = load_aml(&yml, None, &sets(&["inputs.sales=table"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with(
            "wasbs://models@account.blob.core.windows.net/trained cannot be reached here; give the output with --set outputs.models=PATH"
        ),
        "{err}"
    );
    let (spec, _) = load_aml(
        &yml,
        None,
        &sets(&["inputs.sales=table", "outputs.models=s3://bucket/trained/"]),
    )
    .unwrap();
    assert_eq!(spec.arguments[3], "${{outputs.models}}");
}

/// `convert` takes the job file's `--set` keys as `run` does: written into the TOML, each
/// comment naming the `--set`; an unknown key is refused as `run` refuses it.
#[test]
fn convert_writes_the_job_files_set_keys_into_the_toml() {
    let dir = folder();
    let text = fs::read_to_string(dir.path().join("pipeline.yml")).unwrap();
    let overrides = sets(&["inputs.sales=table", "environment=.venv", "run_max_try=5"]);
    let (mut converted, rest) =
        fleetrun_config::aml::convert(&text, "pipeline.yml", dir.path(), None, &overrides).unwrap();
    converted.set(&rest).unwrap();
    let toml = converted.to_toml("pipeline.yml");
    for line in [
        "environment = \".venv\"  # --set environment=.venv\n",
        "run_max_try = 5  # --set run_max_try=5\n",
    ] {
        assert!(toml.contains(line), "{line:?} not in:\n{toml}");
    }
    assert_eq!(toml.matches("run_max_try = ").count(), 1, "{toml}");
    assert!(converted.set(&sets(&["no_such_key=1"])).is_err());
}
