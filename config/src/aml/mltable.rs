//! An `MLTable` folder given as a v2 job's `mltable` input, read as a tabular input: its
//! one `paths` entry (`file` or `folder`) and how it is read (`read_delimited`,
//! `read_parquet`, `read_json_lines`). Anything else it asks for is refused, naming the key.

use std::path::Path;

use yaml_serde::Value as Yaml;

/// What an `MLTable` file says of its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The data's path, relative to the `MLTable`'s folder.
    pub relative: String,
    /// `csv`, `jsonl` or `parquet`.
    pub format: &'static str,
    /// `read_delimited`'s `delimiter`, when it is not `,`.
    pub separator: Option<String>,
}

impl Table {
    /// The data's path, from where the folder `folder` is given.
    pub fn path(&self, folder: &str) -> String {
        let relative = self.relative.trim_start_matches("./");
        format!("{}/{relative}", folder.trim_end_matches('/'))
    }
}

/// The `MLTable` in `folder`, if it holds one.
pub fn read(folder: &Path) -> Option<Result<Table, String>> {
    let file = folder.join("MLTable");
    let text = std::fs::read_to_string(&file).ok()?;
    Some(parse(&text).map_err(|e| format!("{}: {e}", file.display())))
}

fn parse(text: &str) -> Result<Table, String> {
    let doc: Yaml = yaml_serde::from_str(text).map_err(|e| e.to_string())?;
    for key in doc.as_mapping().into_iter().flat_map(|m| m.keys()) {
        let key = key.as_str().unwrap_or_default();
        if !["paths", "transformations", "type", "$schema"].contains(&key) {
            return Err(format!("{key}: not supported by fleetrun"));
        }
    }
    let paths = doc
        .get("paths")
        .and_then(Yaml::as_sequence)
        .ok_or("paths: required")?;
    let [entry] = paths.as_slice() else {
        return Err(format!(
            "paths: fleetrun reads one entry, got {}",
            paths.len()
        ));
    };
    let relative = ["file", "folder"]
        .iter()
        .find_map(|kind| entry.get(kind).and_then(Yaml::as_str))
        .ok_or("paths: an entry of `file` or `folder` (`pattern` is not supported)")?
        .to_owned();
    if relative.contains("://") {
        return Err(format!("paths: {relative} cannot be reached here"));
    }
    let mut table = Table {
        relative,
        format: "csv",
        separator: None,
    };
    for step in doc
        .get("transformations")
        .and_then(Yaml::as_sequence)
        .into_iter()
        .flatten()
    {
        let (name, settings) = step
            .as_mapping()
            .and_then(|m| m.iter().next())
            .ok_or("transformations: each is a mapping")?;
        match name.as_str().unwrap_or_default() {
            "read_delimited" => {
                table.format = "csv";
                let delimiter = settings.get("delimiter").and_then(Yaml::as_str);
                table.separator = delimiter.filter(|d| *d != ",").map(str::to_owned);
            }
            "read_parquet" => table.format = "parquet",
            "read_json_lines" => table.format = "jsonl",
            other => {
                return Err(format!(
                    "transformations.{other}: not supported by fleetrun (it reads read_delimited, read_parquet and read_json_lines)"
                ));
            }
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delimited_file_is_a_csv_input() {
        let table = parse(
            "paths:\n  - file: ./rows.csv\ntransformations:\n  - read_delimited:\n      delimiter: ';'\n      header: all_files_same_headers\n",
        )
        .unwrap();
        assert_eq!(table.path("./data"), "./data/rows.csv");
        assert_eq!(
            (table.format, table.separator.as_deref()),
            ("csv", Some(";"))
        );
    }

    #[test]
    fn what_fleetrun_does_not_read_is_refused_by_key() {
        let err = parse("paths:\n  - pattern: ./*.csv\n").unwrap_err();
        assert!(err.contains("pattern"), "{err}");
        let err = parse(
            "paths:\n  - folder: ./d\ntransformations:\n  - extract_columns_from_partition_format:\n      partition_format: '{Store}/x.csv'\n",
        )
        .unwrap_err();
        assert!(
            err.starts_with("transformations.extract_columns_from_partition_format"),
            "{err}"
        );
    }
}
