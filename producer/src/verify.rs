//! `fleetrun verify OUTPUT`: checks a job's output against its manifest
//! (`logs/manifest.json`, see [`fleetrun_worker::job::manifest`]), streaming, and names each
//! problem it finds: a mini-batch's rows that changed, a line missing, a line duplicated or
//! foreign (and where), `failed_items.csv` changed, the input listed otherwise than the job
//! saw it, a signature that does not hold.
//!
//! The output file is read once, line by line. Each mini-batch's lines are taken in index
//! order and hashed against the manifest's SHA-256; when they do not match, the lines that
//! follow are searched (a few either side of where the next mini-batch should start) for
//! the next mini-batch's digest, which says how many lines this one has now: fewer (lines
//! missing), more (a line added: the one whose removal restores the digest is named, as a
//! duplicate of another line or as foreign), or as many (its rows changed).

use std::collections::{HashMap, VecDeque};
use std::fmt;

use fleetrun_common::storage::s3::S3Settings;
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_config::Location;
use fleetrun_worker::job;
use fleetrun_worker::job::manifest::{
    self, FileDigest, Manifest, ManifestError, MiniBatchEntry, hex,
};
use futures::TryStreamExt;
use sha2::{Digest, Sha256};

/// How many lines either side of where a mini-batch should end are searched for the next
/// one's rows.
const WINDOW: usize = 16;

/// What was found wrong with an output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The lines of a mini-batch, as many as it wrote, are not the ones it wrote.
    Changed { batch: Batch, lines: Lines },
    /// A mini-batch has fewer lines than it wrote.
    Missing {
        batch: Batch,
        count: u64,
        lines: Lines,
    },
    /// A line the output holds twice.
    Duplicated { batch: Batch, line: u64, of: u64 },
    /// A line no mini-batch wrote.
    Foreign { batch: Option<Batch>, line: u64 },
    /// A mini-batch has more lines than it wrote, none of which alone is the odd one.
    Extra {
        batch: Batch,
        count: u64,
        lines: Lines,
    },
    /// From this line on, no mini-batch's rows could be found where they should be.
    Unmatched { batch: Batch, line: u64 },
    /// A file fleetrun wrote is missing or changed as a whole.
    File { file: String, what: &'static str },
    /// The manifest's items do not cover the input exactly once.
    Items(String),
    /// The input lists otherwise than when the job ran.
    Input { count: u64, was: u64 },
    /// The manifest is not signed by the key given, or not signed at all.
    Signature(&'static str),
}

/// A mini-batch as a problem names it: its index and items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub index: u64,
    pub items: Option<[u64; 2]>,
}

/// Lines `first..=last` of the output file, from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lines {
    pub first: u64,
    pub count: u64,
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mini-batch {}", self.index)?;
        match self.items {
            Some([first, end]) if end > first => write!(f, " (items {first}-{})", end - 1),
            Some(_) => write!(f, " (no items)"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Lines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.count {
            0 => write!(f, "before line {}", self.first),
            1 => write!(f, "line {}", self.first),
            n => write!(f, "lines {}-{}", self.first, self.first + n - 1),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Changed { batch, lines } => write!(f, "{batch}: its rows changed ({lines})"),
            Problem::Missing {
                batch,
                count,
                lines,
            } => write!(
                f,
                "{batch}: {count} line(s) missing (its rows are at {lines})"
            ),
            Problem::Duplicated { batch, line, of } => {
                write!(f, "{batch}: line {line} is a duplicate of line {of}")
            }
            Problem::Foreign {
                batch: Some(batch),
                line,
            } => write!(
                f,
                "{batch}: line {line} is foreign (no mini-batch wrote it)"
            ),
            Problem::Foreign { batch: None, line } => {
                write!(
                    f,
                    "line {line} is foreign (after the last mini-batch's rows)"
                )
            }
            Problem::Extra {
                batch,
                count,
                lines,
            } => write!(f, "{batch}: {count} line(s) too many ({lines})"),
            Problem::Unmatched { batch, line } => write!(
                f,
                "{batch}: its rows are not found from line {line} on; the rest is not checked"
            ),
            Problem::File { file, what } => write!(f, "{file}: {what}"),
            Problem::Items(what) => write!(f, "items: {what}"),
            Problem::Input { count, was } => write!(
                f,
                "the input lists {count} files now, otherwise than the {was} the job listed"
            ),
            Problem::Signature(what) => write!(f, "signature: {what}"),
        }
    }
}

/// Why an output could not be verified at all.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "no manifest ({}): the job did not complete, or this is not a job's output",
        manifest::MANIFEST_KEY
    )]
    NoManifest,
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// How the manifest's signature stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signature {
    Valid,
    /// Signed, but no key was given to check it with.
    NotChecked,
    /// Not signed, and no key was given.
    Unsigned,
}

/// What `verify` found.
#[derive(Debug)]
pub struct Verified {
    pub manifest: Manifest,
    /// The digest of the manifest as read.
    pub digest: String,
    /// Lines of the output file read.
    pub lines: u64,
    pub signature: Signature,
    pub problems: Vec<Problem>,
}

impl Verified {
    /// The line `verify` prints when it found nothing wrong.
    pub fn summary(&self) -> String {
        let c = &self.manifest.counts;
        let signature = match self.signature {
            Signature::Valid => "signature valid",
            Signature::NotChecked => "signature not checked (no key)",
            Signature::Unsigned => "unsigned",
        };
        let unfinished = self
            .manifest
            .mini_batches
            .iter()
            .filter(|e| e.unfinished)
            .count();
        let expired = match unfinished {
            0 => String::new(),
            n => format!(" ({n} unfinished, listed in logs/unfinished_mini_batches.csv)"),
        };
        format!(
            "verified: {} lines, {} mini-batches{expired}, {} items ({} succeeded, {} failed), {signature}",
            self.lines,
            self.manifest.mini_batches.len(),
            c.succeeded_items + c.failed_items,
            c.succeeded_items,
            c.failed_items,
        )
    }
}

/// [`verify`] of the output at `output` (a folder or S3 prefix), with `input` listed again
/// when given.
pub async fn verify_at(
    output: &Location,
    input: Option<&Location>,
    key: Option<&[u8]>,
) -> Result<Verified, VerifyError> {
    let s3 = S3Settings::from_env()?;
    let output = job::open_storage(output, &s3).await?;
    let input = match input {
        Some(input) => Some(job::open_storage(input, &s3).await?),
        None => None,
    };
    verify(&*output, input.as_deref(), key).await
}

/// Verifies the output at `output` against its manifest; `input`, when given, is listed
/// again instead of trusting the manifest's listing; `key` checks the signature.
pub async fn verify(
    output: &dyn Storage,
    input: Option<&dyn Storage>,
    key: Option<&[u8]>,
) -> Result<Verified, VerifyError> {
    let (manifest, digest) = match manifest::Manifest::read(output).await {
        Err(ManifestError::Storage(StorageError::NotFound(_))) => {
            return Err(VerifyError::NoManifest);
        }
        read => read?,
    };
    let mut problems = Vec::new();
    let signature = match (key, &manifest.signature) {
        (Some(key), Some(_)) if manifest.signed_by(key) => Signature::Valid,
        (Some(_), Some(_)) => {
            problems.push(Problem::Signature("does not match the key given"));
            Signature::NotChecked
        }
        (Some(_), None) => {
            problems.push(Problem::Signature("the manifest is not signed"));
            Signature::Unsigned
        }
        (None, Some(_)) => Signature::NotChecked,
        (None, None) => Signature::Unsigned,
    };
    problems.extend(check_items(&manifest));
    if let Some(input) = input {
        let now = manifest::listing(input).await?;
        match &manifest.input {
            Some(was) if *was == now => {}
            Some(was) => problems.push(Problem::Input {
                count: now.count,
                was: was.count,
            }),
            None => problems.push(Problem::Items("the manifest has no input listing".into())),
        }
    }
    if let Some(failed) = &manifest.failed_items {
        problems.extend(check_file(output, failed).await?);
    }
    let mut lines = 0;
    if let Some(file) = &manifest.output {
        let (read, found) = check_output(output, file, &manifest.mini_batches).await?;
        lines = read;
        problems.extend(found);
    }
    Ok(Verified {
        manifest,
        digest,
        lines,
        signature,
        problems,
    })
}

/// The mini-batches' items: each counted, one after another from the first, adding up to
/// the job's items. An expired job's unfinished mini-batches hold no items, and where the
/// items of those after the first of them begin is not known.
fn check_items(manifest: &Manifest) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut next = 0;
    let mut gap = false;
    for entry in &manifest.mini_batches {
        if entry.unfinished {
            gap = true;
            continue;
        }
        match entry.items {
            Some([_, end]) if gap => next = end,
            None if gap => {}
            Some([first, end]) if first == next => next = end,
            Some(_) => problems.push(Problem::Items(format!(
                "mini-batch {}'s items do not follow the last one's",
                entry.index
            ))),
            None => problems.push(Problem::Items(format!(
                "mini-batch {} has no record of its items",
                entry.index
            ))),
        }
    }
    let c = &manifest.counts;
    if problems.is_empty() && !gap && next != c.succeeded_items + c.failed_items {
        problems.push(Problem::Items(format!(
            "the mini-batches hold {next} items, the job counted {}",
            c.succeeded_items + c.failed_items
        )));
    }
    let failed: u64 = manifest.mini_batches.iter().map(|e| e.failed).sum();
    if failed != c.failed_items {
        problems.push(Problem::Items(format!(
            "the mini-batches failed {failed} items, the job counted {}",
            c.failed_items
        )));
    }
    if let Some(file) = manifest.failed_items.as_ref().filter(|_| failed > 0)
        && file.lines != failed + 1
    {
        problems.push(Problem::Items(format!(
            "{} lists {} items, {failed} failed",
            file.file,
            file.lines.saturating_sub(1)
        )));
    }
    problems
}

/// A file checked whole against its digest.
async fn check_file(output: &dyn Storage, file: &FileDigest) -> Result<Vec<Problem>, StorageError> {
    let what = match manifest::file_digest(output, &file.file).await? {
        None => "missing",
        Some(now) if now.sha256 != file.sha256 => "changed",
        Some(_) => return Ok(Vec::new()),
    };
    Ok(vec![Problem::File {
        file: file.file.clone(),
        what,
    }])
}

/// Reads the output file once, checking each mini-batch's lines; returns the lines read and
/// the problems found.
async fn check_output(
    output: &dyn Storage,
    file: &FileDigest,
    entries: &[MiniBatchEntry],
) -> Result<(u64, Vec<Problem>), StorageError> {
    let mut pieces = match output.get_pieces(&file.file).await {
        Ok(pieces) => pieces,
        Err(StorageError::NotFound(_)) => {
            let missing = Problem::File {
                file: file.file.clone(),
                what: "missing",
            };
            return Ok((0, vec![missing]));
        }
        Err(e) => return Err(e),
    };
    let mut whole = Sha256::new();
    let mut splitter = LineSplitter::default();
    let mut checker = PartChecker::new(entries, file.header);
    while let Some(piece) = pieces.try_next().await? {
        whole.update(&piece);
        splitter.push(&piece, |line| checker.push(line));
    }
    splitter.finish(|line| checker.push(line));
    let lines = checker.line_count();
    let mut problems = checker.finish();
    if problems.is_empty() && hex(whole.finalize()) != file.sha256 {
        problems.push(Problem::File {
            file: file.file.clone(),
            what: "changed (its header, or its bytes between lines)",
        });
    }
    Ok((lines, problems))
}

/// Cuts bytes into lines, each with its newline (the last one may have none).
#[derive(Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    pub fn push(&mut self, mut piece: &[u8], mut line: impl FnMut(Vec<u8>)) {
        while let Some(end) = piece.iter().position(|b| *b == b'\n') {
            let mut whole = std::mem::take(&mut self.partial);
            whole.extend_from_slice(&piece[..=end]);
            line(whole);
            piece = &piece[end + 1..];
        }
        self.partial.extend_from_slice(piece);
    }

    pub fn finish(self, mut line: impl FnMut(Vec<u8>)) {
        if !self.partial.is_empty() {
            line(self.partial);
        }
    }
}

/// Checks an output file's lines, fed in order, against its mini-batches' digests.
pub struct PartChecker<'a> {
    /// The mini-batches that wrote lines, in order.
    parts: Vec<&'a MiniBatchEntry>,
    next: usize,
    /// Lines read and not yet settled; the first is line `first_line`.
    buffer: VecDeque<Vec<u8>>,
    first_line: u64,
    /// The header line is still to come.
    header: bool,
    /// The rows could not be followed any further.
    lost: bool,
    read: u64,
    /// Each line's hash → the first line it was read at, to tell a duplicated line from a
    /// foreign one.
    seen: HashMap<u64, u64>,
    problems: Vec<Problem>,
}

impl<'a> PartChecker<'a> {
    pub fn new(entries: &'a [MiniBatchEntry], header: bool) -> PartChecker<'a> {
        PartChecker {
            parts: entries.iter().filter(|e| e.rows > 0).collect(),
            next: 0,
            buffer: VecDeque::new(),
            first_line: 1,
            header,
            lost: false,
            read: 0,
            seen: HashMap::new(),
            problems: Vec::new(),
        }
    }

    pub fn line_count(&self) -> u64 {
        self.read
    }

    pub fn push(&mut self, line: Vec<u8>) {
        self.read += 1;
        if std::mem::take(&mut self.header) {
            self.first_line += 1;
            return;
        }
        if self.lost {
            return;
        }
        self.seen.entry(line_hash(&line)).or_insert(self.read);
        self.buffer.push_back(line);
        self.settle(false);
    }

    pub fn finish(mut self) -> Vec<Problem> {
        self.settle(true);
        if !self.lost {
            for i in 0..self.buffer.len() {
                self.problems.push(Problem::Foreign {
                    batch: None,
                    line: self.first_line + i as u64,
                });
            }
        }
        self.problems
    }

    /// Settles every mini-batch whose lines (and what follows, to check where it ends) have
    /// been read; at the end of the file (`eof`), all of them.
    fn settle(&mut self, eof: bool) {
        while !self.lost && self.next < self.parts.len() {
            let part = self.parts[self.next];
            let following = self.parts.get(self.next + 1).copied();
            let rows = part.rows as usize;
            let wanted = rows + WINDOW + following.map_or(0, |f| f.rows as usize);
            if !eof && self.buffer.len() < wanted {
                return;
            }
            let len = if self.buffer.len() >= rows && self.digest(0, rows) == *hash_of(part) {
                rows
            } else {
                match self.end_of(part, following, eof) {
                    Some(len) => {
                        let problem = self.diagnose(part, len);
                        self.problems.push(problem);
                        len
                    }
                    None => {
                        self.problems.push(Problem::Unmatched {
                            batch: batch(part),
                            line: self.first_line,
                        });
                        self.lost = true;
                        return;
                    }
                }
            };
            self.buffer.drain(..len);
            self.first_line += len as u64;
            self.next += 1;
        }
    }

    /// How many lines `part` has now, told by where `following`'s rows start (or, for the
    /// last, by the end of the file).
    fn end_of(
        &self,
        part: &MiniBatchEntry,
        following: Option<&MiniBatchEntry>,
        eof: bool,
    ) -> Option<usize> {
        let rows = part.rows as usize;
        let Some(following) = following else {
            return (eof && self.buffer.len() <= rows + WINDOW).then_some(self.buffer.len());
        };
        let after = following.rows as usize;
        let candidates = (0..=WINDOW).flat_map(|d| [rows.checked_sub(d), Some(rows + d)]);
        candidates.flatten().find(|&len| {
            self.buffer.len() >= len + after && self.digest(len, len + after) == *hash_of(following)
        })
    }

    /// What is wrong with `part`, which has the first `len` lines of the buffer now.
    fn diagnose(&self, part: &MiniBatchEntry, len: usize) -> Problem {
        let rows = part.rows as usize;
        let batch = batch(part);
        let lines = Lines {
            first: self.first_line,
            count: len as u64,
        };
        if len < rows {
            return Problem::Missing {
                batch,
                count: (rows - len) as u64,
                lines,
            };
        }
        if len == rows {
            return Problem::Changed { batch, lines };
        }
        if len == rows + 1 {
            let mine: Vec<&Vec<u8>> = self.buffer.range(..len).collect();
            for odd in (0..len).rev() {
                let mut hasher = Sha256::new();
                for (i, line) in mine.iter().enumerate() {
                    if i != odd {
                        hasher.update(line);
                    }
                }
                if hex(hasher.finalize()) != *hash_of(part) {
                    continue;
                }
                let line = self.first_line + odd as u64;
                return match self.seen.get(&line_hash(mine[odd])) {
                    Some(&of) if of != line => Problem::Duplicated { batch, line, of },
                    _ => Problem::Foreign {
                        batch: Some(batch),
                        line,
                    },
                };
            }
        }
        Problem::Extra {
            batch,
            count: (len - rows) as u64,
            lines,
        }
    }

    /// The SHA-256 of buffered lines `start..end`.
    fn digest(&self, start: usize, end: usize) -> String {
        let mut hasher = Sha256::new();
        for line in self.buffer.range(start..end) {
            hasher.update(line);
        }
        hex(hasher.finalize())
    }
}

fn line_hash(line: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    line.hash(&mut hasher);
    hasher.finish()
}

fn hash_of(part: &MiniBatchEntry) -> &String {
    static NONE: String = String::new();
    part.sha256.as_ref().unwrap_or(&NONE)
}

fn batch(part: &MiniBatchEntry) -> Batch {
    Batch {
        index: part.index,
        items: part.items,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mini-batches of the given rows, with their digests.
    fn entries(parts: &[&[&str]]) -> Vec<MiniBatchEntry> {
        let mut first = 0;
        parts
            .iter()
            .enumerate()
            .map(|(index, rows)| {
                let body: String = rows.iter().map(|r| format!("{r}\n")).collect();
                let n = rows.len() as u64;
                first += n;
                MiniBatchEntry {
                    index: index as u64,
                    items: Some([first - n, first]),
                    failed: 0,
                    rows: n,
                    sha256: Some(hex(Sha256::digest(body.as_bytes()))),
                    unfinished: false,
                }
            })
            .collect()
    }

    fn check(entries: &[MiniBatchEntry], text: &str) -> Vec<String> {
        let mut checker = PartChecker::new(entries, false);
        let mut splitter = LineSplitter::default();
        // Pieces that cut lines anywhere.
        for piece in text.as_bytes().chunks(3) {
            splitter.push(piece, |l| checker.push(l));
        }
        splitter.finish(|l| checker.push(l));
        checker.finish().iter().map(ToString::to_string).collect()
    }

    const PARTS: [&[&str]; 3] = [&["a0", "a1", "a2"], &["b0", "b1"], &["c0", "c1", "c2"]];

    #[test]
    fn an_intact_output_has_no_problem() {
        let e = entries(&PARTS);
        assert!(check(&e, "a0\na1\na2\nb0\nb1\nc0\nc1\nc2\n").is_empty());
    }

    #[test]
    fn each_kind_of_change_is_named_where_it_is() {
        let e = entries(&PARTS);
        assert_eq!(
            check(&e, "a0\na2\nb0\nb1\nc0\nc1\nc2\n"),
            ["mini-batch 0 (items 0-2): 1 line(s) missing (its rows are at lines 1-2)"]
        );
        assert_eq!(
            check(&e, "a0\na1\na2\nb0\nb1\nb1\nc0\nc1\nc2\n"),
            ["mini-batch 2 (items 5-7): line 6 is a duplicate of line 5"]
        );
        assert_eq!(
            check(&e, "a0\na1\na1\na2\nb0\nb1\nc0\nc1\nc2\n"),
            ["mini-batch 0 (items 0-2): line 3 is a duplicate of line 2"]
        );
        assert_eq!(
            check(&e, "a0\na1\na2\nb0\nzz\nb1\nc0\nc1\nc2\n"),
            ["mini-batch 1 (items 3-4): line 5 is foreign (no mini-batch wrote it)"]
        );
        assert_eq!(
            check(&e, "a0\na1\na2\nb0\nB1\nc0\nc1\nc2\n"),
            ["mini-batch 1 (items 3-4): its rows changed (lines 4-5)"]
        );
        assert_eq!(
            check(&e, "a0\na1\na2\nb0\nb1\nc0\nc1\nc2\nzz\n"),
            ["line 9 is foreign (after the last mini-batch's rows)"]
        );
        assert_eq!(
            check(&e, "a0\na1\na2\nb0\nb1\nc0\nc2\n"),
            ["mini-batch 2 (items 5-7): 1 line(s) missing (its rows are at lines 6-7)"]
        );
    }

    /// An expired job's manifest: its unfinished mini-batches hold no items and are not
    /// missing; the finished ones after them are checked for their rows only.
    #[test]
    fn an_expired_jobs_unfinished_mini_batches_are_not_missing() {
        let mut e = entries(&PARTS);
        e[1] = MiniBatchEntry {
            items: None,
            rows: 0,
            sha256: None,
            unfinished: true,
            ..e[1].clone()
        };
        e[2].items = None;
        let manifest = Manifest {
            version: manifest::MANIFEST_VERSION,
            job_id: "j".into(),
            state: fleetrun_common::ledger::JobState::Expired,
            fingerprint: Default::default(),
            python: None,
            input: None,
            output: None,
            failed_items: None,
            counts: fleetrun_common::events::Counts {
                total_mini_batches: Some(3),
                completed_mini_batches: 2,
                failed_mini_batches: 0,
                succeeded_items: 6,
                failed_items: 0,
            },
            mini_batches: e.clone(),
            signature: None,
        };
        assert_eq!(check_items(&manifest), []);
        let text: String = [PARTS[0], PARTS[2]]
            .concat()
            .iter()
            .map(|r| format!("{r}\n"))
            .collect();
        assert!(check(&e, &text).is_empty(), "{:?}", check(&e, &text));
        // A finished mini-batch is still one that must be there.
        let short: String = PARTS[0].iter().map(|r| format!("{r}\n")).collect();
        assert!(!check(&e, &short).is_empty());
        // Without the mark, the same manifest misses mini-batch 1's items.
        let mut whole = manifest.clone();
        whole.mini_batches[1].unfinished = false;
        assert!(!check_items(&whole).is_empty());
    }
}
