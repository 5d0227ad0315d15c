//! Errors and URLs as a person reads them: one line, each cause said once, no secrets.

use std::error::Error;

/// An error and its sources' messages on one line, joined by `: `. A cause whose message the
/// line already holds (an error that prints its source and also returns it from
/// [`Error::source`]) is not said again.
pub fn one_line(e: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        next = e.source();
    }
    line
}

/// A service URL fit for a message or a log: its password, if any, is replaced by `***`.
/// A URL that does not parse is cut to its scheme, so nothing it carries is shown.
pub fn redact_url(url: &str) -> String {
    // A URL without an authority (`redis:/:pw@host`) keeps what looks like a password in
    // its path: it is treated as one that does not parse.
    match reqwest::Url::parse(url).ok().filter(|u| u.has_host()) {
        Some(mut parsed) => {
            if parsed.password().is_some() {
                // Only URLs that cannot have a password (no host) refuse this.
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        None => match url.split_once(':') {
            Some((scheme, _)) if scheme.chars().all(|c| c.is_ascii_alphanumeric()) => {
                format!("{scheme}://… (not a valid URL)")
            }
            _ => "(not a valid URL)".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {source}")]
    struct Outer {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("wrapper")]
    struct Wrapper(#[source] Outer);

    #[test]
    fn each_cause_is_said_once() {
        let e = Wrapper(Outer {
            source: std::io::Error::other("refused"),
        });
        assert_eq!(one_line(&e), "wrapper: outer: refused");
    }

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact_url("amqp://guest:hunter2@127.0.0.1:5673/%2f"),
            "amqp://guest:***@127.0.0.1:5673/%2f"
        );
        assert_eq!(
            redact_url("redis://:hunter2@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(redact_url("redis://host:6379/"), "redis://host:6379/");
        assert!(!redact_url("redis://:hun ter2@[bad").contains("hun"));
        assert!(!redact_url("redis:/:hunter2@host").contains("hunter2"));
        assert!(!redact_url("amqp:guest:hunter2@host").contains("hunter2"));
    }
}
