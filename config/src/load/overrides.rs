//! `--set key=value`: one field of the job file, set from the command line.

use toml::{Table, Value};

use super::keys;
use crate::ConfigError;

/// A `--set key=value` applied to the job file.
pub(super) struct Override<'a> {
    arg: &'a str,
    key: &'a str,
}

impl<'a> Override<'a> {
    /// Sets `key` (dotted into a table: `input.files`) to `value`, read as a TOML value
    /// (`5`, `-1`, `true`, `"x"`, `["a", "b"]`) or else taken as a plain string
    /// (`data/other`).
    pub(super) fn apply(doc: &mut Table, arg: &'a str) -> Result<Self, ConfigError> {
        let (key, raw) = arg
            .split_once('=')
            .map(|(key, raw)| (key.trim(), raw.trim()))
            .filter(|(key, _)| !key.is_empty())
            .ok_or_else(|| ConfigError::Override {
                arg: arg.to_owned(),
            })?;
        let applied = Override { arg, key };
        keys::check_key(key).map_err(|fault| fault.at(applied.origin()))?;

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

    /// Whether this override wrote `field` (or the table holding it).
    pub(super) fn covers(&self, field: &str) -> bool {
        field
            .strip_prefix(self.key)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    }

    /// The job file's key it sets, dotted into a table (`input.files`).
    pub(super) fn key(&self) -> &str {
        self.key
    }

    /// `--set key=value`, as an error names it.
    pub(super) fn origin(&self) -> String {
        format!("--set {}", self.arg)
    }
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
