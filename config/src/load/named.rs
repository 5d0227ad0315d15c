//! `[side_inputs]`, `[models]`, the `${{…}}` references to them in `arguments`, and
//! `partition_format` for file inputs.

use std::collections::BTreeMap;

use toml::Value;

use super::location::location;
use super::read::{self, Fault};
use crate::named::{MODELS, SIDE_INPUTS, references};
use crate::{Input, Location, PartitionFormat};

/// `[side_inputs] name = "path"`, or the list form, each entry named after its last path
/// component (`data/labels.txt` → `labels.txt`).
pub(super) fn side_inputs(
    field: &str,
    value: &Value,
    base: &Location,
) -> Result<BTreeMap<String, Location>, Fault> {
    match value {
        Value::Array(items) => {
            let mut named = BTreeMap::new();
            for item in items {
                let text = read::string(field, item)?;
                let name = text
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .filter(|n| !n.is_empty() && !n.ends_with(':'))
                    .ok_or_else(|| Fault::rule(field, "names no file or folder", item))?;
                let location = existing(field, location(field, item, base)?)?;
                if named.insert(name.to_owned(), location).is_some() {
                    let rule = "two entries share a last path component; use the table form \
                                [side_inputs] name = \"path\"";
                    return Err(Fault::rule(field, rule, item));
                }
            }
            Ok(named)
        }
        _ => table(field, value, base),
    }
}

/// `[models] name = "path-or-s3-prefix"`.
pub(super) fn models(
    field: &str,
    value: &Value,
    base: &Location,
) -> Result<BTreeMap<String, Location>, Fault> {
    table(field, value, base)
}

fn table(field: &str, value: &Value, base: &Location) -> Result<BTreeMap<String, Location>, Fault> {
    read::table(field, value)
        .map_err(|_| Fault::wrong_type(field, "a table of name = \"path\"", value))?
        .iter()
        .map(|(name, path)| {
            let entry = format!("{field}.{name}");
            if name.is_empty() || name.contains(['/', '\0']) || name == "." || name == ".." {
                let rule = "names must be non-empty and without \"/\"";
                return Err(Fault::rule(field, rule, &Value::String(name.clone())));
            }
            Ok((
                name.clone(),
                existing(&entry, location(&entry, path, base)?)?,
            ))
        })
        .collect()
}

/// A local side input or model must be there; an S3 one is taken on trust.
fn existing(field: &str, location: Location) -> Result<Location, Fault> {
    match &location {
        Location::Local(path) if !path.exists() => {
            Err(Fault::path_rule(field, "file or folder not found", path))
        }
        _ => Ok(location),
    }
}

/// Every `${{side_inputs.x}}` / `${{models.x}}` in `arguments` names an entry of its table.
pub(super) fn check_references(
    arguments: &[String],
    side_inputs: Option<&BTreeMap<String, Location>>,
    models: Option<&BTreeMap<String, Location>>,
) -> Result<(), Fault> {
    for argument in arguments {
        for reference in references(argument) {
            let (table, field) = match reference.kind {
                SIDE_INPUTS => (side_inputs, SIDE_INPUTS),
                MODELS => (models, MODELS),
                other => {
                    let rule = format!(
                        "${{{{{other}.…}}}} is not a reference fleetrun knows; use \
                         ${{{{side_inputs.<name>}}}} or ${{{{models.<name>}}}}"
                    );
                    return Err(Fault::rule(
                        "arguments",
                        rule,
                        &Value::String(argument.clone()),
                    ));
                }
            };
            if !table.is_some_and(|t| t.contains_key(reference.name)) {
                let known = table
                    .map(|t| t.keys().cloned().collect::<Vec<_>>().join(", "))
                    .filter(|k| !k.is_empty())
                    .unwrap_or_else(|| "none".to_owned());
                let rule = format!(
                    "names {field}.{}, which [{field}] does not define (known: {known})",
                    reference.name
                );
                return Err(Fault::rule(
                    "arguments",
                    rule,
                    &Value::String(argument.clone()),
                ));
            }
        }
    }
    Ok(())
}

/// `partition_format` goes with `partition_keys` on a file input, and names every key.
pub(super) fn check_partition_format(
    format: Option<&str>,
    keys: Option<&[String]>,
    keys_value: Option<&Value>,
    input: &Input,
) -> Result<(), Fault> {
    const FIELD: &str = "partition_format";
    let is_files = matches!(input, Input::Files(_));
    match (format, keys) {
        (None, Some(_)) if is_files => Err(Fault::rule(
            "partition_keys",
            "a file input also needs partition_format, naming the keys' path parts \
             (such as \"{user}/{genres}/{name}.txt\")",
            keys_value.expect("partition_keys was read"),
        )),
        (Some(format), _) if !is_files => Err(Fault::rule(
            FIELD,
            "only for file inputs",
            &Value::String(format.to_owned()),
        )),
        (Some(format), keys) => {
            let got = || Value::String(format.to_owned());
            let parsed =
                PartitionFormat::parse(format).map_err(|why| Fault::rule(FIELD, why, &got()))?;
            let Some(keys) = keys else {
                return Err(Fault::rule(FIELD, "needs partition_keys", &got()));
            };
            if keys.is_empty() {
                return Err(Fault::rule(
                    "partition_keys",
                    "must name at least one key",
                    keys_value.expect("partition_keys was read"),
                ));
            }
            for key in keys {
                if !parsed.keys().any(|k| k == key) {
                    let rule = format!("does not name the partition key {{{key}}}");
                    return Err(Fault::rule(FIELD, rule, &got()));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
