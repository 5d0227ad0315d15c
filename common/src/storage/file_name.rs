//! Keys for local file names, which are bytes.
//!
//! A key is a `String`; a Unix file name is any bytes but `/` and NUL. A name that is UTF-8
//! is its own key, byte for byte, with one exception below; each byte of a name that is not
//! valid UTF-8 (always `0x80..=0xFF`) becomes `%XX`, upper-case hex. A `%` in the name that
//! would read as such an escape (one followed by `25` or by `8`–`F` and a hex digit) is
//! written `%25`. So every name has exactly one key, [`name`] gives the name back, and the
//! keys of ordinary names, `%` included (`100%.txt`, `a%41`), are unchanged: mini-batches and
//! the ledger of a job started before this scheme still name the same files.
//!
//! Decoding only ever produces `%` or a byte `0x80..=0xFF`, never `/`, NUL or `.`, so a key
//! that passed [`check_key`](super::check_key) cannot name a path outside the root.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStringExt;

/// The key of a file name, or of a relative path of names joined by `/`.
#[cfg(test)]
pub(super) fn key(name: &[u8]) -> String {
    let mut key = String::with_capacity(name.len());
    push_key(name, &mut key);
    key
}

/// Appends the key of `name` to `key`: a listing packs its folder's keys in one buffer.
pub(super) fn push_key(name: &[u8], key: &mut String) {
    for chunk in name.utf8_chunks() {
        let mut rest = chunk.valid();
        while let Some(i) = rest.find('%') {
            key.push_str(&rest[..=i]);
            rest = &rest[i + 1..];
            // What follows this `%` in the key is the rest of this chunk: an invalid byte
            // after it is written `%XX`, which does not continue an escape.
            if escape(rest.as_bytes()).is_some() {
                key.push_str("25");
            }
        }
        key.push_str(rest);
        for byte in chunk.invalid() {
            let _ = write!(key, "%{byte:02X}");
        }
    }
}

/// The file name (or relative path) a key stands for.
pub(super) fn name(key: &str) -> OsString {
    let bytes = key.as_bytes();
    let mut name = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| escape(&bytes[i + 1..]))
            .flatten();
        match escaped {
            Some(byte) => {
                name.push(byte);
                i += 3;
            }
            None => {
                name.push(bytes[i]);
                i += 1;
            }
        }
    }
    OsString::from_vec(name)
}

/// The byte that `after`, the text after a `%`, escapes, if it starts an escape.
fn escape(after: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    match after {
        [b'2', b'5', ..] => Some(b'%'),
        [hi, lo, ..] => {
            let byte = digit(*hi)? << 4 | digit(*lo)?;
            (byte >= 0x80).then_some(byte)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn utf8_names_are_their_own_keys() {
        for name in [
            "a.txt",
            "a\\b.txt",
            "line\nbreak",
            "100%.txt",
            "a%41",
            "%2",
            "é",
            "dir/f",
        ] {
            assert_eq!(key(name.as_bytes()), name);
            assert_eq!(self::name(name).as_bytes(), name.as_bytes());
        }
    }

    #[test]
    fn invalid_bytes_and_percent_signs_that_read_as_escapes_are_escaped() {
        assert_eq!(key(b"caf\xe9.txt"), "caf%E9.txt");
        assert_eq!(key(b"%E9"), "%25E9");
        assert_eq!(key(b"%25"), "%2525");
        assert_eq!(key(b"%\xff"), "%%FF");
        assert_eq!(key(b"%e9"), "%e9", "escapes are upper-case only");
        assert_eq!(name("caf%E9.txt").as_bytes(), b"caf\xe9.txt");
        assert_eq!(name("%2525").as_bytes(), b"%25");
    }

    /// Every name over an alphabet of the tricky bytes, up to four long, round-trips, and
    /// distinct names get distinct keys.
    #[test]
    fn every_short_name_round_trips_to_a_distinct_key() {
        const ALPHABET: &[u8] = b"%25CE9a\\\n\xc3\xa9\xff";
        let mut names: Vec<Vec<u8>> = vec![vec![]];
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4 {
            let longer: Vec<Vec<u8>> = names
                .iter()
                .flat_map(|n| {
                    ALPHABET.iter().map(move |&b| {
                        let mut n = n.clone();
                        n.push(b);
                        n
                    })
                })
                .collect();
            for n in &longer {
                let k = key(n);
                assert_eq!(name(&k).as_bytes(), &n[..], "{n:?} -> {k:?}");
                assert!(seen.insert(k.clone()), "{k:?} is the key of two names");
            }
            names = longer;
        }
    }

    #[test]
    fn decoding_never_makes_a_separator_or_a_dot() {
        for key in ["%2F", "%2E%2E", "%00", "%2f", "%7F"] {
            assert_eq!(name(key).as_bytes(), key.as_bytes());
        }
    }
}
