//! Named data a job brings along whole (`[side_inputs]`, `[models]`), and the
//! `${{side_inputs.name}}` / `${{models.name}}` references to them in `arguments` (AML v2's
//! syntax), replaced by each node with the data's local path.

use std::collections::BTreeMap;
use std::path::Path;

/// The kinds of named data an argument may refer to, as the reference spells them.
pub const SIDE_INPUTS: &str = "side_inputs";
pub const MODELS: &str = "models";

/// One `${{kind.name}}` found in an argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference<'a> {
    /// `side_inputs` or `models` (anything else is reported as unknown).
    pub kind: &'a str,
    pub name: &'a str,
}

/// The `${{kind.name}}` references of `argument`, in order. An unclosed `${{` is not one.
pub fn references(argument: &str) -> Vec<Reference<'_>> {
    let mut found = Vec::new();
    let mut rest = argument;
    while let Some(start) = rest.find("${{") {
        let after = &rest[start + 3..];
        let Some(end) = after.find("}}") else { break };
        let inner = after[..end].trim();
        let (kind, name) = inner.split_once('.').unwrap_or((inner, ""));
        found.push(Reference {
            kind: kind.trim(),
            name: name.trim(),
        });
        rest = &after[end + 2..];
    }
    found
}

/// `argument` with each `${{side_inputs.name}}` / `${{models.name}}` replaced by the local
/// path `paths` gives for it; a reference `paths` does not know is left as written (the job
/// file's validation refuses those).
pub fn substitute(
    argument: &str,
    side_inputs: &BTreeMap<String, &Path>,
    models: &BTreeMap<String, &Path>,
) -> String {
    let mut out = String::with_capacity(argument.len());
    let mut rest = argument;
    while let Some(start) = rest.find("${{") {
        let after = &rest[start + 3..];
        let Some(end) = after.find("}}") else { break };
        let inner = after[..end].trim();
        let (kind, name) = inner.split_once('.').unwrap_or((inner, ""));
        let table = match kind.trim() {
            SIDE_INPUTS => Some(side_inputs),
            MODELS => Some(models),
            _ => None,
        };
        out.push_str(&rest[..start]);
        match table.and_then(|t| t.get(name.trim())) {
            Some(path) => out.push_str(&path.to_string_lossy()),
            None => out.push_str(&rest[start..start + 3 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_and_replaced() {
        let arg = "--labels=${{side_inputs.labels}}:${{ models.m }}";
        assert_eq!(
            references(arg),
            [
                Reference {
                    kind: "side_inputs",
                    name: "labels"
                },
                Reference {
                    kind: "models",
                    name: "m"
                }
            ]
        );
        let side = BTreeMap::from([("labels".to_owned(), Path::new("/c/l.txt"))]);
        let models = BTreeMap::from([("m".to_owned(), Path::new("/c/m"))]);
        assert_eq!(substitute(arg, &side, &models), "--labels=/c/l.txt:/c/m");
        assert_eq!(
            substitute("${{inputs.x}} ${{", &side, &models),
            "${{inputs.x}} ${{"
        );
        assert!(references("plain ${{ unclosed").is_empty());
    }
}
