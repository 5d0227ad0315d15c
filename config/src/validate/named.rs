//! `[side_inputs]`, `[models]`, `[outputs]`, the `${{…}}` references to them in
//! `arguments`, and `partition_format` for file inputs.

use std::collections::BTreeMap;

use super::location::location;
use crate::file::{NamedPaths, SideInputPaths};
use crate::named::{MODELS, OUTPUTS, SIDE_INPUTS, references};
use crate::{FieldError, Input, Location, PartitionFormat};

/// `[side_inputs] name = "path"`, or the list form, each entry named after its last path
/// component (`data/labels.txt` → `labels.txt`).
pub(super) fn side_inputs(
    paths: &SideInputPaths,
    base: &Location,
) -> Result<BTreeMap<String, Location>, FieldError> {
    const FIELD: &str = SIDE_INPUTS;
    let listed = match paths {
        SideInputPaths::Named(named) => return table(FIELD, named, base),
        SideInputPaths::Listed(listed) => listed,
    };
    let mut named = BTreeMap::new();
    for text in listed {
        let name = text
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty() && !n.ends_with(':'))
            .ok_or_else(|| FieldError::rule(FIELD, "names no file or folder", text))?;
        let location = existing(FIELD, location(FIELD, text, base)?)?;
        if named.insert(name.to_owned(), location).is_some() {
            let rule = "two entries share a last path component; use the table form \
                        [side_inputs] name = \"path\"";
            return Err(FieldError::rule(FIELD, rule, text));
        }
    }
    Ok(named)
}

/// `[models] name = "path-or-s3-prefix"`.
pub(super) fn models(
    paths: &NamedPaths,
    base: &Location,
) -> Result<BTreeMap<String, Location>, FieldError> {
    table(MODELS, paths, base)
}

fn table(
    field: &str,
    paths: &NamedPaths,
    base: &Location,
) -> Result<BTreeMap<String, Location>, FieldError> {
    paths
        .0
        .iter()
        .map(|(name, path)| {
            let entry = format!("{field}.{name}");
            if name.is_empty() || name.contains(['/', '\0']) || name == "." || name == ".." {
                let rule = "names must be non-empty and without \"/\"";
                return Err(FieldError::rule(field, rule, name));
            }
            Ok((
                name.clone(),
                existing(&entry, location(&entry, path, base)?)?,
            ))
        })
        .collect()
}

/// Names fleetrun keeps for itself in a job's output: a named output may not lie in them.
const OUTPUT_RESERVED: [&str; 4] = ["logs", "_parts", "_fleetrun", ".fleetrun"];

/// `[outputs] name = "folder-or-s3-prefix"`: names are identifiers (AML v2's output names);
/// each lies outside the input, outside the names fleetrun keeps in the job's output, and
/// apart from every other named output.
pub(super) fn outputs(
    paths: &NamedPaths,
    base: &Location,
    input: &Input,
    output: &Location,
    append_row_file_name: &str,
) -> Result<BTreeMap<String, Location>, FieldError> {
    let mut named: BTreeMap<String, Location> = BTreeMap::new();
    for (name, text) in &paths.0 {
        let field = format!("{OUTPUTS}.{name}");
        if !is_identifier(name) {
            let rule =
                "names must be identifiers: a letter or \"_\", then letters, digits or \"_\"";
            return Err(FieldError::rule(OUTPUTS, rule, name));
        }
        let place = location(&field, text, base)?;
        if place.within(input.location()).is_some() || input.location().within(&place).is_some() {
            let rule = "must be outside the input, and not hold it";
            return Err(FieldError::rule(&field, rule, text));
        }
        if let Some(rel) = place.within(output) {
            if rel.is_empty() {
                let rule = "must not be the output folder itself, where fleetrun keeps its own \
                            files (EntryScript().output_dir writes there); name a folder in it";
                return Err(FieldError::rule(&field, rule, text));
            }
            let first = rel.split('/').next().unwrap_or_default();
            if OUTPUT_RESERVED.contains(&first) || first == append_row_file_name {
                let rule = format!(
                    "must not lie in {first}, which fleetrun keeps in the output folder for \
                     itself"
                );
                return Err(FieldError::rule(&field, rule, text));
            }
        }
        if let Some((other, _)) = named
            .iter()
            .find(|(_, l)| place.within(l).is_some() || l.within(&place).is_some())
        {
            let rule = format!("must be apart from outputs.{other}: one holds the other");
            return Err(FieldError::rule(&field, rule, text));
        }
        named.insert(name.clone(), place);
    }
    Ok(named)
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`.
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A local side input or model must be there; an S3 one is taken on trust.
fn existing(field: &str, location: Location) -> Result<Location, FieldError> {
    match &location {
        Location::Local(path) if !path.exists() => Err(FieldError::path_rule(
            field,
            "file or folder not found",
            path,
        )),
        _ => Ok(location),
    }
}

/// Every `${{side_inputs.x}}` / `${{models.x}}` / `${{outputs.x}}` in `arguments` names an
/// entry of its table.
pub(super) fn check_references(
    arguments: &[String],
    side_inputs: &BTreeMap<String, Location>,
    models: &BTreeMap<String, Location>,
    outputs: &BTreeMap<String, Location>,
) -> Result<(), FieldError> {
    for argument in arguments {
        for reference in references(argument) {
            let (table, field) = match reference.kind {
                SIDE_INPUTS => (side_inputs, SIDE_INPUTS),
                MODELS => (models, MODELS),
                OUTPUTS => (outputs, OUTPUTS),
                other => {
                    let rule = format!(
                        "${{{{{other}.…}}}} is not a reference fleetrun knows; use \
                         ${{{{side_inputs.<name>}}}}, ${{{{models.<name>}}}} or \
                         ${{{{outputs.<name>}}}}"
                    );
                    return Err(FieldError::rule("arguments", rule, argument));
                }
            };
            if !table.contains_key(reference.name) {
                let known = match table.keys().cloned().collect::<Vec<_>>().join(", ") {
                    none if none.is_empty() => "none".to_owned(),
                    known => known,
                };
                let rule = format!(
                    "names {field}.{}, which [{field}] does not define (known: {known})",
                    reference.name
                );
                return Err(FieldError::rule("arguments", rule, argument));
            }
        }
    }
    Ok(())
}

/// `partition_format` goes with `partition_keys` on a file input, and names every key.
pub(super) fn check_partition_format(
    format: Option<&str>,
    keys: Option<&[String]>,
    input: &Input,
) -> Result<(), FieldError> {
    const FIELD: &str = "partition_format";
    let is_files = matches!(input, Input::Files(_));
    match (format, keys) {
        (None, Some(keys)) if is_files => Err(FieldError::rule(
            "partition_keys",
            "a file input also needs partition_format, naming the keys' path parts \
             (such as \"{user}/{genres}/{name}.txt\")",
            keys,
        )),
        (Some(format), _) if !is_files => {
            Err(FieldError::rule(FIELD, "only for file inputs", format))
        }
        (Some(format), keys) => {
            let parsed = PartitionFormat::parse(format)
                .map_err(|why| FieldError::rule(FIELD, why, format))?;
            let Some(keys) = keys else {
                return Err(FieldError::rule(FIELD, "needs partition_keys", format));
            };
            if keys.is_empty() {
                return Err(FieldError::rule(
                    "partition_keys",
                    "must name at least one key",
                    keys,
                ));
            }
            for key in keys {
                if !parsed.keys().any(|k| k == key) {
                    let rule = format!("does not name the partition key {{{key}}}");
                    return Err(FieldError::rule(FIELD, rule, format));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
