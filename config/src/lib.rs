//! The fleetrun job: what a user asks to run, checked before anything connects or runs.
//!
//! # Layout
//!
//! - [`JobFile`] (`file.rs`) is the job as written: one serde type, read from the TOML job
//!   file (see `docs/guide.md` and docs/contract.md §2), from the `--set key=value` overrides layered
//!   onto it, and from JSON (the job as an API client sends it). Unknown keys are refused.
//! - [`JobFile::validate`] (`validate.rs`) checks every rule, fills in the defaults that
//!   depend on other fields and resolves relative paths against the job file's folder,
//!   giving a [`JobSpec`]: the validated job the producer stores and workers read back.
//! - [`load`], [`load_str`] and [`load_json`] (`load.rs`) do both steps and blame every
//!   mistake on where it was made: one line naming the job file or the `--set` at fault,
//!   the dotted field, the rule and the value given, and for an unknown key the one it
//!   most likely meant ([`ConfigError`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod aml;
mod did_you_mean;
mod error;
pub mod file;
mod load;
pub mod mltable;
pub mod named;
mod partition_format;
mod validate;

pub use did_you_mean::did_you_mean;
pub use error::{ConfigError, FieldError};
pub use file::JobFile;
pub use load::arguments::SETTINGS as ARGUMENT_SETTINGS;
pub use load::{load, load_aml, load_json, load_str};
pub use partition_format::{FormatError, PartitionFormat};

/// A validated job: every field has its value (defaults filled in) and every path is
/// absolute. Serializable, so the producer can store it with the job and workers can
/// read it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job (step) name: 3–32 chars, `^[a-z]([-a-z0-9]*[a-z0-9])?$`.
    pub name: String,
    /// The entry script, absolute (resolved against `source_directory` when that is set,
    /// else against the job file's folder).
    pub entry_script: Location,
    /// The folder shipped with the script and importable from it.
    pub source_directory: Option<Location>,
    /// The script's `sys.argv[1:]`.
    pub arguments: Vec<String>,
    /// What is partitioned.
    pub input: Input,
    /// Reference data every node gets whole, by name (`[side_inputs] labels = "..."`; a
    /// list names each entry after its last path component).
    #[serde(deserialize_with = "named_or_listed")]
    pub side_inputs: BTreeMap<String, Location>,
    /// Models every node gets whole, by name: `Model.get_model_path(name)` returns the local
    /// copy.
    #[serde(default)]
    pub models: BTreeMap<String, Location>,
    /// Named outputs: folders or S3 prefixes the script's files reach, by name. Each runner
    /// writes into a local folder of its own, given by `${{outputs.name}}` in `arguments`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, Location>,
    /// The output folder: the `append_row` file and `logs/` go here.
    pub output: Location,
    /// What becomes of the elements `run()` returns.
    pub output_action: OutputAction,
    /// The one `append_row` file in `output`: a plain file name.
    pub append_row_file_name: String,
    /// Files per mini-batch (file inputs, at least 1), or bytes per mini-batch (tabular
    /// inputs; `1MB` by default).
    pub mini_batch_size: MiniBatchSize,
    /// Failed items tolerated over the whole input; `-1` ignores all failures.
    pub error_threshold: i64,
    /// Failed mini-batches tolerated; `None` = no limit (`-1` in the file).
    pub allowed_failed_count: Option<u64>,
    /// Failed mini-batches tolerated as a percentage of all mini-batches (0–100).
    pub allowed_failed_percent: f64,
    /// Attempts of `run()` per mini-batch (at least 1).
    pub run_max_try: u32,
    /// Split a mini-batch of several items that failed its attempts, down to the items that
    /// fail alone. A job recorded before this field isolates.
    #[serde(default = "yes")]
    pub isolate_failures: bool,
    /// Seconds one `run()` call may take (at least 1).
    pub run_invocation_timeout: u64,
    /// Worker machines to run on (at least 1).
    pub node_count: u32,
    /// 0 to 9: the jobs of a pool with work and the highest priority get its runners first.
    /// A job recorded before this field has 0.
    #[serde(default)]
    pub priority: u8,
    /// Runner processes per node; `None` = 1 on a GPU machine, the number of cores otherwise.
    pub process_count_per_node: Option<u32>,
    /// The level of the script's `EntryScript().logger` and of fleetrun's own logs.
    pub logging_level: LoggingLevel,
    /// Seconds between resource checks; 0 turns them off.
    pub resource_monitor_interval: u64,
    /// Tabular inputs only: rows sharing these columns' values form one mini-batch.
    pub partition_keys: Option<Vec<String>>,
    /// File inputs: the parts of each file's path, relative to the input, that
    /// `partition_keys` name (`{user}/{genres}/{name}.txt`).
    pub partition_format: Option<String>,
    /// Set in every worker process.
    pub environment_variables: BTreeMap<String, String>,
    /// The variables fleetrun keeps from the runners that this job's runners get from the
    /// worker's environment all the same. A job recorded before this field passes none.
    #[serde(default)]
    pub pass_environment: Vec<String>,
    /// Write the DataFrame header once at the top of the `append_row` file.
    pub append_row_dataframe_header: bool,
    /// The field separator of the rows a returned DataFrame becomes in the `append_row`
    /// file (one byte; a space by default, as ParallelRunStep writes them). A job recorded
    /// by a submitter before this field reads as the default.
    #[serde(default = "space")]
    pub append_row_separator: u8,
    /// Seconds from the job's start to its first mini-batch before the job fails.
    pub first_task_creation_timeout: u64,
    /// Seconds a mini-batch may take from its delivery until `run()` is called with it
    /// (staging its inputs). A job recorded before this field reads as the default.
    #[serde(default = "default_task_overhead_timeout")]
    pub task_overhead_timeout: u64,
    /// Seconds without a completion before the job is declared stalled. Defaults to
    /// `run_invocation_timeout × run_max_try`, never less than 300.
    pub progress_update_timeout: u64,
    /// The Python environment: a virtualenv folder or an interpreter path. `None` = the
    /// active virtualenv if any, else `python3` on `PATH`.
    pub environment: Option<PathBuf>,
    /// Run each runner's `init()` and `run()` calls under cProfile and write the stats to
    /// `logs/sys/profile/<node_id>/<process_name>.profile` when the runner stops cleanly.
    #[serde(default)]
    pub profile: bool,
    /// Where the job's end is POSTed (its event as JSON, signed with HMAC-SHA256), by
    /// whichever process ends it; retried, and never in the job's way.
    #[serde(default)]
    pub notify_url: Option<String>,
    /// Seconds from the job's submission after which it ends Expired, keeping what its
    /// finished mini-batches wrote; `None`: no deadline. A resumed job has none: it runs the
    /// rest to its end.
    #[serde(default)]
    pub deadline: Option<u64>,
    /// ParallelRunStep's settings found in `arguments` (`--allowed_failed_percent 30`), in
    /// their order: taken as the job's keys, or overruled by the job file. Said once when
    /// the job starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings_from_arguments: Vec<ArgumentSetting>,
    /// The input folder's `MLTable` file, when it has one: which of its files are the input
    /// and how they are read. Read by the submitter from the input's storage before the job
    /// is registered ([`mltable::MlTable::parse`]); `None` until then, and for an input
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mltable: Option<mltable::MlTable>,
}

/// A ParallelRunStep setting written in `arguments` (`--allowed_failed_percent 30`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentSetting {
    /// The job file's key of the same name.
    pub key: String,
    /// The value as written.
    pub value: String,
    /// Taken as the job's setting; false when the job file (or a `--set`) gives the key
    /// too, and wins.
    pub taken: bool,
}

impl std::fmt::Display for ArgumentSetting {
    /// `allowed_failed_percent = 30, from --allowed_failed_percent in arguments`, or why not.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (key, value) = (&self.key, &self.value);
        if self.taken {
            write!(f, "{key} = {value}, from --{key} in arguments")
        } else {
            write!(
                f,
                "--{key} {value} in arguments is overruled by the job's own {key}"
            )
        }
    }
}

fn default_task_overhead_timeout() -> u64 {
    file::default::task_overhead_timeout() as u64
}

/// Side inputs as a record holds them: by name, or as the list records written before they
/// had names held (each then named after its last path component, as the job file's list
/// form names them).
fn named_or_listed<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Location>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Recorded {
        Named(BTreeMap<String, Location>),
        Listed(Vec<Location>),
    }
    Ok(match Recorded::deserialize(d)? {
        Recorded::Named(named) => named,
        Recorded::Listed(listed) => listed
            .into_iter()
            .map(|location| (location.last_component(), location))
            .collect(),
    })
}

const fn yes() -> bool {
    true
}

const fn space() -> u8 {
    b' '
}

/// Where data lives: a local path (absolute) or an S3 prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Location {
    Local(PathBuf),
    S3 { bucket: String, prefix: String },
}

impl Location {
    /// The last component of its path or prefix (`labels.txt`, `vocab` of `ref/vocab/`).
    pub fn last_component(&self) -> String {
        let path = match self {
            Location::Local(p) => p.to_string_lossy().into_owned(),
            Location::S3 { prefix, .. } => prefix.clone(),
        };
        path.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    /// A location given on a command line: an `s3://bucket/prefix` URI, or a path against
    /// the current folder.
    pub fn parse(text: &str) -> Result<Location, FieldError> {
        validate::command_line_location(text)
    }

    /// The local path, if this is one.
    pub fn as_local(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            Location::S3 { .. } => None,
        }
    }

    /// Whether the two are the same place or one holds the other ([`Location::within`]: by
    /// whole path components, `s3://b/out` holds `s3://b/out/a`, not `s3://b/outer`).
    pub fn overlaps(&self, other: &Location) -> bool {
        self.within(other).is_some() || other.within(self).is_some()
    }

    /// Where `self` lies inside `outer`: `Some("")` when it is `outer`, `Some("a/b")` for a
    /// folder or prefix below it, `None` elsewhere.
    pub fn within(&self, outer: &Location) -> Option<String> {
        match (self, outer) {
            (Location::Local(path), Location::Local(dir)) => {
                let rel = path.strip_prefix(dir).ok()?;
                Some(rel.to_string_lossy().into_owned())
            }
            (
                Location::S3 { bucket, prefix },
                Location::S3 {
                    bucket: outer_bucket,
                    prefix: outer_prefix,
                },
            ) if bucket == outer_bucket => {
                let (inner, outer) = (
                    prefix.trim_end_matches('/'),
                    outer_prefix.trim_end_matches('/'),
                );
                if outer.is_empty() {
                    return Some(inner.to_owned());
                }
                match inner.strip_prefix(outer)? {
                    "" => Some(String::new()),
                    rest => Some(rest.strip_prefix('/')?.to_owned()),
                }
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// The partitioned input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Input {
    /// A folder or prefix of files; each file is one item (`[input] files = "..."`).
    Files(Location),
    /// One table file, or a folder or prefix of them, cut into byte ranges of records
    /// (`[input] tabular = "..."`); each record (row) is one item.
    Tabular(Tabular),
}

impl Input {
    /// Where the input lives.
    pub fn location(&self) -> &Location {
        match self {
            Input::Files(location) => location,
            Input::Tabular(tabular) => &tabular.location,
        }
    }

    /// The tabular input, when the input is one.
    pub fn tabular(&self) -> Option<&Tabular> {
        match self {
            Input::Files(_) => None,
            Input::Tabular(tabular) => Some(tabular),
        }
    }
}

/// A tabular input: where it is, how its records are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tabular {
    /// One file, or a folder or prefix of files (read recursively, in key order).
    pub location: Location,
    /// `[input] format`; `None` = from each file's extension (`.csv`, `.jsonl`/`.json`,
    /// `.parquet`). The submitter settles it before the job is registered (see
    /// [`TabularFormat::of_key`]).
    pub format: Option<TabularFormat>,
    /// `[input] separator`: the CSV field separator, one byte (default `,`).
    pub separator: u8,
}

/// How a tabular file's records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TabularFormat {
    /// RFC 4180 CSV with a header line; a newline inside quotes is not a record boundary.
    Csv,
    /// One JSON object per line.
    JsonLines,
    /// Apache Parquet; a mini-batch is a run of whole row groups.
    Parquet,
}

impl TabularFormat {
    /// The format a file name's extension says (`a/b.CSV` is CSV), if it says one.
    pub fn of_key(key: &str) -> Option<TabularFormat> {
        let name = key.rsplit('/').next().unwrap_or(key);
        let (_, extension) = name.rsplit_once('.')?;
        match extension.to_ascii_lowercase().as_str() {
            "csv" => Some(TabularFormat::Csv),
            "jsonl" | "json" | "ndjson" => Some(TabularFormat::JsonLines),
            "parquet" | "pq" => Some(TabularFormat::Parquet),
            _ => None,
        }
    }

    /// The name the job file uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            TabularFormat::Csv => "csv",
            TabularFormat::JsonLines => "jsonl",
            TabularFormat::Parquet => "parquet",
        }
    }

    /// The extension a staged chunk gets, which tells the runner how to read it.
    pub fn extension(self) -> &'static str {
        match self {
            TabularFormat::Csv => "csv",
            TabularFormat::JsonLines => "jsonl",
            TabularFormat::Parquet => "parquet",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputAction {
    /// Every returned element becomes one line of the one `append_row_file_name` file.
    AppendRow,
    /// The script stores its own output; returned elements only count successes.
    SummaryOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MiniBatchSize {
    /// Files per mini-batch (file inputs).
    Files(u64),
    /// Bytes per mini-batch (tabular inputs): `1024`, `1024KB`, `10MB`, `1GB`.
    Bytes(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoggingLevel {
    Warning,
    Info,
    Debug,
}

impl LoggingLevel {
    /// The name Python's `logging` module uses.
    pub fn as_str(self) -> &'static str {
        match self {
            LoggingLevel::Warning => "WARNING",
            LoggingLevel::Info => "INFO",
            LoggingLevel::Debug => "DEBUG",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: &str, prefix: &str) -> Location {
        Location::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn places_overlap_when_one_holds_the_other_by_whole_components() {
        assert!(s3("b", "out").overlaps(&s3("b", "out/")));
        assert!(s3("b", "out").overlaps(&s3("b", "out/a")));
        assert!(s3("b", "out/a/").overlaps(&s3("b", "out")));
        assert!(s3("b", "").overlaps(&s3("b", "out")));
        assert!(!s3("b", "out").overlaps(&s3("b", "outer")));
        assert!(!s3("b", "out").overlaps(&s3("c", "out")));
        let local = |p: &str| Location::Local(PathBuf::from(p));
        assert!(local("/data/out").overlaps(&local("/data/out/x")));
        assert!(local("/data/out/").overlaps(&local("/data/out")));
        assert!(!local("/data/out").overlaps(&local("/data/outer")));
        assert!(!local("/data/out").overlaps(&s3("data", "out")));
    }
}
