//! A job's id, made in one place for every way of submitting (`fleetrun run`, `submit`,
//! `retry`, `POST /v1/jobs`), and the rule an id a caller gives must follow.

/// A job id a caller gives: what Redis keys and log lines can hold (the job names'
/// alphabet, plus `_` and `.`), 1 to 128 characters.
pub fn parse(id: &str) -> Result<String, BadJobId> {
    let ok = (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && id.as_bytes()[0].is_ascii_alphanumeric();
    if ok { Ok(id.to_owned()) } else { Err(BadJobId) }
}

/// A job id [`parse`] refuses.
#[derive(Debug, thiserror::Error)]
#[error("1 to 128 of a-z, A-Z, 0-9, '-', '_', '.', starting with a letter or digit")]
pub struct BadJobId;

/// The id of a new job named `name`: the name, the time and a few random characters.
pub fn new(name: &str) -> String {
    let suffix: u16 = rand::random();
    format!(
        "{name}-{}-{suffix:04x}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S")
    )
}

/// The id the caller gave, else a new one for a job named `name`.
pub fn given_or_new(given: Option<&str>, name: &str) -> String {
    given.map_or_else(|| new(name), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_id_follows_the_rule_a_given_one_must() {
        let id = new("digits-v2");
        assert_eq!(parse(&id).unwrap(), id);
        assert_eq!(given_or_new(Some("mine-1"), "digits"), "mine-1");
        assert!(given_or_new(None, "digits").starts_with("digits-"));
    }

    #[test]
    fn an_id_keys_cannot_hold_is_refused() {
        for bad in ["", "-lead", "has space", "a/b", &"x".repeat(129)] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse("run_1.retry-2").is_ok());
    }
}
