//! The keys a job file may hold, read off [`JobFile`] itself, and the "did you mean" for
//! those it may not.

use std::sync::OnceLock;

use serde::Deserialize;
use toml::{Table, Value};

use super::Fault;
use crate::JobFile;

/// The keys of a job file.
#[derive(Default)]
struct Keys {
    /// Every key with a fixed name, top-level ones first, tables' keys dotted
    /// (`input.files`).
    fixed: Vec<String>,
    /// The tables whose keys are names (`environment_variables`, `models`).
    named: Vec<String>,
}

/// The keys of [`JobFile`], so that a field added there is known here too: a job with
/// every field left out, written as JSON, holds every field (`null` or its default), the
/// fields of its tables inside them, and `{}` for the tables of names.
fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let empty = JobFile::deserialize(Value::Table(Table::new()))
            .expect("every field of a job file may be left out");
        let serde_json::Value::Object(fields) =
            serde_json::to_value(empty).expect("a job file is JSON")
        else {
            unreachable!("a struct is a JSON object")
        };
        let mut keys = Keys::default();
        let mut nested = Vec::new();
        for (key, value) in fields {
            match value {
                serde_json::Value::Object(table) if table.is_empty() => {
                    keys.named.push(key.clone());
                }
                serde_json::Value::Object(table) => {
                    nested.extend(table.keys().map(|field| format!("{key}.{field}")));
                }
                _ => {}
            }
            keys.fixed.push(key);
        }
        keys.fixed.extend(nested);
        keys
    })
}

/// Checks a dotted key, as a `--set` names it: `mini_batch_size`, `input.files`,
/// `environment_variables.OMP_NUM_THREADS`.
pub(super) fn check_key(key: &str) -> Result<(), Fault> {
    let keys = keys();
    let known = keys.fixed.iter().any(|known| known == key)
        || key.split_once('.').is_some_and(|(table, name)| {
            !name.is_empty() && keys.named.iter().any(|named| named == table)
        });
    if known { Ok(()) } else { Err(unknown(key)) }
}

/// The fault of `field`, a key fleetrun does not know.
pub(super) fn unknown(field: &str) -> Fault {
    Fault::Unknown {
        field: field.to_owned(),
        suggestion: suggest(field),
    }
}

/// The known key `field` most likely meant: the same key in another place (`files` at
/// the top level, `mini_batch_size` under `[input]`), else the closest spelling.
fn suggest(field: &str) -> Option<String> {
    let last_part = |key: &str| key.rsplit('.').next().map(str::to_owned);
    let candidates = &keys().fixed;
    if let Some(moved) = candidates
        .iter()
        .find(|known| last_part(known) == last_part(field))
    {
        return Some(moved.clone());
    }
    crate::did_you_mean(field, candidates.iter().map(String::as_str)).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suggestion(key: &str) -> Option<String> {
        match check_key(key) {
            Err(Fault::Unknown { suggestion, .. }) => suggestion,
            other => panic!("{key}: {other:?}"),
        }
    }

    #[test]
    fn known_keys_pass() {
        for key in [
            "name",
            "input",
            "input.files",
            "output.path",
            "environment_variables.A",
        ] {
            assert_eq!(check_key(key), Ok(()), "{key}");
        }
    }

    #[test]
    fn typos_get_the_closest_key() {
        assert_eq!(
            suggestion("mini_bacth_size").as_deref(),
            Some("mini_batch_size")
        );
        assert_eq!(suggestion("input.fles").as_deref(), Some("input.files"));
        assert_eq!(suggestion("inputs").as_deref(), Some("input"));
        assert_eq!(suggestion("zzz"), None);
    }

    #[test]
    fn misplaced_keys_get_their_place() {
        assert_eq!(suggestion("files").as_deref(), Some("input.files"));
        assert_eq!(
            suggestion("input.mini_batch_size").as_deref(),
            Some("mini_batch_size")
        );
    }
}
