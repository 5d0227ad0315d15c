//! Storage on a local folder.
//!
//! Every entry of a folder is listed under a key (`file_name.rs` gives names that are not
//! UTF-8 one), with two kinds of symlink in mind:
//! - a symlink that leads nowhere (dangling, or a loop of file symlinks) is listed as an item
//!   of size 0: the item then fails alone, with the script's `FileNotFoundError` or `OSError`
//!   as its cause in `failed_items.csv`, and the input's count stays the count of its names;
//! - a folder symlink back into the walk's own path (a directory loop) is skipped with a
//!   warning: it would list the same files again and again.
//!
//! Folders are told apart by (device, inode), so a folder excluded with
//! [`LocalStorage::excluding`] is left out however the walk reaches it.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::mpsc;

use super::{ObjectMeta, ObjectWriter, Storage, StorageError, check_key, file_name};

/// Listed entries travel from the walking thread in batches of this many.
const LIST_BATCH: usize = 256;

/// A folder as storage: key `a/b.png` is `<root>/a/b.png`.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
    excluded: Vec<PathBuf>,
}

impl LocalStorage {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStorage {
            root: root.into(),
            excluded: Vec::new(),
        }
    }

    /// Leaves `folder` out of listings, wherever it appears under the root, directly or
    /// through a symlink: the job's output folder, when it lies inside the input folder,
    /// must not feed its own logs and parts back in as input items. Reads and writes are
    /// unaffected; a folder that does not exist when a listing starts excludes nothing, and
    /// the root itself is never excluded.
    pub fn excluding(mut self, folder: impl Into<PathBuf>) -> Self {
        self.excluded.push(folder.into());
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StorageError> {
        check_key(key)?;
        Ok(self.root.join(file_name::name(key)))
    }
}

fn io_err(key: &str) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            StorageError::NotFound(key.to_owned())
        } else {
            StorageError::Io {
                key: key.to_owned(),
                source,
            }
        }
    }
}

/// Writes `body` to a temporary sibling of `path` and renames it into place, so a reader
/// never sees half an object.
fn write_atomic(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let tmp = temp_sibling(path);
    // Folders are made only when missing: the common case (a part beside the last one)
    // costs no mkdir.
    match fs::write(&tmp, body) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
            fs::write(&tmp, body)?;
        }
        other => other?,
    }
    fs::rename(&tmp, path)
}

/// Objects up to this size are written on the calling thread: a handful of syscalls costs
/// less than a hop to the blocking pool and back (mini-batch parts are this small).
const INLINE_PUT: usize = 256 << 10;

fn temp_sibling(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// Whether a listing reads each file's size (one `stat` each) or only its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sizes {
    Read,
    Skip,
}

impl LocalStorage {
    /// Walks the folder on a blocking thread, handing over batches through a bounded
    /// channel: memory stays flat however large the folder.
    fn walk<'a>(
        &'a self,
        prefix: &'a str,
        sizes: Sizes,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        let (tx, rx) = mpsc::channel::<Vec<Result<ObjectMeta, StorageError>>>(4);
        let root = self.root.clone();
        let excluded = self.excluded.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || walk(&root, &prefix, &excluded, sizes, &tx));
        stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        })
        .flat_map(stream::iter)
        .boxed()
    }
}

#[async_trait]
impl Storage for LocalStorage {
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.walk(prefix, Sizes::Read)
    }

    fn list_keys<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<String, StorageError>> {
        self.walk(prefix, Sizes::Skip)
            .map(|object| object.map(|o| o.key))
            .boxed()
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        let path = self.path(key)?;
        tokio::fs::read(&path)
            .await
            .map(Bytes::from)
            .map_err(io_err(key))
    }

    async fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, StorageError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let path = self.path(key)?;
        let mut file = tokio::fs::File::open(&path).await.map_err(io_err(key))?;
        file.seek(std::io::SeekFrom::Start(start))
            .await
            .map_err(io_err(key))?;
        let mut buf = Vec::with_capacity(end.saturating_sub(start).min(1 << 26) as usize);
        file.take(end.saturating_sub(start))
            .read_to_end(&mut buf)
            .await
            .map_err(io_err(key))?;
        Ok(buf.into())
    }

    async fn put(&self, key: &str, body: Bytes) -> Result<(), StorageError> {
        let path = self.path(key)?;
        if body.len() <= INLINE_PUT {
            return write_atomic(&path, &body).map_err(io_err(key));
        }
        tokio::task::spawn_blocking(move || write_atomic(&path, &body))
            .await
            .expect("write task panicked")
            .map_err(io_err(key))
    }

    async fn writer(&self, key: &str) -> Result<Box<dyn ObjectWriter>, StorageError> {
        let path = self.path(key)?;
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(io_err(key))?;
        }
        let tmp = temp_sibling(&path);
        let file = tokio::fs::File::create(&tmp).await.map_err(io_err(key))?;
        Ok(Box::new(LocalWriter {
            key: key.to_owned(),
            path,
            tmp,
            file: tokio::io::BufWriter::with_capacity(1 << 20, file),
            size: 0,
        }))
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<(), StorageError> {
        let path = if prefix.is_empty() {
            self.root.clone()
        } else {
            self.path(prefix.trim_end_matches('/'))?
        };
        match tokio::fs::remove_dir_all(&path).await {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                tokio::fs::remove_file(&path).await.map_err(io_err(prefix))
            }
            other => other.map_err(io_err(prefix)),
        }
    }

    fn local_path(&self, key: &str) -> Option<PathBuf> {
        self.path(key).ok()
    }
}

struct LocalWriter {
    key: String,
    path: PathBuf,
    tmp: PathBuf,
    file: tokio::io::BufWriter<tokio::fs::File>,
    size: u64,
}

#[async_trait]
impl ObjectWriter for LocalWriter {
    async fn write(&mut self, piece: Bytes) -> Result<(), StorageError> {
        use tokio::io::AsyncWriteExt;
        self.size += piece.len() as u64;
        self.file.write_all(&piece).await.map_err(io_err(&self.key))
    }

    async fn finish(self: Box<Self>) -> Result<u64, StorageError> {
        use tokio::io::AsyncWriteExt;
        let LocalWriter {
            key,
            path,
            tmp,
            mut file,
            size,
        } = *self;
        file.flush().await.map_err(io_err(&key))?;
        file.get_ref().sync_all().await.map_err(io_err(&key))?;
        tokio::fs::rename(&tmp, &path).await.map_err(io_err(&key))?;
        Ok(size)
    }
}

/// A folder's identity: (device, inode).
type FolderId = (u64, u64);

fn folder_id(meta: &fs::Metadata) -> FolderId {
    (meta.dev(), meta.ino())
}

/// What a folder entry is, symlinks followed.
enum Kind {
    Folder(FolderId),
    File { size: u64 },
}

struct Entry {
    key: String,
    path: PathBuf,
    kind: std::io::Result<Kind>,
}

/// Walks `root`, yielding files under `prefix` in byte order of their keys.
///
/// Sorting each folder's entries by key, with `/` appended to folder keys, gives exactly
/// the byte order of the full keys (`a-c` < `a/b` because `-` < `/`), which is the order
/// S3 lists in: the same input is partitioned the same way wherever it lives.
fn walk(
    root: &Path,
    prefix: &str,
    excluded: &[PathBuf],
    sizes: Sizes,
    tx: &mpsc::Sender<Vec<Result<ObjectMeta, StorageError>>>,
) {
    let mut batch = Vec::with_capacity(LIST_BATCH);
    let emit = |item, batch: &mut Vec<_>| -> bool {
        batch.push(item);
        if batch.len() >= LIST_BATCH {
            return tx.blocking_send(std::mem::take(batch)).is_ok();
        }
        true
    };
    let excluded: Vec<FolderId> = excluded
        .iter()
        .filter_map(|path| fs::metadata(path).ok())
        .map(|meta| folder_id(&meta))
        .collect();
    // Start in the deepest folder the prefix names whole.
    let start = match prefix.rfind('/') {
        Some(i) => &prefix[..=i],
        None => "",
    };
    // A prefix inside an excluded folder lists nothing.
    let mut start_dir = root.to_path_buf();
    for segment in start.split_terminator('/') {
        start_dir.push(file_name::name(segment));
        if fs::metadata(&start_dir).is_ok_and(|meta| excluded.contains(&folder_id(&meta))) {
            return;
        }
    }
    let opened = fs::metadata(&start_dir).and_then(|meta| {
        let entries = sorted_entries(&start_dir, start, sizes)?;
        Ok((folder_id(&meta), entries))
    });
    // The folders on the path from the start to the one being read, with their entries
    // still to visit: a folder met again among its own ancestors is a loop.
    let mut stack = match opened {
        Ok((id, entries)) => vec![(id, entries.into_iter())],
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !start.is_empty() => Vec::new(),
        Err(e) => {
            let _ = tx.blocking_send(vec![Err(io_err(start)(e))]);
            return;
        }
    };
    while let Some((_, entries)) = stack.last_mut() {
        let Some(Entry { key, path, kind }) = entries.next() else {
            stack.pop();
            continue;
        };
        let item = match kind {
            Ok(Kind::Folder(id)) => {
                let folder = format!("{key}/");
                // Skip folders that cannot hold a key under the prefix.
                if !(folder.starts_with(prefix) || prefix.starts_with(&folder)) {
                    continue;
                }
                if excluded.contains(&id) {
                    tracing::info!(folder = %path.display(), "Leaving an excluded folder out of the listing.");
                    continue;
                }
                if stack.iter().any(|(on_path, _)| *on_path == id) {
                    tracing::warn!(folder = %path.display(), "Skipping a folder symlink that loops back into its own path.");
                    continue;
                }
                match sorted_entries(&path, &folder, sizes) {
                    Ok(children) => {
                        stack.push((id, children.into_iter()));
                        continue;
                    }
                    Err(e) => Err(io_err(&key)(e)),
                }
            }
            _ if !key.starts_with(prefix) => continue,
            Ok(Kind::File { size }) => Ok(ObjectMeta { key, size }),
            Err(e) => Err(io_err(&key)(e)),
        };
        if !emit(item, &mut batch) {
            return;
        }
    }
    if !batch.is_empty() {
        let _ = tx.blocking_send(batch);
    }
}

/// A folder's entries, in key order.
fn sorted_entries(dir: &Path, folder_key: &str, sizes: Sizes) -> std::io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        // The entry's own type and metadata come from its folder (readdir, then a stat
        // relative to the folder); only a symlink is followed by its full path.
        let file_type = entry.file_type();
        let symlink = file_type.as_ref().is_ok_and(|t| t.is_symlink());
        if sizes == Sizes::Skip && file_type.as_ref().is_ok_and(|t| t.is_file()) {
            let key = format!("{folder_key}{}", key_of(&entry.file_name()));
            entries.push(Entry {
                key,
                path,
                kind: Ok(Kind::File { size: 0 }),
            });
            continue;
        }
        let meta = if symlink {
            fs::metadata(&path)
        } else {
            entry.metadata()
        };
        let kind = match meta {
            Ok(meta) if meta.is_dir() => Ok(Kind::Folder(folder_id(&meta))),
            Ok(meta) => Ok(Kind::File { size: meta.len() }),
            // A symlink that leads nowhere is an item that fails when opened.
            Err(_) if symlink => Ok(Kind::File { size: 0 }),
            Err(e) => Err(e),
        };
        let key = format!("{folder_key}{}", key_of(&entry.file_name()));
        entries.push(Entry { key, path, kind });
    }
    let sort_key = |entry: &Entry| match entry.kind {
        Ok(Kind::Folder(_)) => format!("{}/", entry.key),
        _ => entry.key.clone(),
    };
    entries.sort_by_cached_key(sort_key);
    Ok(entries)
}

fn key_of(name: &OsStr) -> String {
    file_name::key(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::symlink;

    use futures::TryStreamExt;

    use super::*;

    async fn keys(storage: &LocalStorage, prefix: &str) -> Vec<String> {
        let listed: Vec<ObjectMeta> = storage.list(prefix).try_collect().await.unwrap();
        let keys: Vec<String> = listed.into_iter().map(|o| o.key).collect();
        // Listing names alone (no file's metadata read) lists the very same keys.
        let names: Vec<String> = storage.list_keys(prefix).try_collect().await.unwrap();
        assert_eq!(names, keys, "list_keys and list agree under {prefix:?}");
        keys
    }

    /// Names are bytes: each legal name is listed once, under a key that reads it back and
    /// leads `local_path` to the very file.
    #[tokio::test]
    async fn any_file_name_is_listed_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let names: [&[u8]; 5] = [
            b"caf\xe9.txt",
            b"a\\b.txt",
            b"line\nbreak",
            b"%E9",
            b"plain",
        ];
        fs::create_dir(dir.path().join("sub")).unwrap();
        for name in names {
            let path = dir
                .path()
                .join("sub")
                .join(OsString::from_vec(name.to_vec()));
            fs::write(path, name).unwrap();
        }
        let storage = LocalStorage::new(dir.path());
        let listed = keys(&storage, "").await;
        assert_eq!(
            listed,
            [
                "sub/%25E9",
                "sub/a\\b.txt",
                "sub/caf%E9.txt",
                "sub/line\nbreak",
                "sub/plain"
            ]
        );
        assert_eq!(keys(&storage, "sub/caf").await, ["sub/caf%E9.txt"]);
        for key in &listed {
            let body = storage.get(key).await.unwrap();
            let path = storage.local_path(key).unwrap();
            assert_eq!(path.file_name().unwrap().as_bytes(), &body[..], "{key:?}");
        }
        storage
            .put("sub/new\u{e9}%FF", Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert!(
            dir.path()
                .join("sub")
                .join(OsString::from_vec(b"new\xc3\xa9\xff".to_vec()))
                .is_file()
        );
    }

    /// A dangling symlink is an item (it fails alone when opened); a folder symlink back up
    /// the walk is skipped; neither fails the listing.
    #[tokio::test]
    async fn symlinks_that_lead_nowhere_or_loop_do_not_fail_the_listing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("d/e")).unwrap();
        fs::write(root.join("d/e/f"), "f").unwrap();
        symlink("missing", root.join("dangling")).unwrap();
        symlink("self", root.join("self")).unwrap();
        symlink("..", root.join("d/e/up")).unwrap();
        symlink(root, root.join("d/root")).unwrap();
        // A folder symlink that is no loop is followed.
        symlink("d/e", root.join("e-too")).unwrap();
        let storage = LocalStorage::new(root);
        let listed: Vec<ObjectMeta> = storage.list("").try_collect().await.unwrap();
        let listed: Vec<(&str, u64)> = listed.iter().map(|o| (&*o.key, o.size)).collect();
        assert_eq!(
            listed,
            [("d/e/f", 1), ("dangling", 0), ("e-too/f", 1), ("self", 0)]
        );
    }

    /// The output folder inside the input folder stays out of the input, also when reached
    /// through a symlink.
    #[tokio::test]
    async fn an_excluded_folder_is_left_out_however_it_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("out/logs")).unwrap();
        fs::write(root.join("out/logs/job_result.txt"), "x").unwrap();
        fs::write(root.join("in.txt"), "x").unwrap();
        symlink("out", root.join("out-link")).unwrap();
        let storage = LocalStorage::new(root).excluding(root.join("out"));
        assert_eq!(keys(&storage, "").await, ["in.txt"]);
        assert_eq!(keys(&storage, "out/").await, Vec::<String>::new());
        assert_eq!(keys(&storage, "out-link/logs/").await, Vec::<String>::new());
        // Reads and writes are unaffected.
        assert_eq!(
            &storage.get("out/logs/job_result.txt").await.unwrap()[..],
            b"x"
        );
        let everything = LocalStorage::new(root);
        assert_eq!(keys(&everything, "").await.len(), 3);
    }
}
