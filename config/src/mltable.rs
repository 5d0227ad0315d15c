//! An `MLTable` folder as an input (Azure ML's table): the `MLTable` YAML file at the input's
//! root says which files of the folder are the input (`paths`: `file`, `folder`, `pattern`)
//! and how they are read (`read_delimited`, `read_parquet`, `read_json_lines`), may name
//! columns taken from each file's path (`extract_columns_from_partition_format`) and columns
//! `run()` is not given (`drop_columns`).
//!
//! [`MlTable::parse`] is pure: the submitter reads the file from the input's storage (a local
//! folder or an S3 prefix) and keeps what it parsed in the job's spec
//! ([`crate::JobSpec::mltable`]). Whatever fleetrun does not read is refused by its key
//! (`transformations.keep_columns: not supported`), never ignored.

use serde::{Deserialize, Serialize};
use yaml_serde::Value as Yaml;

use crate::{PartitionFormat, TabularFormat};

/// The name of the file that makes a folder an MLTable.
pub const MLTABLE_FILE: &str = "MLTable";

/// The column `include_path_column` adds, as Azure ML names it.
pub const PATH_COLUMN: &str = "Path";

/// What is wrong with an `MLTable` file: the key, dotted, and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {rule}")]
pub struct MlTableError {
    /// `transformations.drop_columns`, `paths[1].pattern`, `read_delimited.header`.
    pub key: String,
    pub rule: String,
}

fn refuse(key: impl Into<String>, rule: impl Into<String>) -> MlTableError {
    MlTableError {
        key: key.into(),
        rule: rule.into(),
    }
}

/// An `MLTable` file, as fleetrun reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlTable {
    /// The `paths` entries, relative to the MLTable's folder (`./` taken off).
    pub paths: Vec<PathEntry>,
    /// The read transformation; `None` when the file names none (each file's extension
    /// then tells its format, as for any tabular input).
    pub read: Option<Read>,
    /// `extract_columns_from_partition_format`: `{Store}/{Brand}/data.csv`, matched against
    /// the end of each file's path.
    pub partition_format: Option<String>,
    /// `drop_columns`: columns of the files or of the path that `run()` is not given, in
    /// their order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_columns: Vec<String>,
}

/// One entry of `paths`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathEntry {
    /// `file: ./data.csv`: that file.
    File(String),
    /// `folder: ./data`: every file under it, at any depth (`.` for the whole folder).
    Folder(String),
    /// `pattern: ./data/**/*.csv`: every file whose path matches the glob (`*` and `?` within
    /// one path part, `**` across parts, `[abc]`, `[a-z]`, `[!a]`).
    Pattern(String),
}

/// How the files are read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Read {
    pub format: TabularFormat,
    /// `read_delimited`'s `delimiter` (`,` by default).
    pub separator: u8,
    /// The Python codec of `encoding`, when it is not UTF-8.
    pub encoding: Option<String>,
    /// `read_delimited`'s `empty_as_string`: empty fields are `""`, not missing.
    pub empty_as_string: bool,
    /// `include_path_column`: each row gets the column `Path`, its file's location.
    pub include_path_column: bool,
}

impl MlTable {
    /// Reads an `MLTable` file's text.
    pub fn parse(text: &str) -> Result<MlTable, MlTableError> {
        let doc: Yaml = yaml_serde::from_str(text).map_err(|e| refuse("MLTable", e.to_string()))?;
        let Some(top) = doc.as_mapping() else {
            return Err(refuse("MLTable", "must be a YAML mapping"));
        };
        for key in top.keys() {
            let key = key.as_str().unwrap_or_default();
            if !["paths", "transformations", "type", "$schema"].contains(&key) {
                return Err(refuse(key, "not supported"));
            }
        }
        if let Some(kind) = doc.get("type").filter(|t| t.as_str() != Some("mltable")) {
            return Err(refuse("type", format!("must be mltable (got {kind:?})")));
        }
        let paths = paths(doc.get("paths"))?;
        let mut table = MlTable {
            paths,
            read: None,
            partition_format: None,
            drop_columns: Vec::new(),
        };
        let steps = match doc.get("transformations") {
            None | Some(Yaml::Null) => &[][..],
            Some(Yaml::Sequence(steps)) => steps.as_slice(),
            Some(_) => return Err(refuse("transformations", "must be a list")),
        };
        let no_settings = Yaml::Null;
        for step in steps {
            let (name, settings) = match step {
                Yaml::Mapping(m) if m.len() == 1 => {
                    let (name, settings) = m.iter().next().expect("one entry");
                    (name.as_str().unwrap_or_default(), settings)
                }
                // `- read_parquet`, a step without settings.
                Yaml::String(name) => (name.as_str(), &no_settings),
                _ => return Err(refuse("transformations", "each is one name: settings")),
            };
            let key = format!("transformations.{name}");
            if !table.drop_columns.is_empty() && name != "drop_columns" {
                let rule = "comes after drop_columns; fleetrun drops columns last (move drop_columns to the end)";
                return Err(refuse(key, rule));
            }
            match name {
                "read_delimited" | "read_parquet" | "read_json_lines" => {
                    if table.read.is_some() {
                        return Err(refuse(key, "a second read transformation"));
                    }
                    table.read = Some(read(name, settings)?);
                }
                "extract_columns_from_partition_format" => {
                    table.partition_format = Some(partition_format(&key, settings)?);
                }
                "drop_columns" => {
                    for column in column_names(&key, settings)? {
                        if table.drop_columns.contains(&column) {
                            return Err(refuse(key, format!("names {column} twice")));
                        }
                        table.drop_columns.push(column);
                    }
                }
                _ => return Err(refuse(key, "not supported")),
            }
        }
        Ok(table)
    }

    /// Whether the file `key` (relative to the MLTable's folder) is one the paths select.
    /// The `MLTable` file itself never is.
    pub fn selects(&self, key: &str) -> bool {
        key != MLTABLE_FILE
            && self.paths.iter().any(|entry| match entry {
                PathEntry::File(file) => key == file,
                PathEntry::Folder(folder) => {
                    folder.is_empty()
                        || key
                            .strip_prefix(folder.as_str())
                            .is_some_and(|rest| rest.starts_with('/'))
                }
                PathEntry::Pattern(pattern) => glob(pattern.as_bytes(), key.as_bytes()),
            })
    }

    /// The columns `extract_columns_from_partition_format` names, in its order.
    pub fn path_column_names(&self) -> Vec<String> {
        self.partition_format
            .as_deref()
            .and_then(|format| PartitionFormat::parse(format).ok())
            .map(|format| format.keys().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Every column the table takes from the path: those of the partition format, then `Path`
    /// with `include_path_column`.
    pub fn all_path_column_names(&self) -> Vec<String> {
        let mut names = self.path_column_names();
        if self
            .read
            .as_ref()
            .is_some_and(|read| read.include_path_column)
        {
            names.push(PATH_COLUMN.to_owned());
        }
        names
    }

    /// The columns of the files that `drop_columns` names: those it names that are not
    /// taken from the path. Each must be a column of the rows read.
    pub fn dropped_file_columns(&self) -> Vec<String> {
        let from_path = self.all_path_column_names();
        self.drop_columns
            .iter()
            .filter(|name| !from_path.contains(name))
            .cloned()
            .collect()
    }

    /// Whether `drop_columns` names the column `name`.
    pub fn drops(&self, name: &str) -> bool {
        self.drop_columns.iter().any(|dropped| dropped == name)
    }

    /// The values of the path columns for the file `key`, in their order: `None` when its
    /// path does not end in the format's shape; empty without a format.
    pub fn path_columns(&self, key: &str) -> Option<Vec<(String, String)>> {
        let Some(text) = self.partition_format.as_deref() else {
            return Some(Vec::new());
        };
        let format = PartitionFormat::parse(text).ok()?;
        // The format covers the path's last parts, as many as it has.
        let parts = text.trim_start_matches('/').matches('/').count() + 1;
        let start = key
            .rmatch_indices('/')
            .nth(parts - 1)
            .map_or(0, |(at, _)| at + 1);
        let values = format.matches(&key[start..])?;
        Some(
            format
                .keys()
                .map(|k| (k.to_owned(), values[k].clone()))
                .collect(),
        )
    }
}

fn paths(paths: Option<&Yaml>) -> Result<Vec<PathEntry>, MlTableError> {
    let Some(Yaml::Sequence(entries)) = paths else {
        return Err(refuse(
            "paths",
            "required: a list of file, folder or pattern",
        ));
    };
    if entries.is_empty() {
        return Err(refuse("paths", "names no file, folder or pattern"));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let at = format!("paths[{i}]");
            let Some(map) = entry.as_mapping().filter(|m| m.len() == 1) else {
                return Err(refuse(at, "each is one of file, folder or pattern"));
            };
            let (kind, value) = map.iter().next().expect("one entry");
            let kind = kind.as_str().unwrap_or_default();
            let at = format!("{at}.{kind}");
            let Some(value) = value.as_str() else {
                return Err(refuse(at, "must be a path"));
            };
            let relative = relative(&at, value)?;
            match kind {
                "file" if relative.is_empty() => Err(refuse(at, "names no file")),
                "file" => Ok(PathEntry::File(relative)),
                "folder" => Ok(PathEntry::Folder(relative)),
                "pattern" => Ok(PathEntry::Pattern(relative)),
                _ => Err(refuse(at, "not supported (file, folder or pattern)")),
            }
        })
        .collect()
}

/// A path inside the MLTable's folder, `/`-separated, without `./` or a trailing `/`.
fn relative(at: &str, path: &str) -> Result<String, MlTableError> {
    if path.contains("://") || path.starts_with("azureml:") {
        return Err(refuse(
            at,
            format!(
                "{path} cannot be reached here: fleetrun reads paths inside the MLTable's folder"
            ),
        ));
    }
    if path.starts_with('/') || path.split('/').any(|part| part == "..") {
        return Err(refuse(
            at,
            format!("{path} is outside the MLTable's folder: fleetrun reads paths inside it"),
        ));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    Ok(parts.join("/"))
}

/// `drop_columns: [a, b]` or `drop_columns: a`, as the mltable package takes them.
fn column_names(at: &str, settings: &Yaml) -> Result<Vec<String>, MlTableError> {
    let names = match settings {
        Yaml::String(name) => vec![name],
        Yaml::Sequence(names) => names
            .iter()
            .map(|name| match name {
                Yaml::String(name) => Ok(name),
                _ => Err(refuse(at, "each column is a name")),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(refuse(at, "expected a column name or a list of them")),
    };
    Ok(names.into_iter().cloned().collect())
}

/// Encodings whose bytes keep `\n`, `"` and the delimiter as ASCII, so records can be cut by
/// byte: Azure's name → Python's codec (`None` for UTF-8).
const ENCODINGS: [(&str, Option<&str>); 6] = [
    ("utf8", None),
    ("ascii", Some("ascii")),
    ("latin1", Some("latin-1")),
    ("iso88591", Some("iso-8859-1")),
    ("windows1252", Some("cp1252")),
    ("utf8bom", Some("utf-8-sig")),
];

fn read(name: &str, settings: &Yaml) -> Result<Read, MlTableError> {
    let format = match name {
        "read_delimited" => TabularFormat::Csv,
        "read_json_lines" => TabularFormat::JsonLines,
        _ => TabularFormat::Parquet,
    };
    let mut read = Read {
        format,
        separator: b',',
        encoding: None,
        empty_as_string: false,
        include_path_column: false,
    };
    let settings = match settings {
        Yaml::Null => return Ok(read),
        Yaml::Mapping(settings) => settings,
        _ => return Err(refuse(name, "settings must be a mapping")),
    };
    let csv = format == TabularFormat::Csv;
    let json = format == TabularFormat::JsonLines;
    for (key, value) in settings {
        let key = key.as_str().unwrap_or_default();
        let at = format!("{name}.{key}");
        let flag = || {
            value
                .as_bool()
                .ok_or_else(|| refuse(&at, "must be true or false"))
        };
        let text = || {
            value
                .as_str()
                .ok_or_else(|| refuse(&at, "must be a string"))
        };
        match key {
            "include_path_column" => read.include_path_column = flag()?,
            "delimiter" if csv => {
                read.separator = match text()?.as_bytes() {
                    [byte] if byte.is_ascii() && !matches!(byte, b'"' | b'\n' | b'\r') => *byte,
                    _ => {
                        let rule =
                            "fleetrun reads one ASCII character other than a quote or a newline";
                        return Err(refuse(at, rule));
                    }
                }
            }
            "header" if csv => match text()? {
                "all_files_same_headers" | "all_files_different_headers" => {}
                other => {
                    let rule = format!(
                        "{other} not supported (fleetrun reads a header in every file: all_files_same_headers, all_files_different_headers)"
                    );
                    return Err(refuse(at, rule));
                }
            },
            "empty_as_string" if csv => read.empty_as_string = flag()?,
            // fleetrun always reads quoted line breaks as part of their field (RFC 4180).
            "support_multi_line" if csv => {
                flag()?;
            }
            "infer_column_types" if csv => {
                if !flag()? {
                    return Err(refuse(at, "false not supported (pandas infers the types)"));
                }
            }
            "encoding" if csv || json => {
                let given = text()?;
                let Some((_, codec)) = ENCODINGS.iter().find(|(azure, _)| *azure == given) else {
                    let known: Vec<&str> = ENCODINGS.iter().map(|(azure, _)| *azure).collect();
                    let rule = format!(
                        "{given} not supported (fleetrun reads {})",
                        known.join(", ")
                    );
                    return Err(refuse(at, rule));
                };
                read.encoding = codec.map(str::to_owned);
            }
            "invalid_lines" if json => {
                if text()? != "error" {
                    return Err(refuse(
                        at,
                        "only error is supported (a bad line fails its mini-batch)",
                    ));
                }
            }
            _ => return Err(refuse(at, "not supported")),
        }
    }
    Ok(read)
}

/// `extract_columns_from_partition_format: '{Store}/{Brand}/data.csv'`, or with its
/// `partition_format:` key as the mltable package writes it.
fn partition_format(at: &str, settings: &Yaml) -> Result<String, MlTableError> {
    let text = match settings {
        Yaml::String(text) => text.as_str(),
        Yaml::Mapping(map) => match map.get("partition_format").and_then(Yaml::as_str) {
            Some(text) if map.len() == 1 => text,
            // `{timestamp:yyyy/MM/dd}` unquoted is YAML's mapping of one key.
            _ => {
                let rule = "expected a format such as '{Store}/{Brand}/data.csv' (quoted); \
                            datetime parts ({name:yyyy/MM/dd}) are not supported";
                return Err(refuse(at, rule));
            }
        },
        _ => {
            return Err(refuse(
                at,
                "expected a format such as '{Store}/{Brand}/data.csv'",
            ));
        }
    };
    PartitionFormat::parse(text).map_err(|why| {
        let hint = if text.contains(':') {
            " (datetime parts such as {name:yyyy/MM/dd} are not supported)"
        } else {
            ""
        };
        refuse(at, format!("{text}: {why}{hint}"))
    })?;
    Ok(text.to_owned())
}

/// Whether `text` matches the glob `pattern`: `*` and `?` within one path part, `**` a whole
/// part across any depth (`a/**/b` matches `a/b`), `[…]` one character of a set or range
/// (`!` or `^` first negates).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern {
        [] => text.is_empty(),
        [b'*', b'*', b'/', rest @ ..] => {
            // Zero or more whole parts.
            glob(rest, text)
                || text
                    .iter()
                    .enumerate()
                    .any(|(i, b)| *b == b'/' && glob(rest, &text[i + 1..]))
        }
        [b'*', b'*'] => true,
        [b'*', rest @ ..] => (0..=text.len())
            .take_while(|&i| i == 0 || text[i - 1] != b'/')
            .any(|i| glob(rest, &text[i..])),
        [b'?', rest @ ..] => matches!(text, [c, tail @ ..] if *c != b'/' && glob(rest, tail)),
        [b'[', rest @ ..] => match (class(rest), text) {
            (Some((matched, after)), [c, tail @ ..]) => {
                *c != b'/' && matched(*c) && glob(after, tail)
            }
            (None, [c, tail @ ..]) => *c == b'[' && glob(rest, tail),
            _ => false,
        },
        [p, rest @ ..] => matches!(text, [c, tail @ ..] if c == p && glob(rest, tail)),
    }
}

/// A `[…]` set (what follows its `[`): a test of one byte, and the pattern after its `]`.
#[allow(clippy::type_complexity)]
fn class(pattern: &[u8]) -> Option<(Box<dyn Fn(u8) -> bool + '_>, &[u8])> {
    let (negated, body) = match pattern {
        [b'!' | b'^', rest @ ..] => (true, rest),
        _ => (false, pattern),
    };
    // A `]` first is a member.
    let end = body.iter().skip(1).position(|b| *b == b']')? + 1;
    let set = &body[..end];
    let test = move |c: u8| {
        let mut i = 0;
        let mut found = false;
        while i < set.len() {
            if i + 2 < set.len() && set[i + 1] == b'-' {
                found |= (set[i]..=set[i + 2]).contains(&c);
                i += 3;
            } else {
                found |= set[i] == c;
                i += 1;
            }
        }
        found != negated
    };
    Some((Box::new(test), &body[end + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        MlTable::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_delimited_table_of_several_paths() {
        let table = MlTable::parse(
            "$schema: x\ntype: mltable\npaths:\n  - file: ./a.csv\n  - folder: ./more/\n  - pattern: ./p/**/*.csv\ntransformations:\n  - read_delimited:\n      delimiter: ';'\n      header: all_files_same_headers\n      encoding: latin1\n      empty_as_string: true\n      include_path_column: true\n      support_multi_line: true\n",
        )
        .unwrap();
        let read = table.read.clone().unwrap();
        assert_eq!(read.format, TabularFormat::Csv);
        assert_eq!(read.separator, b';');
        assert_eq!(read.encoding.as_deref(), Some("latin-1"));
        assert!(read.empty_as_string && read.include_path_column);
        for key in [
            "a.csv",
            "more/x.csv",
            "more/deep/y.txt",
            "p/z.csv",
            "p/1/2/z.csv",
        ] {
            assert!(table.selects(key), "{key}");
        }
        for key in [
            "MLTable",
            "b.csv",
            "a.csv.bak",
            "moreover/x.csv",
            "p/z.txt",
            "q/p/z.csv",
        ] {
            assert!(!table.selects(key), "{key}");
        }
    }

    #[test]
    fn the_whole_folder_never_selects_the_mltable_file() {
        let table = MlTable::parse("paths:\n  - folder: .\n").unwrap();
        assert!(table.selects("data/a.csv"));
        assert!(!table.selects("MLTable"));
        assert_eq!(table.read, None);
    }

    #[test]
    fn globs() {
        let yes = |p: &str, t: &str| glob(p.as_bytes(), t.as_bytes());
        assert!(yes("*.csv", "a.csv"));
        assert!(!yes("*.csv", "d/a.csv"), "* stays in its part");
        assert!(yes("d/?.csv", "d/a.csv"));
        assert!(!yes("d/?.csv", "d/ab.csv"));
        assert!(yes("**/*.csv", "a.csv"));
        assert!(yes("**/*.csv", "x/y/a.csv"));
        assert!(yes("x/**", "x/y/a.csv"));
        assert!(yes("[ab]*.csv", "b1.csv"));
        assert!(!yes("[!ab]*.csv", "b1.csv"));
        assert!(yes("part-[0-9].csv", "part-7.csv"));
        assert!(!yes("part-[0-9].csv", "part-x.csv"));
    }

    #[test]
    fn columns_come_from_the_end_of_the_path() {
        let table = MlTable::parse(
            "paths:\n  - pattern: ./**/*.csv\ntransformations:\n  - read_delimited: {}\n  - extract_columns_from_partition_format:\n      partition_format: '{Store}/{Brand}/data.csv'\n",
        )
        .unwrap();
        assert_eq!(table.path_column_names(), ["Store", "Brand"]);
        let columns = table.path_columns("sales/1000/dominicks/data.csv").unwrap();
        assert_eq!(
            columns,
            [
                ("Store".into(), "1000".into()),
                ("Brand".into(), "dominicks".into())
            ]
        );
        assert_eq!(table.path_columns("1000/data.csv"), None);
        assert_eq!(table.path_columns("1000/x/other.csv"), None);
        let bare = MlTable::parse(
            "paths:\n  - folder: .\ntransformations:\n  - read_parquet\n  - extract_columns_from_partition_format: '/{Store}/x.parquet'\n",
        )
        .unwrap();
        assert_eq!(bare.read.as_ref().unwrap().format, TabularFormat::Parquet);
        assert_eq!(bare.path_columns("7/x.parquet").unwrap()[0].1, "7");
    }

    #[test]
    fn dropped_columns_of_the_path_and_of_the_files() {
        let table = MlTable::parse(
            "paths:\n  - pattern: ./**/*.csv\ntransformations:\n  - read_delimited:\n      include_path_column: true\n  - extract_columns_from_partition_format:\n      partition_format: '{Store}/{Brand}/{file_name}.{extension}'\n  - drop_columns: [Path, file_name, extension, Advert]\n",
        )
        .unwrap();
        assert_eq!(
            table.drop_columns,
            ["Path", "file_name", "extension", "Advert"]
        );
        assert_eq!(
            table.all_path_column_names(),
            ["Store", "Brand", "file_name", "extension", "Path"]
        );
        assert_eq!(table.dropped_file_columns(), ["Advert"]);
        assert!(table.drops("Path") && !table.drops("Store"));
        let one = MlTable::parse(
            "paths:\n  - folder: .\ntransformations:\n  - read_delimited: {}\n  - drop_columns: Path\n  - drop_columns: []\n",
        )
        .unwrap();
        assert_eq!(one.drop_columns, ["Path"]);
        assert_eq!(
            one.dropped_file_columns(),
            ["Path"],
            "without include_path_column, Path can only be a column of the files"
        );
    }

    #[test]
    fn what_fleetrun_does_not_read_is_refused_by_key() {
        let cases = [
            (
                "paths:\n  - folder: .\ntransformations:\n  - keep_columns: [a]\n",
                "transformations.keep_columns: not supported",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - drop_columns: [a, b, a]\n",
                "transformations.drop_columns: names a twice",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - drop_columns: {a: 1}\n",
                "transformations.drop_columns: expected a column name or a list",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - drop_columns: [[a]]\n",
                "transformations.drop_columns: each column is a name",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - read_delimited: {}\n  - drop_columns: a\n  - extract_columns_from_partition_format: '{a}/x.csv'\n",
                "transformations.extract_columns_from_partition_format: comes after drop_columns",
            ),
            (
                "paths:\n  - folder: .\ntraits:\n  index_columns: [a]\n",
                "traits: not supported",
            ),
            (
                "paths:\n  - file: https://x/y.csv\n",
                "paths[0].file: https://x/y.csv cannot be reached here",
            ),
            (
                "paths:\n  - file: ./a.csv\n  - folder: ../up\n",
                "paths[1].folder: ../up is outside",
            ),
            ("paths:\n  - url: ./a.csv\n", "paths[0].url: not supported"),
            ("paths: []\n", "paths: names no"),
            ("transformations: []\n", "paths: required"),
            (
                "paths:\n  - folder: .\ntransformations:\n  - read_delimited:\n      header: no_header\n",
                "read_delimited.header: no_header not supported",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - read_delimited:\n      encoding: utf16\n",
                "read_delimited.encoding: utf16 not supported",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - read_json_lines:\n      invalid_lines: drop\n",
                "read_json_lines.invalid_lines",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - read_parquet:\n      delimiter: ','\n",
                "read_parquet.delimiter: not supported",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - read_delta_lake:\n      version_as_of: 1\n",
                "transformations.read_delta_lake: not supported",
            ),
            (
                "paths:\n  - folder: .\ntransformations:\n  - extract_columns_from_partition_format: {timestamp:yyyy/MM/dd}\n",
                "transformations.extract_columns_from_partition_format: expected a format",
            ),
        ];
        for (text, expected) in cases {
            let err = refused(text);
            assert!(err.starts_with(expected), "{text}\n→ {err}");
        }
    }
}
