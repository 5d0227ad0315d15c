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
//!
//! Listing in key order reads each folder whole and sorts it before its first key; a folder
//! of 300,000 files then holds a few MB, packed ([`Sorted`]), given back as the walk moves
//! on. [`Storage::list_keys_any_order`] reads folders as they come and holds nothing but
//! the folders on the walk's path.

use std::fs;
use std::io;
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

fn io_err(key: &str) -> impl FnOnce(io::Error) -> StorageError + '_ {
    move |source| {
        if source.kind() == io::ErrorKind::NotFound {
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
fn write_atomic(path: &Path, body: &[u8]) -> io::Result<()> {
    let tmp = temp_sibling(path);
    // Folders are made only when missing: the common case (a part beside the last one)
    // costs no mkdir.
    match fs::write(&tmp, body) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
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

/// What a writer gathers before each write to its file. tokio's file copies each write into
/// a buffer of its own for the blocking thread that does it, so a writer holds twice this:
/// a job's output joined at its end then costs half a MB beside the rest of the agent.
const WRITER_BUFFER: usize = 256 << 10;

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
        order: Order,
    ) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        let (tx, rx) = mpsc::channel::<Vec<Result<ObjectMeta, StorageError>>>(4);
        let root = self.root.clone();
        let excluded = self.excluded.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || walk(&root, &prefix, &excluded, sizes, order, &tx));
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
        self.walk(prefix, Sizes::Read, Order::Sorted)
    }

    fn list_keys<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<String, StorageError>> {
        self.walk(prefix, Sizes::Skip, Order::Sorted)
            .map(|object| object.map(|o| o.key))
            .boxed()
    }

    fn list_keys_any_order<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxStream<'a, Result<String, StorageError>> {
        self.walk(prefix, Sizes::Skip, Order::AsRead)
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
        file.seek(io::SeekFrom::Start(start))
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
            file: tokio::io::BufWriter::with_capacity(WRITER_BUFFER, file),
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
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
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

/// What one entry of a folder is. Its own type and metadata come from its folder (readdir,
/// then a stat relative to the folder); only a symlink is followed by its full path.
fn kind_of(entry: &fs::DirEntry, sizes: Sizes) -> io::Result<Kind> {
    let file_type = entry.file_type();
    if sizes == Sizes::Skip && file_type.as_ref().is_ok_and(|t| t.is_file()) {
        return Ok(Kind::File { size: 0 });
    }
    let symlink = file_type.as_ref().is_ok_and(|t| t.is_symlink());
    let meta = if symlink {
        fs::metadata(entry.path())
    } else {
        entry.metadata()
    };
    match meta {
        Ok(meta) if meta.is_dir() => Ok(Kind::Folder(folder_id(&meta))),
        Ok(meta) => Ok(Kind::File { size: meta.len() }),
        // A symlink that leads nowhere is an item that fails when opened.
        Err(_) if symlink => Ok(Kind::File { size: 0 }),
        Err(e) => Err(e),
    }
}

/// Walks `root`, yielding files under `prefix` in byte order of their keys, or with
/// [`Order::AsRead`] in the order the folders give them.
///
/// Sorting each folder's entries by key, with `/` appended to folder keys, gives exactly
/// the byte order of the full keys (`a-c` < `a/b` because `-` < `/`), which is the order
/// S3 lists in: the same input is partitioned the same way wherever it lives.
fn walk(
    root: &Path,
    prefix: &str,
    excluded: &[PathBuf],
    sizes: Sizes,
    order: Order,
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
    let opened = fs::metadata(&start_dir)
        .and_then(|meta| Folder::open(start_dir, start.to_owned(), folder_id(&meta), order, sizes));
    // The folders on the path from the start to the one being read, with their entries
    // still to visit: a folder met again among its own ancestors is a loop.
    let mut stack = match opened {
        Ok(folder) => vec![folder],
        Err(e) if e.kind() == io::ErrorKind::NotFound && !start.is_empty() => Vec::new(),
        Err(e) => {
            let _ = tx.blocking_send(vec![Err(io_err(start)(e))]);
            return;
        }
    };
    while let Some(folder) = stack.last_mut() {
        let (key, kind) = match folder.next(sizes) {
            Some(Ok(entry)) => entry,
            Some(Err(e)) => {
                // The folder could not be read to its end.
                let failed = Err(io_err(folder.key.trim_end_matches('/'))(e));
                stack.pop();
                if !emit(failed, &mut batch) {
                    return;
                }
                continue;
            }
            None => {
                stack.pop();
                continue;
            }
        };
        let item = match kind {
            Ok(Kind::Folder(id)) => {
                let folder_key = format!("{key}/");
                // Skip folders that cannot hold a key under the prefix.
                if !(folder_key.starts_with(prefix) || prefix.starts_with(&folder_key)) {
                    continue;
                }
                let path = folder.path.join(file_name::name(&key[folder.key.len()..]));
                if excluded.contains(&id) {
                    tracing::info!(folder = %path.display(), "Leaving an excluded folder out of the listing.");
                    continue;
                }
                if stack.iter().any(|on_path| on_path.id == id) {
                    tracing::warn!(folder = %path.display(), "Skipping a folder symlink that loops back into its own path.");
                    continue;
                }
                match Folder::open(path, folder_key, id, order, sizes) {
                    Ok(child) => {
                        stack.push(child);
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

/// In which order a walk lists its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Byte order of the keys: each folder is read whole and sorted before its first entry.
    Sorted,
    /// The order readdir gives: nothing is held but the folders on the walk's path.
    AsRead,
}

/// A folder on the walk's path, with its entries still to visit.
struct Folder {
    id: FolderId,
    path: PathBuf,
    /// Its key, ending in `/` (empty for the root).
    key: String,
    entries: Entries,
}

enum Entries {
    Sorted(Sorted),
    AsRead(fs::ReadDir),
}

impl Folder {
    fn open(
        path: PathBuf,
        key: String,
        id: FolderId,
        order: Order,
        sizes: Sizes,
    ) -> io::Result<Folder> {
        let entries = match order {
            Order::Sorted => Entries::Sorted(Sorted::read(&path, sizes)?),
            Order::AsRead => Entries::AsRead(fs::read_dir(&path)?),
        };
        Ok(Folder {
            id,
            path,
            key,
            entries,
        })
    }

    /// The next entry's full key and what it is; an error when the folder cannot be read
    /// further.
    fn next(&mut self, sizes: Sizes) -> Option<io::Result<(String, io::Result<Kind>)>> {
        match &mut self.entries {
            Entries::Sorted(sorted) => sorted.pop(&self.key).map(Ok),
            Entries::AsRead(read_dir) => {
                let entry = match read_dir.next()? {
                    Ok(entry) => entry,
                    Err(e) => return Some(Err(e)),
                };
                let mut key = self.key.clone();
                file_name::push_key(entry.file_name().as_bytes(), &mut key);
                Some(Ok((key, kind_of(&entry, sizes))))
            }
        }
    }
}

/// A folder's entries read whole and handed out in key order, packed, as one folder may hold
/// millions. No entry's path is held (a subfolder's is made when the walk enters it), and
/// sorting moves 4-byte offsets, never keys.
///
/// Once sorted, the entries are written again in the order they are visited, each key as
/// what it does not share with the one visited before it, the entry to visit first last:
/// the walk takes entries off the end, and the buffer shrinks as it goes.
#[derive(Default)]
struct Sorted {
    /// The entries still to visit, the next one last (see [`Sorted::write_ahead`]).
    ahead: Vec<u8>,
    /// The key of the entry visited last (its name's: the folder's own is left out).
    last: String,
    /// What some entries are, by the index their record holds.
    sizes: Vec<u64>,
    folders: Vec<FolderId>,
    failures: Vec<Option<io::Error>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum What {
    /// A file whose size was not read.
    File,
    Sized,
    Folder,
    Failed,
}

impl What {
    fn of(byte: u8) -> What {
        match byte {
            0 => What::File,
            1 => What::Sized,
            2 => What::Folder,
            3 => What::Failed,
            _ => unreachable!("a byte Sorted wrote"),
        }
    }
}

/// A folder's entries still to visit are moved to a smaller buffer once they fill no more
/// than half of theirs, when theirs holds this much or more.
const AHEAD_SHRINKS_FROM: usize = 64 << 10;

impl Sorted {
    fn read(dir: &Path, sizes: Sizes) -> io::Result<Sorted> {
        let mut sorted = Sorted::default();
        // Entries as read: `what`, the key's length (u16), the index of what it is (u32,
        // but for a plain file), the key.
        let mut read = Vec::new();
        let mut offsets: Vec<u32> = Vec::new();
        let mut key = String::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let (what, at) = match kind_of(&entry, sizes) {
                Ok(Kind::File { .. }) if sizes == Sizes::Skip => (What::File, 0),
                Ok(Kind::File { size }) => (What::Sized, push(&mut sorted.sizes, size)),
                Ok(Kind::Folder(id)) => (What::Folder, push(&mut sorted.folders, id)),
                Err(e) => (What::Failed, push(&mut sorted.failures, Some(e))),
            };
            key.clear();
            file_name::push_key(entry.file_name().as_bytes(), &mut key);
            let len = u16::try_from(key.len()).map_err(|_| too_large(dir))?;
            offsets.push(u32::try_from(read.len()).map_err(|_| too_large(dir))?);
            read.push(what as u8);
            read.extend_from_slice(&len.to_le_bytes());
            if what != What::File {
                let at = u32::try_from(at).map_err(|_| too_large(dir))?;
                read.extend_from_slice(&at.to_le_bytes());
            }
            read.extend_from_slice(key.as_bytes());
        }
        // Byte order of the keys, a folder's read as if it ended in `/`.
        offsets.sort_unstable_by(|a, b| {
            let (a, b) = (Record::at(&read, *a), Record::at(&read, *b));
            key_order(a.key, a.what == What::Folder, b.key, b.what == What::Folder)
        });
        for (i, offset) in offsets.iter().enumerate().rev() {
            let before = i.checked_sub(1).map(|i| Record::at(&read, offsets[i]).key);
            sorted.write_ahead(&Record::at(&read, *offset), before.unwrap_or_default());
        }
        Ok(sorted)
    }

    /// Writes the entry visited after the one whose key is `before`. Backwards, as it is
    /// read from the end: its index (but for a plain file), the end of its key after what
    /// it shares with `before`, that end's length, the length shared, `what`.
    fn write_ahead(&mut self, record: &Record, before: &[u8]) {
        let key = std::str::from_utf8(record.key).expect("keys are UTF-8");
        let mut shared = key.bytes().zip(before).take_while(|(a, b)| a == *b).count();
        // Whole characters: the last key is a `String`.
        while !key.is_char_boundary(shared) {
            shared -= 1;
        }
        if record.what != What::File {
            self.ahead.extend_from_slice(&record.at.to_le_bytes());
        }
        self.ahead.extend_from_slice(&record.key[shared..]);
        push_len(&mut self.ahead, record.key.len() - shared);
        push_len(&mut self.ahead, shared);
        self.ahead.push(record.what as u8);
    }

    /// Takes the next entry: its key under `folder_key` and what it is.
    fn pop(&mut self, folder_key: &str) -> Option<(String, io::Result<Kind>)> {
        let what = What::of(self.ahead.pop()?);
        let shared = pop_len(&mut self.ahead);
        let len = pop_len(&mut self.ahead);
        let end = self.ahead.len() - len;
        self.last.truncate(shared);
        self.last
            .push_str(std::str::from_utf8(&self.ahead[end..]).expect("keys are UTF-8"));
        self.ahead.truncate(end);
        let at = if what == What::File {
            0
        } else {
            let start = self.ahead.len() - 4;
            let at = u32::from_le_bytes(self.ahead[start..].try_into().expect("four bytes"));
            self.ahead.truncate(start);
            at as usize
        };
        if self.ahead.capacity() >= AHEAD_SHRINKS_FROM
            && self.ahead.len() <= self.ahead.capacity() / 2
        {
            self.ahead.shrink_to_fit();
        }
        let mut key = String::with_capacity(folder_key.len() + self.last.len());
        key.push_str(folder_key);
        key.push_str(&self.last);
        let kind = match what {
            What::File => Ok(Kind::File { size: 0 }),
            What::Sized => Ok(Kind::File {
                size: self.sizes[at],
            }),
            What::Folder => Ok(Kind::Folder(self.folders[at])),
            What::Failed => Err(self.failures[at].take().expect("each entry is taken once")),
        };
        Some((key, kind))
    }
}

/// An entry as [`Sorted::read`] holds it before sorting.
struct Record<'a> {
    what: What,
    at: u32,
    key: &'a [u8],
}

impl Record<'_> {
    fn at(read: &[u8], offset: u32) -> Record<'_> {
        let record = &read[offset as usize..];
        let what = What::of(record[0]);
        let len = usize::from(u16::from_le_bytes([record[1], record[2]]));
        let (at, key) = match what {
            What::File => (0, &record[3..]),
            _ => (
                u32::from_le_bytes(record[3..7].try_into().expect("four bytes")),
                &record[7..],
            ),
        };
        Record {
            what,
            at,
            key: &key[..len],
        }
    }
}

/// A length as [`Sorted::write_ahead`] writes it, to be read backwards: one byte below 255,
/// else two bytes and 255.
fn push_len(ahead: &mut Vec<u8>, len: usize) {
    match u8::try_from(len) {
        Ok(len) if len < u8::MAX => ahead.push(len),
        _ => {
            let len = u16::try_from(len).expect("keys are shorter than 64 KiB");
            ahead.extend_from_slice(&len.to_le_bytes());
            ahead.push(u8::MAX);
        }
    }
}

fn pop_len(ahead: &mut Vec<u8>) -> usize {
    match ahead.pop().expect("a length") {
        u8::MAX => {
            let hi = ahead.pop().expect("a length");
            let lo = ahead.pop().expect("a length");
            usize::from(u16::from_le_bytes([lo, hi]))
        }
        len => usize::from(len),
    }
}

/// Byte order of two names' keys, a folder's read as if it ended in `/`.
fn key_order(x: &[u8], x_folder: bool, y: &[u8], y_folder: bool) -> std::cmp::Ordering {
    let common = x.len().min(y.len());
    x[..common].cmp(&y[..common]).then_with(|| {
        // One name starts the other: what follows the shorter is its `/` if it is a folder,
        // else nothing, which sorts first. A name holds no `/`, so a tie is the same entry.
        let after =
            |name: &[u8], folder: bool| name.get(common).copied().or(folder.then_some(b'/'));
        after(x, x_folder).cmp(&after(y, y_folder))
    })
}

/// Pushes `value`; returns its index.
fn push<T>(values: &mut Vec<T>, value: T) -> usize {
    values.push(value);
    values.len() - 1
}

fn too_large(dir: &Path) -> io::Error {
    io::Error::other(format!(
        "{}: too large to list (a name of more than 64 KiB, or names of more than 4 GiB in all)",
        dir.display()
    ))
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
        // In readdir's order, the very same set.
        let mut any: Vec<String> = storage
            .list_keys_any_order(prefix)
            .try_collect()
            .await
            .unwrap();
        any.sort();
        assert_eq!(
            any, keys,
            "list_keys_any_order lists the same keys under {prefix:?}"
        );
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
        assert_eq!(keys(&storage, "").await.len(), 4);
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

    /// Folders and files whose names start alike come in the byte order of their whole keys:
    /// a folder's entries where `<name>/` sorts, whatever readdir gives first.
    #[tokio::test]
    async fn a_folder_sorts_as_its_name_and_a_slash() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let files = [
            "a-c", "a.", "a0", "ab/x", "a b/x", "a/x", "a/-", "a/.h", "a/y/z", "A", "%E9",
        ];
        for name in files {
            let path = root.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, name).unwrap();
        }
        let mut want: Vec<String> = files.iter().map(|k| file_name::key(k.as_bytes())).collect();
        want.sort();
        assert_eq!(keys(&LocalStorage::new(root), "").await, want);
        assert_eq!(
            keys(&LocalStorage::new(root), "a/").await,
            ["a/-", "a/.h", "a/x", "a/y/z"]
        );
    }

    /// A folder being listed holds its names' keys packed and a small slot per entry: no
    /// path, no allocation per entry, nothing cloned to sort. The walk is measured on this
    /// thread with a prefix that no key takes, so every key it makes is dropped where made.
    #[test]
    fn listing_a_large_folder_holds_little_per_entry() {
        let dir = tempfile::tempdir().unwrap();
        let n = 20_000;
        let mut name_bytes = 0;
        for i in 0..n {
            let name = format!("f-{i:06}.txt");
            name_bytes += name.len();
            fs::File::create(dir.path().join(name)).unwrap();
        }
        let (tx, _rx) = mpsc::channel(1);
        for order in [Order::Sorted, Order::AsRead] {
            let held = crate::allocation::peak_during(|| {
                walk(dir.path(), "zzz", &[], Sizes::Skip, order, &tx);
            });
            // Each buffer grows by doubling, so may hold twice its due: the keys with a
            // few bytes each as read, and a 4-byte offset to sort by; then again in the
            // order visited, each key without what it shares with the one before.
            let bound = 2 * (name_bytes + n * 7) + (name_bytes + n * 6) + (64 << 10);
            assert!(
                held <= bound,
                "{order:?}: {held} bytes held at the peak for {n} entries ({bound} allowed)"
            );
        }
    }

    /// Entries are given back as the walk takes them: what is left to visit shrinks.
    #[test]
    fn a_sorted_folder_shrinks_as_it_is_visited() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10_000 {
            fs::File::create(dir.path().join(format!("{i:05}"))).unwrap();
        }
        let mut sorted = Sorted::read(dir.path(), Sizes::Skip).unwrap();
        let full = sorted.ahead.len();
        assert!(full <= 10_000 * 6, "{full} bytes for 10,000 names of 5");
        for i in 0..9_000 {
            let (key, _) = sorted.pop("d/").unwrap();
            assert_eq!(key, format!("d/{i:05}"));
        }
        assert!(sorted.ahead.capacity() <= full / 5 + AHEAD_SHRINKS_FROM);
        for i in 9_000..10_000 {
            assert_eq!(sorted.pop("").unwrap().0, format!("{i:05}"));
        }
        assert!(sorted.pop("").is_none());
    }

    /// Every kind of entry, long names and names that share part of a character, come back
    /// whole from the packed listing.
    #[test]
    fn a_sorted_folder_gives_back_what_each_entry_is() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // The longest name there is: its length is written in three bytes.
        let long = "x".repeat(255);
        fs::create_dir(root.join("sub")).unwrap();
        fs::write(root.join("caf\u{e9}"), "1").unwrap();
        fs::write(root.join("caf\u{e8}"), "22").unwrap();
        fs::write(root.join(&long), "333").unwrap();
        fs::write(root.join(format!("{}y", &long[1..])), "4444").unwrap();
        let mut sorted = Sorted::read(root, Sizes::Read).unwrap();
        let mut got = Vec::new();
        while let Some((key, kind)) = sorted.pop("") {
            let what = match kind.unwrap() {
                Kind::File { size } => format!("file {size}"),
                Kind::Folder(id) => {
                    assert_eq!(id, folder_id(&fs::metadata(root.join("sub")).unwrap()));
                    "folder".to_owned()
                }
            };
            got.push((key, what));
        }
        let want: Vec<(String, String)> = [
            ("caf\u{e8}".to_owned(), "file 2"),
            ("caf\u{e9}".to_owned(), "file 1"),
            ("sub".to_owned(), "folder"),
            (long.clone(), "file 3"),
            (format!("{}y", &long[1..]), "file 4"),
        ]
        .into_iter()
        .map(|(k, w)| (k, w.to_owned()))
        .collect();
        assert_eq!(got, want);
    }
}
