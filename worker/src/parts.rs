//! Where a job's output parts wait for the finalizer.
//!
//! Each successful mini-batch's rows are one part. Storing a part returns a reference, which
//! the ledger keeps with the mini-batch's recording; only the first recording's counts, and
//! the finalizer joins the parts the ledger names, in mini-batch order ([`join_parts`]). A
//! redelivered mini-batch may store a second part, and an attempt that died may have stored
//! one, but neither is ever read, and a mini-batch that failed whole names none: every
//! counted row lands once, and no other.
//!
//! Two ways to keep them:
//! - [`SegmentParts`] append to one segment file per writer in a local folder: no file per
//!   mini-batch for the file system to create and delete (thousands of small files cost more
//!   than the work on a fast script). For `fleetrun run`, and for a fleet whose output is on
//!   a local file system, whose page cache every reader on the machine shares.
//! - [`ObjectParts`] are one storage object per part: on S3, and on a network file system,
//!   where another machine sees a file's bytes once its writer has closed it.
//! - [`InlineParts`] keep a small part in its reference itself, in the ledger, within a
//!   budget per job, and hand larger ones (and every part past the budget) to
//!   [`ObjectParts`]. A request to S3 costs more than the ledger's recording it already
//!   makes: a job of small mini-batches on S3 writes no object per mini-batch, and its
//!   finalizer reads a thousand parts per ledger call instead of one per request.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use fleetrun_common::ledger::{Ledger, LedgerError};
use fleetrun_common::storage::{Storage, StorageError};
use futures::{StreamExt, TryStreamExt};

use crate::scratch::FolderError;

/// Parts read ahead of the one being written (they are independent objects on S3).
const READ_AHEAD: usize = 16;
/// Mini-batches whose part references the finalizer asks the ledger for at once.
const REFS_PER_CALL: u64 = 1000;

/// Why a part was not stored, read back, joined or removed.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// The local folder of the parts cannot take it (full, read-only, not a folder): a system
    /// error of the node, which another attempt would meet again.
    #[error(transparent)]
    Folder(#[from] FolderError),
    /// The storage did not take the part as an object (on S3), or did not give it back; a
    /// fault of the storage's when [`StorageError::is_transient`].
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The ledger did not answer (reserving inline bytes, listing or forgetting parts):
    /// another attempt may do better.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A segment file could not be written, read or removed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A segment's part could not be read where its reference says.
    #[error("{segment} at {offset}+{len}: {source}")]
    Read {
        segment: String,
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    /// A reference that does not name a part of this kind (`a segment`, `an object`).
    #[error("not {kind} part reference: {part:?}")]
    BadReference { kind: &'static str, part: String },
    /// A part edited or cut short since it was written.
    #[error("part {0} changed since it was written (its digest does not match)")]
    Changed(String),
    /// A part kept in the ledger does not decode.
    #[error("a part kept in the ledger is corrupt: {0}")]
    CorruptInline(#[source] base64::DecodeError),
    /// A framed part's header frame is cut short or too long.
    #[error("a part's header frame is corrupt")]
    CorruptFrame,
}

impl PartError {
    /// Whether the storage did not take the part for a fault of its own (throttled,
    /// failing, unreachable), which a later try may not meet.
    pub fn is_transient(&self) -> bool {
        matches!(self, PartError::Storage(e) if e.is_transient())
    }
}

#[async_trait]
pub trait Parts: Send + Sync {
    /// Stores the part of mini-batch `index`; returns the reference to record with it.
    async fn put(&self, index: u64, body: Bytes) -> Result<String, PartError>;
    /// Reads back a part stored by any writer of the job.
    async fn get(&self, part: &str) -> Result<Bytes, PartError>;
    /// Removes every part of the job.
    async fn clear(&self) -> Result<(), PartError>;
}

/// What the parts a ledger reference names hold: a mini-batch's rows, the lines of
/// `failed_items.csv` for its failed items, or both (a mini-batch whose failed items were
/// isolated). The failed items' part follows this mark, after the rows' part if any.
const FAILED_ITEMS_MARK: char = '!';

/// The mark before the digest a stored part's reference ends with: the first 16 hex digits
/// of the part's SHA-256, checked as it is read back, so a part edited or cut short since
/// it was written is never taken for the mini-batch's rows (a resume runs that mini-batch
/// again, a finalizer refuses it). A reference without one (written by an older fleetrun,
/// or a part kept in the ledger, which no user edits) is read unchecked.
const DIGEST_MARK: char = '#';

/// `reference` with `body`'s digest.
fn sealed(reference: String, body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest: String = Sha256::digest(body)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{reference}{DIGEST_MARK}{digest}")
}

/// A stored part's reference, and the digest it carries.
fn unseal(sealed: &str) -> (&str, Option<&str>) {
    match sealed.rsplit_once(DIGEST_MARK) {
        Some((part, digest)) => (part, Some(digest)),
        None => (sealed, None),
    }
}

/// `body`, read back for `part`, if it is what was stored (`digest`).
fn check(part: &str, digest: Option<&str>, body: Bytes) -> Result<Bytes, PartError> {
    match digest {
        Some(digest) if sealed(String::new(), &body)[1..] != *digest => {
            Err(PartError::Changed(part.to_owned()))
        }
        _ => Ok(body),
    }
}

/// Reads every stored part a ledger reference names (a mini-batch's rows, its failed items'
/// lines), checking each against its digest: `Err` says which changed or is gone.
pub async fn check_kept(parts: &dyn Parts, reference: &str) -> Result<(), PartError> {
    for kind in [PartKind::Rows, PartKind::FailedItems] {
        if let Some(part) = kind.take(reference.to_owned()) {
            parts.get(&part).await?;
        }
    }
    Ok(())
}

/// Which of the counted parts a join takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// Rows, for the output file.
    Rows,
    /// Failed items' lines, for `failed_items.csv`.
    FailedItems,
}

/// The reference to record in the ledger for a mini-batch whose rows were stored as `rows`
/// and its failed items' lines as `failed_items` (either may be absent); `None` for neither.
pub fn reference(rows: Option<&str>, failed_items: Option<&str>) -> Option<String> {
    match (rows, failed_items) {
        (None, None) => None,
        (Some(rows), None) => Some(rows.to_owned()),
        (rows, Some(failed)) => Some(format!(
            "{}{FAILED_ITEMS_MARK}{failed}",
            rows.unwrap_or_default()
        )),
    }
}

impl PartKind {
    /// The stored part of this kind a ledger reference names, if it names one.
    fn take(self, reference: String) -> Option<String> {
        let (rows, failed) = match reference.split_once(FAILED_ITEMS_MARK) {
            Some((rows, failed)) => (rows, Some(failed)),
            None => (reference.as_str(), None),
        };
        match self {
            PartKind::Rows => Some(rows).filter(|r| !r.is_empty()).map(str::to_owned),
            PartKind::FailedItems => failed.map(str::to_owned),
        }
    }
}

/// The bodies of the parts of `kind` the ledger counted for mini-batches `0..total`, with
/// their mini-batch's index, in mini-batch order, read a few ahead. The ledger is asked for
/// its references a thousand at a time, so memory does not grow with the job.
fn counted<'a>(
    parts: &'a dyn Parts,
    ledger: &'a dyn Ledger,
    job: &'a str,
    total: u64,
    kind: PartKind,
) -> impl futures::Stream<Item = Result<(u64, Bytes), PartError>> + 'a {
    let ranges = (0..total)
        .step_by(REFS_PER_CALL as usize)
        .map(move |start| start..total.min(start + REFS_PER_CALL));
    futures::stream::iter(ranges)
        .then(move |range| async move {
            let start = range.start;
            let refs = ledger.parts(job, range).await?;
            Ok::<_, PartError>((start, refs))
        })
        .map_ok(move |(start, refs)| {
            let wanted = (start..).zip(refs).filter_map(move |(index, r)| {
                r.and_then(|r| kind.take(r)).map(|part| (index, part))
            });
            futures::stream::iter(wanted.map(Ok::<_, PartError>))
        })
        .try_flatten()
        .map_ok(move |(index, part)| async move { Ok((index, parts.get(&part).await?)) })
        .try_buffered(READ_AHEAD)
}

/// What a join writes into the output file, piece by piece, as its watcher (the job's
/// manifest) is told.
#[derive(Debug, Clone, Copy)]
pub enum Joined<'a> {
    /// The header line, newline included, written once at the top.
    Header(&'a [u8]),
    /// Mini-batch `index`'s rows.
    Part { index: u64, rows: &'a [u8] },
}

/// Writes the parts the ledger recorded for mini-batches `0..total`, in order, into
/// `file_name` of `output`, telling `watch` each piece. Returns the output's size. The parts
/// stay until the caller clears them, once the job is Completed: another finalizer may
/// still be reading them.
#[allow(clippy::too_many_arguments)]
pub async fn join_parts(
    parts: &dyn Parts,
    ledger: &dyn Ledger,
    job: &str,
    total: u64,
    output: &dyn Storage,
    file_name: &str,
    framed: bool,
    watch: &mut (dyn FnMut(Joined<'_>) + Send),
) -> Result<u64, PartError> {
    let mut header_written = false;
    let mut writer = output.writer(file_name).await?;
    let bodies = counted(parts, ledger, job, total, PartKind::Rows);
    futures::pin_mut!(bodies);
    while let Some((index, body)) = bodies.try_next().await? {
        let body = if framed {
            let (header, rows) = split_header(body)?;
            if !header_written && !header.is_empty() {
                header_written = true;
                let mut line = header.to_vec();
                line.push(b'\n');
                watch(Joined::Header(&line));
                writer.write(line.into()).await?;
            }
            rows
        } else {
            body
        };
        watch(Joined::Part { index, rows: &body });
        writer.write(body).await?;
    }
    Ok(writer.finish().await?)
}

/// Writes the failed items the ledger counted for mini-batches `0..total`, in order, into
/// `key` of `output` under `header`: one file for the job, whichever nodes failed them.
/// Writes nothing when no mini-batch failed whole; true when it wrote.
pub async fn join_failed_items(
    parts: &dyn Parts,
    ledger: &dyn Ledger,
    job: &str,
    total: u64,
    output: &dyn Storage,
    key: &str,
    header: &str,
) -> Result<bool, PartError> {
    let bodies = counted(parts, ledger, job, total, PartKind::FailedItems);
    futures::pin_mut!(bodies);
    let Some((_, first)) = bodies.try_next().await? else {
        return Ok(false);
    };
    let mut writer = output.writer(key).await?;
    let top = Bytes::from(format!("{header}\n"));
    for body in [top, first] {
        writer.write(body).await?;
    }
    while let Some((_, body)) = bodies.try_next().await? {
        writer.write(body).await?;
    }
    writer.finish().await?;
    Ok(true)
}

/// The bytes before a part's rows that say its DataFrame's header, for a job with
/// `append_row_dataframe_header`: the header's length (8 bytes, little-endian), then the
/// header. The join writes the first header it meets once, at the top.
const HEADER_LEN: usize = 8;

/// A part's body: its rows, one per line, after the header when the job keeps headers
/// (`framed`).
pub fn with_header(header: Option<&str>, rows: &[String], framed: bool) -> Bytes {
    let rows = join_rows(rows);
    if !framed {
        return rows;
    }
    let header = header.unwrap_or_default().as_bytes();
    let mut body = Vec::with_capacity(HEADER_LEN + header.len() + rows.len());
    body.extend_from_slice(&(header.len() as u64).to_le_bytes());
    body.extend_from_slice(header);
    body.extend_from_slice(&rows);
    body.into()
}

/// A framed part's header and rows.
fn split_header(body: Bytes) -> Result<(Bytes, Bytes), PartError> {
    let len: [u8; HEADER_LEN] = body
        .get(..HEADER_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or(PartError::CorruptFrame)?;
    let end = HEADER_LEN
        .checked_add(usize::try_from(u64::from_le_bytes(len)).map_err(|_| PartError::CorruptFrame)?)
        .filter(|end| *end <= body.len())
        .ok_or(PartError::CorruptFrame)?;
    Ok((body.slice(HEADER_LEN..end), body.slice(end..)))
}

/// The parts a job's writer on this node keeps: segments in the output's `_parts/<job>/`
/// when that is a local file system, else small ones in the ledger and the others objects
/// there.
pub fn for_job(
    storage: Arc<dyn Storage>,
    ledger: Arc<dyn Ledger>,
    job: &str,
    writer: &str,
) -> Arc<dyn Parts> {
    let prefix = format!("_parts/{job}");
    match storage.local_path(&prefix) {
        Some(dir) if !is_network_fs(&dir) => Arc::new(SegmentParts::new(dir, writer)),
        _ => Arc::new(InlineParts::new(
            ledger,
            job,
            ObjectParts::new(storage, job, writer),
        )),
    }
}

/// A name for one writer of a job's parts, unique across nodes and restarts: the node id
/// (made safe for a file name) and a random suffix.
pub fn writer_name(node: &str) -> String {
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}-{:08x}", rand::random::<u32>())
}

/// Whether `path` (or the nearest folder above it that exists) is on a network file system,
/// where another machine sees a file's bytes only once its writer closes it.
fn is_network_fs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    // f_type values of statfs(2) for NFS, SMB/CIFS, FUSE (s3fs, blobfuse, gcsfuse, …),
    // Ceph, 9P, AFS, Lustre and GPFS.
    const NETWORK: [i64; 11] = [
        0x6969,
        0x517B,
        0xFF53_4D42,
        0xFE53_4D42,
        0x6573_5546,
        0x00C3_6400,
        0x0102_1997,
        0x5346_414F,
        0x6B41_4653,
        0x0BD0_0BD0,
        0x4750_4653,
    ];
    let mut probe = path;
    loop {
        if probe.exists() {
            break;
        }
        match probe.parent() {
            Some(parent) => probe = parent,
            None => return false,
        }
    }
    let Ok(c_path) = std::ffi::CString::new(probe.as_os_str().as_bytes()) else {
        return false;
    };
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statfs struct to fill.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 or u32 depending on the target
    NETWORK.contains(&(stat.f_type as i64))
}

/// Parts appended to this writer's segment file in `dir`; a reference is
/// `<segment>@<offset>+<length>`.
pub struct SegmentParts {
    dir: PathBuf,
    segment: String,
    /// This writer's segment, opened at its first part, and its length.
    own: Mutex<Option<(File, u64)>>,
    /// Segments opened for reading, by name.
    readers: Mutex<HashMap<String, Arc<File>>>,
}

impl SegmentParts {
    pub fn new(dir: PathBuf, writer: &str) -> SegmentParts {
        SegmentParts {
            dir,
            segment: format!("{writer}.seg"),
            own: Mutex::new(None),
            readers: Mutex::new(HashMap::new()),
        }
    }

    fn reader(&self, segment: &str) -> Result<Arc<File>, PartError> {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(file) = readers.get(segment) {
            return Ok(file.clone());
        }
        let path = self.dir.join(segment);
        let file = Arc::new(File::open(&path).map_err(|source| PartError::Io {
            path: path.clone(),
            source,
        })?);
        readers.insert(segment.to_owned(), file.clone());
        Ok(file)
    }
}

#[async_trait]
impl Parts for SegmentParts {
    async fn put(&self, _index: u64, body: Bytes) -> Result<String, PartError> {
        let path = || self.dir.join(&self.segment);
        let write_error = |e| match FolderError::of_write(&self.dir, e) {
            Ok(full) => PartError::Folder(full),
            Err(source) => PartError::Io {
                path: path(),
                source,
            },
        };
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        if own.is_none() {
            std::fs::create_dir_all(&self.dir).map_err(|e| FolderError::new(&self.dir, e))?;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path())
                .map_err(write_error)?;
            *own = Some((file, 0));
        }
        let (file, len) = own.as_mut().expect("opened above");
        let offset = *len;
        if let Err(e) = file.write_all_at(&body, offset) {
            // Give back what a part written halfway took: on a full disk, the job's results
            // still need the room.
            let _ = file.set_len(offset);
            return Err(write_error(e));
        }
        *len += body.len() as u64;
        let reference = format!("{}@{offset}+{}", self.segment, body.len());
        Ok(sealed(reference, &body))
    }

    async fn get(&self, sealed: &str) -> Result<Bytes, PartError> {
        let (part, digest) = unseal(sealed);
        let bad = || PartError::BadReference {
            kind: "a segment",
            part: part.to_owned(),
        };
        let (segment, span) = part.rsplit_once('@').ok_or_else(bad)?;
        let (offset, len) = span.split_once('+').ok_or_else(bad)?;
        let offset: u64 = offset.parse().map_err(|_| bad())?;
        let len: usize = len.parse().map_err(|_| bad())?;
        if segment.is_empty() || segment.contains('/') || segment.starts_with('.') {
            return Err(bad());
        }
        let file = self.reader(segment)?;
        let mut body = vec![0u8; len];
        file.read_exact_at(&mut body, offset)
            .map_err(|source| PartError::Read {
                segment: segment.to_owned(),
                offset,
                len,
                source,
            })?;
        check(part, digest, body.into())
    }

    async fn clear(&self) -> Result<(), PartError> {
        self.readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self.own.lock().unwrap_or_else(|p| p.into_inner()) = None;
        match std::fs::remove_dir_all(&self.dir) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => Err(PartError::Io {
                path: self.dir.clone(),
                source,
            }),
            _ => Ok(()),
        }
    }
}

/// Parts as objects `_parts/<job>/<index>.<writer>.<n>` of the job's output storage; a
/// reference is the object's name in that folder. Every attempt writes its own object, so
/// a later attempt never replaces the part that was counted.
pub struct ObjectParts {
    storage: Arc<dyn Storage>,
    prefix: String,
    writer: String,
    puts: AtomicU64,
}

impl ObjectParts {
    pub fn new(storage: Arc<dyn Storage>, job: &str, writer: &str) -> ObjectParts {
        ObjectParts {
            storage,
            prefix: format!("_parts/{job}/"),
            writer: writer.to_owned(),
            puts: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl Parts for ObjectParts {
    async fn put(&self, index: u64, body: Bytes) -> Result<String, PartError> {
        let n = self.puts.fetch_add(1, Ordering::Relaxed);
        let name = format!("{index:010}.{}.{n}", self.writer);
        let reference = sealed(name, &body);
        let name = unseal(&reference).0;
        self.storage
            .put(&format!("{}{name}", self.prefix), body)
            .await?;
        Ok(reference)
    }

    async fn get(&self, sealed: &str) -> Result<Bytes, PartError> {
        let (part, digest) = unseal(sealed);
        if part.is_empty() || part.contains('/') || part.starts_with('.') {
            return Err(PartError::BadReference {
                kind: "an object",
                part: part.to_owned(),
            });
        }
        let body = self.storage.get(&format!("{}{part}", self.prefix)).await?;
        check(part, digest, body)
    }

    async fn clear(&self) -> Result<(), PartError> {
        Ok(self.storage.delete_prefix(&self.prefix).await?)
    }
}

/// The largest part kept in the ledger, before encoding.
const INLINE_PART_MAX: usize = 8 << 10;
/// The bytes of parts (encoded) one job may keep in the ledger: what a running job costs
/// the ledger's memory at most, besides its few dozen bytes per mini-batch.
const INLINE_BUDGET: u64 = 64 << 20;
/// The first character of a reference that holds its part (base64 has none of it, nor of
/// [`FAILED_ITEMS_MARK`]; an object's name starts with a digit).
const INLINE_MARK: char = '~';

/// What a writer reserves of the job's budget at once: one ledger call per this many bytes
/// of parts, not one per part. A writer leaves at most this much of the budget unused.
const INLINE_ALLOWANCE: u64 = 256 << 10;

/// Parts of up to [`INLINE_PART_MAX`] bytes kept in their ledger reference, `~<base64>`,
/// while the job's [`INLINE_BUDGET`] lasts; the others go to `objects`.
pub struct InlineParts {
    ledger: Arc<dyn Ledger>,
    job: String,
    objects: ObjectParts,
    /// Bytes this writer reserved of the budget and has not used yet.
    allowance: tokio::sync::Mutex<u64>,
}

impl InlineParts {
    pub fn new(ledger: Arc<dyn Ledger>, job: &str, objects: ObjectParts) -> InlineParts {
        InlineParts {
            ledger,
            job: job.to_owned(),
            objects,
            allowance: tokio::sync::Mutex::new(0),
        }
    }

    /// Takes `bytes` of this writer's allowance, reserving more of the job's budget when it
    /// runs short; false once the budget is spent.
    async fn take_allowance(&self, bytes: u64) -> Result<bool, PartError> {
        let mut allowance = self.allowance.lock().await;
        if *allowance < bytes {
            let more = INLINE_ALLOWANCE.max(bytes);
            let within = self
                .ledger
                .reserve_part_bytes(&self.job, more, INLINE_BUDGET)
                .await?;
            if !within {
                return Ok(false);
            }
            *allowance += more;
        }
        *allowance -= bytes;
        Ok(true)
    }
}

#[async_trait]
impl Parts for InlineParts {
    async fn put(&self, index: u64, body: Bytes) -> Result<String, PartError> {
        use base64::Engine as _;
        if body.len() <= INLINE_PART_MAX {
            let inline = format!(
                "{INLINE_MARK}{}",
                base64::engine::general_purpose::STANDARD.encode(&body)
            );
            if self.take_allowance(inline.len() as u64).await? {
                return Ok(inline);
            }
        }
        self.objects.put(index, body).await
    }

    async fn get(&self, part: &str) -> Result<Bytes, PartError> {
        use base64::Engine as _;
        match part.strip_prefix(INLINE_MARK) {
            Some(encoded) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map(Bytes::from)
                .map_err(PartError::CorruptInline),
            None => self.objects.get(part).await,
        }
    }

    /// Removes the job's objects, then the references that hold the other parts: called
    /// once the job is Completed.
    async fn clear(&self) -> Result<(), PartError> {
        self.objects.clear().await?;
        Ok(self.ledger.forget_parts(&self.job).await?)
    }
}

/// A part: the rows, one per line.
pub fn join_rows(rows: &[String]) -> Bytes {
    let mut part = Vec::with_capacity(rows.iter().map(|r| r.len() + 1).sum());
    for row in rows {
        part.extend_from_slice(row.as_bytes());
        part.push(b'\n');
    }
    part.into()
}

#[cfg(test)]
mod tests {
    use fleetrun_common::ledger::{Limits, MemoryLedger, Outcome};
    use fleetrun_common::storage::LocalStorage;

    use super::*;

    const OK: Outcome = Outcome {
        succeeded: 1,
        failed: 0,
        batch_failed: false,
    };

    /// Two writers store parts; the ledger keeps the first recording of each mini-batch. The
    /// join holds exactly the recorded parts, in index order, whoever wrote them.
    async fn joins_what_the_ledger_counted(a: &dyn Parts, b: &dyn Parts) -> String {
        let ledger = MemoryLedger::new();
        ledger.create("j", Limits::NONE).await.unwrap();
        let put = |parts: &'static str| Bytes::from(parts);
        let r2 = b.put(2, put("c\n")).await.unwrap();
        ledger.record("j", 2, OK, Some(&r2)).await.unwrap();
        let r0 = a.put(0, put("a\n")).await.unwrap();
        ledger.record("j", 0, OK, Some(&r0)).await.unwrap();
        // A redelivered mini-batch 0 run again elsewhere: stored, never counted.
        let again = b.put(0, put("a, second run\n")).await.unwrap();
        assert!(!ledger.record("j", 0, OK, Some(&again)).await.unwrap().first);
        // An attempt that stored a part and died; the mini-batch then failed whole.
        a.put(1, put("stale\n")).await.unwrap();
        ledger
            .record("j", 1, Outcome::all_failed(1), None)
            .await
            .unwrap();
        let r3 = a.put(3, put("d1\nd2\n")).await.unwrap();
        ledger.record("j", 3, OK, Some(&r3)).await.unwrap();

        let out_dir = tempfile::tempdir().unwrap();
        let out = LocalStorage::new(out_dir.path());
        let size = join_parts(a, &ledger, "j", 4, &out, "out.txt", false, &mut |_| {})
            .await
            .unwrap();
        a.clear().await.unwrap();
        let joined = std::fs::read_to_string(out_dir.path().join("out.txt")).unwrap();
        assert_eq!(size, joined.len() as u64);
        joined
    }

    /// Small parts travel in the ledger until the job's budget is spent; larger ones, and
    /// every one past the budget, are objects. The join takes both, in order; clearing a
    /// Completed job removes the objects and the references.
    #[tokio::test]
    async fn small_parts_are_kept_in_the_ledger_within_the_jobs_budget() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
        let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
        ledger.create("j", Limits::NONE).await.unwrap();
        let parts = InlineParts::new(
            ledger.clone(),
            "j",
            ObjectParts::new(storage, "j", &writer_name("n1")),
        );
        let small = Bytes::from_static(b"a!~\n\xff");
        let large = Bytes::from(vec![b'x'; INLINE_PART_MAX + 1]);
        let r0 = parts.put(0, small.clone()).await.unwrap();
        assert!(r0.starts_with(INLINE_MARK), "{r0}");
        let r1 = parts.put(1, large.clone()).await.unwrap();
        assert!(!r1.starts_with(INLINE_MARK), "{r1}");
        // One ledger call reserved an allowance for many parts.
        assert!(
            ledger
                .reserve_part_bytes("j", 0, INLINE_ALLOWANCE)
                .await
                .unwrap()
        );
        assert!(
            !ledger
                .reserve_part_bytes("j", 1, INLINE_ALLOWANCE)
                .await
                .unwrap()
        );
        // The budget spent (by this node or others), small parts go to objects too once
        // this writer's allowance is used up.
        assert!(
            !ledger
                .reserve_part_bytes("j", INLINE_BUDGET, INLINE_BUDGET)
                .await
                .unwrap()
        );
        let mut inline_after = 0;
        let r2 = loop {
            let part = parts.put(2, small.clone()).await.unwrap();
            if !part.starts_with(INLINE_MARK) {
                break part;
            }
            inline_after += 1;
            assert!(
                inline_after <= INLINE_ALLOWANCE,
                "the allowance never ran out"
            );
        };
        assert!(inline_after > 0, "the allowance was not used");
        for (index, part) in [r0, r1, r2].iter().enumerate() {
            ledger
                .record(
                    "j",
                    index as u64,
                    OK,
                    Some(&reference(Some(part), None).unwrap()),
                )
                .await
                .unwrap();
        }
        let out_dir = tempfile::tempdir().unwrap();
        let out = LocalStorage::new(out_dir.path());
        join_parts(
            &parts,
            &*ledger,
            "j",
            3,
            &out,
            "out.txt",
            false,
            &mut |_| {},
        )
        .await
        .unwrap();
        let joined = std::fs::read(out_dir.path().join("out.txt")).unwrap();
        assert_eq!(joined, [&small[..], &large[..], &small[..]].concat());

        parts.clear().await.unwrap();
        assert!(!dir.path().join("_parts/j").exists());
        assert!(
            join_parts(
                &parts,
                &*ledger,
                "j",
                3,
                &out,
                "again.txt",
                false,
                &mut |_| {}
            )
            .await
            .is_err()
        );
        assert!(!out_dir.path().join("again.txt").exists());
    }

    /// With `append_row_dataframe_header`, the first header met is written once, at the top.
    #[tokio::test]
    async fn framed_parts_give_the_header_once() {
        let dir = tempfile::tempdir().unwrap();
        let parts = SegmentParts::new(dir.path().join("_parts/j"), &writer_name("n1"));
        let ledger = MemoryLedger::new();
        ledger.create("j", Limits::NONE).await.unwrap();
        let rows = |rows: &[&str]| rows.iter().map(|r| r.to_string()).collect::<Vec<_>>();
        let bodies = [
            with_header(None, &rows(&[]), true),
            with_header(Some("id text"), &rows(&["1 a", "2 b"]), true),
            with_header(Some("id text"), &rows(&["3 c"]), true),
        ];
        for (index, body) in bodies.into_iter().enumerate() {
            let part = parts.put(index as u64, body).await.unwrap();
            ledger
                .record("j", index as u64, OK, Some(&part))
                .await
                .unwrap();
        }
        let out = LocalStorage::new(dir.path());
        join_parts(&parts, &ledger, "j", 3, &out, "out.txt", true, &mut |_| {})
            .await
            .unwrap();
        let joined = std::fs::read_to_string(dir.path().join("out.txt")).unwrap();
        assert_eq!(joined, "id text\n1 a\n2 b\n3 c\n");
        assert_eq!(with_header(Some("h"), &rows(&["x"]), false), "x\n");
    }

    /// A mini-batch that returned short has rows for the output and failed items for
    /// `failed_items.csv`; each join takes its own, and a `summary_only` one has no rows.
    #[tokio::test]
    async fn a_short_return_gives_rows_and_failed_items() {
        let dir = tempfile::tempdir().unwrap();
        let parts = SegmentParts::new(dir.path().join("_parts/j"), &writer_name("n1"));
        let ledger = MemoryLedger::new();
        ledger.create("j", Limits::NONE).await.unwrap();
        let short = Outcome {
            succeeded: 1,
            failed: 1,
            batch_failed: true,
        };
        let rows = parts.put(0, Bytes::from("a\n")).await.unwrap();
        let failed = parts.put(0, Bytes::from("x,0,1,short\n")).await.unwrap();
        let both = reference(Some(&rows), Some(&failed));
        ledger.record("j", 0, short, both.as_deref()).await.unwrap();
        let failed = parts.put(1, Bytes::from("y,1,1,short\n")).await.unwrap();
        let only = reference(None, Some(&failed));
        ledger.record("j", 1, short, only.as_deref()).await.unwrap();
        let r2 = parts.put(2, Bytes::from("c\n")).await.unwrap();
        ledger.record("j", 2, OK, Some(&r2)).await.unwrap();
        let out = LocalStorage::new(dir.path());
        join_parts(&parts, &ledger, "j", 3, &out, "out.txt", false, &mut |_| {})
            .await
            .unwrap();
        join_failed_items(&parts, &ledger, "j", 3, &out, "failed.csv", "h")
            .await
            .unwrap();
        let read = |name| std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(read("out.txt"), "a\nc\n");
        assert_eq!(read("failed.csv"), "h\nx,0,1,short\ny,1,1,short\n");
    }

    #[tokio::test]
    async fn segment_parts_join_the_counted_parts_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let parts_dir = dir.path().join("_parts/j");
        let a = SegmentParts::new(parts_dir.clone(), &writer_name("n1"));
        let b = SegmentParts::new(parts_dir.clone(), &writer_name("n2"));
        assert_eq!(
            joins_what_the_ledger_counted(&a, &b).await,
            "a\nc\nd1\nd2\n"
        );
        assert!(!parts_dir.exists(), "the parts are removed once joined");
    }

    #[tokio::test]
    async fn object_parts_join_the_counted_parts_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
        let a = ObjectParts::new(storage.clone(), "j", &writer_name("n1"));
        let b = ObjectParts::new(storage, "j", &writer_name("n2"));
        assert_eq!(
            joins_what_the_ledger_counted(&a, &b).await,
            "a\nc\nd1\nd2\n"
        );
        assert!(!dir.path().join("_parts/j").exists());
    }

    #[tokio::test]
    async fn a_local_folder_gets_segments_and_no_parts_make_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
        let parts = for_job(storage, Arc::new(MemoryLedger::new()), "j", "n1-0");
        let name = parts.put(0, Bytes::from("x\n")).await.unwrap();
        // The reference ends with the part's digest (SHA-256 of "x\n", its first 8 bytes).
        assert_eq!(name, "n1-0.seg@0+2#73cb3858a687a849");
        assert!(dir.path().join("_parts/j/n1-0.seg").is_file());
        assert_eq!(parts.get(&name).await.unwrap(), Bytes::from("x\n"));
        // An older reference, with no digest, reads unchecked.
        assert_eq!(parts.get("n1-0.seg@0+2").await.unwrap(), Bytes::from("x\n"));
        // A part edited in place is refused, and so is one cut short.
        std::fs::write(dir.path().join("_parts/j/n1-0.seg"), "y\n").unwrap();
        let fresh = for_job(
            Arc::new(LocalStorage::new(dir.path())),
            Arc::new(MemoryLedger::new()),
            "j",
            "n2-0",
        );
        let changed = fresh.get(&name).await.unwrap_err();
        assert!(matches!(&changed, PartError::Changed(_)), "{changed:?}");
        assert!(
            changed.to_string().contains("changed since it was written"),
            "{changed}"
        );
        assert!(check_kept(&*fresh, &name).await.is_err());
        std::fs::write(dir.path().join("_parts/j/n1-0.seg"), "x\n").unwrap();
        assert!(check_kept(&*fresh, &name).await.is_ok());
        std::fs::write(dir.path().join("_parts/j/n1-0.seg"), "").unwrap();
        assert!(check_kept(&*fresh, &name).await.is_err());
        std::fs::write(dir.path().join("_parts/j/n1-0.seg"), "x\n").unwrap();

        let ledger = MemoryLedger::new();
        ledger.create("j", Limits::NONE).await.unwrap();
        let out = LocalStorage::new(dir.path());
        join_parts(
            &*parts,
            &ledger,
            "j",
            0,
            &out,
            "out.txt",
            false,
            &mut |_| {},
        )
        .await
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
            ""
        );
    }

    #[tokio::test]
    async fn a_parts_folder_that_cannot_be_made_is_the_folders_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), "").unwrap();
        let folder = dir.path().join("file/_parts/j");
        let parts = SegmentParts::new(folder.clone(), "w");
        match parts.put(0, Bytes::from("x\n")).await {
            Err(PartError::Folder(e)) => assert_eq!(e.folder, folder),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reference_names_the_rows_the_failed_items_or_both() {
        use super::{PartKind, reference};
        let take = |r: &Option<String>, kind: PartKind| r.clone().and_then(|r| kind.take(r));
        let rows = reference(Some("w-1.seg@0+4"), None);
        assert_eq!(take(&rows, PartKind::Rows).as_deref(), Some("w-1.seg@0+4"));
        assert_eq!(take(&rows, PartKind::FailedItems), None);
        let failed = reference(None, Some("w-1.seg@4+9"));
        assert_eq!(take(&failed, PartKind::Rows), None);
        assert_eq!(
            take(&failed, PartKind::FailedItems).as_deref(),
            Some("w-1.seg@4+9")
        );
        let both = reference(Some("a"), Some("b"));
        assert_eq!(take(&both, PartKind::Rows).as_deref(), Some("a"));
        assert_eq!(take(&both, PartKind::FailedItems).as_deref(), Some("b"));
        assert_eq!(reference(None, None), None);
    }

    #[tokio::test]
    async fn references_cannot_leave_the_parts_folder() {
        let dir = tempfile::tempdir().unwrap();
        let segments = SegmentParts::new(dir.path().join("p"), "w");
        for bad in [
            "../x.seg@0+1",
            "x.seg",
            "x.seg@a+1",
            "/etc/passwd@0+1",
            "@0+1",
        ] {
            assert!(segments.get(bad).await.is_err(), "{bad}");
        }
        let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
        let objects = ObjectParts::new(storage, "j", "w");
        for bad in ["../../secret", "a/b", ""] {
            assert!(objects.get(bad).await.is_err(), "{bad}");
        }
    }
}
