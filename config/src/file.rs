//! The job as users write it: one serde type for the TOML job file, the `--set` overrides
//! layered onto it and the JSON an API client sends. [`JobFile::validate`] turns it into a
//! [`JobSpec`](crate::JobSpec).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A job as written (CONTRACT.md §2), before any rule is checked: paths as written, choices
/// as strings, counts as signed integers, so that a broken rule can be reported with the
/// value given. Required fields are `Option`s here, so that a missing one is reported by
/// name like every other rule. Tables (`[input]`, `[output]`) are nested structs; keys are
/// refused unless a field below names them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// The job (step) name: 3–32 characters, `^[a-z]([-a-z0-9]*[a-z0-9])?$`. Required.
    pub name: Option<String>,
    /// The entry script: relative to `source_directory` when that is set, else to the job
    /// file's folder; a local one must exist. Required.
    pub entry_script: Option<String>,
    /// The folder shipped with the script and importable from it, relative to the job
    /// file's folder; a local one must exist.
    pub source_directory: Option<String>,
    /// The script's `sys.argv[1:]`. Numbers and booleans are taken as written
    /// (`["--n", 5]`), as users coming from YAML write them.
    #[serde(default, deserialize_with = "lenient_strings")]
    pub arguments: Vec<String>,
    /// What is partitioned: `[input] files = "..."` or `[input] tabular = "..."`.
    #[serde(default, deserialize_with = "table")]
    pub input: InputTable,
    /// Reference data every node gets whole: `[side_inputs] name = "path"`, or a list of
    /// paths, each named after its last component.
    #[serde(default)]
    pub side_inputs: SideInputPaths,
    /// Models every node gets whole: `[models] name = "path-or-s3-prefix"`.
    #[serde(default)]
    pub models: NamedPaths,
    /// Folders the script writes files to, by name (AML v2's named outputs):
    /// `[outputs] name = "folder-or-s3-prefix"`; `${{outputs.name}}` in `arguments` is a
    /// folder of each runner's own whose files reach it after every mini-batch.
    #[serde(default)]
    pub outputs: NamedPaths,
    /// Where results go: `[output] path = "..."`.
    #[serde(default, deserialize_with = "table")]
    pub output: OutputTable,
    /// `"append_row"` or `"summary_only"` (any case). Required.
    pub output_action: Option<String>,
    /// The one `append_row` file in the output folder: a plain file name.
    #[serde(default = "default::append_row_file_name")]
    pub append_row_file_name: String,
    /// A number of files (file inputs, also as a string: `"10"`), or a size such as
    /// `"10MB"` or a number of bytes (tabular inputs). Defaults to
    /// [`default::MINI_BATCH_FILES`] files or [`default::MINI_BATCH_BYTES`] bytes.
    pub mini_batch_size: Option<MiniBatchSizeSetting>,
    /// Failed items tolerated over the whole input, `-1` to `i32::MAX`; `-1` ignores all
    /// failures.
    #[serde(default = "default::error_threshold")]
    pub error_threshold: i64,
    /// Failed mini-batches tolerated; `-1` = no limit.
    #[serde(default = "default::allowed_failed_count")]
    pub allowed_failed_count: i64,
    /// Failed mini-batches tolerated as a percentage of all mini-batches (0–100).
    #[serde(default = "default::allowed_failed_percent")]
    pub allowed_failed_percent: f64,
    /// Attempts of `run()` per mini-batch (1–100).
    #[serde(default = "default::run_max_try")]
    pub run_max_try: i64,
    /// A mini-batch of several items that failed its `run_max_try` attempts is split in
    /// halves, each run again, down to the items that fail alone (false: the mini-batch fails
    /// whole, as in ParallelRunStep).
    #[serde(default = "default::isolate_failures")]
    pub isolate_failures: bool,
    /// Seconds one `run()` call may take (1 to a year).
    #[serde(default = "default::run_invocation_timeout")]
    pub run_invocation_timeout: i64,
    /// Worker machines to run on (at least 1).
    #[serde(default = "default::node_count")]
    pub node_count: i64,
    /// 0 to 9: a pool's nodes give their runners to the jobs of the highest priority that
    /// have work first, and share them evenly among jobs of the same priority.
    #[serde(default)]
    pub priority: i64,
    /// Runner processes per node (1–1024); unset = 1 on a GPU machine, the number of cores
    /// otherwise.
    pub process_count_per_node: Option<i64>,
    /// `"WARNING"`, `"INFO"` or `"DEBUG"` (any case): the level of the script's logger and
    /// of fleetrun's own logs.
    #[serde(default = "default::logging_level")]
    pub logging_level: String,
    /// Seconds between resource checks (0 to a year); 0 turns them off.
    #[serde(default = "default::resource_monitor_interval")]
    pub resource_monitor_interval: i64,
    /// Columns (tabular inputs) or path parts named by `partition_format` (file inputs)
    /// whose shared values make one mini-batch.
    pub partition_keys: Option<Vec<String>>,
    /// File inputs: the parts of each file's path that `partition_keys` name
    /// (`{user}/{genres}/{name}.txt`).
    pub partition_format: Option<String>,
    /// Set in every worker process. Values may be numbers or booleans, taken as written.
    #[serde(default, deserialize_with = "lenient_string_map")]
    pub environment_variables: BTreeMap<String, String>,
    /// Variables of the worker's environment that fleetrun keeps from the runners (its
    /// broker and ledger URLs, storage credentials) and this job's runners get all the same,
    /// by name (`["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]`).
    #[serde(default)]
    pub pass_environment: Vec<String>,
    /// Write the DataFrame header once at the top of the `append_row` file.
    #[serde(default)]
    pub append_row_dataframe_header: bool,
    /// The one ASCII character between the values of a returned DataFrame's rows in the
    /// `append_row` file (a space, as ParallelRunStep writes them).
    #[serde(default = "default::append_row_separator")]
    pub append_row_separator: String,
    /// Seconds from the job's start to its first mini-batch before the job fails (1 to a
    /// year).
    #[serde(default = "default::first_task_creation_timeout")]
    pub first_task_creation_timeout: i64,
    /// Seconds a mini-batch may take from its delivery until `run()` is called with it:
    /// staging its inputs (downloads, range reads) and handing them to the runner (1 to a
    /// year). ParallelRunStep's `--task_overhead_timeout`.
    #[serde(default = "default::task_overhead_timeout")]
    pub task_overhead_timeout: i64,
    /// Seconds without a completion before the job is declared stalled (1 to a year).
    /// Defaults to `run_invocation_timeout × run_max_try`, never less than
    /// [`default::MIN_PROGRESS_UPDATE_TIMEOUT`].
    pub progress_update_timeout: Option<i64>,
    /// The Python environment, on this machine: a virtualenv folder or an interpreter path.
    /// Unset = the active virtualenv if any, else the interpreter fleetrun was built
    /// against.
    pub environment: Option<String>,
    /// Run the script under cProfile and keep the stats in the job's logs.
    #[serde(default)]
    pub profile: bool,
    /// An `http://` or `https://` URL that is POSTed the job's event (JSON) when it ends,
    /// signed with `FLEETRUN_WEBHOOK_SECRET`.
    pub notify_url: Option<String>,
    /// How long the job may take, counted from its submission: `"30s"`, `"90m"`, `"24h"`,
    /// `"7d"` (or a number of seconds). Past it the job ends Expired, with the rows of every
    /// mini-batch finished by then in its output. Unset: no deadline.
    #[serde(default, deserialize_with = "lenient_option")]
    pub deadline: Option<String>,
}

/// `[input]`: `files`, or `tabular` with its `format` and `separator`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputTable {
    /// A folder or S3 prefix of files, each one item; relative to the job file's folder.
    pub files: Option<String>,
    /// A table file, or a folder or S3 prefix of them, each record one item.
    pub tabular: Option<String>,
    /// `"csv"`, `"jsonl"` or `"parquet"` (any case); unset = from each file's extension.
    pub format: Option<String>,
    /// The CSV field separator: one ASCII character other than a quote or a newline
    /// ([`default::CSV_SEPARATOR`] when unset).
    pub separator: Option<String>,
}

/// `[output]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputTable {
    /// The output folder, local or on S3, never the input: the `append_row` file and
    /// `logs/` go here. Required.
    pub path: Option<String>,
}

/// `mini_batch_size` as written, its meaning settled by the input's kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum MiniBatchSizeSetting {
    /// `10`: files for a file input, bytes for a tabular one.
    Count(i64),
    /// `"10"` (files) or `"10MB"` (bytes).
    Text(String),
}

/// What a type error says `mini_batch_size` takes.
pub(crate) const MINI_BATCH_SIZE_EXPECTED: &str = r#"a number of files or a size such as "10MB""#;

impl<'de> Deserialize<'de> for MiniBatchSizeSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Setting;
        impl Visitor<'_> for Setting {
            type Value = MiniBatchSizeSetting;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(MINI_BATCH_SIZE_EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(MiniBatchSizeSetting::Count(n))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
                i64::try_from(n)
                    .map(MiniBatchSizeSetting::Count)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(MiniBatchSizeSetting::Text(text.to_owned()))
            }
        }
        deserializer.deserialize_any(Setting)
    }
}

/// `[models]`, or the table form of `[side_inputs]`: `name = "path"`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct NamedPaths(pub BTreeMap<String, String>);

/// What a type error says `[models]` and `[side_inputs]` take.
const NAMED_PATHS_EXPECTED: &str = r#"a table of name = "path""#;

impl<'de> Deserialize<'de> for NamedPaths {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match deserializer.deserialize_map(PathsVisitor { lists: false })? {
            SideInputPaths::Named(named) => Ok(named),
            SideInputPaths::Listed(_) => unreachable!("PathsVisitor takes no list here"),
        }
    }
}

/// `[side_inputs]`: by name, or a list of paths each named after its last component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SideInputPaths {
    /// `[side_inputs] labels = "data/labels.txt"`.
    Named(NamedPaths),
    /// `side_inputs = ["data/labels.txt"]`: named `labels.txt`.
    Listed(Vec<String>),
}

impl Default for SideInputPaths {
    fn default() -> Self {
        SideInputPaths::Named(NamedPaths::default())
    }
}

impl<'de> Deserialize<'de> for SideInputPaths {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PathsVisitor { lists: true })
    }
}

/// A table of paths by name, or, where `lists` says so, a list of paths.
struct PathsVisitor {
    lists: bool,
}

impl<'de> Visitor<'de> for PathsVisitor {
    type Value = SideInputPaths;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(NAMED_PATHS_EXPECTED)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let named = BTreeMap::deserialize(MapAccessDeserializer::new(map))?;
        Ok(SideInputPaths::Named(NamedPaths(named)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        if !self.lists {
            return Err(de::Error::invalid_type(de::Unexpected::Seq, &self));
        }
        Vec::deserialize(SeqAccessDeserializer::new(seq)).map(SideInputPaths::Listed)
    }
}

/// A table, never a list: serde lets a list fill a struct's fields in order, which a job
/// file does not mean.
fn table<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    struct Table<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Table<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_map(Table(std::marker::PhantomData))
}

/// A string, or a number or boolean taken as written (`5`, `0.5`, `true`).
struct LenientString(String);

impl<'de> Deserialize<'de> for LenientString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Lenient;
        impl Visitor<'_> for Lenient {
            type Value = LenientString;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(LenientString(text.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(LenientString(n.to_string()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
                Ok(LenientString(n.to_string()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
                // `1.0` stays `1.0`, as written.
                Ok(LenientString(format!("{n:?}")))
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
                Ok(LenientString(b.to_string()))
            }
        }
        deserializer.deserialize_any(Lenient)
    }
}

fn lenient_option<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<LenientString>::deserialize(deserializer)?.map(|item| item.0))
}

fn lenient_strings<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let items = Vec::<LenientString>::deserialize(deserializer)?;
    Ok(items.into_iter().map(|item| item.0).collect())
}

fn lenient_string_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let entries = BTreeMap::<String, LenientString>::deserialize(deserializer)?;
    Ok(entries.into_iter().map(|(k, v)| (k, v.0)).collect())
}

/// The defaults of CONTRACT.md §2: those of a field alone here, those that depend on other
/// fields applied by [`JobFile::validate`].
pub mod default {
    /// Files per mini-batch of a file input, ParallelRunConfig's default.
    pub const MINI_BATCH_FILES: u64 = 10;
    /// `1MB`, ParallelRunConfig's default for tabular inputs.
    pub const MINI_BATCH_BYTES: u64 = 1 << 20;
    /// CSV's own separator.
    pub const CSV_SEPARATOR: u8 = b',';
    /// Five minutes: a job of quick calls is not declared stalled by one slow moment.
    pub const MIN_PROGRESS_UPDATE_TIMEOUT: u64 = 300;

    /// Every attempt of one mini-batch may time out before the job counts as stalled.
    pub const fn progress_update_timeout(run_invocation_timeout: u64, run_max_try: u32) -> u64 {
        let all_attempts = run_invocation_timeout.saturating_mul(run_max_try as u64);
        if all_attempts > MIN_PROGRESS_UPDATE_TIMEOUT {
            all_attempts
        } else {
            MIN_PROGRESS_UPDATE_TIMEOUT
        }
    }

    pub(super) fn append_row_file_name() -> String {
        "parallel_run_step.txt".to_owned()
    }
    /// ParallelRunStep writes a DataFrame's values separated by a space.
    pub(super) fn append_row_separator() -> String {
        " ".to_owned()
    }
    pub(super) fn logging_level() -> String {
        "INFO".to_owned()
    }
    pub(super) const fn error_threshold() -> i64 {
        -1
    }
    pub(super) const fn allowed_failed_count() -> i64 {
        -1
    }
    pub(super) const fn allowed_failed_percent() -> f64 {
        100.0
    }
    pub(super) const fn isolate_failures() -> bool {
        true
    }

    pub(super) const fn run_max_try() -> i64 {
        3
    }
    pub(super) const fn run_invocation_timeout() -> i64 {
        60
    }
    pub(super) const fn node_count() -> i64 {
        1
    }
    pub(super) const fn resource_monitor_interval() -> i64 {
        600
    }
    pub(super) const fn first_task_creation_timeout() -> i64 {
        600
    }
    /// Azure ML's parallel job default.
    pub const fn task_overhead_timeout() -> i64 {
        600
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_strings_keep_numbers_as_written() {
        let file: JobFile = toml::from_str(r#"arguments = ["--n", 5, 0.5, 1.0, true]"#).unwrap();
        assert_eq!(file.arguments, ["--n", "5", "0.5", "1.0", "true"]);
    }

    #[test]
    fn the_same_type_reads_json_and_writes_it_back() {
        let json = r#"{"name": "digits", "arguments": ["--n", 5], "mini_batch_size": "1MB",
            "input": {"files": "data"}, "side_inputs": ["a/labels.txt"]}"#;
        let file: JobFile = serde_json::from_str(json).unwrap();
        assert_eq!(file.arguments, ["--n", "5"]);
        assert_eq!(
            file.mini_batch_size,
            Some(MiniBatchSizeSetting::Text("1MB".into()))
        );
        assert_eq!(
            file.side_inputs,
            SideInputPaths::Listed(vec!["a/labels.txt".into()])
        );
        assert_eq!(file.run_max_try, 3);
        let again: JobFile = serde_json::from_value(serde_json::to_value(&file).unwrap()).unwrap();
        assert_eq!(again, file);
    }
}
