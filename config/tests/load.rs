//! The job file as users write it: every field, the defaults, path resolution,
//! overrides, and the one-line message of every rule.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use fleetrun_config::{
    ConfigError, Input, JobFile, JobSpec, Location, LoggingLevel, MiniBatchSize, OutputAction,
    Tabular, TabularFormat, load, load_json, load_str,
};
use tempfile::TempDir;

/// A job folder holding `score.py`, `scripts/score.py` and a `.venv` folder.
struct JobDir {
    dir: TempDir,
}

impl JobDir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("score.py"), "def run(b): return b\n").unwrap();
        fs::create_dir_all(dir.path().join("scripts")).unwrap();
        fs::write(
            dir.path().join("scripts/score.py"),
            "def run(b): return b\n",
        )
        .unwrap();
        // Side inputs and models on this machine must be there.
        fs::create_dir_all(dir.path().join("data")).unwrap();
        fs::write(dir.path().join("data/labels.txt"), "cat\n").unwrap();
        fs::create_dir_all(dir.path().join("models/digits")).unwrap();
        Self { dir }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn load(&self, text: &str) -> Result<JobSpec, ConfigError> {
        self.load_with(text, &[])
    }

    fn load_with(&self, text: &str, overrides: &[&str]) -> Result<JobSpec, ConfigError> {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        load_str(text, "job.toml", self.dir.path(), &overrides)
    }

    /// The one-line message of a job file that must fail.
    fn error(&self, text: &str) -> String {
        self.error_with(text, &[])
    }

    fn error_with(&self, text: &str, overrides: &[&str]) -> String {
        let message = match self.load_with(text, overrides) {
            Ok(spec) => panic!("expected an error, loaded {spec:#?}"),
            Err(err) => err.to_string(),
        };
        assert!(!message.contains('\n'), "not one line: {message}");
        message
    }
}

/// The minimal job file, with top-level `key = value` lines replaced or added (an empty
/// value removes the key).
fn job(set: &[(&str, &str)]) -> String {
    let mut top = vec![
        ("name", r#""digits""#),
        ("entry_script", r#""score.py""#),
        ("output_action", r#""append_row""#),
    ];
    for &(key, value) in set {
        match top.iter_mut().find(|(known, _)| *known == key) {
            Some(line) => line.1 = value,
            None => top.push((key, value)),
        }
    }
    let mut text: String = top
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| format!("{key} = {value}\n"))
        .collect();
    text.push_str("\n[input]\nfiles = \"data/images\"\n\n[output]\npath = \"out\"\n");
    text
}

fn minimal() -> String {
    job(&[])
}

/// Checks `key = value → message`: the minimal job file with that line must fail with
/// `job.toml: message`.
fn assert_rejects(dir: &JobDir, case: &str) {
    let (line, expected) = case.split_once(" → ").expect("key = value → message");
    let (key, value) = line.split_once(" = ").expect("key = value");
    assert_eq!(
        dir.error(&job(&[(key, value)])),
        format!("job.toml: {expected}"),
        "{line}"
    );
}

#[test]
fn a_full_job_file_sets_every_field() {
    let dir = JobDir::new();
    let text = r#"
name = "digits-2"
entry_script = "score.py"
source_directory = "scripts"
arguments = ["--labels", "data/labels.txt", "--n", 5, "--lr", 0.5, "--verbose", true]
output_action = "summary_only"
append_row_file_name = "results.csv"
mini_batch_size = 4
error_threshold = 7
allowed_failed_count = 3
allowed_failed_percent = 12.5
run_max_try = 5
isolate_failures = false
run_invocation_timeout = 120
deadline = "24h"
node_count = 2
priority = 3
process_count_per_node = 8
logging_level = "debug"
resource_monitor_interval = 0
environment_variables = { OMP_NUM_THREADS = 1, MODE = "fast", DRY = false }
pass_environment = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
append_row_dataframe_header = true
first_task_creation_timeout = 30
progress_update_timeout = 1000
environment = ".venv"
profile = true
notify_url = "https://hooks.example.com/fleetrun?team=vision"
side_inputs = ["data/labels.txt", "s3://models/digits/v1"]

[input]
files = "s3://my-bucket/images/2024"

[output]
path = "./results/../out"
"#;
    let spec = dir.load(text).unwrap();
    let expected = JobSpec {
        name: "digits-2".into(),
        entry_script: Location::Local(dir.path("scripts/score.py")),
        source_directory: Some(Location::Local(dir.path("scripts"))),
        arguments: [
            "--labels",
            "data/labels.txt",
            "--n",
            "5",
            "--lr",
            "0.5",
            "--verbose",
            "true",
        ]
        .map(String::from)
        .to_vec(),
        input: Input::Files(Location::S3 {
            bucket: "my-bucket".into(),
            prefix: "images/2024".into(),
        }),
        side_inputs: BTreeMap::from([
            (
                "labels.txt".into(),
                Location::Local(dir.path("data/labels.txt")),
            ),
            (
                "v1".into(),
                Location::S3 {
                    bucket: "models".into(),
                    prefix: "digits/v1".into(),
                },
            ),
        ]),
        models: BTreeMap::new(),
        outputs: BTreeMap::new(),
        partition_format: None,
        output: Location::Local(dir.path("out")),
        output_action: OutputAction::SummaryOnly,
        append_row_file_name: "results.csv".into(),
        mini_batch_size: MiniBatchSize::Files(4),
        error_threshold: 7,
        allowed_failed_count: Some(3),
        allowed_failed_percent: 12.5,
        run_max_try: 5,
        isolate_failures: false,
        run_invocation_timeout: 120,
        node_count: 2,
        priority: 3,
        process_count_per_node: Some(8),
        logging_level: LoggingLevel::Debug,
        resource_monitor_interval: 0,
        partition_keys: None,
        environment_variables: BTreeMap::from([
            ("DRY".into(), "false".into()),
            ("MODE".into(), "fast".into()),
            ("OMP_NUM_THREADS".into(), "1".into()),
        ]),
        pass_environment: vec!["AWS_ACCESS_KEY_ID".into(), "AWS_SECRET_ACCESS_KEY".into()],
        append_row_dataframe_header: true,
        append_row_separator: b' ',
        first_task_creation_timeout: 30,
        progress_update_timeout: 1000,
        environment: Some(dir.path(".venv")),
        profile: true,
        notify_url: Some("https://hooks.example.com/fleetrun?team=vision".into()),
        deadline: Some(24 * 60 * 60),
        task_overhead_timeout: 600,
        settings_from_arguments: vec![],
        mltable: None,
    };
    assert_eq!(spec, expected);
}

#[test]
fn a_minimal_job_file_gets_the_defaults() {
    let dir = JobDir::new();
    let spec = dir.load(&minimal()).unwrap();
    let expected = JobSpec {
        name: "digits".into(),
        entry_script: Location::Local(dir.path("score.py")),
        source_directory: None,
        arguments: vec![],
        input: Input::Files(Location::Local(dir.path("data/images"))),
        side_inputs: BTreeMap::new(),
        models: BTreeMap::new(),
        outputs: BTreeMap::new(),
        partition_format: None,
        output: Location::Local(dir.path("out")),
        output_action: OutputAction::AppendRow,
        append_row_file_name: "parallel_run_step.txt".into(),
        mini_batch_size: MiniBatchSize::Files(10),
        error_threshold: -1,
        allowed_failed_count: None,
        allowed_failed_percent: 100.0,
        run_max_try: 3,
        isolate_failures: true,
        run_invocation_timeout: 60,
        node_count: 1,
        priority: 0,
        process_count_per_node: None,
        logging_level: LoggingLevel::Info,
        resource_monitor_interval: 600,
        partition_keys: None,
        environment_variables: BTreeMap::new(),
        pass_environment: vec![],
        append_row_dataframe_header: false,
        append_row_separator: b' ',
        first_task_creation_timeout: 600,
        progress_update_timeout: 300,
        environment: None,
        profile: false,
        notify_url: None,
        deadline: None,
        task_overhead_timeout: 600,
        settings_from_arguments: vec![],
        mltable: None,
    };
    assert_eq!(spec, expected);
}

#[test]
fn load_reads_the_file_and_resolves_against_its_folder() {
    let dir = JobDir::new();
    let file = dir.path("job.toml");
    fs::write(&file, minimal()).unwrap();
    let spec = load(&file, &[]).unwrap();
    assert_eq!(spec.entry_script, Location::Local(dir.path("score.py")));
    assert_eq!(spec.output, Location::Local(dir.path("out")));
}

#[test]
fn load_names_a_missing_file() {
    let err = load(Path::new("/no/such/job.toml"), &[]).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("/no/such/job.toml: cannot read the job file: "),
        "{message}"
    );
    assert_eq!(err.field(), None);
}

#[test]
fn relative_paths_resolve_against_the_job_folder_and_source_directory() {
    let dir = JobDir::new();
    let spec = dir
        .load(&job(&[
            ("source_directory", r#""./scripts/""#),
            ("side_inputs", r#"["scripts/../data/labels.txt"]"#),
            ("environment", r#""/opt/venv/bin/python""#),
        ]))
        .unwrap();
    assert_eq!(
        spec.source_directory,
        Some(Location::Local(dir.path("scripts")))
    );
    assert_eq!(
        spec.entry_script,
        Location::Local(dir.path("scripts/score.py"))
    );
    assert_eq!(
        spec.side_inputs,
        BTreeMap::from([(
            "labels.txt".to_owned(),
            Location::Local(dir.path("data/labels.txt"))
        )])
    );
    assert_eq!(
        spec.environment,
        Some(PathBuf::from("/opt/venv/bin/python"))
    );
}

#[test]
fn an_absolute_entry_script_is_kept() {
    let dir = JobDir::new();
    let script = dir.path("scripts/score.py");
    let spec = dir
        .load(&job(&[(
            "entry_script",
            &format!("{:?}", script.display().to_string()),
        )]))
        .unwrap();
    assert_eq!(spec.entry_script, Location::Local(script));
}

#[test]
fn scripts_on_s3_are_not_checked() {
    let dir = JobDir::new();
    let spec = dir
        .load(&job(&[
            ("source_directory", r#""s3://code-bucket/jobs/digits""#),
            ("entry_script", r#""score.py""#),
        ]))
        .unwrap();
    assert_eq!(
        spec.entry_script,
        Location::S3 {
            bucket: "code-bucket".into(),
            prefix: "jobs/digits/score.py".into(),
        }
    );
}

#[test]
fn progress_update_timeout_defaults_to_every_attempt_but_at_least_300() {
    let dir = JobDir::new();
    let spec = dir.load(&job(&[("run_invocation_timeout", "60")])).unwrap();
    assert_eq!(spec.progress_update_timeout, 300);
    let spec = dir
        .load(&job(&[("run_invocation_timeout", "200")]))
        .unwrap();
    assert_eq!(spec.progress_update_timeout, 600);
    let spec = dir
        .load(&job(&[
            ("run_invocation_timeout", "200"),
            ("run_max_try", "1"),
        ]))
        .unwrap();
    assert_eq!(spec.progress_update_timeout, 300);
}

#[test]
fn allowed_failed_count_minus_one_means_no_limit() {
    let dir = JobDir::new();
    let spec = dir.load(&job(&[("allowed_failed_count", "-1")])).unwrap();
    assert_eq!(spec.allowed_failed_count, None);
    let spec = dir.load(&job(&[("allowed_failed_count", "0")])).unwrap();
    assert_eq!(spec.allowed_failed_count, Some(0));
    assert_rejects(
        &dir,
        "allowed_failed_count = -2 → allowed_failed_count: must be -1 (no limit) or at least 0 (got -2)",
    );
}

// --- One rule, one line ---------------------------------------------------------------

#[test]
fn name_rules() {
    let dir = JobDir::new();
    let rule = "must be 3-32 characters matching ^[a-z]([-a-z0-9]*[a-z0-9])?$";
    for bad in ["My_Job", "ab", "digits-", "1digits", &"a".repeat(33)] {
        assert_eq!(
            dir.error(&job(&[("name", &format!("{bad:?}"))])),
            format!("job.toml: name: {rule} (got {bad:?})")
        );
    }
    for good in ["abc", "a-1", &"a".repeat(32)] {
        assert!(
            dir.load(&job(&[("name", &format!("{good:?}"))])).is_ok(),
            "{good}"
        );
    }
}

#[test]
fn mini_batch_size_rules() {
    let dir = JobDir::new();
    for case in [
        r#"mini_batch_size = 0 → mini_batch_size: must be at least 1 (got 0)"#,
        r#"mini_batch_size = "1MB" → mini_batch_size: a file input takes a number of files, not a size (got "1MB")"#,
        r#"mini_batch_size = "0" → mini_batch_size: must be at least 1 (got "0")"#,
        r#"mini_batch_size = "lots" → mini_batch_size: expected a number of files or a size such as "10MB" (got "lots")"#,
        r#"mini_batch_size = 2.5 → mini_batch_size: expected a number of files or a size such as "10MB", got a float (2.5)"#,
    ] {
        assert_rejects(&dir, case);
    }
}

#[test]
fn number_ranges() {
    let dir = JobDir::new();
    for case in [
        "error_threshold = -2 → error_threshold: must be between -1 and 2147483647 (got -2)",
        "error_threshold = 2147483648 → error_threshold: must be between -1 and 2147483647 (got 2147483648)",
        "run_max_try = 0 → run_max_try: must be between 1 and 100 (got 0)",
        "run_max_try = 101 → run_max_try: must be between 1 and 100 (got 101)",
        "run_invocation_timeout = 0 → run_invocation_timeout: must be between 1 and 31536000 (got 0)",
        "node_count = 0 → node_count: must be between 1 and 4294967295 (got 0)",
        "priority = 10 → priority: must be between 0 and 9 (got 10)",
        "process_count_per_node = 0 → process_count_per_node: must be between 1 and 1024 (got 0)",
        "process_count_per_node = 1025 → process_count_per_node: must be between 1 and 1024 (got 1025)",
        "resource_monitor_interval = -1 → resource_monitor_interval: must be between 0 and 31536000 (got -1)",
        "first_task_creation_timeout = 0 → first_task_creation_timeout: must be between 1 and 31536000 (got 0)",
        "progress_update_timeout = 0 → progress_update_timeout: must be between 1 and 31536000 (got 0)",
        "allowed_failed_percent = 101 → allowed_failed_percent: must be between 0 and 100 (got 101)",
        "allowed_failed_percent = -0.5 → allowed_failed_percent: must be between 0 and 100 (got -0.5)",
    ] {
        assert_rejects(&dir, case);
    }
}

#[test]
fn wrong_types_name_what_was_expected_and_given() {
    let dir = JobDir::new();
    for case in [
        r#"error_threshold = "five" → error_threshold: expected an integer, got a string ("five")"#,
        r#"name = 42 → name: expected a string, got an integer (42)"#,
        r#"append_row_dataframe_header = "yes" → append_row_dataframe_header: expected a boolean (true or false), got a string ("yes")"#,
        r#"profile = 1 → profile: expected a boolean (true or false), got an integer (1)"#,
        r#"arguments = "--n 5" → arguments: expected a list of strings, got a string ("--n 5")"#,
        r#"arguments = ["--n", [5]] → arguments: expected a string, got a list ([5])"#,
        r#"allowed_failed_percent = true → allowed_failed_percent: expected a number, got a boolean (true)"#,
        r#"environment_variables = "A=1" → environment_variables: expected a table, got a string ("A=1")"#,
        r#"environment_variables = { A = [1] } → environment_variables.A: expected a string, got a list ([1])"#,
        r#"pass_environment = "AWS_ACCESS_KEY_ID" → pass_environment: expected a list of strings, got a string ("AWS_ACCESS_KEY_ID")"#,
    ] {
        assert_rejects(&dir, case);
    }
    let text = minimal().replace(r#"files = "data/images""#, "files = 5");
    assert_eq!(
        dir.error(&text),
        "job.toml: input.files: expected a string, got an integer (5)"
    );
}

#[test]
fn required_fields() {
    let dir = JobDir::new();
    for field in ["name", "entry_script", "output_action"] {
        assert_eq!(
            dir.error(&job(&[(field, "")])),
            format!("job.toml: {field}: required field is missing")
        );
    }
    let no_input = minimal().replace("[input]\nfiles = \"data/images\"\n", "");
    assert_eq!(
        dir.error(&no_input),
        "job.toml: input.files: required field is missing"
    );
    let empty_output = minimal().replace("path = \"out\"\n", "");
    assert_eq!(
        dir.error(&empty_output),
        "job.toml: output.path: required field is missing"
    );
}

#[test]
fn unknown_keys_get_a_suggestion() {
    let dir = JobDir::new();
    assert_eq!(
        dir.error(&job(&[("mini_bacth_size", "5")])),
        r#"job.toml: unknown field "mini_bacth_size" (did you mean "mini_batch_size"?)"#
    );
    assert_eq!(
        dir.error(&job(&[("colour", "5")])),
        r#"job.toml: unknown field "colour""#
    );
    let typo_in_input = minimal().replace("files = ", "fles = ");
    assert_eq!(
        dir.error(&typo_in_input),
        r#"job.toml: unknown field "input.fles" (did you mean "input.files"?)"#
    );
    let typo_in_output = minimal().replace("path = ", "paht = ");
    assert_eq!(
        dir.error(&typo_in_output),
        r#"job.toml: unknown field "output.paht" (did you mean "output.path"?)"#
    );
    let after_the_table = format!("{}mini_batch_size = 5\n", minimal());
    assert_eq!(
        dir.error(&after_the_table),
        r#"job.toml: unknown field "output.mini_batch_size" (did you mean "mini_batch_size"? top-level keys go above the first [table])"#
    );
    let err = dir.load(&job(&[("mini_bacth_size", "5")])).unwrap_err();
    assert_eq!(err.field(), Some("mini_bacth_size"));
}

#[test]
fn input_must_be_a_table() {
    let dir = JobDir::new();
    let text = minimal().replace("[input]\nfiles = ", "input = ");
    let text = text.replacen("input = \"data/images\"\n", "", 1);
    let text = format!("input = \"data/images\"\n{text}");
    assert_eq!(
        dir.error(&text),
        r#"job.toml: input: expected a table, got a string ("data/images")"#
    );
}

#[test]
fn choice_rules() {
    let dir = JobDir::new();
    for case in [
        r#"logging_level = "TRACE" → logging_level: must be "WARNING", "INFO" or "DEBUG" (got "TRACE")"#,
        r#"output_action = "append" → output_action: must be "append_row" or "summary_only" (got "append")"#,
    ] {
        assert_rejects(&dir, case);
    }
    let spec = dir
        .load(&job(&[("logging_level", r#""warning""#)]))
        .unwrap();
    assert_eq!(spec.logging_level, LoggingLevel::Warning);
}

#[test]
fn append_row_file_name_is_a_plain_name() {
    let dir = JobDir::new();
    let rule = r#"must be a plain file name, without "/" or "..""#;
    for bad in [r#""a/b.txt""#, r#""..""#, r#""""#, r#"'a\b.txt'"#] {
        let shown = bad.replace('\'', "\"").replace('\\', "\\\\");
        assert_rejects(
            &dir,
            &format!("append_row_file_name = {bad} → append_row_file_name: {rule} (got {shown})"),
        );
    }
}

#[test]
fn s3_uris_need_a_valid_bucket() {
    let dir = JobDir::new();
    let rule = "must be s3://bucket/prefix with a bucket name of 3-63 characters [a-z0-9.-], \
                starting and ending with a letter or digit";
    for bad in ["s3://", "s3://My_Bucket/x", "s3://ab"] {
        let text = minimal().replace("\"data/images\"", &format!("{bad:?}"));
        assert_eq!(
            dir.error(&text),
            format!("job.toml: input.files: {rule} (got {bad:?})")
        );
    }
}

#[test]
fn a_local_entry_script_must_exist() {
    let dir = JobDir::new();
    let missing = dir.path("missing.py");
    assert_eq!(
        dir.error(&job(&[("entry_script", r#""missing.py""#)])),
        format!(
            "job.toml: entry_script: file not found (got {:?})",
            missing.display().to_string()
        )
    );
    assert_eq!(
        dir.error(&job(&[("entry_script", r#""scripts""#)])),
        format!(
            "job.toml: entry_script: must be a file, not a folder (got {:?})",
            dir.path("scripts").display().to_string()
        )
    );
    // With a source directory, the script is looked for there.
    fs::remove_file(dir.path("scripts/score.py")).unwrap();
    assert_eq!(
        dir.error(&job(&[("source_directory", r#""scripts""#)])),
        format!(
            "job.toml: entry_script: file not found (got {:?})",
            dir.path("scripts/score.py").display().to_string()
        )
    );
}

#[test]
fn a_local_source_directory_must_exist() {
    let dir = JobDir::new();
    assert_eq!(
        dir.error(&job(&[("source_directory", r#""nowhere""#)])),
        format!(
            "job.toml: source_directory: folder not found (got {:?})",
            dir.path("nowhere").display().to_string()
        )
    );
}

#[test]
fn the_input_folder_need_not_exist_yet() {
    let dir = JobDir::new();
    assert!(!dir.path("data/images").exists());
    assert!(dir.load(&minimal()).is_ok());
}

#[test]
fn output_must_differ_from_input() {
    let dir = JobDir::new();
    let text = minimal().replace("path = \"out\"", "path = \"./data/images/\"");
    assert_eq!(
        dir.error(&text),
        r#"job.toml: output.path: must differ from input.files (got "./data/images/")"#
    );
    let text = minimal()
        .replace("\"data/images\"", "\"s3://bkt/in\"")
        .replace("\"out\"", "\"s3://bkt/in/\"");
    assert_eq!(
        dir.error(&text),
        r#"job.toml: output.path: must differ from input.files (got "s3://bkt/in/")"#
    );
}

#[test]
fn partition_keys_of_a_file_input_need_a_partition_format_naming_them() {
    let dir = JobDir::new();
    assert_rejects(
        &dir,
        r#"partition_keys = ["user"] → partition_keys: a file input also needs partition_format, naming the keys' path parts (such as "{user}/{genres}/{name}.txt") (got ["user"])"#,
    );
    let text = job(&[
        ("partition_keys", r#"["user", "mood"]"#),
        ("partition_format", r#""{user}/{genres}/{name}.txt""#),
    ]);
    assert_eq!(
        dir.error(&text),
        r#"job.toml: partition_format: does not name the partition key {mood} (got "{user}/{genres}/{name}.txt")"#
    );
    let text = job(&[
        ("partition_keys", r#"["user"]"#),
        ("partition_format", r#""{user}{genres}""#),
    ]);
    assert_eq!(
        dir.error(&text),
        r#"job.toml: partition_format: {genres} touches the key before it (got "{user}{genres}")"#
    );
    let text = job(&[
        ("partition_keys", r#"["user", "genres"]"#),
        ("partition_format", r#""{user}/{genres}/{name}.txt""#),
    ]);
    let spec = dir.load(&text).unwrap();
    assert_eq!(spec.partition_keys.unwrap(), ["user", "genres"]);
    assert_eq!(
        spec.partition_format.as_deref(),
        Some("{user}/{genres}/{name}.txt")
    );
}

#[test]
fn side_inputs_and_models_are_named_tables() {
    let dir = JobDir::new();
    let text = format!(
        "{}\n[side_inputs]\nlabels = \"data/labels.txt\"\nvocab = \"s3://bkt/vocab/\"\n\n[models]\ndigits = \"models/digits\"\n",
        job(&[(
            "arguments",
            r#"["--labels", "${{side_inputs.labels}}", "--m=${{models.digits}}"]"#
        )])
    );
    let spec = dir.load(&text).unwrap();
    assert_eq!(
        spec.side_inputs,
        BTreeMap::from([
            (
                "labels".to_owned(),
                Location::Local(dir.path("data/labels.txt"))
            ),
            (
                "vocab".to_owned(),
                Location::S3 {
                    bucket: "bkt".into(),
                    prefix: "vocab/".into()
                }
            ),
        ])
    );
    assert_eq!(
        spec.models,
        BTreeMap::from([(
            "digits".to_owned(),
            Location::Local(dir.path("models/digits"))
        )])
    );
    // The references stay for each node to fill in with its local copy.
    assert_eq!(spec.arguments[1], "${{side_inputs.labels}}");
    let over = dir
        .load_with(&minimal(), &["side_inputs.labels=data/labels.txt"])
        .unwrap();
    assert_eq!(
        over.side_inputs["labels"],
        Location::Local(dir.path("data/labels.txt"))
    );
    assert_eq!(
        dir.error_with(&minimal(), &["models.m=nowhere"]),
        format!(
            "--set models.m=nowhere: models.m: file or folder not found (got {:?})",
            dir.path("nowhere").display().to_string()
        )
    );
}

#[test]
fn an_argument_naming_an_unknown_side_input_or_model_is_refused() {
    let dir = JobDir::new();
    assert_rejects(
        &dir,
        r#"arguments = ["--labels", "${{side_inputs.labels}}"] → arguments: names side_inputs.labels, which [side_inputs] does not define (known: none) (got "${{side_inputs.labels}}")"#,
    );
    let text = job(&[
        ("arguments", r#"["${{models.big}}"]"#),
        ("side_inputs", r#"["data/labels.txt"]"#),
    ]) + "\n[models]\nsmall = \"models/digits\"\n";
    assert_eq!(
        dir.error(&text),
        r#"job.toml: arguments: names models.big, which [models] does not define (known: small) (got "${{models.big}}")"#
    );
    assert_rejects(
        &dir,
        r#"arguments = ["${{inputs.x}}"] → arguments: ${{inputs.…}} is not a reference fleetrun knows; use ${{side_inputs.<name>}}, ${{models.<name>}} or ${{outputs.<name>}} (got "${{inputs.x}}")"#,
    );
}

#[test]
fn named_outputs_are_resolved_and_referenced_from_arguments() {
    let dir = JobDir::new();
    let text = job(&[(
        "arguments",
        r#"["--model_folder", "${{outputs.model_folder}}"]"#,
    )]) + "\n[outputs]\nmodel_folder = \"results/models\"\nscores = \"s3://bucket/scores/\"\n";
    let spec = dir.load(&text).unwrap();
    assert_eq!(
        spec.outputs["model_folder"],
        Location::Local(dir.path("results/models"))
    );
    assert_eq!(
        spec.outputs["scores"],
        Location::S3 {
            bucket: "bucket".into(),
            prefix: "scores/".into()
        }
    );
    // The reference stays for each runner to fill in with a folder of its own.
    assert_eq!(spec.arguments[1], "${{outputs.model_folder}}");
    // Inside the job's output folder, beside what fleetrun keeps there, is fine.
    let inside = job(&[]) + "\n[outputs]\nmodels = \"out/models\"\n";
    assert_eq!(
        dir.load(&inside).unwrap().outputs["models"],
        Location::Local(dir.path("out/models"))
    );
}

#[test]
fn a_bad_named_output_is_refused_naming_the_field_and_the_rule() {
    let dir = JobDir::new();
    let with = |table: &str, arguments: &str| {
        job(&[("arguments", arguments)]) + "\n[outputs]\n" + table + "\n"
    };
    for (table, arguments, message) in [
        (
            "\"model-folder\" = \"m\"",
            "",
            r#"job.toml: outputs: names must be identifiers: a letter or "_", then letters, digits or "_" (got "model-folder")"#,
        ),
        (
            "m = \"data/images\"",
            "",
            r#"job.toml: outputs.m: must be outside the input, and not hold it (got "data/images")"#,
        ),
        (
            "m = \"data/images/models\"",
            "",
            r#"job.toml: outputs.m: must be outside the input, and not hold it (got "data/images/models")"#,
        ),
        (
            "m = \"out\"",
            "",
            r#"job.toml: outputs.m: must not be the output folder itself, where fleetrun keeps its own files (EntryScript().output_dir writes there); name a folder in it (got "out")"#,
        ),
        (
            "m = \"out/logs/models\"",
            "",
            r#"job.toml: outputs.m: must not lie in logs, which fleetrun keeps in the output folder for itself (got "out/logs/models")"#,
        ),
        (
            "m = \"out/parallel_run_step.txt\"",
            "",
            r#"job.toml: outputs.m: must not lie in parallel_run_step.txt, which fleetrun keeps in the output folder for itself (got "out/parallel_run_step.txt")"#,
        ),
        (
            "a = \"m\"\nb = \"m/b\"",
            "",
            r#"job.toml: outputs.b: must be apart from outputs.a: one holds the other (got "m/b")"#,
        ),
        (
            "m = \"m\"",
            r#"["${{outputs.model_folder}}"]"#,
            r#"job.toml: arguments: names outputs.model_folder, which [outputs] does not define (known: m) (got "${{outputs.model_folder}}")"#,
        ),
    ] {
        assert_eq!(dir.error(&with(table, arguments)), message, "{table}");
    }
}

#[test]
fn environment_variable_names() {
    let dir = JobDir::new();
    for case in [
        r#"environment_variables = { "A=B" = "1" } → environment_variables: names must be non-empty and without "=" (got "A=B")"#,
        r#"environment_variables = { "" = "1" } → environment_variables: names must be non-empty and without "=" (got "")"#,
        r#"pass_environment = ["A=B"] → pass_environment: names must be non-empty and without "=" (got "A=B")"#,
    ] {
        assert_rejects(&dir, case);
    }
}

#[test]
fn environment_must_be_local() {
    assert_rejects(
        &JobDir::new(),
        r#"environment = "s3://envs/py311" → environment: must be a local path (got "s3://envs/py311")"#,
    );
}

#[test]
fn syntax_errors_are_one_line_with_line_and_column() {
    let dir = JobDir::new();
    let message =
        dir.error("name = \"digits\"\nentry_script = \"score.py\"\nmini_batch_size = = 5\n");
    assert!(
        message.starts_with("job.toml:3:19: invalid TOML: "),
        "{message}"
    );
    let message = dir.error("name = \"a\"\nname = \"b\"\n");
    assert!(
        message.starts_with("job.toml:2:1: invalid TOML: "),
        "{message}"
    );
}

// --- Overrides ------------------------------------------------------------------------

#[test]
fn overrides_set_fields() {
    let dir = JobDir::new();
    let spec = dir
        .load_with(
            &minimal(),
            &[
                "mini_batch_size=5",
                "error_threshold=-1",
                "input.files=other",
                "output.path=s3://results/run-1",
                "arguments=[\"--n\", \"5\"]",
                "environment_variables.OMP_NUM_THREADS=4",
                "name = digits-v2",
            ],
        )
        .unwrap();
    assert_eq!(spec.mini_batch_size, MiniBatchSize::Files(5));
    assert_eq!(spec.error_threshold, -1);
    assert_eq!(spec.input, Input::Files(Location::Local(dir.path("other"))));
    assert_eq!(
        spec.output,
        Location::S3 {
            bucket: "results".into(),
            prefix: "run-1".into(),
        }
    );
    assert_eq!(spec.arguments, ["--n", "5"]);
    assert_eq!(spec.environment_variables["OMP_NUM_THREADS"], "4");
    assert_eq!(spec.name, "digits-v2");
}

#[test]
fn overrides_fill_in_missing_tables() {
    let dir = JobDir::new();
    let text = minimal().replace("[input]\nfiles = \"data/images\"\n", "");
    let spec = dir.load_with(&text, &["input.files=data/x"]).unwrap();
    assert_eq!(
        spec.input,
        Input::Files(Location::Local(dir.path("data/x")))
    );
}

#[test]
fn a_bad_override_is_named() {
    let dir = JobDir::new();
    assert_eq!(
        dir.error_with(&minimal(), &["mini_batch_size=abc"]),
        r#"--set mini_batch_size=abc: mini_batch_size: expected a number of files or a size such as "10MB" (got "abc")"#
    );
    assert_eq!(
        dir.error_with(&minimal(), &["error_threshold=-5"]),
        "--set error_threshold=-5: error_threshold: must be between -1 and 2147483647 (got -5)"
    );
    assert_eq!(
        dir.error_with(&minimal(), &["mini_bacth_size=5"]),
        r#"--set mini_bacth_size=5: unknown field "mini_bacth_size" (did you mean "mini_batch_size"?)"#
    );
    assert_eq!(
        dir.error_with(&minimal(), &["input.fles=x"]),
        r#"--set input.fles=x: unknown field "input.fles" (did you mean "input.files"?)"#
    );
    assert_eq!(
        dir.error_with(&minimal(), &["mini_batch_size"]),
        "--set mini_batch_size: expected key=value"
    );
    assert_eq!(
        dir.error_with(&minimal(), &["=5"]),
        "--set =5: expected key=value"
    );
}

#[test]
fn errors_in_the_file_still_name_the_file() {
    let dir = JobDir::new();
    assert_eq!(
        dir.error_with(&job(&[("run_max_try", "0")]), &["mini_batch_size=5"]),
        "job.toml: run_max_try: must be between 1 and 100 (got 0)"
    );
}

#[test]
fn the_last_override_wins() {
    let dir = JobDir::new();
    let spec = dir
        .load_with(&minimal(), &["mini_batch_size=0", "mini_batch_size=7"])
        .unwrap();
    assert_eq!(spec.mini_batch_size, MiniBatchSize::Files(7));
}

// --- Shipped examples -----------------------------------------------------------------

#[test]
fn every_shipped_example_job_file_loads() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let Ok(entries) = fs::read_dir(&examples) else {
        return; // No examples shipped yet.
    };
    let job_files = entries
        .map(|entry| entry.unwrap().path().join("job.toml"))
        .filter(|job_file| job_file.is_file());
    for job_file in job_files {
        load(&job_file, &[]).unwrap_or_else(|err| panic!("{err}"));
    }
}

// --- Tabular inputs -------------------------------------------------------------------

/// The minimal job file with a tabular input and `extra` lines under `[input]`.
fn tabular_job(set: &[(&str, &str)], extra: &str) -> String {
    job(set).replace(
        "[input]\nfiles = \"data/images\"\n",
        &format!("[input]\ntabular = \"data/rows.csv\"\n{extra}"),
    )
}

#[test]
fn mini_batch_size_as_a_string_counts_files() {
    let dir = JobDir::new();
    let spec = dir.load(&job(&[("mini_batch_size", r#""5""#)])).unwrap();
    assert_eq!(spec.mini_batch_size, MiniBatchSize::Files(5));
    let spec = dir
        .load_with(&minimal(), &[r#"mini_batch_size="7""#])
        .unwrap();
    assert_eq!(spec.mini_batch_size, MiniBatchSize::Files(7));
}

#[test]
fn a_tabular_input_and_its_defaults() {
    let dir = JobDir::new();
    let spec = dir.load(&tabular_job(&[], "")).unwrap();
    assert_eq!(
        spec.input,
        Input::Tabular(Tabular {
            location: Location::Local(dir.path("data/rows.csv")),
            format: None,
            separator: b',',
        })
    );
    assert_eq!(spec.mini_batch_size, MiniBatchSize::Bytes(1 << 20));
    assert_eq!(spec.append_row_separator, b' ');
    let spec = dir
        .load(&tabular_job(
            &[
                ("mini_batch_size", r#""64KB""#),
                ("partition_keys", r#"["region", "day"]"#),
                ("append_row_separator", r#"",""#),
            ],
            "format = \"CSV\"\nseparator = \"\\t\"\n",
        ))
        .unwrap();
    assert_eq!(spec.mini_batch_size, MiniBatchSize::Bytes(64 << 10));
    assert_eq!(spec.partition_keys.unwrap(), ["region", "day"]);
    assert_eq!(spec.append_row_separator, b',');
    let tabular = spec.input.tabular().unwrap();
    assert_eq!(tabular.format, Some(TabularFormat::Csv));
    assert_eq!(tabular.separator, b'\t');
    for (size, bytes) in [("10", 10), (r#""10MB""#, 10 << 20), (r#""1GB""#, 1 << 30)] {
        let spec = dir
            .load(&tabular_job(&[("mini_batch_size", size)], ""))
            .unwrap();
        assert_eq!(spec.mini_batch_size, MiniBatchSize::Bytes(bytes), "{size}");
    }
}

#[test]
fn tabular_rules_name_the_field() {
    let dir = JobDir::new();
    let cases = [
        (
            tabular_job(&[("mini_batch_size", r#""lots""#)], ""),
            r#"job.toml: mini_batch_size: a tabular input takes a size such as "64KB", "1MB", "1GB" or a number of bytes (KB = 1024 bytes) (got "lots")"#,
        ),
        (
            tabular_job(&[], "format = \"xml\"\n"),
            r#"job.toml: input.format: must be "csv", "jsonl" or "parquet" (got "xml")"#,
        ),
        (
            tabular_job(&[], "separator = \";;\"\n"),
            r#"job.toml: input.separator: must be one ASCII character other than a quote or a newline, such as "," or "\t" (got ";;")"#,
        ),
        (
            tabular_job(&[], "files = \"data/images\"\n"),
            r#"job.toml: input.tabular: set input.files or input.tabular, not both (got "data/rows.csv")"#,
        ),
        (
            job(&[]).replace("[input]\n", "[input]\nseparator = \";\"\n"),
            r#"job.toml: input.separator: only for input.tabular (got ";")"#,
        ),
        (
            tabular_job(&[("partition_keys", "[]")], ""),
            "job.toml: partition_keys: must name at least one column, each once (got [])",
        ),
        (
            tabular_job(&[("partition_keys", r#"["a"]"#)], "format = \"parquet\"\n"),
            r#"job.toml: partition_keys: not yet supported for Parquet inputs (CSV and JSON Lines only) (got ["a"])"#,
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(dir.error(&text), expected);
    }
}

// --- The job as JSON ------------------------------------------------------------------

#[test]
fn a_json_job_loads_as_its_job_file_does() {
    let dir = JobDir::new();
    let json = r#"{
        "name": "digits",
        "entry_script": "score.py",
        "output_action": "append_row",
        "input": {"files": "data/images"},
        "output": {"path": "out"},
        "arguments": ["--n", 5],
        "process_count_per_node": null
    }"#;
    let spec = load_json(json, "request", dir.dir.path()).unwrap();
    let from_toml = dir.load(&job(&[("arguments", r#"["--n", 5]"#)])).unwrap();
    assert_eq!(spec, from_toml);
}

#[test]
fn json_errors_name_the_sender_and_the_field() {
    let dir = JobDir::new();
    let error = |json: &str| match load_json(json, "request", dir.dir.path()) {
        Ok(spec) => panic!("expected an error, loaded {spec:#?}"),
        Err(err) => err.to_string(),
    };
    let fields = r#""name": "digits", "entry_script": "score.py", "output_action": "append_row",
        "output": {"path": "out"}"#;
    assert_eq!(
        error(&format!(r#"{{{fields}, "input": {{"fles": "data"}}}}"#)),
        r#"request: unknown field "input.fles" (did you mean "input.files"?)"#
    );
    assert_eq!(
        error(&format!(
            r#"{{{fields}, "input": {{"files": "data"}}, "run_max_try": "five"}}"#
        )),
        r#"request: run_max_try: expected an integer, got a string ("five")"#
    );
    assert_eq!(
        error(&format!(
            r#"{{{fields}, "input": {{"files": "data"}}, "run_max_try": 0}}"#
        )),
        "request: run_max_try: must be between 1 and 100 (got 0)"
    );
    assert_eq!(
        error(&format!(r#"{{{fields}}}"#)),
        "request: input.files: required field is missing"
    );
    let message = error(r#"{"name": "#);
    assert!(
        message.starts_with("request: invalid JSON: ") && !message.contains('\n'),
        "{message}"
    );
    let message = error(r#"["digits"]"#);
    assert!(message.starts_with("request: invalid JSON: "), "{message}");
}

#[test]
fn a_job_file_written_back_reads_the_same() {
    let dir = JobDir::new();
    let text = job(&[
        ("arguments", r#"["--n", 5]"#),
        ("mini_batch_size", r#""4""#),
        ("side_inputs", r#"["data/labels.txt"]"#),
        ("environment_variables", "{ A = 1 }"),
    ]);
    let file: JobFile = toml::from_str(&text).unwrap();
    let written = toml::to_string(&file).unwrap();
    assert_eq!(dir.load(&written).unwrap(), dir.load(&text).unwrap());
    let json = serde_json::to_string(&file).unwrap();
    assert_eq!(
        load_json(&json, "request", dir.dir.path()).unwrap(),
        dir.load(&text).unwrap()
    );
}

#[test]
fn notify_url_must_be_an_http_url_with_a_host() {
    let dir = JobDir::new();
    for bad in [
        "ftp://hooks.example.com/x",
        "https:///x",
        "hooks.example.com",
        "http://a b/",
    ] {
        assert_eq!(
            dir.error(&job(&[("notify_url", &format!("{bad:?}"))])),
            format!(
                "job.toml: notify_url: must be an http:// or https:// URL with a host (got {bad:?})"
            ),
        );
    }
    let spec = dir
        .load(&job(&[("notify_url", "\"http://127.0.0.1:9000/hook\"")]))
        .unwrap();
    assert_eq!(
        spec.notify_url.as_deref(),
        Some("http://127.0.0.1:9000/hook")
    );
}

/// `deadline` is a duration from a second to a year: seconds, minutes, hours or days, or a
/// number of seconds; a `--set` (as `--deadline` passes it) reads the same. Anything else
/// is refused naming the field and the rule.
#[test]
fn deadline_is_a_duration_from_a_second_to_a_year() {
    let dir = JobDir::new();
    for (written, seconds) in [
        ("\"20s\"", 20),
        ("\"90m\"", 90 * 60),
        ("\"24h\"", 24 * 3600),
        ("\"7d\"", 7 * 24 * 3600),
        ("45", 45),
        ("\"365d\"", 365 * 24 * 3600),
    ] {
        let spec = dir.load(&job(&[("deadline", written)])).unwrap();
        assert_eq!(spec.deadline, Some(seconds), "{written}");
    }
    let set = dir.load_with(&minimal(), &["deadline=20s"]).unwrap();
    assert_eq!(set.deadline, Some(20));
    // As the API sends it: the job's field in its JSON.
    let json = r#"{"name": "digits", "entry_script": "score.py", "output_action": "append_row",
        "input": {"files": "data/images"}, "output": {"path": "out"}, "deadline": "24h"}"#;
    let sent = load_json(json, "request", dir.dir.path()).unwrap();
    assert_eq!(sent.deadline, Some(24 * 3600));
    let bad = json.replace("24h", "soon");
    let refused = load_json(&bad, "request", dir.dir.path()).unwrap_err();
    assert!(
        refused
            .to_string()
            .starts_with("request: deadline: must be a duration"),
        "{refused}"
    );
    assert_eq!(dir.load(&minimal()).unwrap().deadline, None);
    for bad in ["0s", "1.5h", "24 hours", "h", "-5s", "366d", "", "1w"] {
        assert_eq!(
            dir.error(&job(&[("deadline", &format!("{bad:?}"))])),
            format!(
                "job.toml: deadline: must be a duration such as \"30s\", \"90m\", \"24h\" or \"7d\", from 1s to 365d (got {bad:?})"
            ),
        );
    }
}

/// ParallelRunStep's settings in `arguments` are the job's settings, the job file and a
/// `--set` win over them, and a bad one is refused naming the key and the argument.
#[test]
fn parallel_run_step_settings_in_arguments_are_the_jobs() {
    let dir = JobDir::new();
    let arguments = r#"["--model", "m", "--allowed_failed_percent", "30", "--task_overhead_timeout", "1200", "--progress_update_timeout=900", "--allowed_failed_count", "4"]"#;
    let text = job(&[("arguments", arguments), ("allowed_failed_count", "2")]);
    let spec = dir
        .load_with(&text, &["progress_update_timeout=700"])
        .unwrap();
    assert_eq!(spec.allowed_failed_percent, 30.0);
    assert_eq!(spec.task_overhead_timeout, 1200);
    assert_eq!(spec.progress_update_timeout, 700, "--set wins");
    assert_eq!(spec.allowed_failed_count, Some(2), "the job file wins");
    assert_eq!(spec.arguments.len(), 9, "the script still gets them all");
    let said: Vec<String> = spec
        .settings_from_arguments
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        said,
        [
            "allowed_failed_percent = 30, from --allowed_failed_percent in arguments",
            "task_overhead_timeout = 1200, from --task_overhead_timeout in arguments",
            "--progress_update_timeout 900 in arguments is overruled by the job's own progress_update_timeout",
            "--allowed_failed_count 4 in arguments is overruled by the job's own allowed_failed_count",
        ]
    );

    let bad = job(&[("arguments", r#"["--allowed_failed_percent", "300"]"#)]);
    assert_eq!(
        dir.error(&bad),
        "job.toml: allowed_failed_percent: must be between 0 and 100 (got 300), from `--allowed_failed_percent 300` in arguments"
    );
    let bad = job(&[("arguments", r#"["--run_max_try", "many"]"#)]);
    assert!(
        dir.error(&bad)
            .ends_with("from `--run_max_try many` in arguments"),
        "{}",
        dir.error(&bad)
    );
}
