//! What is wrong with a job: one line naming where the mistake was made, the field, the
//! rule and the value given.

use std::path::PathBuf;

use thiserror::Error;

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
    /// The text is not a JSON object: `request: invalid JSON: ... at line 1 column 7`.
    #[error("{origin}: invalid JSON: {source}")]
    Json {
        origin: String,
        source: serde_json::Error,
    },
    /// An Azure ML YAML that cannot be read as a job:
    /// `pipeline.yml: jobs.train.input_data: required`.
    #[error("{origin}: {at}: {message}")]
    Aml {
        origin: String,
        /// The YAML key, dotted.
        at: String,
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
            | ConfigError::Json { .. }
            | ConfigError::Aml { .. }
            | ConfigError::Override { .. } => None,
        }
    }

    /// `error`, made where `origin` says (the job file, or a `--set key=value`).
    pub fn at(origin: String, error: FieldError) -> Self {
        let FieldError { field, problem } = error;
        ConfigError::Invalid {
            origin,
            field,
            problem,
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

/// A field missing, of the wrong type or breaking its rule, before it is blamed on the job
/// file or on a `--set` (which [`ConfigError::at`] does): `run_max_try: must be between 1
/// and 100 (got 0)`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// The field, dotted inside tables (`input.files`).
    pub field: String,
    /// The rule broken, ending with the value given.
    pub problem: String,
}

impl FieldError {
    pub(crate) fn missing(field: &str) -> Self {
        Self::new(field, "required field is missing".to_owned())
    }

    /// `field: <rule> (got <value>)`, the value as written: strings quoted, lists in
    /// brackets (what `Debug` gives), numbers bare.
    pub(crate) fn rule(
        field: &str,
        rule: impl std::fmt::Display,
        got: impl std::fmt::Debug,
    ) -> Self {
        Self::new(field, format!("{rule} (got {got:?})"))
    }

    /// `field: <rule> (got "<path>")`, for a rule about where a path leads.
    pub(crate) fn path_rule(
        field: &str,
        rule: impl std::fmt::Display,
        got: &std::path::Path,
    ) -> Self {
        Self::rule(field, rule, got.display().to_string())
    }

    pub(crate) fn new(field: &str, problem: String) -> Self {
        FieldError {
            field: field.to_owned(),
            problem,
        }
    }
}
