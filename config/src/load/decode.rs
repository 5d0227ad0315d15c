//! A [`JobFile`] from the TOML table of a job (the file with its overrides, or JSON made
//! one), and the one-line message of a value of the wrong type or of a key fleetrun does
//! not know: the dotted field, what it takes, and the value given.

use serde_path_to_error::Segment;
use toml::{Table, Value};

use super::{Fault, keys};
use crate::{FieldError, JobFile};

/// The job in `doc`, every field of the type it takes.
pub(super) fn job_file(doc: Table) -> Result<JobFile, Fault> {
    // The table is kept to quote the value at fault, which serde's message leaves out or
    // cuts short (a list is only "sequence").
    let file = serde_path_to_error::deserialize(Value::Table(doc.clone())).map_err(|err| {
        let field = dotted(err.path());
        let message = err.inner().message();
        if message.starts_with("unknown field") {
            return keys::unknown(&field);
        }
        // serde's words: "invalid type: string \"x\", expected i64".
        let expected = message
            .strip_prefix("invalid type: ")
            .and_then(|rest| rest.rsplit_once(", expected "));
        let problem = match (expected, value_at(&doc, err.path())) {
            (Some((_, expected)), Some(got)) => format!(
                "expected {}, got {} ({})",
                expectation(expected),
                kind(got),
                show(got)
            ),
            _ => message.to_owned(),
        };
        Fault::Invalid(FieldError::new(&field, problem))
    })?;
    match date_time(&doc) {
        // toml hands a date-time to serde as its text: `name = 2024-01-01` would pass.
        Some((field, date_time)) => {
            let rule = "a date-time is not a value a job file takes; quote it to make it a string";
            Err(Fault::Invalid(FieldError::rule(
                &field,
                rule,
                format_args!("{date_time}"),
            )))
        }
        None => Ok(file),
    }
}

/// The first date-time in `doc`, with its field.
fn date_time(doc: &Table) -> Option<(String, &toml::value::Datetime)> {
    doc.iter().find_map(|(key, value)| match value {
        Value::Datetime(date_time) => Some((key.clone(), date_time)),
        Value::Table(table) => {
            date_time(table).map(|(field, found)| (format!("{key}.{field}"), found))
        }
        // An item of a list is its list's field (`arguments`).
        Value::Array(items) => items.iter().find_map(|item| match item {
            Value::Datetime(date_time) => Some((key.clone(), date_time)),
            _ => None,
        }),
        _ => None,
    })
}

/// The field a path leads to, dotted inside tables; an item of a list is its list's
/// (`arguments`, not `arguments[1]`).
fn dotted(path: &serde_path_to_error::Path) -> String {
    let keys: Vec<&str> = path
        .iter()
        .map_while(|segment| match segment {
            Segment::Map { key } => Some(key.as_str()),
            Segment::Seq { .. } | Segment::Enum { .. } | Segment::Unknown => None,
        })
        .collect();
    keys.join(".")
}

/// The value a path leads to.
fn value_at<'a>(doc: &'a Table, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    let mut segments = path.iter();
    let Some(Segment::Map { key }) = segments.next() else {
        return None;
    };
    segments.try_fold(doc.get(key)?, |value, segment| match segment {
        Segment::Map { key } => value.get(key.as_str()),
        Segment::Seq { index } => value.get(*index),
        Segment::Enum { .. } | Segment::Unknown => None,
    })
}

/// What a serde visitor says it expects, as a person reads it. Every list in a job file is
/// a list of strings.
fn expectation(serde_says: &str) -> &str {
    match serde_says {
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" => "an integer",
        "f32" | "f64" => "a number",
        "a boolean" => "a boolean (true or false)",
        "a sequence" => "a list of strings",
        "a map" => "a table",
        struct_name if struct_name.starts_with("struct ") => "a table",
        other => other,
    }
}

/// How a value reads in an error message: strings quoted, everything else as TOML.
fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Integer(n) => n.to_string(),
        Value::Float(n) => format!("{n:?}"),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => d.to_string(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Table(table) => {
            let entries: Vec<String> = table
                .iter()
                .map(|(key, value)| format!("{key} = {}", show(value)))
                .collect();
            format!("{{ {} }}", entries.join(", "))
        }
    }
}

/// The kind of a value, with its article, for "expected X, got Y".
fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "a list",
        Value::Table(_) => "a table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(text: &str) -> String {
        match job_file(toml::from_str(text).unwrap()) {
            Err(Fault::Invalid(error)) => error.to_string(),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn wrong_types_name_both_kinds() {
        assert_eq!(
            problem(r#"run_max_try = "five""#),
            r#"run_max_try: expected an integer, got a string ("five")"#
        );
        assert_eq!(
            problem(r#"arguments = ["--n", { n = 5 }]"#),
            "arguments: expected a string, got a table ({ n = 5 })"
        );
        assert_eq!(
            problem("models = [1]"),
            r#"models: expected a table of name = "path", got a list ([1])"#
        );
    }

    #[test]
    fn a_list_is_no_table_and_a_date_time_no_string() {
        assert_eq!(
            problem("input = [1]"),
            "input: expected a table, got a list ([1])"
        );
        assert_eq!(
            problem("[environment_variables]\nDAY = 2024-01-01"),
            "environment_variables.DAY: a date-time is not a value a job file takes; quote it \
             to make it a string (got 2024-01-01)"
        );
    }

    #[test]
    fn show_renders_nested_values() {
        let table: Table = toml::from_str(r#"v = { a = [1, "x"] }"#).unwrap();
        assert_eq!(show(&table["v"]), r#"{ a = [1, "x"] }"#);
    }
}
