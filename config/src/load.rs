//! Reading a job: TOML text (or JSON) → `--set` overrides → [`JobFile`] →
//! [`JobFile::validate`] → [`JobSpec`].
//!
//! Every mistake becomes a one-line [`ConfigError`] that names where it was made (the job
//! file, or the `--set` that set the field), the field, the rule and the value.

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
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let base_dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    load_str(&text, &path.display().to_string(), base_dir, overrides)
}

/// [`load`] for a job file already read: relative paths are resolved against `base_dir`,
/// and errors name `source` as the file.
pub fn load_str(
    text: &str,
    source: &str,
    base_dir: &Path,
    overrides: &[String],
) -> Result<JobSpec, ConfigError> {
    let mut doc = parse(text, source)?;
    let overrides = overrides
        .iter()
        .map(|arg| Override::apply(&mut doc, arg))
        .collect::<Result<Vec<_>, _>>()?;
    check(doc, base_dir).map_err(|fault| {
        // Blame the last `--set` that wrote the field, else the file.
        let origin = overrides
            .iter()
            .rev()
            .find(|applied| applied.covers(fault.field()))
            .map_or_else(|| source.to_owned(), Override::origin);
        fault.at(origin)
    })
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

/// The job in `doc`, validated.
fn check(doc: Table, base_dir: &Path) -> Result<JobSpec, Fault> {
    let file: JobFile = decode::job_file(doc)?;
    file.validate(base_dir).map_err(Fault::Invalid)
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
