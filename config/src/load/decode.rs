//! A [`JobFile`] from the TOML table of a job (the file with its overrides, or JSON made
//! one), and the one-line message of a value of the wrong type or of a key fleetrun does
//! not know: the dotted field, what it takes, and the value given.
//!
//! The table is read through a deserializer of its own ([`Doc`]) whose error, [`Mismatch`],
//! keeps what serde's visitors report (a key not known, the type expected) as fields, so no
//! message text is read back.

use std::fmt;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;
use serde_path_to_error::Segment;
use toml::{Table, Value};

use super::{Fault, keys};
use crate::{FieldError, JobFile};

/// The job in `doc`, every field of the type it takes.
pub(super) fn job_file(doc: Table) -> Result<JobFile, Fault> {
    // The table is kept to quote the value at fault, which serde's visitors do not see
    // whole (a list is only "sequence").
    let root = Value::Table(doc);
    let file = serde_path_to_error::deserialize(Doc(&root)).map_err(|err| {
        let field = dotted(err.path());
        let problem = match err.inner() {
            Mismatch::UnknownField => return keys::unknown(&field),
            Mismatch::Type { expected, said } => match value_at(&root, err.path()) {
                Some(got) => format!(
                    "expected {}, got {} ({})",
                    expectation(expected),
                    kind(got),
                    show(got)
                ),
                None => said.clone(),
            },
            Mismatch::Other(said) => said.clone(),
        };
        Fault::Invalid(FieldError::new(&field, problem))
    })?;
    let Value::Table(doc) = &root else {
        unreachable!("made a table above")
    };
    match date_time(doc) {
        // A date-time is handed to serde as its text: `name = 2024-01-01` would pass.
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

/// What went wrong deserializing a job's table, as serde's visitors report it.
#[derive(Debug, thiserror::Error)]
enum Mismatch {
    /// A key the table's struct does not take (`deny_unknown_fields`).
    #[error("unknown field")]
    UnknownField,
    /// A value of another type than the field's: what the field expects, in serde's words
    /// (`i64`, `a sequence`, a visitor's own), and serde's whole sentence.
    #[error("{said}")]
    Type { expected: String, said: String },
    /// Anything else (a value out of range, a missing field), in serde's words.
    #[error("{0}")]
    Other(String),
}

impl de::Error for Mismatch {
    fn custom<T: fmt::Display>(message: T) -> Mismatch {
        Mismatch::Other(message.to_string())
    }

    fn invalid_type(unexpected: de::Unexpected<'_>, expected: &dyn de::Expected) -> Mismatch {
        Mismatch::Type {
            expected: expected.to_string(),
            said: format!("invalid type: {unexpected}, expected {expected}"),
        }
    }

    fn unknown_field(_field: &str, _expected: &'static [&'static str]) -> Mismatch {
        Mismatch::UnknownField
    }
}

/// A TOML value as serde reads it, with [`Mismatch`] as its error.
#[derive(Clone, Copy)]
struct Doc<'a>(&'a Value);

impl<'de> de::Deserializer<'de> for Doc<'_> {
    type Error = Mismatch;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Mismatch> {
        match self.0 {
            Value::String(s) => visitor.visit_str(s),
            Value::Integer(n) => visitor.visit_i64(*n),
            Value::Float(n) => visitor.visit_f64(*n),
            Value::Boolean(b) => visitor.visit_bool(*b),
            Value::Datetime(d) => visitor.visit_string(d.to_string()),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.iter().map(Doc));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Value::Table(table) => {
                let entries = table.iter().map(|(key, value)| (key.as_str(), Doc(value)));
                let mut map = MapDeserializer::new(entries);
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    /// TOML has no null: a value present is `Some`.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Mismatch> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Mismatch> {
        visitor.visit_newtype_struct(self)
    }

    /// A unit variant by its name (`"csv"`); anything else is read as it is, for the
    /// visitor to refuse.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Mismatch> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            _ => self.deserialize_any(visitor),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

impl<'de, 'a> IntoDeserializer<'de, Mismatch> for Doc<'a> {
    type Deserializer = Doc<'a>;

    fn into_deserializer(self) -> Doc<'a> {
        self
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

/// The value a path leads to from `root`; `None` for the root itself.
fn value_at<'a>(root: &'a Value, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    let mut segments = path.iter().peekable();
    segments.peek()?;
    segments.try_fold(root, |value, segment| match segment {
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
