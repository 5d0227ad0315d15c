//! `partition_format` for file inputs (FileDataset's): `{user}/{genres}/{name}.txt` names
//! the parts of each file's path, relative to the input's root, so that `partition_keys`
//! can group the files by those parts' values.

use std::collections::BTreeMap;

/// A parsed `partition_format`: literal text and `{key}`s, each `{key}` matching one or
/// more characters other than `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFormat {
    tokens: Vec<Token>,
}

/// Why a `partition_format` does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("a \"}}\" without its \"{{\"")]
    UnopenedBrace,
    #[error("a \"{{\" without its \"}}\"")]
    UnclosedBrace,
    #[error("{{{0}}} is not a key name (letters, digits, _)")]
    BadKey(String),
    #[error("{{{0}}} touches the key before it")]
    Touching(String),
    #[error("{{{0}}} appears twice")]
    Repeated(String),
    #[error("names no {{key}}")]
    NoKey,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Text(String),
    Key(String),
}

impl PartitionFormat {
    /// Parses `{a}/{b}/{name}.txt`. Keys are identifiers; two keys may not touch (`{a}{b}`
    /// cannot be told apart) and no key may repeat.
    pub fn parse(format: &str) -> Result<PartitionFormat, FormatError> {
        let mut tokens = Vec::new();
        let mut rest = format.trim_start_matches('/');
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                Some(i) if rest.as_bytes()[i] == b'}' => {
                    return Err(FormatError::UnopenedBrace);
                }
                Some(0) => {
                    let end = rest.find('}').ok_or(FormatError::UnclosedBrace)?;
                    let key = &rest[1..end];
                    let identifier = !key.is_empty()
                        && key.chars().all(|c| c.is_alphanumeric() || c == '_')
                        && !key.starts_with(|c: char| c.is_ascii_digit());
                    if !identifier {
                        return Err(FormatError::BadKey(key.to_owned()));
                    }
                    if matches!(tokens.last(), Some(Token::Key(_))) {
                        return Err(FormatError::Touching(key.to_owned()));
                    }
                    if tokens.iter().any(|t| t == &Token::Key(key.to_owned())) {
                        return Err(FormatError::Repeated(key.to_owned()));
                    }
                    tokens.push(Token::Key(key.to_owned()));
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    tokens.push(Token::Text(rest[..end].to_owned()));
                    rest = &rest[end..];
                }
            }
        }
        if !tokens.iter().any(|t| matches!(t, Token::Key(_))) {
            return Err(FormatError::NoKey);
        }
        Ok(PartitionFormat { tokens })
    }

    /// The keys the format names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tokens.iter().filter_map(|t| match t {
            Token::Key(k) => Some(k.as_str()),
            Token::Text(_) => None,
        })
    }

    /// The value of every key in `path` (relative, `/`-separated), or `None` when the path
    /// does not have the format's shape.
    pub fn matches(&self, path: &str) -> Option<BTreeMap<String, String>> {
        let mut values = BTreeMap::new();
        match_from(&self.tokens, path, &mut values).then_some(values)
    }
}

fn match_from(tokens: &[Token], path: &str, values: &mut BTreeMap<String, String>) -> bool {
    match tokens.split_first() {
        None => path.is_empty(),
        Some((Token::Text(text), rest)) => path
            .strip_prefix(text.as_str())
            .is_some_and(|after| match_from(rest, after, values)),
        Some((Token::Key(key), rest)) => {
            let segment_end = path.find('/').unwrap_or(path.len());
            // Longest first: `{name}.txt` on `a.b.txt` gives `a.b`.
            for end in (1..=segment_end).rev() {
                if !path.is_char_boundary(end) {
                    continue;
                }
                if match_from(rest, &path[end..], values) {
                    values.insert(key.clone(), path[..end].to_owned());
                    return true;
                }
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_parts_of_a_path() {
        let format = PartitionFormat::parse("{user}/{genres}/{name}.txt").unwrap();
        assert_eq!(
            format.keys().collect::<Vec<_>>(),
            ["user", "genres", "name"]
        );
        let values = format.matches("ann/jazz/a.b.txt").unwrap();
        assert_eq!(values["user"], "ann");
        assert_eq!(values["genres"], "jazz");
        assert_eq!(values["name"], "a.b");
        for other in [
            "ann/jazz.txt",
            "ann/jazz/x/a.txt",
            "ann/jazz/a.csv",
            "/jazz/a.txt",
        ] {
            assert_eq!(format.matches(other), None, "{other}");
        }
    }

    #[test]
    fn bad_formats_say_why() {
        for bad in ["plain/path", "{a}{b}", "{a}/{a}", "{a", "a}", "{}", "{1x}"] {
            assert!(PartitionFormat::parse(bad).is_err(), "{bad}");
        }
    }
}
