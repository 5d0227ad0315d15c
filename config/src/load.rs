//! Reading a job: TOML text (or JSON) → `--set` overrides → [`JobFile`] →
//! [`JobFile::validate`] → [`JobSpec`].
//!
//! Every mistake becomes a one-line [`ConfigError`] that names where it was made (the job
//! file, or the `--set` that set the field), the field, the rule and the value.

pub mod arguments;
mod decode;
mod keys;
mod overrides;

use std::path::Path;

use toml::Table;

use self::overrides::Override;
use crate::{ConfigError, FieldError, JobFile, JobSpec};

/// A mistake in one field, before it is blamed on the job file or on a `--set`.
#[derive(Debug, Clone, PartialEq)]
enum Fault {
    /// The field is missing, of the wrong type or breaks its rule.
    Invalid(FieldError),
    /// A key fleetrun does not know, with the known key it most likely meant.
    Unknown {
        field: String,
        suggestion: Option<String>,
    },
}

impl Fault {
    /// The dotted name of the field at fault (`mini_batch_size`, `input.files`).
    fn field(&self) -> &str {
        match self {
            Fault::Invalid(error) => &error.field,
            Fault::Unknown { field, .. } => field,
        }
    }

    /// The fault, made where `origin` says.
    fn at(self, origin: String) -> ConfigError {
        match self {
            Fault::Invalid(error) => ConfigError::at(origin, error),
            Fault::Unknown { field, suggestion } => ConfigError::UnknownField {
                origin,
                field,
                suggestion,
            },
        }
    }
}

/// Reads the job file at `path`, applies `overrides` (each `key=value`, as given to
/// `--set`: `mini_batch_size=5`, `input.files=data/x`) and validates the result.
/// Relative paths in the file are relative to the file's folder.
pub fn load(path: &Path, overrides: &[String]) -> Result<JobSpec, ConfigError> {
    let (text, base_dir) = read(path)?;
    load_str(&text, &path.display().to_string(), base_dir, overrides)
}

/// The text of the file at `path`, and the folder its relative paths start from.
fn read(path: &Path) -> Result<(String, &Path), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let base_dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    Ok((text, base_dir))
}

/// `doc` with `overrides` applied, validated; a mistake is blamed on the last `--set` that
/// wrote the field, else on `source`.
fn check_with(
    mut doc: Table,
    source: &str,
    base_dir: &Path,
    overrides: &[String],
) -> Result<JobSpec, ConfigError> {
    let overrides = overrides
        .iter()
        .map(|arg| Override::apply(&mut doc, arg))
        .collect::<Result<Vec<_>, _>>()?;
    check(doc, base_dir).map_err(|fault| {
        let origin = overrides
            .iter()
            .rev()
            .find(|applied| applied.covers(fault.field()))
            .map_or_else(|| source.to_owned(), Override::origin);
        fault.at(origin)
    })
}

/// One `--set key=value` read as [`load`] applies it: the job file's key (dotted into a
/// table: `input.files`) and its value.
pub(crate) fn override_value(arg: &str) -> Result<(String, toml::Value), ConfigError> {
    let mut doc = Table::new();
    let key = Override::apply(&mut doc, arg)?.key().to_owned();
    let value = match key.split_once('.') {
        None => doc.remove(&key),
        Some((table, nested)) => doc
            .get_mut(table)
            .and_then(toml::Value::as_table_mut)
            .and_then(|table| table.remove(nested)),
    };
    Ok((key, value.expect("an override sets its key")))
}

/// [`load`] for a job file already read: relative paths are resolved against `base_dir`,
/// and errors name `source` as the file.
pub fn load_str(
    text: &str,
    source: &str,
    base_dir: &Path,
    overrides: &[String],
) -> Result<JobSpec, ConfigError> {
    let doc = parse(text, source)?;
    check_with(doc, source, base_dir, overrides)
}

/// Reads an Azure ML v2 YAML at `path` (a parallel job, a parallel component, or a
/// pipeline naming `job`) as a job, with `overrides` as [`load`] takes them plus
/// `inputs.NAME=…` and `outputs.NAME=…` for what the YAML cannot reach. Returns the job and
/// what the conversion made of the YAML (for its warning).
pub fn load_aml(
    path: &Path,
    job: Option<&str>,
    overrides: &[String],
) -> Result<(JobSpec, crate::aml::Converted), ConfigError> {
    let (text, base_dir) = read(path)?;
    let source = path.display().to_string();
    let (converted, rest) = crate::aml::convert(&text, &source, base_dir, job, overrides)?;
    let spec = check_with(converted.table(), &source, base_dir, &rest)?;
    Ok((spec, converted))
}

/// [`load_str`] for a job sent as a JSON object with the job file's fields (`{"name":
/// "digits", "input": {"files": "s3://bucket/images"}, ...}`), as an API client sends
/// it. A field set to `null` counts as left out. Errors name `source` as the sender.
pub fn load_json(text: &str, source: &str, base_dir: &Path) -> Result<JobSpec, ConfigError> {
    let json_error = |source_error| ConfigError::Json {
        origin: source.to_owned(),
        source: source_error,
    };
    let mut json: serde_json::Value = serde_json::from_str(text).map_err(json_error)?;
    drop_nulls(&mut json);
    let doc: Table = serde::Deserialize::deserialize(json).map_err(json_error)?;
    check(doc, base_dir).map_err(|fault| fault.at(source.to_owned()))
}

/// The job in `doc`, with the settings its `arguments` give, validated. A setting taken from
/// `arguments` that breaks its rule says so.
fn check(mut doc: Table, base_dir: &Path) -> Result<JobSpec, Fault> {
    let settings = arguments::take(&mut doc);
    let from_arguments = |fault: Fault| match fault {
        Fault::Invalid(mut error) => {
            if let Some(setting) = settings.iter().find(|s| s.taken && s.key == error.field) {
                error.problem = format!(
                    "{}, from `--{} {}` in arguments",
                    error.problem, setting.key, setting.value
                );
            }
            Fault::Invalid(error)
        }
        unknown => unknown,
    };
    let file: JobFile = decode::job_file(doc).map_err(from_arguments)?;
    let mut spec = file
        .validate(base_dir)
        .map_err(|e| from_arguments(Fault::Invalid(e)))?;
    spec.settings_from_arguments = settings;
    Ok(spec)
}

/// Removes every object entry that is `null`: TOML has no null, and an API client's
/// `null` means "not set".
fn drop_nulls(json: &mut serde_json::Value) {
    match json {
        serde_json::Value::Object(entries) => {
            entries.retain(|_, value| !value.is_null());
            entries.values_mut().for_each(drop_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

fn parse(text: &str, source: &str) -> Result<Table, ConfigError> {
    toml::from_str(text).map_err(|err: toml::de::Error| {
        // The message may run over several lines; the error is one.
        let message = err
            .message()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        let before = err
            .span()
            .and_then(|span| text.get(..span.start))
            .unwrap_or_default();
        let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
        ConfigError::Syntax {
            origin: source.to_owned(),
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
            message,
        }
    })
}
