//! How `fleetrun-worker` and `fleetrun` write their own log lines to stderr: text for a
//! person, in colour only at a terminal (and never under `NO_COLOR`); with
//! `FLEETRUN_LOG_FORMAT=json`, one JSON object a line for a log collector, its fields
//! (`job`, `mini_batch`, …) at the top level and the span's (`node`, `slot`) under `span`.
//! `FLEETRUN_LOG` picks what is logged, as `RUST_LOG` does.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt};

/// The variable that picks the format: `text` (the default) or `json`.
pub const FORMAT_VAR: &str = "FLEETRUN_LOG_FORMAT";

/// The variable that picks what is logged (an `EnvFilter` directive).
pub const FILTER_VAR: &str = "FLEETRUN_LOG";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// A `FLEETRUN_LOG_FORMAT` that names no format.
#[derive(Debug, thiserror::Error)]
#[error("{FORMAT_VAR}={0:?} is not a log format (text or json)")]
pub struct UnknownLogFormat(pub String);

impl LogFormat {
    /// The format `value` names (`None`, empty: text), in any case.
    pub fn parse(value: Option<&str>) -> Result<LogFormat, UnknownLogFormat> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("" | "text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(_) => Err(UnknownLogFormat(value.unwrap_or_default().to_owned())),
        }
    }

    /// The format `FLEETRUN_LOG_FORMAT` names.
    pub fn from_env() -> Result<LogFormat, UnknownLogFormat> {
        let value = std::env::var(FORMAT_VAR).ok();
        LogFormat::parse(value.as_deref())
    }
}

/// Sets up the process's log lines, in `FLEETRUN_LOG_FORMAT`'s format, logging what
/// `FLEETRUN_LOG` says, else `default_filter`; `targets`: each line names the module that
/// wrote it. Call once, first thing in `main`. Returns the format, for what the binary
/// writes itself.
pub fn init(default_filter: &str, targets: bool) -> Result<LogFormat, UnknownLogFormat> {
    let format = LogFormat::from_env()?;
    let filter =
        EnvFilter::try_from_env(FILTER_VAR).unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(targets);
    match format {
        LogFormat::Text => {
            // Colour for a person at a terminal only, and never under NO_COLOR (no-color.org).
            let ansi = std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            builder.with_ansi(ansi).init();
        }
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_ansi(false)
            .init(),
    }
    Ok(format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_named_in_any_case_and_text_is_the_default() {
        assert_eq!(LogFormat::parse(None).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse(Some("")).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse(Some("text")).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse(Some("JSON")).unwrap(), LogFormat::Json);
        let e = LogFormat::parse(Some("xml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "FLEETRUN_LOG_FORMAT=\"xml\" is not a log format (text or json)"
        );
    }
}
