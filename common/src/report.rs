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
/// A URL that does not parse is cut to its scheme, so nothing it carries is shown. A
/// comma-separated list of URLs (a cluster's nodes) is each of them so shown.
pub fn redact_url(url: &str) -> String {
    let urls = split_list(url);
    if urls.len() > 1 {
        return urls
            .iter()
            .map(|url| redact_one(url.trim()))
            .collect::<Vec<_>>()
            .join(",");
    }
    redact_one(url)
}

/// `text` cut at each comma followed by a `scheme://`; a comma elsewhere (a password's, a
/// host list's) stays inside its URL.
fn split_list(text: &str) -> Vec<&str> {
    let starts_url = |rest: &str| {
        let rest = rest.trim_start();
        rest.split_once("://").is_some_and(|(scheme, _)| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        })
    };
    let mut parts = Vec::new();
    let mut start = 0;
    for (at, _) in text.match_indices(',') {
        if starts_url(&text[at + 1..]) {
            parts.push(&text[start..at]);
            start = at + 1;
        }
    }
    parts.push(&text[start..]);
    parts
}

fn redact_one(url: &str) -> String {
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

    #[test]
    fn every_url_of_a_list_is_hidden() {
        assert_eq!(
            redact_url("amqp://u:pw1@h1:5672/%2f, amqps://u:pw2@h2:5671/%2f,amqp://u:pw3@h3/"),
            "amqp://u:***@h1:5672/%2f,amqps://u:***@h2:5671/%2f,amqp://u:***@h3/"
        );
        // A comma that starts no URL stays in its URL, which then does not parse.
        let sentinels = redact_url("redis+sentinel://u:hunter2@h1:26379,h2:26379/main");
        assert!(!sentinels.contains("hunter2"), "{sentinels}");
        let list = redact_url("amqp://u:pw@h1/,amqp://u:hunter2@h2:bad/");
        assert!(!list.contains("hunter2"), "{list}");
    }
}
