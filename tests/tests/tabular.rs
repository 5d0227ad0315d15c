//! Tabular inputs on `fleetrun run` (CONTRACT §1, §2): CSV with quoted newlines, JSON Lines
//! and Parquet cut into the chunks the byte arithmetic predicts, every row's output exactly
//! once; `partition_keys`; the DataFrame's header and separator in the output; a Python
//! without pandas refused before any mini-batch.

use fleetrun_tests::tabular::{self, ID_AND_LENGTH, REGIONS};
use fleetrun_tests::{JobDir, code, exit_within};

/// A job whose input is `[input] tabular = "<input>"` (relative to the job folder), with
/// `extra` lines under `[input]`.
fn tabular_job(script: &str, settings: &str, input: &str, extra: &str) -> JobDir {
    JobDir::new(script, settings).input(&format!("tabular = \"{input}\"\n{extra}"))
}

/// The mini-batches the job processed, from its report (one row per attempt).
fn mini_batches(job: &JobDir) -> u64 {
    job.log("sys/job_report/processed_mini-batches.csv")
        .lines()
        .skip(1)
        .filter(|line| line.split(',').nth(1) == Some("1"))
        .count() as u64
}

fn sorted_output(job: &JobDir) -> Vec<String> {
    let mut lines = job.output_lines();
    lines.sort();
    lines
}

#[test]
fn a_csv_with_quoted_newlines_gives_every_row_once_in_the_predicted_chunks() {
    let rows = 100_000;
    let job = tabular_job(
        ID_AND_LENGTH,
        "mini_batch_size = \"64KB\"\nprocess_count_per_node = 2",
        "data/rows.csv",
        "",
    );
    let header = tabular::write_csv(&job.path("data/rows.csv"), 0..rows);
    let size = std::fs::metadata(job.path("data/rows.csv")).unwrap().len();
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(sorted_output(&job), tabular::expected_id_lengths(rows));
    assert_eq!(
        mini_batches(&job),
        tabular::predicted_chunks(size - header, 64 << 10)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{rows} items succeeded")),
        "items are rows"
    );
}

#[test]
fn json_lines_give_every_row_once_in_the_predicted_chunks() {
    let rows = 100_000;
    let job = tabular_job(
        ID_AND_LENGTH,
        "mini_batch_size = \"64KB\"\nprocess_count_per_node = 2",
        "data",
        "",
    );
    // Two files: chunks never cross a file.
    tabular::write_json_lines(&job.path("data/a.jsonl"), 0..60_000);
    tabular::write_json_lines(&job.path("data/b.jsonl"), 60_000..rows);
    let predicted: u64 = ["data/a.jsonl", "data/b.jsonl"]
        .iter()
        .map(|f| std::fs::metadata(job.path(f)).unwrap().len())
        .map(|len| tabular::predicted_chunks(len, 64 << 10))
        .sum();
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(sorted_output(&job), tabular::expected_id_lengths(rows));
    assert_eq!(mini_batches(&job), predicted);
}

#[test]
fn parquet_chunks_are_runs_of_whole_row_groups() {
    let rows = 100_000;
    let job = tabular_job(
        ID_AND_LENGTH,
        "mini_batch_size = \"64KB\"\nprocess_count_per_node = 2",
        "data/rows.parquet",
        "",
    );
    let predicted = tabular::write_parquet(&job.path("data/rows.parquet"), rows, 4_000, 64 << 10);
    assert!(predicted > 1, "the file spans several chunks");
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(sorted_output(&job), tabular::expected_id_lengths(rows));
    assert_eq!(mini_batches(&job), predicted);
}

#[test]
fn partition_keys_put_one_key_in_each_mini_batch() {
    let rows = 3_000;
    let script = "def run(frame):\n    regions = set(frame[\"region\"])\n    assert len(regions) == 1, regions\n    return [f\"{r} {i}\" for r, i in zip(frame[\"region\"], frame[\"id\"])]\n";
    let job = tabular_job(
        script,
        "partition_keys = [\"region\"]\nmini_batch_size = \"1KB\"",
        "data",
        "",
    );
    // The keys' rows are spread over two files; each key's mini-batch holds both files'.
    tabular::write_csv(&job.path("data/a.csv"), 0..1_000);
    tabular::write_csv(&job.path("data/b.csv"), 1_000..rows);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(mini_batches(&job), REGIONS.len() as u64);
    let mut expected: Vec<String> = (0..rows)
        .map(|i| format!("{} {i}", REGIONS[i % 3]))
        .collect();
    expected.sort();
    assert_eq!(sorted_output(&job), expected);
}

/// A record longer than `mini_batch_size` leaves the chunks whose edges fall inside it
/// empty: they still count (the arithmetic holds), and `run()` never gets an empty frame.
#[test]
fn a_record_longer_than_a_chunk_leaves_empty_chunks_that_run_never_sees() {
    let script = "def run(frame):\n    assert len(frame) > 0\n    return [f\"{i} {len(t)}\" for i, t in zip(frame['id'], frame['text'])]\n";
    let job = tabular_job(
        script,
        "mini_batch_size = \"1KB\"\nallowed_failed_count = 0\nrun_max_try = 1",
        "data/rows.csv",
        "",
    );
    let long = "x".repeat(10_000);
    let text = format!("id,text\n0,a\n1,\"{long}\n{long}\"\n2,b\n");
    std::fs::write(job.path("data/rows.csv"), &text).unwrap();
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert_eq!(sorted_output(&job), ["0 1", "1 20001", "2 1"]);
    let body = (text.len() - "id,text\n".len()) as u64;
    assert_eq!(mini_batches(&job), tabular::predicted_chunks(body, 1024));
}

#[test]
fn a_returned_dataframe_keeps_its_header_and_separator_and_fewer_rows_fail() {
    // Drops the row with id 7: one failed item; the rest are written as CSV records.
    let script = "def run(frame):\n    return frame[frame[\"id\"] != 7][[\"id\", \"text\"]]\n";
    let job = tabular_job(
        script,
        "append_row_dataframe_header = true\nappend_row_separator = \";\"\nmini_batch_size = 64\nerror_threshold = 5",
        "data/rows.csv",
        "",
    );
    tabular::write_csv(&job.path("data/rows.csv"), 0..10);
    let out = job.run(&[]);
    assert_eq!(
        code(&out),
        0,
        "error_threshold not exceeded: the job completes"
    );
    let text = std::fs::read_to_string(job.path("out/parallel_run_step.txt")).unwrap();
    let mut expected = String::from("id;text\n");
    for i in (0..10).filter(|&i| i != 7) {
        let field = tabular::text(i);
        let field = if field.contains(['\n', '"', ';']) {
            format!("\"{}\"", field.replace('"', "\"\""))
        } else {
            field
        };
        expected.push_str(&format!("{i};{field}\n"));
    }
    assert_eq!(text, expected);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("9 items succeeded, 1 failed"),
        "a row not returned is a failed item"
    );
}

#[test]
fn a_mini_batch_that_fails_names_its_file_and_rows_and_counts_rows() {
    let script = "def run(frame):\n    raise ValueError('bad rows')\n";
    let job = tabular_job(
        script,
        "run_max_try = 1\nmini_batch_size = \"1KB\"",
        "data/rows.csv",
        "",
    );
    tabular::write_csv(&job.path("data/rows.csv"), 0..100);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("0 items succeeded, 100 failed"),
        "every row of a failed mini-batch counts"
    );
    let failed = job.log("failed_items.csv");
    assert!(failed.contains("rows.csv bytes 15-"), "{failed}");
    assert!(failed.contains(" rows 0-"), "{failed}");
}

#[test]
fn a_python_without_pandas_fails_the_job_before_any_mini_batch() {
    let job = tabular_job(
        "def run(frame):\n    return []\n",
        "environment = \"venv\"\nprocess_count_per_node = 2",
        "data/rows.csv",
        "",
    );
    tabular::write_csv(&job.path("data/rows.csv"), 0..10);
    let mut making = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(job.path("venv"))
        .spawn()
        .unwrap();
    assert!(exit_within(&mut making, std::time::Duration::from_secs(120)).success());
    let out = job.run(&[]);
    assert_eq!(code(&out), 42);
    let result = job.log("job_result.txt");
    assert!(result.contains("needs pandas"), "{result}");
    assert!(result.contains("-m pip install pandas"), "{result}");
    assert!(
        !job.path("out/logs/sys/job_report/processed_mini-batches.csv")
            .exists(),
        "no mini-batch ran"
    );
    // One start, not 3 × process_count_per_node of them.
    let main = job.log("sys/node/0/_main.txt");
    assert!(main.matches("failed to start").count() <= 2, "{main}");
}

/// A file whose format its name does not tell is refused before anything runs (exit 2),
/// naming the field; nothing is written in the output folder.
#[test]
fn a_format_the_extension_does_not_tell_is_refused_before_the_run() {
    let job = tabular_job("def run(frame):\n    return []\n", "", "data/rows.txt", "");
    tabular::write_csv(&job.path("data/rows.txt"), 0..10);
    let out = job.run(&[]);
    assert_eq!(code(&out), 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("input.tabular: rows.txt: cannot tell the format")
            && stderr.contains("set input.format"),
        "{stderr}"
    );
    assert!(!job.path("out").exists());
    // Told the format, the same file runs.
    let job = tabular_job(
        "def run(frame):\n    return list(frame['id'])\n",
        "",
        "data/rows.txt",
        "format = \"csv\"\n",
    );
    tabular::write_csv(&job.path("data/rows.txt"), 0..10);
    assert_eq!(code(&job.run(&[])), 0);
    assert_eq!(job.output_lines().len(), 10);
}

/// A folder that mixes table formats is refused, naming the file, instead of reading a
/// JSON Lines file as CSV.
#[test]
fn a_folder_mixing_formats_fails_naming_the_odd_file() {
    let job = tabular_job(
        "def run(frame):\n    return list(frame['id'])\n",
        "",
        "data",
        "",
    );
    tabular::write_csv(&job.path("data/a.csv"), 0..10);
    tabular::write_json_lines(&job.path("data/b.jsonl"), 10..20);
    let out = job.run(&[]);
    assert_ne!(code(&out), 0);
    let result = job.log("job_result.txt");
    assert!(result.contains("b.jsonl"), "{result}");
    assert!(!job.path("out/parallel_run_step.txt").exists());
}
