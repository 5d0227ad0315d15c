//! Turning the strings of a job file into [`Location`]s: `s3://bucket/prefix` URIs, and
//! local paths made absolute against the job file's folder without touching the
//! filesystem.

use std::path::{Component, Path, PathBuf};

use crate::{FieldError, Location};

const S3_SCHEME: &str = "s3://";
const S3_RULE: &str = "must be s3://bucket/prefix with a bucket name of 3-63 characters \
                       [a-z0-9.-], starting and ending with a letter or digit";

/// Reads a location: an `s3://` URI as written, or a path relative to `base` (a local
/// folder, or an S3 prefix when `entry_script` sits under an S3 `source_directory`).
pub(super) fn location(field: &str, text: &str, base: &Location) -> Result<Location, FieldError> {
    if text.is_empty() {
        return Err(FieldError::rule(field, "must not be empty", text));
    }
    if let Some(rest) = strip_s3_scheme(text) {
        return s3(rest).ok_or_else(|| FieldError::rule(field, S3_RULE, text));
    }
    let path = Path::new(text);
    Ok(match base {
        _ if path.is_absolute() => Location::Local(normalize(path)),
        Location::Local(dir) => Location::Local(normalize(&dir.join(path))),
        Location::S3 { bucket, prefix } => Location::S3 {
            bucket: bucket.clone(),
            prefix: join_key(prefix, text),
        },
    })
}

/// Reads a location that must be on this machine (the Python environment).
pub(super) fn local_path(field: &str, text: &str, base: &Path) -> Result<PathBuf, FieldError> {
    match location(field, text, &Location::Local(base.to_path_buf()))? {
        Location::Local(path) => Ok(path),
        Location::S3 { .. } => Err(FieldError::rule(field, "must be a local path", text)),
    }
}

/// `base` made absolute against the current folder, with `.` and `..` resolved.
pub(super) fn absolute(base: &Path) -> PathBuf {
    // `absolute` only fails when the current folder is gone; the lexical path is then
    // the best there is, and any path check reports what is wrong with it.
    normalize(&std::path::absolute(base).unwrap_or_else(|_| base.to_path_buf()))
}

/// Resolves `.` and `..` lexically: no symlinks followed, nothing required to exist.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `/..` is `/`.
                Some(Component::RootDir | Component::Prefix(_)) => {}
                // A relative path may climb any number of folders.
                Some(Component::ParentDir | Component::CurDir) | None => out.push(component),
            },
            Component::Prefix(_) | Component::RootDir | Component::Normal(_) => {
                out.push(component);
            }
        }
    }
    out
}

/// The part after `s3://`, accepting `S3://` too.
fn strip_s3_scheme(text: &str) -> Option<&str> {
    let scheme = text.get(..S3_SCHEME.len())?;
    scheme
        .eq_ignore_ascii_case(S3_SCHEME)
        .then(|| &text[S3_SCHEME.len()..])
}

/// `bucket/prefix` → [`Location::S3`]; the prefix is kept as written, minus leading `/`.
fn s3(rest: &str) -> Option<Location> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    is_bucket_name(bucket).then(|| Location::S3 {
        bucket: bucket.to_owned(),
        prefix: prefix.trim_start_matches('/').to_owned(),
    })
}

fn is_bucket_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'.' || *b == b'-';
    (3..=63).contains(&bytes.len())
        && bytes.iter().all(allowed)
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// Joins an S3 prefix and a relative key with exactly one `/`.
fn join_key(prefix: &str, key: &str) -> String {
    match prefix {
        "" => key.to_owned(),
        _ if prefix.ends_with('/') => format!("{prefix}{key}"),
        _ => format!("{prefix}/{key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3_location(bucket: &str, prefix: &str) -> Location {
        Location::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    fn read(text: &str, base: &Location) -> Result<Location, FieldError> {
        location("f", text, base)
    }

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(normalize(Path::new("/a/./b/../c/")), Path::new("/a/c"));
        assert_eq!(normalize(Path::new("/a/../../b")), Path::new("/b"));
        assert_eq!(normalize(Path::new("a/../../b")), Path::new("../b"));
        assert_eq!(normalize(Path::new("../../b")), Path::new("../../b"));
    }

    #[test]
    fn s3_uris_keep_the_prefix_as_written() {
        let base = Location::Local("/jobs".into());
        assert_eq!(
            read("s3://my-bucket", &base),
            Ok(s3_location("my-bucket", ""))
        );
        assert_eq!(
            read("s3://my-bucket/", &base),
            Ok(s3_location("my-bucket", ""))
        );
        assert_eq!(
            read("s3://my.bucket//in/x/", &base),
            Ok(s3_location("my.bucket", "in/x/"))
        );
        assert_eq!(read("S3://abc/k", &base), Ok(s3_location("abc", "k")));
    }

    #[test]
    fn bad_bucket_names_are_refused() {
        let base = Location::Local("/jobs".into());
        for bad in [
            "s3://",
            "s3:///x",
            "s3://ab/x",
            "s3://My_Bucket/x",
            "s3://-abc/x",
        ] {
            assert!(read(bad, &base).is_err(), "{bad}");
        }
    }

    #[test]
    fn relative_paths_join_the_base() {
        let local = Location::Local("/jobs/digits".into());
        assert_eq!(
            read("../data/./images", &local),
            Ok(Location::Local("/jobs/data/images".into()))
        );
        assert_eq!(read("/abs/x", &local), Ok(Location::Local("/abs/x".into())));
        let remote = s3_location("bucket", "code");
        assert_eq!(
            read("score.py", &remote),
            Ok(s3_location("bucket", "code/score.py"))
        );
        let remote = s3_location("bucket", "");
        assert_eq!(
            read("score.py", &remote),
            Ok(s3_location("bucket", "score.py"))
        );
    }
}
