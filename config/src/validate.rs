//! [`JobFile::validate`]: the rule of every field, the defaults that depend on other
//! fields, and paths made absolute, turning a [`JobFile`] into a [`JobSpec`].

mod location;
mod named;

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::Path;

use self::location::{absolute, local_path, location};
use crate::file::{InputTable, MINI_BATCH_SIZE_EXPECTED, MiniBatchSizeSetting, default};
use crate::{
    FieldError, Input, JobFile, JobSpec, Location, LoggingLevel, MiniBatchSize, OutputAction,
    Tabular, TabularFormat,
};

/// The longest timeout or interval, in seconds (a year): longer ones are typos, and would
/// overflow the clocks they are added to.
const MAX_SECONDS: i64 = 365 * 24 * 60 * 60;
const MAX_RUN_MAX_TRY: i64 = 100;
const MAX_PROCESS_COUNT_PER_NODE: i64 = 1024;
/// The highest job priority.
const MAX_PRIORITY: i64 = 9;

const NAME_RULE: &str = "must be 3-32 characters matching ^[a-z]([-a-z0-9]*[a-z0-9])?$";

impl JobFile {
    /// Checks every field by its rule and fills in the defaults that depend on other
    /// fields, before anything connects or runs. Relative paths are resolved against
    /// `base_dir` (the job file's folder); local scripts, source folders, side inputs and
    /// models must exist. The only I/O is looking at those paths.
    pub fn validate(&self, base_dir: &Path) -> Result<JobSpec, FieldError> {
        let base_dir = location::absolute(base_dir);
        let here = Location::Local(base_dir.clone());
        let seconds = |field: &str, value: i64, min| int_in(field, value, min..=MAX_SECONDS);

        let name = name(required("name", &self.name)?)?;
        let source_directory = self
            .source_directory
            .as_deref()
            .map(|text| {
                existing_folder(
                    "source_directory",
                    location("source_directory", text, &here)?,
                )
            })
            .transpose()?;
        let script_base = source_directory.as_ref().unwrap_or(&here);
        let entry_script = required("entry_script", &self.entry_script)?;
        let entry_script = existing_file(
            "entry_script",
            location("entry_script", entry_script, script_base)?,
        )?;

        let input = input(&self.input, &here)?;
        let side_inputs = named::side_inputs(&self.side_inputs, &here)?;
        let models = named::models(&self.models, &here)?;
        let output_path = required("output.path", &self.output.path)?;
        let output = location("output.path", output_path, &here)?;
        if same_place(&output, input.location()) {
            let rule = match input {
                Input::Files(_) => "must differ from input.files",
                Input::Tabular(_) => "must differ from input.tabular",
            };
            return Err(FieldError::rule("output.path", rule, output_path));
        }
        let output_action = output_action(required("output_action", &self.output_action)?)?;
        let append_row_file_name = file_name("append_row_file_name", &self.append_row_file_name)?;
        let outputs = named::outputs(&self.outputs, &here, &input, &output, &append_row_file_name)?;
        named::check_references(&self.arguments, &side_inputs, &models, &outputs)?;
        let append_row_separator = separator("append_row_separator", &self.append_row_separator)?;

        let mini_batch_size = match &self.mini_batch_size {
            Some(setting) => mini_batch_size(setting, &input)?,
            None => match &input {
                Input::Files(_) => MiniBatchSize::Files(default::MINI_BATCH_FILES),
                Input::Tabular(_) => MiniBatchSize::Bytes(default::MINI_BATCH_BYTES),
            },
        };
        let partition_keys = self
            .partition_keys
            .as_ref()
            .map(|keys| partition_keys(keys, &input))
            .transpose()?;
        named::check_partition_format(
            self.partition_format.as_deref(),
            partition_keys.as_deref(),
            &input,
        )?;
        let error_threshold = int_in(
            "error_threshold",
            self.error_threshold,
            -1..=i32::MAX.into(),
        )?;
        let allowed_failed_count = allowed_failed_count(self.allowed_failed_count)?;
        let allowed_failed_percent =
            percent("allowed_failed_percent", self.allowed_failed_percent)?;

        let run_max_try = int_in("run_max_try", self.run_max_try, 1..=MAX_RUN_MAX_TRY)?;
        let run_invocation_timeout =
            seconds("run_invocation_timeout", self.run_invocation_timeout, 1)?;
        let node_count = int_in("node_count", self.node_count, 1..=u32::MAX.into())?;
        let priority = int_in("priority", self.priority, 0..=MAX_PRIORITY)?;
        let process_count_per_node = self
            .process_count_per_node
            .map(|n| int_in("process_count_per_node", n, 1..=MAX_PROCESS_COUNT_PER_NODE))
            .transpose()?;
        let logging_level = logging_level(&self.logging_level)?;
        let resource_monitor_interval = seconds(
            "resource_monitor_interval",
            self.resource_monitor_interval,
            0,
        )?;
        let first_task_creation_timeout = seconds(
            "first_task_creation_timeout",
            self.first_task_creation_timeout,
            1,
        )?;
        let task_overhead_timeout =
            seconds("task_overhead_timeout", self.task_overhead_timeout, 1)?;
        let progress_update_timeout = match self.progress_update_timeout {
            Some(timeout) => seconds("progress_update_timeout", timeout, 1)?,
            None => default::progress_update_timeout(run_invocation_timeout, run_max_try),
        };
        let environment_variables = environment_variables(&self.environment_variables)?;
        let pass_environment = variable_names("pass_environment", &self.pass_environment)?;
        let environment = self
            .environment
            .as_deref()
            .map(|text| local_path("environment", text, &base_dir))
            .transpose()?;

        Ok(JobSpec {
            name,
            entry_script,
            source_directory,
            arguments: self.arguments.clone(),
            input,
            side_inputs,
            models,
            outputs,
            output,
            output_action,
            append_row_file_name,
            mini_batch_size,
            error_threshold,
            allowed_failed_count,
            allowed_failed_percent,
            run_max_try,
            isolate_failures: self.isolate_failures,
            run_invocation_timeout,
            node_count,
            priority,
            process_count_per_node,
            logging_level,
            resource_monitor_interval,
            partition_keys,
            partition_format: self.partition_format.clone(),
            environment_variables,
            pass_environment,
            append_row_dataframe_header: self.append_row_dataframe_header,
            append_row_separator,
            first_task_creation_timeout,
            progress_update_timeout,
            task_overhead_timeout,
            environment,
            profile: self.profile,
            notify_url: self.notify_url.as_deref().map(notify_url).transpose()?,
            deadline: self.deadline.as_deref().map(deadline).transpose()?,
            settings_from_arguments: Vec::new(),
            mltable: None,
        })
    }
}

/// The rule of `deadline`, as a refusal says it.
const DEADLINE_RULE: &str =
    "must be a duration such as \"30s\", \"90m\", \"24h\" or \"7d\", from 1s to 365d";

/// `deadline`: a whole number of seconds, minutes, hours or days (`30s`, `90m`, `24h`,
/// `7d`), or of seconds alone, from a second to a year; in seconds.
fn deadline(text: &str) -> Result<u64, FieldError> {
    let refused = || FieldError::rule("deadline", DEADLINE_RULE, text);
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale: i64 = match unit.trim() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 60 * 60,
        "d" => 24 * 60 * 60,
        _ => return Err(refused()),
    };
    let seconds = number
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|s| (1..=MAX_SECONDS).contains(s))
        .ok_or_else(refused)?;
    Ok(seconds as u64)
}

/// `notify_url`: an `http://` or `https://` URL with a host, and no spaces.
fn notify_url(url: &str) -> Result<String, FieldError> {
    let host = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
    match host {
        Some(host) if !host.is_empty() && !url.contains(char::is_whitespace) => Ok(url.to_owned()),
        _ => Err(FieldError::rule(
            "notify_url",
            "must be an http:// or https:// URL with a host",
            url,
        )),
    }
}

fn required<'a>(field: &str, value: &'a Option<String>) -> Result<&'a str, FieldError> {
    value.as_deref().ok_or_else(|| FieldError::missing(field))
}

/// An integer within `range`, converted to the type the spec stores it in.
fn int_in<T: TryFrom<i64>>(
    field: &str,
    n: i64,
    range: RangeInclusive<i64>,
) -> Result<T, FieldError> {
    let out_of_range = || {
        let rule = match (range.start(), range.end()) {
            (lo, &i64::MAX) => format!("must be at least {lo}"),
            (lo, hi) => format!("must be between {lo} and {hi}"),
        };
        FieldError::rule(field, rule, n)
    };
    if !range.contains(&n) {
        return Err(out_of_range());
    }
    T::try_from(n).map_err(|_| out_of_range())
}

/// A percentage, 0 to 100.
fn percent(field: &str, n: f64) -> Result<f64, FieldError> {
    if (0.0..=100.0).contains(&n) {
        Ok(n)
    } else {
        // `101`, not `101.0`: as a person writes it.
        Err(FieldError::rule(
            field,
            "must be between 0 and 100",
            format_args!("{n}"),
        ))
    }
}

fn name(name: &str) -> Result<String, FieldError> {
    let bytes = name.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let valid = (3..=32).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes.iter().all(allowed)
        && !name.ends_with('-');
    if valid {
        Ok(name.to_owned())
    } else {
        Err(FieldError::rule("name", NAME_RULE, name))
    }
}

/// A local folder must exist; an S3 one is taken on trust.
fn existing_folder(field: &str, location: Location) -> Result<Location, FieldError> {
    match &location {
        Location::Local(path) if !path.is_dir() => {
            let rule = if path.exists() {
                "must be a folder"
            } else {
                "folder not found"
            };
            Err(FieldError::path_rule(field, rule, path))
        }
        _ => Ok(location),
    }
}

/// A local file must exist; an S3 one is taken on trust.
fn existing_file(field: &str, location: Location) -> Result<Location, FieldError> {
    match &location {
        Location::Local(path) if !path.is_file() => {
            let rule = if path.is_dir() {
                "must be a file, not a folder"
            } else {
                "file not found"
            };
            Err(FieldError::path_rule(field, rule, path))
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

fn output_action(action: &str) -> Result<OutputAction, FieldError> {
    match action.to_ascii_lowercase().as_str() {
        "append_row" => Ok(OutputAction::AppendRow),
        "summary_only" => Ok(OutputAction::SummaryOnly),
        _ => Err(FieldError::rule(
            "output_action",
            r#"must be "append_row" or "summary_only""#,
            action,
        )),
    }
}

/// A name for a file inside the output folder, never a path out of it.
fn file_name(field: &str, name: &str) -> Result<String, FieldError> {
    let plain = !matches!(name, "" | "." | "..") && !name.contains(['/', '\\', '\0']);
    if plain {
        Ok(name.to_owned())
    } else {
        let rule = r#"must be a plain file name, without "/" or "..""#;
        Err(FieldError::rule(field, rule, name))
    }
}

/// A number of files (`10`, or `"10"` as ParallelRunConfig takes it) for a file input; a
/// number of bytes (`"10MB"`, or a bare number) for a tabular one.
fn mini_batch_size(
    setting: &MiniBatchSizeSetting,
    input: &Input,
) -> Result<MiniBatchSize, FieldError> {
    const FIELD: &str = "mini_batch_size";
    let rule = |rule: &str| match setting {
        MiniBatchSizeSetting::Count(n) => FieldError::rule(FIELD, rule, n),
        MiniBatchSizeSetting::Text(text) => FieldError::rule(FIELD, rule, text),
    };
    let at_least_one = |n: u64| {
        if n >= 1 {
            Ok(n)
        } else {
            Err(rule("must be at least 1"))
        }
    };
    let count = |n: i64| u64::try_from(n).map_err(|_| rule("must be at least 1"));
    match (input, setting) {
        (Input::Files(_), MiniBatchSizeSetting::Count(n)) => {
            Ok(MiniBatchSize::Files(at_least_one(count(*n)?)?))
        }
        (Input::Files(_), MiniBatchSizeSetting::Text(text)) => {
            let text = text.trim();
            if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
                let files = text
                    .parse::<u64>()
                    .map_err(|_| rule(&format!("expected {MINI_BATCH_SIZE_EXPECTED}")))?;
                Ok(MiniBatchSize::Files(at_least_one(files)?))
            } else if byte_size(text).is_some() {
                Err(rule("a file input takes a number of files, not a size"))
            } else {
                Err(rule(&format!("expected {MINI_BATCH_SIZE_EXPECTED}")))
            }
        }
        (Input::Tabular(_), MiniBatchSizeSetting::Count(n)) => {
            Ok(MiniBatchSize::Bytes(at_least_one(count(*n)?)?))
        }
        (Input::Tabular(_), MiniBatchSizeSetting::Text(text)) => byte_size(text)
            .map(MiniBatchSize::Bytes)
            .ok_or_else(|| {
                rule(r#"a tabular input takes a size such as "64KB", "1MB", "1GB" or a number of bytes (KB = 1024 bytes)"#)
            }),
    }
}

/// `[input]`: `files`, or `tabular` with its `format` and `separator`.
fn input(table: &InputTable, here: &Location) -> Result<Input, FieldError> {
    let local = |field: &str, text: &str| location(field, text, here);
    match (&table.files, &table.tabular) {
        (Some(_), Some(tabular)) => Err(FieldError::rule(
            "input.tabular",
            "set input.files or input.tabular, not both",
            tabular,
        )),
        (files, None) => {
            let tabular_only = [
                ("input.format", &table.format),
                ("input.separator", &table.separator),
            ];
            if let Some((field, Some(value))) = tabular_only.iter().find(|(_, v)| v.is_some()) {
                return Err(FieldError::rule(field, "only for input.tabular", value));
            }
            match files {
                Some(files) => Ok(Input::Files(local("input.files", files)?)),
                None => Err(FieldError::missing("input.files")),
            }
        }
        (None, Some(tabular)) => Ok(Input::Tabular(Tabular {
            location: local("input.tabular", tabular)?,
            format: table.format.as_deref().map(tabular_format).transpose()?,
            separator: match &table.separator {
                Some(separator) => self::separator("input.separator", separator)?,
                None => default::CSV_SEPARATOR,
            },
        })),
    }
}

fn tabular_format(format: &str) -> Result<TabularFormat, FieldError> {
    match format.to_ascii_lowercase().as_str() {
        "csv" => Ok(TabularFormat::Csv),
        "jsonl" | "json" | "json_lines" | "ndjson" => Ok(TabularFormat::JsonLines),
        "parquet" => Ok(TabularFormat::Parquet),
        _ => Err(FieldError::rule(
            "input.format",
            r#"must be "csv", "jsonl" or "parquet""#,
            format,
        )),
    }
}

/// One ASCII character that can separate CSV fields (`","`, `";"`, `"\t"`, `" "`).
fn separator(field: &str, separator: &str) -> Result<u8, FieldError> {
    match separator.as_bytes() {
        [byte] if byte.is_ascii() && !matches!(byte, b'"' | b'\n' | b'\r') => Ok(*byte),
        _ => Err(FieldError::rule(
            field,
            r#"must be one ASCII character other than a quote or a newline, such as "," or "\t""#,
            separator,
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

fn partition_keys(keys: &[String], input: &Input) -> Result<Vec<String>, FieldError> {
    // Rows (tabular) or files (with `partition_format`, checked there) sharing the keys'
    // values form one mini-batch.
    match input {
        Input::Files(_) => Ok(keys.to_vec()),
        Input::Tabular(tabular) => tabular_partition_keys(keys, tabular),
    }
}

/// Column names, at least one, each once; CSV and JSON Lines only (not yet Parquet).
fn tabular_partition_keys(keys: &[String], tabular: &Tabular) -> Result<Vec<String>, FieldError> {
    const FIELD: &str = "partition_keys";
    let distinct: std::collections::BTreeSet<&String> = keys.iter().collect();
    if keys.is_empty() || keys.iter().any(String::is_empty) || distinct.len() != keys.len() {
        let rule = "must name at least one column, each once";
        return Err(FieldError::rule(FIELD, rule, keys));
    }
    let parquet = match tabular.format {
        Some(format) => format == TabularFormat::Parquet,
        None => {
            TabularFormat::of_key(&tabular.location.to_string()) == Some(TabularFormat::Parquet)
        }
    };
    if parquet {
        let rule = "not yet supported for Parquet inputs (CSV and JSON Lines only)";
        return Err(FieldError::rule(FIELD, rule, keys));
    }
    Ok(keys.to_vec())
}

/// `-1` is no limit (`None`), as in ParallelRunConfig.
fn allowed_failed_count(count: i64) -> Result<Option<u64>, FieldError> {
    match count {
        -1 => Ok(None),
        count => u64::try_from(count).map(Some).map_err(|_| {
            let rule = "must be -1 (no limit) or at least 0";
            FieldError::rule("allowed_failed_count", rule, count)
        }),
    }
}

fn logging_level(level: &str) -> Result<LoggingLevel, FieldError> {
    [
        LoggingLevel::Warning,
        LoggingLevel::Info,
        LoggingLevel::Debug,
    ]
    .into_iter()
    .find(|known| known.as_str().eq_ignore_ascii_case(level))
    .ok_or_else(|| {
        let rule = r#"must be "WARNING", "INFO" or "DEBUG""#;
        FieldError::rule("logging_level", rule, level)
    })
}

/// Variable names as the OS takes them.
fn environment_variables(
    variables: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, FieldError> {
    variable_names("environment_variables", variables.keys())?;
    Ok(variables.clone())
}

/// Refuses a name the OS would not take as a variable's.
fn variable_names<'a>(
    field: &str,
    names: impl IntoIterator<Item = &'a String>,
) -> Result<Vec<String>, FieldError> {
    let mut taken = Vec::new();
    for name in names {
        if name.is_empty() || name.contains(['=', '\0']) {
            let rule = r#"names must be non-empty and without "=""#;
            return Err(FieldError::rule(field, rule, name));
        }
        taken.push(name.clone());
    }
    Ok(taken)
}

/// A location given on a command line: an `s3://` URI, or a path against the current
/// folder.
pub(crate) fn command_line_location(text: &str) -> Result<Location, FieldError> {
    location("location", text, &Location::Local(absolute(Path::new("."))))
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
    fn int_in_names_the_range() {
        let problem = |err: FieldError| err.to_string();
        let err = int_in::<i64>("n", 0, 1..=i64::MAX).unwrap_err();
        assert_eq!(problem(err), "n: must be at least 1 (got 0)");
        let err = int_in::<i64>("n", 101, 1..=100).unwrap_err();
        assert_eq!(problem(err), "n: must be between 1 and 100 (got 101)");
        assert_eq!(int_in::<u32>("n", 7, 1..=100), Ok(7));
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
