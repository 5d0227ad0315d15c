//! MLTable folders on `fleetrun run` (CONTRACT §2, `[input]`): the `MLTable` file's `paths`
//! (`file`, `folder`, `pattern`) choose the input's files, its read transformation says how
//! they are read, `extract_columns_from_partition_format` adds string columns from each
//! file's path, and `partition_keys` may name them; `drop_columns` takes columns of the
//! files or of the path out of what `run()` gets. A files input never has the `MLTable`
//! file as an item. What fleetrun does not read is refused before the run, naming the key.

use std::process::Command;

use fleetrun_tests::{JobDir, code};

/// A job over `[input] <kind> = "table"`, with `settings` at the top of the job file.
fn table_job(script: &str, settings: &str, kind: &str, mltable: &str) -> JobDir {
    let job = JobDir::new(script, settings).input(&format!("{kind} = \"table\"\n"));
    write(&job, "table/MLTable", mltable);
    job
}

fn write(job: &JobDir, rel: &str, text: &str) {
    let path = job.path(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn sorted(mut lines: Vec<String>) -> Vec<String> {
    lines.sort();
    lines
}

/// Runs `code` with python3 in the job's folder and returns its printed lines.
fn python(job: &JobDir, code: &str) -> Vec<String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(code)
        .current_dir(job.path(""))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pandas and pyarrow are needed (scripts/install-deps.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every row `run()` gets, as sorted-key JSON.
const ROWS_AS_JSON: &str = r#"import json

def run(frame):
    return [json.dumps(row, sort_keys=True, default=str) for row in frame.to_dict("records")]
"#;

/// Several `paths` entries (a pattern with `**`, a file), `read_delimited` with its
/// delimiter, encoding and `empty_as_string`, the path's columns and `include_path_column`:
/// every row equals what pandas reads from the selected files with those columns added.
#[test]
fn a_delimited_mltable_reads_its_selected_files_as_pandas_does() {
    let job = table_job(
        ROWS_AS_JSON,
        "",
        "tabular",
        r#"$schema: https://azuremlschemas.azureedge.net/latest/MLTable.schema.json
type: mltable
paths:
  - pattern: ./sales/**/week?.csv
  - file: ./late/1002/minute/week9.csv
transformations:
  - read_delimited:
      delimiter: ';'
      header: all_files_same_headers
      encoding: latin1
      empty_as_string: true
      include_path_column: true
  - extract_columns_from_partition_format:
      partition_format: '{Store}/{Brand}/week{Week}.csv'
"#,
    );
    let files = [
        "table/sales/1000/dominicks/week1.csv",
        "table/sales/1000/dominicks/week2.csv",
        "table/sales/1001/tropicana/week1.csv",
        "table/late/1002/minute/week9.csv",
    ];
    for (n, file) in files.iter().enumerate() {
        // Latin-1 text, an empty field, a quoted newline.
        let text = format!(
            "units;note;price\n{n};caf\u{e9};2.5\n{};;3\n7;\"two\nlines\";\n",
            n * 10
        );
        let latin1: Vec<u8> = text.chars().map(|c| c as u32 as u8).collect();
        let path = job.path(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, latin1).unwrap();
    }
    // Not selected: another name, another folder, and the MLTable file itself.
    write(&job, "table/sales/1000/dominicks/notes.csv", "x;y\n1;2\n");
    write(&job, "table/late/1003/other/week1.csv", "x;y\n1;2\n");
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let root = job.path("table");
    let root = root.to_str().unwrap();
    let expected = python(
        &job,
        &format!(
            r#"
import json
import pandas as pd
from pandas._libs.parsers import STR_NA_VALUES
for rel, store, brand, week in [
    ("sales/1000/dominicks/week1.csv", "1000", "dominicks", "1"),
    ("sales/1000/dominicks/week2.csv", "1000", "dominicks", "2"),
    ("sales/1001/tropicana/week1.csv", "1001", "tropicana", "1"),
    ("late/1002/minute/week9.csv", "1002", "minute", "9"),
]:
    frame = pd.read_csv("table/" + rel, sep=";", encoding="latin-1", keep_default_na=False,
                        na_values=sorted(STR_NA_VALUES - {{""}}))
    frame["Store"], frame["Brand"], frame["Week"] = store, brand, week
    frame["Path"] = "{root}/" + rel
    for row in frame.to_dict("records"):
        print(json.dumps(row, sort_keys=True, default=str))
"#
        ),
    );
    assert_eq!(expected.len(), 12);
    assert_eq!(sorted(job.output_lines()), sorted(expected));
}

/// An MLTable shaped as Azure ML's many-models partition step writes it: Store/Brand folders,
/// `include_path_column`, `{Store}/{Brand}/{file_name}.{extension}`, then `drop_columns` of
/// `Path`, `file_name` and `extension` (and here one column of the files): `run()` gets
/// the files' other columns and Store and Brand, one mini-batch per pair.
#[test]
fn drop_columns_takes_columns_of_the_path_and_of_the_files_out() {
    let script = r#"
def run(frame, context):
    assert list(frame.columns) == ["WeekStarting", "Quantity", "Store", "Brand"], list(frame.columns)
    values = context.partition_key_value
    return ["%s/%s %d %d" % (values["Store"], values["Brand"], len(frame), frame["Quantity"].sum())]
"#;
    let job = table_job(
        script,
        "partition_keys = [\"Store\", \"Brand\"]",
        "tabular",
        "paths:\n- pattern: ./**/*.csv\ntransformations:\n- read_delimited: {delimiter: ',', encoding: ascii, header: all_files_same_headers, include_path_column: true}\n- extract_columns_from_partition_format: {partition_format: '{Store}/{Brand}/{file_name}.{extension}'}\n- drop_columns: [Path, file_name, extension]\n- drop_columns: Advert\n",
    );
    let mut expected = Vec::new();
    for (store, brand, weeks) in [
        ("1000", "dominicks", 3),
        ("1000", "tropicana", 2),
        ("2", "minute", 4),
    ] {
        let mut text = String::from("WeekStarting,Quantity,Advert\n");
        let mut total = 0;
        for week in 0..weeks {
            let quantity = week * 10 + store.len();
            total += quantity;
            text.push_str(&format!("1990-06-{:02},{quantity},1\n", 14 + week));
        }
        write(
            &job,
            &format!("table/{store}/{brand}/partitioned_data.csv"),
            &text,
        );
        expected.push(format!("{store}/{brand} {weeks} {total}"));
    }
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sorted(job.output_lines()), sorted(expected));
}

/// A dropped name that is neither a column of the rows nor one from the path fails its
/// mini-batch, naming the column; `partition_keys` naming a dropped column is refused before
/// the run.
#[test]
fn a_dropped_column_that_is_not_there_fails_its_mini_batch_naming_it() {
    let job = table_job(
        "def run(frame):\n    return [len(frame)]\n",
        "run_max_try = 1",
        "tabular",
        "paths:\n- folder: .\ntransformations:\n- read_delimited: {}\n- drop_columns: [units, Nope]\n",
    );
    write(&job, "table/a.csv", "units,price\n1,2\n");
    job.run(&[]);
    let errors = job.log("user/error.txt");
    assert!(
        errors.contains("drop_columns names Nope, which is neither a column of this mini-batch's rows (units, price)"),
        "{errors}"
    );

    let job = table_job(
        "def run(frame):\n    return []\n",
        "partition_keys = [\"Store\", \"file_name\"]",
        "tabular",
        "paths:\n- pattern: ./**/*.csv\ntransformations:\n- read_delimited: {}\n- extract_columns_from_partition_format: '{Store}/{file_name}.csv'\n- drop_columns: file_name\n",
    );
    write(&job, "table/1000/data.csv", "a\n1\n");
    let out = job.run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains("partition_keys: file_name is a column")
            && stderr.contains("drops (drop_columns)"),
        "{stderr}"
    );
    assert!(!job.path("out/logs").exists(), "nothing ran");
}

/// JSON Lines whose stores and brands are in the path: `partition_keys` over those columns
/// makes one mini-batch per pair, holding every file of the pair, and
/// `partition_key_value` holds the path's strings in `partition_keys` order.
#[test]
fn partition_keys_over_columns_from_the_path_group_the_files() {
    let script = r#"
def run(frame, context):
    pairs = sorted(set(zip(frame["Store"], frame["Brand"])))
    assert len(pairs) == 1, pairs
    values = context.partition_key_value
    return ["%s %r %d %d" % ("/".join(values.values()), values, len(frame), frame["units"].sum())]
"#;
    let job = table_job(
        script,
        "partition_keys = [\"Store\", \"Brand\"]\nmini_batch_size = \"1KB\"",
        "tabular",
        "paths:\n  - folder: ./data\ntransformations:\n  - read_json_lines:\n      encoding: utf8\n  - extract_columns_from_partition_format:\n      partition_format: '{Store}/{Brand}/{Part}.jsonl'\n",
    );
    let mut expected = Vec::new();
    for store in ["1000", "1001"] {
        for brand in ["dominicks", "tropicana"] {
            let mut total = 0;
            for part in ["a", "b"] {
                let mut text = String::new();
                for i in 0..40 {
                    let units = i + store.len() + brand.len();
                    total += units;
                    text.push_str(&format!("{{\"units\": {units}, \"part\": \"{part}\"}}\n"));
                }
                write(
                    &job,
                    &format!("table/data/{store}/{brand}/{part}.jsonl"),
                    &text,
                );
            }
            expected.push(format!(
                "{store}/{brand} {{'Store': '{store}', 'Brand': '{brand}'}} 80 {total}"
            ));
        }
    }
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sorted(job.output_lines()), expected);
}

/// `read_parquet` over a pattern, partitioned by a column from the path: Parquet files are
/// whole mini-batches of their key, their rows as pyarrow reads them.
#[test]
fn parquet_files_partitioned_by_a_column_from_the_path() {
    let job = table_job(
        ROWS_AS_JSON,
        "partition_keys = [\"Store\"]",
        "tabular",
        "paths:\n  - pattern: ./*/rows.parquet\ntransformations:\n  - read_parquet\n  - extract_columns_from_partition_format: '{Store}/rows.parquet'\n",
    );
    let expected = python(
        &job,
        r#"
import json, os
import pandas as pd
for store in ["7", "8"]:
    os.makedirs("table/" + store, exist_ok=True)
    frame = pd.DataFrame({"id": range(int(store) * 10), "x": [0.5] * (int(store) * 10)})
    frame.to_parquet("table/%s/rows.parquet" % store, row_group_size=16)
    frame["Store"] = store
    for row in frame.to_dict("records"):
        print(json.dumps(row, sort_keys=True, default=str))
"#,
    );
    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(sorted(job.output_lines()), sorted(expected));
    let report = job.log("sys/job_report/processed_mini-batches.csv");
    assert_eq!(
        report.lines().count(),
        1 + 2,
        "one mini-batch per store:\n{report}"
    );
}

/// A files input whose folder holds an `MLTable`: the items are the files its paths select,
/// never the `MLTable` file.
#[test]
fn a_files_input_is_the_files_the_mltable_selects() {
    let script = "import os\n\ndef run(paths):\n    return [os.path.relpath(p, os.environ['TABLE']) for p in paths]\n";
    for (paths, expected) in [
        (
            "  - pattern: ./img/*.png\n  - file: ./extra/a.txt\n",
            vec!["extra/a.txt", "img/1.png", "img/2.png"],
        ),
        (
            "  - folder: .\n",
            vec!["extra/a.txt", "img/1.png", "img/2.png", "img/notes.txt"],
        ),
    ] {
        let job = table_job(
            script,
            "",
            "files",
            &format!("type: mltable\npaths:\n{paths}"),
        );
        let toml = std::fs::read_to_string(job.path("job.toml")).unwrap();
        let table = job.path("table");
        let toml = toml.replace(
            "output_action",
            &format!(
                "environment_variables = {{ TABLE = {:?} }}\noutput_action",
                table.to_str().unwrap()
            ),
        );
        std::fs::write(job.path("job.toml"), toml).unwrap();
        for file in ["img/1.png", "img/2.png", "img/notes.txt", "extra/a.txt"] {
            write(&job, &format!("table/{file}"), file);
        }
        let out = job.run(&[]);
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(sorted(job.output_lines()), expected, "{paths}");
    }
}

/// What fleetrun does not read is refused before anything runs (exit 2), naming the
/// `MLTable` file and the key; so is a file off the partition format, naming the file.
#[test]
fn what_the_reader_does_not_support_is_refused_naming_the_key() {
    for (kind, mltable, expected) in [
        (
            "tabular",
            "paths:\n  - folder: .\ntransformations:\n  - read_delimited: {}\n  - keep_columns: [a]\n",
            "transformations.keep_columns: not supported",
        ),
        (
            "tabular",
            "paths:\n  - folder: .\ntransformations:\n  - read_delimited:\n      header: from_first_file\n",
            "read_delimited.header: from_first_file not supported",
        ),
        (
            "files",
            "paths:\n  - file: wasbs://c@a.blob.core.windows.net/x.csv\n",
            "paths[0].file: wasbs://c@a.blob.core.windows.net/x.csv cannot be reached here",
        ),
        (
            "tabular",
            "paths:\n  - folder: .\ntraits:\n  timestamp_column: t\n",
            "traits: not supported",
        ),
    ] {
        let job = table_job("def run(b):\n    return b\n", "", kind, mltable);
        write(&job, "table/a.csv", "a\n1\n");
        let out = job.run(&[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{stderr}");
        let file = job.path("table/MLTable");
        let named = format!("input.{kind}: {}: {expected}", file.display());
        assert!(stderr.contains(&named), "expected {named:?} in {stderr}");
        assert!(!job.path("out/logs").exists(), "nothing ran");
    }
    let job = table_job(
        "def run(b):\n    return []\n",
        "",
        "tabular",
        "paths:\n  - pattern: ./**/*.csv\ntransformations:\n  - read_delimited: {}\n  - extract_columns_from_partition_format: '{Store}/data.csv'\n",
    );
    write(&job, "table/1000/data.csv", "a\n1\n");
    write(&job, "table/1001/other.csv", "a\n1\n");
    let out = job.run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains("\"1001/other.csv\" does not end in \"{Store}/data.csv\""),
        "{stderr}"
    );
    assert!(!job.path("out/logs").exists(), "nothing ran");
}
