//! The embedded ledger's journal: every first recording of one job's mini-batches, appended
//! to a file as it happens, so that a run killed, interrupted or failed can be continued
//! (`fleetrun run --resume`) with what it had recorded.
//!
//! The file is JSON lines: a [`Header`] (the job and the fingerprint of what it ran), then
//! one [`Entry`] per recording. Lines are written whole, one `write` each, and the file is
//! synced to the disk in batches, at most [`SYNC_EVERY`] after a write, and when the journal
//! is dropped. A last line cut short (the process or the machine died mid-write) is dropped
//! when the journal is read, and cut off before anything is appended.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Outcome;

/// How long a recording may wait before it is on the disk.
pub const SYNC_EVERY: Duration = Duration::from_millis(100);

const VERSION: u32 = 1;

/// What a journal is of: the job, and what its run was made of (named parts, each a digest),
/// to tell whether a new run would continue the same work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub v: u32,
    pub job: String,
    pub fingerprint: BTreeMap<String, String>,
}

impl Header {
    pub fn new(job: &str, fingerprint: BTreeMap<String, String>) -> Header {
        Header {
            v: VERSION,
            job: job.to_owned(),
            fingerprint,
        }
    }
}

/// One mini-batch's first recording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(rename = "i")]
    pub index: u64,
    #[serde(rename = "s")]
    pub succeeded: u64,
    #[serde(rename = "f")]
    pub failed: u64,
    #[serde(rename = "b")]
    pub batch_failed: bool,
    /// The part's reference.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    /// The report row of the attempt recorded.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub row: Option<String>,
}

impl Entry {
    pub fn outcome(&self) -> Outcome {
        Outcome {
            succeeded: self.succeeded,
            failed: self.failed,
            batch_failed: self.batch_failed,
        }
    }
}

/// Why a journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a journal fleetrun wrote (its first line: {source})", .path.display())]
    Header {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// How far the run had cut its input into mini-batches, and what the cut held: a digest of
/// its first `batches` mini-batches' items, cumulative (the producer's), so a resumed run
/// that cuts its input again tells whether the mini-batches it keeps are still those.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    #[serde(rename = "cut")]
    pub batches: u64,
    pub listing: String,
    /// The input ended there: the cut is the whole input's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole: bool,
}

/// A journal read back: its header, its whole entries and cuts, and the length they take
/// (what follows is a line cut short).
#[derive(Debug)]
pub struct Read {
    pub header: Header,
    pub entries: Vec<Entry>,
    pub cuts: Vec<Cut>,
    whole: u64,
}

/// A journal being written. Cloning shares it.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

struct Inner {
    job: String,
    path: PathBuf,
    file: Mutex<File>,
    /// The same file, for syncing it without holding up the writers.
    syncing: File,
    dirty: AtomicBool,
    /// Removed: nothing more is synced.
    discarded: AtomicBool,
}

impl Journal {
    /// Starts a new journal at `path` (replacing any), holding `header`.
    pub fn create(path: &Path, header: &Header) -> Result<Journal, JournalError> {
        let io = io_at(path);
        let mut file = File::create(path).map_err(io)?;
        let mut line = serde_json::to_vec(header).expect("a header always encodes");
        line.push(b'\n');
        file.write_all(&line).map_err(io_at(path))?;
        let journal = Journal::start(&header.job, path, file)?;
        // On the disk with the first recordings, not before them: a run that ends first
        // never waits for it.
        journal.inner.dirty.store(true, Ordering::Release);
        Ok(journal)
    }

    /// Reads the journal at `path`; `None` when there is none (or its header was cut short).
    pub fn read(path: &Path) -> Result<Option<Read>, JournalError> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_at(path)(e)),
        };
        let mut reader = io::BufReader::new(file);
        let mut line = Vec::new();
        let mut whole = 0u64;
        let mut header = None;
        let mut entries = Vec::new();
        let mut cuts = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).map_err(io_at(path))?;
            if n == 0 || line.last() != Some(&b'\n') {
                break;
            }
            match &header {
                None => match serde_json::from_slice::<Header>(&line) {
                    Ok(h) => header = Some(h),
                    Err(source) => {
                        return Err(JournalError::Header {
                            path: path.to_owned(),
                            source,
                        });
                    }
                },
                Some(_) => match serde_json::from_slice::<Entry>(&line) {
                    Ok(entry) => entries.push(entry),
                    Err(_) => match serde_json::from_slice::<Cut>(&line) {
                        Ok(cut) => cuts.push(cut),
                        // A line torn and then followed by another cannot happen with whole
                        // writes; take what came before it.
                        Err(_) => break,
                    },
                },
            }
            whole += n as u64;
        }
        Ok(header.map(|header| Read {
            header,
            entries,
            cuts,
            whole,
        }))
    }

    /// Goes on writing the journal `read` came from, at `path`, after its whole lines (a
    /// line cut short is cut off).
    pub fn append(path: &Path, read: &Read) -> Result<Journal, JournalError> {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_at(path))?;
        file.set_len(read.whole).map_err(io_at(path))?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(io_at(path))?;
        Journal::start(&read.header.job, path, file)
    }

    /// Removes this journal: what was not yet synced never will be.
    pub fn discard(&self) -> Result<(), JournalError> {
        self.inner.dirty.store(false, Ordering::Release);
        self.inner.discarded.store(true, Ordering::Release);
        Journal::remove(&self.inner.path)
    }

    /// Removes the journal at `path`, if any.
    pub fn remove(path: &Path) -> Result<(), JournalError> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_at(path)(e)),
            _ => Ok(()),
        }
    }

    fn start(job: &str, path: &Path, file: File) -> Result<Journal, JournalError> {
        let syncing = file.try_clone().map_err(io_at(path))?;
        let inner = Arc::new(Inner {
            job: job.to_owned(),
            path: path.to_owned(),
            file: Mutex::new(file),
            syncing,
            dirty: AtomicBool::new(false),
            discarded: AtomicBool::new(false),
        });
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        // Syncs in batches until the journal is dropped (which syncs the rest).
        std::thread::Builder::new()
            .name("fleetrun-journal".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(SYNC_EVERY);
                    match weak.upgrade() {
                        Some(inner) => inner.sync(),
                        None => return,
                    }
                }
            })
            .expect("a thread starts");
        Ok(Journal { inner })
    }

    /// The job the journal is of.
    pub fn job(&self) -> &str {
        &self.inner.job
    }

    /// Appends `entry` (its line written whole; on the disk within [`SYNC_EVERY`]). A journal
    /// that cannot be written is said once in the log: the run goes on, and a resume finds
    /// fewer mini-batches done.
    pub fn write(&self, entry: &Entry) {
        self.write_line(entry);
    }

    /// Appends how far the input is cut (as [`Journal::write`] does an entry).
    pub fn note_cut(&self, cut: &Cut) {
        self.write_line(cut);
    }

    fn write_line(&self, value: &impl Serialize) {
        let mut line = serde_json::to_vec(value).expect("a journal line always encodes");
        line.push(b'\n');
        let mut file = self.inner.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(&line) {
            tracing::warn!(path = %self.inner.path.display(), error = %e, "Cannot write the run's journal; a resume will redo what it misses.");
        }
        self.inner.dirty.store(true, Ordering::Release);
    }

    /// Puts what was written on the disk now.
    pub fn sync(&self) {
        self.inner.sync();
    }
}

impl Inner {
    fn sync(&self) {
        if self.dirty.swap(false, Ordering::AcqRel) && !self.discarded.load(Ordering::Acquire) {
            // On its own handle: writers go on while the disk catches up.
            if let Err(e) = self.syncing.sync_data() {
                tracing::warn!(path = %self.path.display(), error = %e, "Cannot sync the run's journal.");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.sync();
    }
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64) -> Entry {
        Entry {
            index,
            succeeded: 10,
            failed: 0,
            batch_failed: false,
            part: Some(format!("w.seg@{index}+10")),
            row: Some(format!("{index},1,succeeded")),
        }
    }

    fn header() -> Header {
        Header::new("job-1", BTreeMap::from([("input".into(), "abc".into())]))
    }

    #[test]
    fn entries_come_back_as_written_and_appending_goes_on_after_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        assert!(Journal::read(&path).unwrap().is_none(), "no journal yet");
        let journal = Journal::create(&path, &header()).unwrap();
        journal.write(&entry(0));
        let cut = Cut {
            batches: 16,
            listing: "cafe".into(),
            whole: false,
        };
        journal.note_cut(&cut);
        journal.write(&entry(2));
        drop(journal);
        let read = Journal::read(&path).unwrap().unwrap();
        assert_eq!(read.header, header());
        assert_eq!(read.entries, [entry(0), entry(2)]);
        assert_eq!(read.cuts, [cut]);
        let journal = Journal::append(&path, &read).unwrap();
        journal.write(&entry(1));
        drop(journal);
        let read = Journal::read(&path).unwrap().unwrap();
        assert_eq!(read.entries, [entry(0), entry(2), entry(1)]);
    }

    #[test]
    fn a_last_line_cut_short_is_dropped_and_cut_off_before_appending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let journal = Journal::create(&path, &header()).unwrap();
        journal.write(&entry(0));
        drop(journal);
        let mut torn = OpenOptions::new().append(true).open(&path).unwrap();
        torn.write_all(br#"{"i":1,"s":10,"f":0,"#).unwrap();
        drop(torn);
        let read = Journal::read(&path).unwrap().unwrap();
        assert_eq!(read.entries, [entry(0)]);
        let journal = Journal::append(&path, &read).unwrap();
        journal.write(&entry(3));
        drop(journal);
        let read = Journal::read(&path).unwrap().unwrap();
        assert_eq!(read.entries, [entry(0), entry(3)]);
    }

    #[test]
    fn a_file_that_is_not_a_journal_is_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::write(&path, "hello\n").unwrap();
        let error = Journal::read(&path).unwrap_err().to_string();
        assert!(error.contains("not a journal fleetrun wrote"), "{error}");
    }
}
