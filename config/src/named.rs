//! Named data a job brings along whole (`[side_inputs]`, `[models]`), the folders its
//! script writes to (`[outputs]`), and the `${{side_inputs.name}}` / `${{models.name}}` /
//! `${{outputs.name}}` references to them in `arguments` (AML v2's syntax), replaced by each
//! node with a local path: the staged data's, or a folder of the runner's own for an output.

/// The kinds of named data an argument may refer to, as the reference spells them.
pub const SIDE_INPUTS: &str = "side_inputs";
pub const MODELS: &str = "models";
pub const OUTPUTS: &str = "outputs";

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

/// `argument` with each `${{kind.name}}` replaced by what `path(kind, name)` gives for it; a
/// reference it does not know is left as written (the job file's validation refuses those
/// that no step fills in).
pub fn substitute(argument: &str, path: impl Fn(&str, &str) -> Option<String>) -> String {
    let mut out = String::with_capacity(argument.len());
    let mut rest = argument;
    while let Some(start) = rest.find("${{") {
        let after = &rest[start + 3..];
        let Some(end) = after.find("}}") else { break };
        let inner = after[..end].trim();
        let (kind, name) = inner.split_once('.').unwrap_or((inner, ""));
        out.push_str(&rest[..start]);
        match path(kind.trim(), name.trim()) {
            Some(path) => out.push_str(&path),
            None => out.push_str(&rest[start..start + 3 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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
        let paths = BTreeMap::from([
            ((SIDE_INPUTS, "labels"), "/c/l.txt"),
            ((MODELS, "m"), "/c/m"),
        ]);
        let path = |kind: &str, name: &str| paths.get(&(kind, name)).map(|p| p.to_string());
        assert_eq!(substitute(arg, path), "--labels=/c/l.txt:/c/m");
        assert_eq!(
            substitute("${{inputs.x}} ${{outputs.o}} ${{", path),
            "${{inputs.x}} ${{outputs.o}} ${{"
        );
        assert!(references("plain ${{ unclosed").is_empty());
    }
}
