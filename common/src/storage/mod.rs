//! Storage for inputs, output parts and the final output, addressed by keys relative to a
//! root (a local folder, or an S3 bucket and prefix).
//!
//! Keys use `/` and never contain `..`, an empty segment, a leading `/` or NUL:
//! [`check_key`] refuses them, so an object key can never escape a staging folder. Anything
//! else a file name may hold (a backslash, a newline) is a legal key. A local file name that is
//! not UTF-8 has a key too: [`LocalStorage`] escapes its invalid bytes (see `file_name.rs`).

mod faults;
mod file_name;
mod local;
pub mod s3;
mod selected;

use std::path::PathBuf;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

pub use faults::{Fault, FaultCounts, Tally, faults};
pub use local::LocalStorage;
pub use selected::{SelectedStorage, Selection};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{0}: no such object")]
    NotFound(String),
    #[error("{key}: not a valid object key ({why})")]
    BadKey { key: String, why: &'static str },
    #[error("{key}: {source}")]
    Io { key: String, source: std::io::Error },
    /// The S3 bucket a location names does not exist: a mistake in the job, not a fault.
    #[error("s3://{bucket}: no such bucket")]
    NoBucket { bucket: String },
    /// The S3 settings (from the environment) cannot be used.
    #[error("storage backend: S3 settings: {0}")]
    Settings(String),
    #[error("storage backend: {0:?} is not an S3 bucket name")]
    BadBucket(String),
    /// The storage service refused a request, for a reason a new try does not mend (access
    /// denied, a bad request); `what` is `s3://bucket/key`, `detail` what it answered.
    #[error("storage backend: {what}: {detail}")]
    Refused {
        what: String,
        detail: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request could not be built (the SDK's own check).
    #[error("storage backend: {what}: {source}")]
    Request {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A batch delete left objects: `failed` of them, the first `key` for `reason`.
    #[error(
        "storage backend: s3://{bucket}/{key}: {failed} objects not deleted, first {key}: {reason}"
    )]
    NotDeleted {
        bucket: String,
        key: String,
        failed: usize,
        reason: String,
    },
    /// The service answered a multipart upload's start without its id.
    #[error("storage backend: {0}: multipart upload without an id")]
    NoUploadId(String),
    /// A writer was used again after one of its writes failed.
    #[error("storage backend: {key}: {step} after an earlier error")]
    WriterFailed { key: String, step: &'static str },
    /// An object read back shorter than asked: it changed since the job was planned.
    #[error(
        "storage backend: {key}: bytes {start}-{end} asked, {read} read: the file changed since the job started"
    )]
    Changed {
        key: String,
        start: u64,
        end: u64,
        read: u64,
    },
    /// The storage service did not get a request through, after its client's own retries:
    /// it throttled it, failed on its side, or could not be reached (S3's 503 SlowDown,
    /// 500 InternalError, a connection reset). An infrastructure fault, not the object's:
    /// the same request may well pass later.
    #[error("{what}: {detail}")]
    Unavailable {
        /// What was asked (`s3://bucket/key`).
        what: String,
        fault: Fault,
        /// What the service answered, or why no answer came, for a person.
        detail: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StorageError {
    /// Whether the error is the storage service's passing fault, which a later try of the
    /// same request may not meet: the work that met it is handed back, not failed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::Unavailable { .. })
    }
}

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
}

#[async_trait]
pub trait Storage: Send + Sync {
    /// Lists the objects under `prefix` (a key prefix: `"a/"` lists a folder), recursively,
    /// in byte order of their keys, as a stream: listing a million objects holds one page.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>>;
    /// The keys of [`Storage::list`] alone, for a caller that needs no sizes (a local folder
    /// then reads no file's metadata).
    fn list_keys<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<String, StorageError>> {
        use futures::StreamExt;
        self.list(prefix).map(|o| o.map(|o| o.key)).boxed()
    }
    /// The keys of [`Storage::list_keys`] in any order, for a caller that needs the set or
    /// any one of them (is the input empty?): a local folder is then read as it comes, not
    /// whole and sorted first.
    fn list_keys_any_order<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxStream<'a, Result<String, StorageError>> {
        self.list_keys(prefix)
    }
    async fn get(&self, key: &str) -> Result<Bytes, StorageError>;
    /// The object's bytes in pieces, in order, so that a caller copying it holds one piece
    /// at a time whatever its size. The default holds the whole object, as [`Storage::get`].
    async fn get_pieces(&self, key: &str) -> Result<Pieces, StorageError> {
        let body = self.get(key).await?;
        Ok(Box::pin(futures::stream::once(async { Ok(body) })))
    }
    /// Reads bytes `start..end` (end exclusive, clamped to the object's size).
    async fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, StorageError>;
    /// Writes an object whole, replacing any previous one atomically.
    async fn put(&self, key: &str, body: Bytes) -> Result<(), StorageError>;
    /// Opens a writer for a large object written in pieces; it appears only on `finish`.
    async fn writer(&self, key: &str) -> Result<Box<dyn ObjectWriter>, StorageError>;
    /// Deletes every object under `prefix`.
    async fn delete_prefix(&self, prefix: &str) -> Result<(), StorageError>;
    /// The object's path on this machine, when the storage is a local folder: inputs there
    /// need no staging.
    fn local_path(&self, key: &str) -> Option<PathBuf>;
}

/// An object's bytes as [`Storage::get_pieces`] hands them out.
pub type Pieces = BoxStream<'static, Result<Bytes, StorageError>>;

/// A large object being written in order (a multipart upload on S3).
#[async_trait]
pub trait ObjectWriter: Send {
    async fn write(&mut self, piece: Bytes) -> Result<(), StorageError>;
    /// Makes the object visible; returns its size.
    async fn finish(self: Box<Self>) -> Result<u64, StorageError>;
}

/// Refuses keys that could escape a folder they are joined to.
pub fn check_key(key: &str) -> Result<(), StorageError> {
    let bad = |why| {
        Err(StorageError::BadKey {
            key: key.to_owned(),
            why,
        })
    };
    if key.is_empty() {
        return bad("empty");
    }
    if key.starts_with('/') {
        return bad("absolute");
    }
    if key.contains('\0') {
        return bad("NUL");
    }
    for segment in key.split('/') {
        match segment {
            "" => return bad("empty segment"),
            "." | ".." => return bad("dot segment"),
            _ => {}
        }
    }
    Ok(())
}

/// Joins a prefix and a relative key with exactly one `/` between them.
pub fn join_key(prefix: &str, key: &str) -> String {
    match (prefix.trim_end_matches('/'), key.trim_start_matches('/')) {
        ("", key) => key.to_owned(),
        (prefix, "") => prefix.to_owned(),
        (prefix, key) => format!("{prefix}/{key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_escape_are_refused() {
        for key in ["", "/etc/passwd", "a/../../b", "..", "a//b", "./a", "a\0b"] {
            assert!(check_key(key).is_err(), "{key:?} accepted");
        }
        for key in [
            "a",
            "a/b.png",
            "a/.hidden",
            "a/..b",
            "a\\b.txt",
            "line\nbreak",
            "%FF",
        ] {
            assert!(check_key(key).is_ok(), "{key:?} refused");
        }
    }

    #[test]
    fn join_key_puts_one_slash() {
        assert_eq!(join_key("", "a"), "a");
        assert_eq!(join_key("p/", "a"), "p/a");
        assert_eq!(join_key("p", "/a"), "p/a");
    }
}
