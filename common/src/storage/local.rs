//! Storage on a local folder.

use std::fs;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::mpsc;

use super::{ObjectMeta, ObjectWriter, Storage, StorageError, check_key};

/// Listed entries travel from the walking thread in batches of this many.
const LIST_BATCH: usize = 256;

/// A folder as storage: key `a/b.png` is `<root>/a/b.png`.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
}

impl LocalStorage {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStorage { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StorageError> {
        check_key(key)?;
        Ok(self.root.join(key))
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

#[async_trait]
impl Storage for LocalStorage {
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        // The walk runs on a blocking thread and hands over batches through a bounded
        // channel: memory stays flat however large the folder.
        let (tx, rx) = mpsc::channel::<Vec<Result<ObjectMeta, StorageError>>>(4);
        let root = self.root.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || walk(&root, &prefix, &tx));
        stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        })
        .flat_map(stream::iter)
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

/// Walks `root`, yielding files under `prefix` in byte order of their keys.
///
/// Sorting each folder's entries by name, with `/` appended to folder names, gives exactly
/// the byte order of the full keys (`a-c` < `a/b` because `-` < `/`), which is the order
/// S3 lists in: the same input is partitioned the same way wherever it lives.
fn walk(root: &Path, prefix: &str, tx: &mpsc::Sender<Vec<Result<ObjectMeta, StorageError>>>) {
    let mut batch = Vec::with_capacity(LIST_BATCH);
    let emit = |item, batch: &mut Vec<_>| -> bool {
        batch.push(item);
        if batch.len() >= LIST_BATCH {
            return tx.blocking_send(std::mem::take(batch)).is_ok();
        }
        true
    };
    // Start in the deepest folder the prefix names whole.
    let start = match prefix.rfind('/') {
        Some(i) => &prefix[..=i],
        None => "",
    };
    let mut stack = vec![(
        start.to_owned(),
        match sorted_entries(&root.join(start), start) {
            Ok(entries) => entries.into_iter(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !start.is_empty() => {
                Vec::new().into_iter()
            }
            Err(e) => {
                let _ = tx.blocking_send(vec![Err(io_err(start)(e))]);
                return;
            }
        },
    )];
    while let Some((_, entries)) = stack.last_mut() {
        let Some((key, is_dir)) = entries.next() else {
            stack.pop();
            continue;
        };
        if is_dir {
            let folder = format!("{key}/");
            // Skip folders that cannot hold a key under the prefix.
            if !(folder.starts_with(prefix) || prefix.starts_with(&folder)) {
                continue;
            }
            match sorted_entries(&root.join(&key), &folder) {
                Ok(children) => stack.push((folder, children.into_iter())),
                Err(e) => {
                    if !emit(Err(io_err(&key)(e)), &mut batch) {
                        return;
                    }
                }
            }
        } else if key.starts_with(prefix) {
            let item = fs::metadata(root.join(&key))
                .map(|m| ObjectMeta {
                    key: key.clone(),
                    size: m.len(),
                })
                .map_err(io_err(&key));
            if !emit(item, &mut batch) {
                return;
            }
        }
    }
    if !batch.is_empty() {
        let _ = tx.blocking_send(batch);
    }
}

/// A folder's entries as `(key, is_dir)`, in key order.
fn sorted_entries(dir: &Path, folder_key: &str) -> std::io::Result<Vec<(String, bool)>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            tracing::warn!(folder = %dir.display(), name = ?entry.file_name(), "Skipping a file name that is not UTF-8.");
            continue;
        };
        let is_dir = fs::metadata(entry.path())
            .map(|m| m.is_dir())
            .unwrap_or(false);
        entries.push((name, is_dir));
    }
    entries.sort_by_cached_key(|(name, is_dir)| {
        if *is_dir {
            format!("{name}/")
        } else {
            name.clone()
        }
    });
    Ok(entries
        .into_iter()
        .map(|(name, dir)| (format!("{folder_key}{name}"), dir))
        .collect())
}
