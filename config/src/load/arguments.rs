//! ParallelRunStep's settings written in `arguments` (`--allowed_failed_percent 30
//! --progress_update_timeout 600`), as its samples pass them: each is taken as the job's
//! key of that name unless the job file (or a `--set`) gives the key too, which wins. The
//! arguments stay the script's `sys.argv[1:]` all the same, as on Azure ML.

use toml::{Table, Value};

use crate::ArgumentSetting;

/// The settings ParallelRunStep read from `arguments`, each the job file's key of the same
/// name.
pub const SETTINGS: [&str; 11] = [
    "error_threshold",
    "allowed_failed_count",
    "allowed_failed_percent",
    "progress_update_timeout",
    "first_task_creation_timeout",
    "resource_monitor_interval",
    "task_overhead_timeout",
    "process_count_per_node",
    "run_invocation_timeout",
    "run_max_try",
    "append_row_dataframe_header",
];

/// Takes the settings `doc`'s `arguments` give into `doc` where it has no value of its own,
/// and says what became of each, in the order of `arguments`.
pub(crate) fn take(doc: &mut Table) -> Vec<ArgumentSetting> {
    let found = match doc.get("arguments") {
        Some(Value::Array(arguments)) => find(arguments),
        _ => Vec::new(),
    };
    found
        .into_iter()
        .map(|(key, value)| {
            let taken = !doc.contains_key(key);
            if taken {
                doc.insert(key.to_owned(), typed(&value));
            }
            ArgumentSetting {
                key: key.to_owned(),
                value,
                taken,
            }
        })
        .collect()
}

/// The settings in `arguments`: `--key value` or `--key=value`; the last of a key counts.
fn find(arguments: &[Value]) -> Vec<(&'static str, String)> {
    let text = |value: &Value| match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let words: Vec<String> = arguments.iter().map(text).collect();
    let mut found: Vec<(&'static str, String)> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = &words[i];
        i += 1;
        let Some(flag) = word.strip_prefix("--") else {
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag, None),
        };
        let Some(key) = SETTINGS.iter().find(|key| **key == name) else {
            continue;
        };
        let value = match inline {
            Some(value) => value,
            None => match words.get(i) {
                Some(next) if !next.starts_with("--") => {
                    i += 1;
                    next.clone()
                }
                // A flag alone (`--append_row_dataframe_header`) is true.
                _ => "true".to_owned(),
            },
        };
        found.retain(|(seen, _)| seen != key);
        found.push((key, value));
    }
    found
}

/// `value` as the job file would hold it: a number or a boolean when it reads as one
/// (`True` as Python writes it too), else the text, which validation then refuses by name.
fn typed(value: &str) -> Value {
    let trimmed = value.trim();
    if let Ok(n) = trimmed.parse::<i64>() {
        return Value::Integer(n);
    }
    if let Ok(x) = trimmed.parse::<f64>() {
        return Value::Float(x);
    }
    match trimmed.to_ascii_lowercase().as_str() {
        "true" => Value::Boolean(true),
        "false" => Value::Boolean(false),
        _ => Value::String(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn settings_in_arguments_become_the_jobs_keys_and_stay_in_argv() {
        let mut d = doc(
            r#"arguments = ["--model", "m", "--allowed_failed_percent", "30",
            "--progress_update_timeout=600", "--task_overhead_timeout", 1200,
            "--append_row_dataframe_header", "--run_max_try", "True"]"#,
        );
        let taken = take(&mut d);
        let keys: Vec<_> = taken.iter().map(|s| (s.key.as_str(), s.taken)).collect();
        assert_eq!(
            keys,
            [
                ("allowed_failed_percent", true),
                ("progress_update_timeout", true),
                ("task_overhead_timeout", true),
                ("append_row_dataframe_header", true),
                ("run_max_try", true),
            ]
        );
        assert_eq!(d["allowed_failed_percent"], Value::Integer(30));
        assert_eq!(d["progress_update_timeout"], Value::Integer(600));
        assert_eq!(d["task_overhead_timeout"], Value::Integer(1200));
        assert_eq!(d["append_row_dataframe_header"], Value::Boolean(true));
        // Refused by validation, naming the key: a number of attempts is not a boolean.
        assert_eq!(d["run_max_try"], Value::Boolean(true));
        assert_eq!(d["arguments"].as_array().unwrap().len(), 10);
        assert!(d.get("model").is_none());
    }

    #[test]
    fn the_job_file_wins_and_the_last_argument_counts() {
        let mut d = doc(r#"allowed_failed_count = 3
            arguments = ["--allowed_failed_count", "10", "--error_threshold", "5",
                         "--error_threshold", "7"]"#);
        let taken = take(&mut d);
        assert_eq!(
            taken,
            [
                ArgumentSetting {
                    key: "allowed_failed_count".into(),
                    value: "10".into(),
                    taken: false,
                },
                ArgumentSetting {
                    key: "error_threshold".into(),
                    value: "7".into(),
                    taken: true,
                },
            ]
        );
        assert_eq!(d["allowed_failed_count"], Value::Integer(3));
        assert_eq!(d["error_threshold"], Value::Integer(7));
    }

    #[test]
    fn values_read_as_the_job_file_would_hold_them() {
        assert_eq!(typed("30"), Value::Integer(30));
        assert_eq!(typed("2.5"), Value::Float(2.5));
        assert_eq!(typed("False"), Value::Boolean(false));
        assert_eq!(typed("soon"), Value::String("soon".into()));
    }
}
