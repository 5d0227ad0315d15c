//! Typed readers over TOML values. Each one either returns the value in the type the
//! [`JobSpec`](crate::JobSpec) wants or a [`Fault`] naming the field, the rule and the
//! value it got.

use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::Path;

use toml::{Table, Value};

/// A mistake in one field, before it is attributed to the job file or to a `--set`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fault {
    /// The field is there but wrong (or missing): `problem` says how, ending with the
    /// value it got.
    Invalid { field: String, problem: String },
    /// A key fleetrun does not know, with the known key it most likely meant.
    Unknown {
        field: String,
        suggestion: Option<String>,
    },
}

impl Fault {
    /// The dotted name of the field at fault (`mini_batch_size`, `input.files`).
    pub(super) fn field(&self) -> &str {
        match self {
            Fault::Invalid { field, .. } | Fault::Unknown { field, .. } => field,
        }
    }

    pub(super) fn missing(field: &str) -> Self {
        Self::invalid(field, "required field is missing".to_owned())
    }

    /// `field: <rule> (got <value>)`.
    pub(super) fn rule(field: &str, rule: impl Display, got: &Value) -> Self {
        Self::invalid(field, format!("{rule} (got {})", show(got)))
    }

    /// `field: <rule> (got "<path>")`, for a rule about where a path leads.
    pub(super) fn path_rule(field: &str, rule: impl Display, got: &Path) -> Self {
        Self::invalid(
            field,
            format!("{rule} (got {:?})", got.display().to_string()),
        )
    }

    /// `field: expected <expected>, got <kind> (<value>)`.
    pub(super) fn wrong_type(field: &str, expected: &str, got: &Value) -> Self {
        let problem = format!("expected {expected}, got {} ({})", kind(got), show(got));
        Self::invalid(field, problem)
    }

    fn invalid(field: &str, problem: String) -> Self {
        Fault::Invalid {
            field: field.to_owned(),
            problem,
        }
    }
}

pub(super) fn string<'v>(field: &str, value: &'v Value) -> Result<&'v str, Fault> {
    value
        .as_str()
        .ok_or_else(|| Fault::wrong_type(field, "a string", value))
}

pub(super) fn boolean(field: &str, value: &Value) -> Result<bool, Fault> {
    value
        .as_bool()
        .ok_or_else(|| Fault::wrong_type(field, "a boolean (true or false)", value))
}

pub(super) fn table<'v>(field: &str, value: &'v Value) -> Result<&'v Table, Fault> {
    value
        .as_table()
        .ok_or_else(|| Fault::wrong_type(field, "a table", value))
}

pub(super) fn array<'v>(field: &str, value: &'v Value) -> Result<&'v [Value], Fault> {
    value
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| Fault::wrong_type(field, "a list of strings", value))
}

/// An integer within `range`, converted to the type the spec stores it in.
pub(super) fn int_in<T: TryFrom<i64>>(
    field: &str,
    value: &Value,
    range: RangeInclusive<i64>,
) -> Result<T, Fault> {
    let n = value
        .as_integer()
        .ok_or_else(|| Fault::wrong_type(field, "an integer", value))?;
    let out_of_range = || {
        let rule = match (range.start(), range.end()) {
            (lo, &i64::MAX) => format!("must be at least {lo}"),
            (lo, hi) => format!("must be between {lo} and {hi}"),
        };
        Fault::rule(field, rule, value)
    };
    if !range.contains(&n) {
        return Err(out_of_range());
    }
    T::try_from(n).map_err(|_| out_of_range())
}

/// An integer or a float within `range`.
pub(super) fn number_in(
    field: &str,
    value: &Value,
    range: RangeInclusive<f64>,
) -> Result<f64, Fault> {
    let n = match value {
        Value::Integer(n) => *n as f64,
        Value::Float(n) => *n,
        _ => return Err(Fault::wrong_type(field, "a number", value)),
    };
    if range.contains(&n) {
        Ok(n)
    } else {
        let rule = format!("must be between {} and {}", range.start(), range.end());
        Err(Fault::rule(field, rule, value))
    }
}

/// A list of strings, nothing else.
pub(super) fn string_list(field: &str, value: &Value) -> Result<Vec<String>, Fault> {
    array(field, value)?
        .iter()
        .map(|item| string(field, item).map(str::to_owned))
        .collect()
}

/// A list of strings where numbers and booleans are taken as written (`["--n", 5]`), as
/// users coming from YAML write them.
pub(super) fn lenient_string_list(field: &str, value: &Value) -> Result<Vec<String>, Fault> {
    array(field, value)?
        .iter()
        .map(|item| lenient_string(field, item))
        .collect()
}

/// A string, or a number or boolean turned into one.
pub(super) fn lenient_string(field: &str, value: &Value) -> Result<String, Fault> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Integer(n) => Ok(n.to_string()),
        Value::Float(n) => Ok(format!("{n:?}")),
        Value::Boolean(b) => Ok(b.to_string()),
        _ => Err(Fault::wrong_type(field, "a string", value)),
    }
}

/// How a value reads in an error message: strings quoted, everything else as TOML.
pub(super) fn show(value: &Value) -> String {
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
pub(super) fn kind(value: &Value) -> &'static str {
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

    fn problem(fault: Fault) -> String {
        match fault {
            Fault::Invalid { field, problem } => format!("{field}: {problem}"),
            Fault::Unknown { .. } => panic!("not an invalid-value fault"),
        }
    }

    #[test]
    fn int_in_names_the_range() {
        let err = int_in::<i64>("n", &Value::Integer(0), 1..=i64::MAX).unwrap_err();
        assert_eq!(problem(err), "n: must be at least 1 (got 0)");
        let err = int_in::<i64>("n", &Value::Integer(101), 1..=100).unwrap_err();
        assert_eq!(problem(err), "n: must be between 1 and 100 (got 101)");
        assert_eq!(int_in::<u32>("n", &Value::Integer(7), 1..=100), Ok(7));
    }

    #[test]
    fn wrong_type_names_both_kinds() {
        let err = int_in::<i64>("n", &Value::String("five".into()), 1..=5).unwrap_err();
        assert_eq!(
            problem(err),
            r#"n: expected an integer, got a string ("five")"#
        );
    }

    #[test]
    fn lenient_strings_keep_numbers_as_written() {
        let value: Value =
            toml::from_str::<Table>(r#"v = ["--n", 5, 0.5, 1.0, true]"#).unwrap()["v"].clone();
        assert_eq!(
            lenient_string_list("arguments", &value).unwrap(),
            ["--n", "5", "0.5", "1.0", "true"]
        );
    }

    #[test]
    fn show_renders_nested_values() {
        let table: Table = toml::from_str(r#"v = { a = [1, "x"] }"#).unwrap();
        assert_eq!(show(&table["v"]), r#"{ a = [1, "x"] }"#);
    }
}
