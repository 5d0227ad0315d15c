//! The keys a job file may hold, and the "did you mean" for those it may not.

use toml::Table;

use super::read::{self, Fault};

/// Every top-level key, in the order CONTRACT.md §2 lists them.
const TOP_LEVEL: &[&str] = &[
    "name",
    "entry_script",
    "source_directory",
    "arguments",
    "input",
    "side_inputs",
    "output",
    "mini_batch_size",
    "error_threshold",
    "output_action",
    "append_row_file_name",
    "node_count",
    "process_count_per_node",
    "logging_level",
    "run_invocation_timeout",
    "run_max_try",
    "resource_monitor_interval",
    "allowed_failed_count",
    "allowed_failed_percent",
    "partition_keys",
    "partition_format",
    "models",
    "environment_variables",
    "append_row_dataframe_header",
    "append_row_separator",
    "first_task_creation_timeout",
    "progress_update_timeout",
    "environment",
    "profile",
];

/// The top-level keys that are tables, with the keys they take (`None`: any key).
const TABLES: &[(&str, Option<&[&str]>)] = &[
    ("input", Some(&["files", "tabular", "format", "separator"])),
    ("output", Some(&["path"])),
    ("environment_variables", None),
    ("side_inputs", None),
    ("models", None),
];

/// How alike (Jaro-Winkler, 0–1) an unknown key must be to a known one to be suggested.
const SUGGESTION_SIMILARITY: f64 = 0.8;

/// Checks that every key of `doc`, and of its tables, is one fleetrun knows.
pub(super) fn check(doc: &Table) -> Result<(), Fault> {
    for (key, value) in doc {
        check_key(key)?;
        if let Some((_, Some(known))) = TABLES.iter().find(|(table, _)| table == key) {
            for nested in read::table(key, value)?.keys() {
                if !known.contains(&nested.as_str()) {
                    return Err(unknown(&format!("{key}.{nested}")));
                }
            }
        }
    }
    Ok(())
}

/// Checks a dotted key, as a `--set` names it: `mini_batch_size`, `input.files`,
/// `environment_variables.OMP_NUM_THREADS`.
pub(super) fn check_key(key: &str) -> Result<(), Fault> {
    let known = match key.split_once('.') {
        None => TOP_LEVEL.contains(&key),
        Some((table, nested)) => TABLES.iter().any(|(name, keys)| {
            *name == table
                && match keys {
                    Some(keys) => keys.contains(&nested),
                    None => !nested.is_empty(),
                }
        }),
    };
    if known { Ok(()) } else { Err(unknown(key)) }
}

fn unknown(field: &str) -> Fault {
    Fault::Unknown {
        field: field.to_owned(),
        suggestion: suggest(field),
    }
}

/// The known key `field` most likely meant: the same key in another place (`files` at
/// the top level, `mini_batch_size` under `[input]`), else the closest spelling.
fn suggest(field: &str) -> Option<String> {
    let last_part = |key: &str| key.rsplit('.').next().map(str::to_owned);
    let candidates = known_keys();
    if let Some(moved) = candidates
        .iter()
        .find(|known| last_part(known) == last_part(field))
    {
        return Some(moved.clone());
    }
    candidates
        .into_iter()
        .map(|known| (strsim::jaro_winkler(field, &known), known))
        .filter(|(similarity, _)| *similarity >= SUGGESTION_SIMILARITY)
        .max_by(|(a, _), (b, _)| a.total_cmp(b))
        .map(|(_, known)| known)
}

/// Every key with a fixed name, tables' keys dotted (`input.files`).
fn known_keys() -> Vec<String> {
    let nested = TABLES.iter().flat_map(|(table, keys)| {
        keys.unwrap_or_default()
            .iter()
            .map(move |key| format!("{table}.{key}"))
    });
    TOP_LEVEL
        .iter()
        .map(|key| key.to_string())
        .chain(nested)
        .collect()
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
