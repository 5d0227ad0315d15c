//! Reading a job file: TOML text → `--set` overrides → known keys → one rule per field
//! → [`JobSpec`].
//!
//! Every mistake becomes a one-line [`ConfigError`] that names where it was made (the job
//! file, or the `--set` that set the field), the field, the rule and the value.

mod build;
mod keys;
mod location;
mod named;
mod read;

use std::path::{Path, PathBuf};

use thiserror::Error;
use toml::{Table, Value};

use self::read::Fault;
use crate::JobSpec;

/// A job file that cannot be run, reported in one line.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The job file could not be read.
    #[error("{}: cannot read the job file: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The text is not TOML: `job.toml:3:7: invalid TOML: ...`.
    #[error("{origin}:{line}:{column}: invalid TOML: {message}")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// A `--set` argument that is not `key=value`.
    #[error("--set {arg}: expected key=value")]
    Override { arg: String },
    /// A key fleetrun does not know: `job.toml: unknown field "x" (did you mean "y"?)`.
    #[error("{origin}: unknown field \"{field}\"{}", hint(.field, .suggestion.as_deref()))]
    UnknownField {
        /// The job file, or the `--set key=value` that named the key.
        origin: String,
        /// The key, dotted inside tables (`input.fles`).
        field: String,
        /// The known key it most likely meant.
        suggestion: Option<String>,
    },
    /// A field missing, of the wrong type or breaking its rule:
    /// `job.toml: mini_batch_size: must be at least 1 (got 0)`.
    #[error("{origin}: {field}: {problem}")]
    Invalid {
        /// The job file, or the `--set key=value` that set the field.
        origin: String,
        /// The field, dotted inside tables (`input.files`).
        field: String,
        /// The rule broken, ending with the value given.
        problem: String,
    },
}

impl ConfigError {
    /// The field at fault, dotted inside tables (`input.files`), when there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownField { field, .. } | ConfigError::Invalid { field, .. } => {
                Some(field)
            }
            ConfigError::Read { .. }
            | ConfigError::Syntax { .. }
            | ConfigError::Override { .. } => None,
        }
    }
}

/// ` (did you mean "x"?)`, and where a key found in the wrong table belongs.
fn hint(field: &str, suggestion: Option<&str>) -> String {
    match suggestion {
        None => String::new(),
        Some(known) if field.contains('.') && !known.contains('.') => {
            format!(" (did you mean \"{known}\"? top-level keys go above the first [table])")
        }
        Some(known) => format!(" (did you mean \"{known}\"?)"),
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
        .map(|arg| apply_override(&mut doc, arg))
        .collect::<Result<Vec<_>, _>>()?;
    let base_dir = location::absolute(base_dir);
    keys::check(&doc)
        .and_then(|()| build::build(&doc, &base_dir))
        .map_err(|fault| {
            // Blame the last `--set` that wrote the field, else the file.
            let origin = overrides
                .iter()
                .rev()
                .find(|applied| applied.covers(fault.field()))
                .map_or_else(|| source.to_owned(), Override::origin);
            error(origin, fault)
        })
}

fn error(origin: String, fault: Fault) -> ConfigError {
    match fault {
        Fault::Invalid { field, problem } => ConfigError::Invalid {
            origin,
            field,
            problem,
        },
        Fault::Unknown { field, suggestion } => ConfigError::UnknownField {
            origin,
            field,
            suggestion,
        },
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

/// A `--set key=value` applied to the job file.
struct Override<'a> {
    arg: &'a str,
    key: &'a str,
}

impl Override<'_> {
    /// Whether this override wrote `field` (or the table holding it).
    fn covers(&self, field: &str) -> bool {
        field
            .strip_prefix(self.key)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    }

    fn origin(&self) -> String {
        format!("--set {}", self.arg)
    }
}

/// Sets `key` (dotted into a table: `input.files`) to `value`, read as a TOML value
/// (`5`, `-1`, `true`, `"x"`, `["a", "b"]`) or else taken as a plain string
/// (`data/other`).
fn apply_override<'a>(doc: &mut Table, arg: &'a str) -> Result<Override<'a>, ConfigError> {
    let (key, raw) = arg
        .split_once('=')
        .map(|(key, raw)| (key.trim(), raw.trim()))
        .filter(|(key, _)| !key.is_empty())
        .ok_or_else(|| ConfigError::Override {
            arg: arg.to_owned(),
        })?;
    let applied = Override { arg, key };
    keys::check_key(key).map_err(|fault| error(applied.origin(), fault))?;

    let value = toml_value(raw).unwrap_or_else(|| Value::String(raw.to_owned()));
    match key.split_once('.') {
        None => {
            doc.insert(key.to_owned(), value);
        }
        Some((table, nested)) => {
            let slot = doc
                .entry(table)
                .or_insert_with(|| Value::Table(Table::new()));
            if !slot.is_table() {
                *slot = Value::Table(Table::new());
            }
            if let Value::Table(table) = slot {
                table.insert(nested.to_owned(), value);
            }
        }
    }
    Ok(applied)
}

/// `raw` as a single TOML value, if it is one.
fn toml_value(raw: &str) -> Option<Value> {
    let mut parsed: Table = toml::from_str(&format!("value = {raw}")).ok()?;
    let value = parsed.remove("value")?;
    parsed.is_empty().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_values_are_toml_or_plain_strings() {
        assert_eq!(toml_value("5"), Some(Value::Integer(5)));
        assert_eq!(toml_value("-1"), Some(Value::Integer(-1)));
        assert_eq!(toml_value("true"), Some(Value::Boolean(true)));
        assert_eq!(toml_value(r#""x""#), Some(Value::String("x".into())));
        assert!(toml_value(r#"["a", "b"]"#).unwrap().is_array());
        assert_eq!(toml_value("data/other"), None);
        assert_eq!(toml_value("1\nname = \"x\""), None);
        assert_eq!(toml_value(""), None);
    }

    #[test]
    fn an_override_covers_its_field_and_what_is_inside() {
        let set = |key| Override { arg: "", key };
        assert!(set("input.files").covers("input.files"));
        assert!(set("input").covers("input.files"));
        assert!(!set("input").covers("input_files"));
        assert!(!set("input.files").covers("input"));
    }
}
