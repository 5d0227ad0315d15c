//! The job file's fields, each read by its rule and assembled into a [`JobSpec`].

use std::collections::BTreeMap;
use std::path::Path;

use toml::{Table, Value};

use super::location::{local_path, location};
use super::named;
use super::read::{self, Fault, int_in, number_in};
use crate::{
    Input, JobSpec, Location, LoggingLevel, MiniBatchSize, OutputAction, Tabular, TabularFormat,
};

/// The defaults of CONTRACT.md §2.
mod default {
    pub(super) const APPEND_ROW_FILE_NAME: &str = "parallel_run_step.txt";
    pub(super) const MINI_BATCH_FILES: u64 = 10;
    /// `1MB`, ParallelRunConfig's default for tabular inputs.
    pub(super) const MINI_BATCH_BYTES: u64 = 1 << 20;
    pub(super) const CSV_SEPARATOR: u8 = b',';
    /// ParallelRunStep writes a DataFrame's values separated by a space.
    pub(super) const APPEND_ROW_SEPARATOR: u8 = b' ';
    pub(super) const ERROR_THRESHOLD: i64 = -1;
    pub(super) const ALLOWED_FAILED_PERCENT: f64 = 100.0;
    pub(super) const RUN_MAX_TRY: u32 = 3;
    pub(super) const RUN_INVOCATION_TIMEOUT: u64 = 60;
    pub(super) const NODE_COUNT: u32 = 1;
    pub(super) const RESOURCE_MONITOR_INTERVAL: u64 = 600;
    pub(super) const FIRST_TASK_CREATION_TIMEOUT: u64 = 600;
    const MIN_PROGRESS_UPDATE_TIMEOUT: u64 = 300;

    /// Every attempt of one mini-batch may time out before the job counts as stalled.
    pub(super) const fn progress_update_timeout(
        run_invocation_timeout: u64,
        run_max_try: u32,
    ) -> u64 {
        let all_attempts = run_invocation_timeout.saturating_mul(run_max_try as u64);
        if all_attempts > MIN_PROGRESS_UPDATE_TIMEOUT {
            all_attempts
        } else {
            MIN_PROGRESS_UPDATE_TIMEOUT
        }
    }
}

/// The longest timeout or interval, in seconds (a year): longer ones are typos, and would
/// overflow the clocks they are added to.
const MAX_SECONDS: i64 = 365 * 24 * 60 * 60;
const MAX_RUN_MAX_TRY: i64 = 100;
const MAX_PROCESS_COUNT_PER_NODE: i64 = 1024;

const NAME_RULE: &str = "must be 3-32 characters matching ^[a-z]([-a-z0-9]*[a-z0-9])?$";
const MINI_BATCH_SIZE_EXPECTED: &str = r#"a number of files or a size such as "10MB""#;

/// A job file, overrides applied and keys checked, and the folder its paths start from.
struct Doc<'a> {
    table: &'a Table,
    base_dir: &'a Path,
}

impl<'a> Doc<'a> {
    /// The value of a field, tables' fields dotted (`input.files`).
    fn get(&self, field: &str) -> Option<&'a Value> {
        match field.split_once('.') {
            Some((table, key)) => self.table.get(table)?.as_table()?.get(key),
            None => self.table.get(field),
        }
    }

    fn required<T>(
        &self,
        field: &str,
        read: impl FnOnce(&str, &'a Value) -> Result<T, Fault>,
    ) -> Result<T, Fault> {
        let value = self.get(field).ok_or_else(|| Fault::missing(field))?;
        read(field, value)
    }

    fn optional<T>(
        &self,
        field: &str,
        read: impl FnOnce(&str, &'a Value) -> Result<T, Fault>,
    ) -> Result<Option<T>, Fault> {
        self.get(field).map(|value| read(field, value)).transpose()
    }
}

/// Reads every field of `table`, relative paths against `base_dir` (absolute).
pub(super) fn build(table: &Table, base_dir: &Path) -> Result<JobSpec, Fault> {
    let doc = Doc { table, base_dir };
    let here = Location::Local(base_dir.to_path_buf());
    let local = |field: &str, value: &Value| location(field, value, &here);
    let seconds = |min| move |field: &str, value: &Value| int_in(field, value, min..=MAX_SECONDS);

    let name = doc.required("name", name)?;
    let source_directory = doc.optional("source_directory", |field, value| {
        existing_folder(field, local(field, value)?)
    })?;
    let script_base = source_directory.as_ref().unwrap_or(&here);
    let entry_script = doc.required("entry_script", |field, value| {
        existing_file(field, location(field, value, script_base)?)
    })?;
    let arguments = doc.optional("arguments", read::lenient_string_list)?;

    let input = input(&doc, &local)?;
    let side_inputs = doc.optional("side_inputs", |field, value| {
        named::side_inputs(field, value, &here)
    })?;
    let models = doc.optional("models", |field, value| named::models(field, value, &here))?;
    named::check_references(
        arguments.as_deref().unwrap_or_default(),
        side_inputs.as_ref(),
        models.as_ref(),
    )?;
    let output = doc.required("output.path", local)?;
    if same_place(&output, input.location()) {
        let value = doc.get("output.path").expect("output.path was read");
        let rule = match input {
            Input::Files(_) => "must differ from input.files",
            Input::Tabular(_) => "must differ from input.tabular",
        };
        return Err(Fault::rule("output.path", rule, value));
    }
    let output_action = doc.required("output_action", output_action)?;
    let append_row_file_name = doc.optional("append_row_file_name", file_name)?;
    let append_row_dataframe_header = doc.optional("append_row_dataframe_header", read::boolean)?;
    let append_row_separator = doc.optional("append_row_separator", separator)?;

    let mini_batch_size = doc.optional("mini_batch_size", |field, value| {
        mini_batch_size(field, value, &input)
    })?;
    let partition_keys = doc.optional("partition_keys", |field, value| {
        partition_keys(field, value, &input)
    })?;
    let partition_format = doc.optional("partition_format", read::string)?;
    named::check_partition_format(
        partition_format,
        partition_keys.as_deref(),
        doc.get("partition_keys"),
        &input,
    )?;
    let error_threshold = doc.optional("error_threshold", |field, value| {
        int_in(field, value, -1..=i32::MAX.into())
    })?;
    let allowed_failed_count = doc.optional("allowed_failed_count", allowed_failed_count)?;
    let allowed_failed_percent = doc.optional("allowed_failed_percent", |field, value| {
        number_in(field, value, 0.0..=100.0)
    })?;

    let run_max_try = doc.optional("run_max_try", |field, value| {
        int_in(field, value, 1..=MAX_RUN_MAX_TRY)
    })?;
    let run_invocation_timeout = doc.optional("run_invocation_timeout", seconds(1))?;
    let node_count = doc.optional("node_count", |field, value| {
        int_in(field, value, 1..=u32::MAX.into())
    })?;
    let process_count_per_node = doc.optional("process_count_per_node", |field, value| {
        int_in(field, value, 1..=MAX_PROCESS_COUNT_PER_NODE)
    })?;
    let logging_level = doc.optional("logging_level", logging_level)?;
    let resource_monitor_interval = doc.optional("resource_monitor_interval", seconds(0))?;
    let first_task_creation_timeout = doc.optional("first_task_creation_timeout", seconds(1))?;
    let progress_update_timeout = doc.optional("progress_update_timeout", seconds(1))?;
    let environment_variables = doc.optional("environment_variables", environment_variables)?;
    let profile = doc.optional("profile", read::boolean)?;
    let environment = doc.optional("environment", |field, value| {
        local_path(field, value, doc.base_dir)
    })?;

    let mini_batch_size = mini_batch_size.unwrap_or(match &input {
        Input::Files(_) => MiniBatchSize::Files(default::MINI_BATCH_FILES),
        Input::Tabular(_) => MiniBatchSize::Bytes(default::MINI_BATCH_BYTES),
    });
    let run_max_try = run_max_try.unwrap_or(default::RUN_MAX_TRY);
    let run_invocation_timeout = run_invocation_timeout.unwrap_or(default::RUN_INVOCATION_TIMEOUT);
    Ok(JobSpec {
        name,
        entry_script,
        source_directory,
        arguments: arguments.unwrap_or_default(),
        input,
        side_inputs: side_inputs.unwrap_or_default(),
        models: models.unwrap_or_default(),
        partition_format: partition_format.map(str::to_owned),
        output,
        output_action,
        append_row_file_name: append_row_file_name
            .unwrap_or_else(|| default::APPEND_ROW_FILE_NAME.to_owned()),
        mini_batch_size,
        error_threshold: error_threshold.unwrap_or(default::ERROR_THRESHOLD),
        allowed_failed_count: allowed_failed_count.flatten(),
        allowed_failed_percent: allowed_failed_percent.unwrap_or(default::ALLOWED_FAILED_PERCENT),
        run_max_try,
        run_invocation_timeout,
        node_count: node_count.unwrap_or(default::NODE_COUNT),
        process_count_per_node,
        logging_level: logging_level.unwrap_or(LoggingLevel::Info),
        resource_monitor_interval: resource_monitor_interval
            .unwrap_or(default::RESOURCE_MONITOR_INTERVAL),
        partition_keys,
        environment_variables: environment_variables.unwrap_or_default(),
        append_row_dataframe_header: append_row_dataframe_header.unwrap_or(false),
        append_row_separator: append_row_separator.unwrap_or(default::APPEND_ROW_SEPARATOR),
        first_task_creation_timeout: first_task_creation_timeout
            .unwrap_or(default::FIRST_TASK_CREATION_TIMEOUT),
        progress_update_timeout: progress_update_timeout.unwrap_or(
            default::progress_update_timeout(run_invocation_timeout, run_max_try),
        ),
        environment,
        profile: profile.unwrap_or(false),
    })
}

fn name(field: &str, value: &Value) -> Result<String, Fault> {
    let name = read::string(field, value)?;
    let bytes = name.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let valid = (3..=32).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes.iter().all(allowed)
        && !name.ends_with('-');
    if valid {
        Ok(name.to_owned())
    } else {
        Err(Fault::rule(field, NAME_RULE, value))
    }
}

/// A local folder must exist; an S3 one is taken on trust.
fn existing_folder(field: &str, location: Location) -> Result<Location, Fault> {
    match &location {
        Location::Local(path) if !path.is_dir() => {
            let rule = if path.exists() {
                "must be a folder"
            } else {
                "folder not found"
            };
            Err(Fault::path_rule(field, rule, path))
        }
        _ => Ok(location),
    }
}

/// A local file must exist; an S3 one is taken on trust.
fn existing_file(field: &str, location: Location) -> Result<Location, Fault> {
    match &location {
        Location::Local(path) if !path.is_file() => {
            let rule = if path.is_dir() {
                "must be a file, not a folder"
            } else {
                "file not found"
            };
            Err(Fault::path_rule(field, rule, path))
        }
        _ => Ok(location),
    }
}

/// Whether two locations name the same folder (`s3://b/p` and `s3://b/p/` do).
fn same_place(a: &Location, b: &Location) -> bool {
    match (a, b) {
        (
            Location::S3 { bucket, prefix },
            Location::S3 {
                bucket: other_bucket,
                prefix: other_prefix,
            },
        ) => {
            bucket == other_bucket
                && prefix.trim_end_matches('/') == other_prefix.trim_end_matches('/')
        }
        _ => a == b,
    }
}

fn output_action(field: &str, value: &Value) -> Result<OutputAction, Fault> {
    match read::string(field, value)?.to_ascii_lowercase().as_str() {
        "append_row" => Ok(OutputAction::AppendRow),
        "summary_only" => Ok(OutputAction::SummaryOnly),
        _ => Err(Fault::rule(
            field,
            r#"must be "append_row" or "summary_only""#,
            value,
        )),
    }
}

/// A name for a file inside the output folder, never a path out of it.
fn file_name(field: &str, value: &Value) -> Result<String, Fault> {
    let name = read::string(field, value)?;
    let plain = !matches!(name, "" | "." | "..") && !name.contains(['/', '\\', '\0']);
    if plain {
        Ok(name.to_owned())
    } else {
        let rule = r#"must be a plain file name, without "/" or "..""#;
        Err(Fault::rule(field, rule, value))
    }
}

/// A number of files (`10`, or `"10"` as ParallelRunConfig takes it) for a file input; a
/// number of bytes (`"10MB"`, or a bare number) for a tabular one.
fn mini_batch_size(field: &str, value: &Value, input: &Input) -> Result<MiniBatchSize, Fault> {
    let expected = || Fault::rule(field, format!("expected {MINI_BATCH_SIZE_EXPECTED}"), value);
    let text = match value {
        Value::Integer(_) => None,
        Value::String(text) => Some(text.trim()),
        _ => return Err(Fault::wrong_type(field, MINI_BATCH_SIZE_EXPECTED, value)),
    };
    let at_least_one = |n: u64| {
        if n >= 1 {
            Ok(n)
        } else {
            Err(Fault::rule(field, "must be at least 1", value))
        }
    };
    match (input, text) {
        (Input::Files(_), None) => Ok(MiniBatchSize::Files(int_in(field, value, 1..=i64::MAX)?)),
        (Input::Files(_), Some(text)) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            let files = text.parse::<u64>().map_err(|_| expected())?;
            Ok(MiniBatchSize::Files(at_least_one(files)?))
        }
        (Input::Files(_), Some(text)) => match byte_size(text) {
            Some(_) => {
                let rule = "a file input takes a number of files, not a size";
                Err(Fault::rule(field, rule, value))
            }
            None => Err(expected()),
        },
        (Input::Tabular(_), None) => Ok(MiniBatchSize::Bytes(int_in(field, value, 1..=i64::MAX)?)),
        (Input::Tabular(_), Some(text)) => byte_size(text)
            .map(MiniBatchSize::Bytes)
            .ok_or_else(|| {
                let rule = r#"a tabular input takes a size such as "64KB", "1MB", "1GB" or a number of bytes (KB = 1024 bytes)"#;
                Fault::rule(field, rule, value)
            }),
    }
}

/// `[input]`: `files`, or `tabular` with its `format` and `separator`.
fn input(
    doc: &Doc<'_>,
    local: &impl Fn(&str, &Value) -> Result<Location, Fault>,
) -> Result<Input, Fault> {
    let tabular_only = ["input.format", "input.separator"];
    match (doc.get("input.files"), doc.get("input.tabular")) {
        (Some(_), Some(value)) => Err(Fault::rule(
            "input.tabular",
            "set input.files or input.tabular, not both",
            value,
        )),
        (files, None) => {
            if let Some(field) = tabular_only.iter().find(|f| doc.get(f).is_some()) {
                let value = doc.get(field).expect("found above");
                return Err(Fault::rule(field, "only for input.tabular", value));
            }
            match files {
                Some(value) => Ok(Input::Files(local("input.files", value)?)),
                None => Err(Fault::missing("input.files")),
            }
        }
        (None, Some(value)) => {
            let location = local("input.tabular", value)?;
            let format = doc.optional("input.format", tabular_format)?;
            let separator = doc.optional("input.separator", self::separator)?;
            Ok(Input::Tabular(Tabular {
                location,
                format,
                separator: separator.unwrap_or(default::CSV_SEPARATOR),
            }))
        }
    }
}

fn tabular_format(field: &str, value: &Value) -> Result<TabularFormat, Fault> {
    match read::string(field, value)?.to_ascii_lowercase().as_str() {
        "csv" => Ok(TabularFormat::Csv),
        "jsonl" | "json" | "json_lines" | "ndjson" => Ok(TabularFormat::JsonLines),
        "parquet" => Ok(TabularFormat::Parquet),
        _ => Err(Fault::rule(
            field,
            r#"must be "csv", "jsonl" or "parquet""#,
            value,
        )),
    }
}

/// One ASCII character that can separate CSV fields (`","`, `";"`, `"\t"`, `" "`).
fn separator(field: &str, value: &Value) -> Result<u8, Fault> {
    match read::string(field, value)?.as_bytes() {
        [byte] if byte.is_ascii() && !matches!(byte, b'"' | b'\n' | b'\r') => Ok(*byte),
        _ => Err(Fault::rule(
            field,
            r#"must be one ASCII character other than a quote or a newline, such as "," or "\t""#,
            value,
        )),
    }
}

/// `1024`, `1024KB`, `10 mb`, `1GB` → bytes (KB = 1024). Zero is not a size.
fn byte_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let multiplier: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        _ => return None,
    };
    let bytes = digits.parse::<u64>().ok()?.checked_mul(multiplier)?;
    (bytes > 0).then_some(bytes)
}

fn partition_keys(field: &str, value: &Value, input: &Input) -> Result<Vec<String>, Fault> {
    let keys = read::string_list(field, value)?;
    // Rows (tabular) or files (with `partition_format`, checked there) sharing the keys'
    // values form one mini-batch.
    match input {
        Input::Files(_) => Ok(keys),
        Input::Tabular(tabular) => tabular_partition_keys(field, value, tabular, keys),
    }
}

/// Column names, at least one, each once; CSV and JSON Lines only (not yet Parquet).
fn tabular_partition_keys(
    field: &str,
    value: &Value,
    tabular: &Tabular,
    keys: Vec<String>,
) -> Result<Vec<String>, Fault> {
    let distinct: std::collections::BTreeSet<&String> = keys.iter().collect();
    if keys.is_empty() || keys.iter().any(String::is_empty) || distinct.len() != keys.len() {
        let rule = "must name at least one column, each once";
        return Err(Fault::rule(field, rule, value));
    }
    let parquet = match tabular.format {
        Some(format) => format == TabularFormat::Parquet,
        None => {
            TabularFormat::of_key(&tabular.location.to_string()) == Some(TabularFormat::Parquet)
        }
    };
    if parquet {
        let rule = "not yet supported for Parquet inputs (CSV and JSON Lines only)";
        return Err(Fault::rule(field, rule, value));
    }
    Ok(keys)
}

/// `-1` is no limit (`None`), as in ParallelRunConfig.
fn allowed_failed_count(field: &str, value: &Value) -> Result<Option<u64>, Fault> {
    match value.as_integer() {
        Some(-1) => Ok(None),
        Some(count) => u64::try_from(count)
            .map(Some)
            .map_err(|_| Fault::rule(field, "must be -1 (no limit) or at least 0", value)),
        None => Err(Fault::wrong_type(field, "an integer", value)),
    }
}

fn logging_level(field: &str, value: &Value) -> Result<LoggingLevel, Fault> {
    let level = read::string(field, value)?;
    [
        LoggingLevel::Warning,
        LoggingLevel::Info,
        LoggingLevel::Debug,
    ]
    .into_iter()
    .find(|known| known.as_str().eq_ignore_ascii_case(level))
    .ok_or_else(|| Fault::rule(field, r#"must be "WARNING", "INFO" or "DEBUG""#, value))
}

/// Variable names as the OS takes them; values may be numbers or booleans, as written.
fn environment_variables(field: &str, value: &Value) -> Result<BTreeMap<String, String>, Fault> {
    read::table(field, value)?
        .iter()
        .map(|(name, value)| {
            if name.is_empty() || name.contains(['=', '\0']) {
                let rule = r#"names must be non-empty and without "=""#;
                return Err(Fault::rule(field, rule, &Value::String(name.clone())));
            }
            let value = read::lenient_string(&format!("{field}.{name}"), value)?;
            Ok((name.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(byte_size("1024"), Some(1024));
        assert_eq!(byte_size("1024KB"), Some(1024 * 1024));
        assert_eq!(byte_size("10 mb"), Some(10 << 20));
        assert_eq!(byte_size("1GB"), Some(1 << 30));
        assert_eq!(byte_size("5b"), Some(5));
        for bad in ["", "0", "MB", "1.5MB", "1MiB", "-1", "99999999999999GB"] {
            assert_eq!(byte_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn progress_update_timeout_covers_every_attempt() {
        assert_eq!(default::progress_update_timeout(60, 3), 300);
        assert_eq!(default::progress_update_timeout(200, 3), 600);
        assert_eq!(default::progress_update_timeout(u64::MAX, 3), u64::MAX);
    }

    #[test]
    fn s3_prefixes_compare_without_trailing_slash() {
        let at = |prefix: &str| Location::S3 {
            bucket: "bkt".into(),
            prefix: prefix.into(),
        };
        assert!(same_place(&at("data"), &at("data/")));
        assert!(!same_place(&at("data"), &at("data2")));
    }
}
