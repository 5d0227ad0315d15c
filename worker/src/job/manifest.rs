//! A job's manifest, `logs/manifest.json`: what ran (its fingerprint, its Python and the
//! environment's packages), over what (its input's listing) and what it produced (each
//! mini-batch's rows and their SHA-256, the output's SHA-256, `failed_items.csv`'s), so a
//! user can check an output against it (`fleetrun verify`) and hand it on as evidence.
//!
//! The finalizer writes it last, once the job is Completed, in one atomic put beside the
//! output; the watcher that expires a job writes it the same way, its unfinished
//! mini-batches marked `unfinished`. With a key (`FLEETRUN_MANIFEST_KEY`, else the webhook secret) it is signed: its
//! `signature` is the HMAC-SHA256 of the manifest's JSON without the signature. Its digest,
//! the SHA-256 of the file as written, goes in the job's end event and webhook, and
//! `status --json` and the API read it back, so a receiver can tell the file it fetches is
//! the one the job wrote.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use fleetrun_common::events::Counts;
use fleetrun_common::ledger::JobState;
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_config::JobSpec;
use futures::TryStreamExt;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::warn;

use super::error::JobError;
use crate::parts::Joined;

/// Where the manifest is, under the job's output location.
pub const MANIFEST_KEY: &str = "logs/manifest.json";
/// The variable that holds the manifests' signing key; without it, the webhooks' secret
/// ([`super::notify::SECRET_VAR`]) signs them.
pub const KEY_VAR: &str = "FLEETRUN_MANIFEST_KEY";
/// The manifest's format; a reader refuses a newer one.
pub const MANIFEST_VERSION: u32 = 1;

/// The parts of a fingerprint, as a refusal names them.
pub const JOB_FILE: &str = "the job's settings";
pub const CODE: &str = "the script's code";
pub const INPUT: &str = "the input listing";

/// How long asking the job's Python for its packages may take.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(20);

/// Lists the installed distributions, one `name==version` a line, sorted.
const PACKAGES_PROBE: &str = "import importlib.metadata as m\n\
print('\\n'.join(sorted(set('%s==%s' % (d.metadata['Name'], d.version) for d in m.distributions()))))\n";

/// A job's manifest, as written to `logs/manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`] when written.
    pub version: u32,
    pub job_id: String,
    /// The job's state when the manifest was written.
    pub state: JobState,
    /// SHA-256 of the job's settings and of its code ([`fingerprint`]).
    pub fingerprint: BTreeMap<String, String>,
    /// The Python that ran the script, when it could be asked.
    pub python: Option<PythonInfo>,
    /// The input's listing as the finalizer saw it.
    pub input: Option<Listing>,
    /// The output file (none for `summary_only`).
    pub output: Option<FileDigest>,
    /// `logs/failed_items.csv`, when items failed.
    pub failed_items: Option<FileDigest>,
    pub counts: Counts,
    /// Every mini-batch, in index (input) order.
    pub mini_batches: Vec<MiniBatchEntry>,
    /// `sha256=<hex>`: the HMAC-SHA256 of the manifest's JSON with no signature, when a key
    /// was configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// The Python a job ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonInfo {
    /// `major.minor.micro`.
    pub version: String,
    /// The environment's installed distributions, `name==version`, sorted.
    pub packages: Vec<String>,
}

/// An input's listing: its objects' keys and sizes in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// Files listed.
    pub count: u64,
    /// SHA-256 of the listing, `<key>\t<size>\n` per object.
    pub sha256: String,
}

/// A file fleetrun wrote: its key under the output location, SHA-256 and lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
    /// Lines, header included.
    pub lines: u64,
    /// Whether the first line is a header no mini-batch holds.
    #[serde(default)]
    pub header: bool,
}

/// One mini-batch: its items and what it left in the output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MiniBatchEntry {
    pub index: u64,
    /// Its items' positions in input order, `[first, end)`, as the job's report counted
    /// them; `None` when the report has no row of it.
    pub items: Option<[u64; 2]>,
    /// Items that failed (in `failed_items.csv`).
    pub failed: u64,
    /// Lines of the output it holds, in order after the previous mini-batch's.
    pub rows: u64,
    /// SHA-256 of those lines; `None` when it holds none.
    pub sha256: Option<String>,
    /// It had not finished when the job expired: its items are not in the output, and a
    /// resume runs it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unfinished: bool,
}

/// Why a manifest cannot be read, written or trusted.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{MANIFEST_KEY} does not decode: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("{MANIFEST_KEY} is of format {0}, newer than this fleetrun reads ({MANIFEST_VERSION})")]
    Newer(u32),
}

impl Manifest {
    /// The manifest's JSON with no signature: what the signature is made over.
    fn unsigned_json(&self) -> Vec<u8> {
        let unsigned = Manifest {
            signature: None,
            ..self.clone()
        };
        serde_json::to_vec_pretty(&unsigned).expect("a manifest always encodes")
    }

    /// Signs the manifest with `key`.
    pub fn sign(&mut self, key: &[u8]) {
        self.signature = Some(super::notify::sign(key, &self.unsigned_json()));
    }

    /// Whether the manifest's signature is `key`'s over what it says now (false when it
    /// is not signed).
    pub fn signed_by(&self, key: &[u8]) -> bool {
        let Some(signature) = &self.signature else {
            return false;
        };
        let Some(hex) = signature.strip_prefix("sha256=") else {
            return false;
        };
        let Ok(expected) = decode_hex(hex) else {
            return false;
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
        mac.update(&self.unsigned_json());
        mac.verify_slice(&expected).is_ok()
    }

    /// The manifest as written.
    pub fn to_json(&self) -> Vec<u8> {
        // About what an entry takes, so that a large manifest is not copied as it grows.
        let mut json = Vec::with_capacity(4096 + 256 * self.mini_batches.len());
        serde_json::to_writer_pretty(&mut json, self).expect("a manifest always encodes");
        json.push(b'\n');
        json
    }

    /// Reads a manifest written by [`Manifest::to_json`].
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let version: Version = serde_json::from_slice(bytes).map_err(ManifestError::Decode)?;
        if version.version > MANIFEST_VERSION {
            return Err(ManifestError::Newer(version.version));
        }
        serde_json::from_slice(bytes).map_err(ManifestError::Decode)
    }

    /// Reads the manifest of the output at `output`, with its digest.
    pub async fn read(output: &dyn Storage) -> Result<(Manifest, String), ManifestError> {
        let bytes = output.get(MANIFEST_KEY).await?;
        Ok((Manifest::decode(&bytes)?, digest(&bytes)))
    }
}

/// The key that signs manifests here: `FLEETRUN_MANIFEST_KEY`, else the webhooks' secret.
pub fn signing_key() -> Option<String> {
    [KEY_VAR, super::notify::SECRET_VAR]
        .into_iter()
        .find_map(|var| std::env::var(var).ok().filter(|k| !k.is_empty()))
}

/// `sha256:<hex>` of `bytes`: how the manifest's digest is told.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(Sha256::digest(bytes)))
}

pub fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, std::num::ParseIntError> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("x"), 16))
        .collect()
}

/// What a job run is made of: its settings and its script's code, each a SHA-256. Its input
/// is told by how the run cut it, from the run's own listing.
pub fn fingerprint(spec: &JobSpec) -> Result<BTreeMap<String, String>, JobError> {
    let settings = serde_json::to_vec(spec).expect("a job always encodes");
    let mut parts = BTreeMap::from([(JOB_FILE.to_owned(), hex(Sha256::digest(&settings)))]);
    if let Some(code) = super::code_digest(spec)? {
        parts.insert(CODE.to_owned(), code);
    }
    Ok(parts)
}

/// What a manifest says of what is outside the output: the input's listing and the Python
/// that ran the script. Gathered while the output is joined ([`Outside::gather`]).
pub struct Outside {
    pub listing: Result<Listing, StorageError>,
    pub python: Option<PythonInfo>,
}

impl Outside {
    /// Lists `input` and asks the job's Python, at once.
    pub async fn gather(spec: &JobSpec, input: &dyn Storage) -> Outside {
        let (listing, python) = tokio::join!(listing(input), python_info(spec));
        Outside { listing, python }
    }
}

/// The listing of `input`: its objects' keys and sizes, in key order, streamed.
pub async fn listing(input: &dyn Storage) -> Result<Listing, StorageError> {
    let mut hasher = Sha256::new();
    let mut count = 0;
    let mut objects = input.list("");
    while let Some(object) = objects.try_next().await? {
        hasher.update(format!("{}\t{}\n", object.key, object.size).as_bytes());
        count += 1;
    }
    Ok(Listing {
        count,
        sha256: hex(hasher.finalize()),
    })
}

/// Asks the job's Python its version and installed packages, once; `None` (and a warning)
/// when it cannot be asked.
pub async fn python_info(spec: &JobSpec) -> Option<PythonInfo> {
    let environment = spec.environment.clone();
    let resolved = tokio::task::spawn_blocking(move || {
        fleetrun_common::python::Python::resolve(environment.as_deref())
    })
    .await
    .ok()?;
    let python = match resolved {
        Ok(python) => python,
        Err(e) => {
            warn!(error = %e, "Cannot ask the job's Python for the manifest.");
            return None;
        }
    };
    let listed = tokio::process::Command::new(&python.executable)
        .args(["-c", PACKAGES_PROBE])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let packages = match tokio::time::timeout(PYTHON_TIMEOUT, listed).await {
        Ok(Ok(out)) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => {
            warn!("Cannot list the job's Python packages for the manifest.");
            Vec::new()
        }
    };
    Some(PythonInfo {
        version: python.version,
        packages,
    })
}

/// Keeps the digests of a job's output as the finalizer joins it: the whole file's, and
/// each mini-batch's lines'.
#[derive(Default)]
pub struct OutputDigests {
    whole: Sha256,
    bytes: u64,
    lines: u64,
    header: bool,
    /// Mini-batch index → its lines and their SHA-256.
    parts: HashMap<u64, (u64, String)>,
}

impl OutputDigests {
    /// Notes what the join wrote.
    pub fn note(&mut self, joined: Joined<'_>) {
        let body = match joined {
            Joined::Header(line) => {
                self.header = true;
                line
            }
            Joined::Part { index, rows } => {
                let lines = count_lines(rows);
                self.parts.insert(index, (lines, hex(Sha256::digest(rows))));
                rows
            }
        };
        self.whole.update(body);
        self.bytes += body.len() as u64;
        self.lines += count_lines(body);
    }

    /// Whether the join wrote rows of mini-batch `index`.
    pub fn holds(&self, index: u64) -> bool {
        self.parts.contains_key(&index)
    }

    /// The output file `file`'s digest.
    pub fn file(&self, file: &str) -> FileDigest {
        FileDigest {
            file: file.to_owned(),
            sha256: hex(self.whole.clone().finalize()),
            bytes: self.bytes,
            lines: self.lines,
            header: self.header,
        }
    }
}

/// Lines in `body`: its newlines, and one more for a last line without one.
pub fn count_lines(body: &[u8]) -> u64 {
    let newlines = body.iter().filter(|b| **b == b'\n').count() as u64;
    newlines + u64::from(body.last().is_some_and(|b| *b != b'\n'))
}

/// The digest of a file fleetrun wrote under `output`, streamed; `None` when it is absent.
pub async fn file_digest(
    output: &dyn Storage,
    file: &str,
) -> Result<Option<FileDigest>, StorageError> {
    let mut pieces = match output.get_pieces(file).await {
        Ok(pieces) => pieces,
        Err(StorageError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let (mut hasher, mut bytes, mut lines, mut last) = (Sha256::new(), 0, 0, b'\n');
    while let Some(piece) = pieces.try_next().await? {
        hasher.update(&piece);
        bytes += piece.len() as u64;
        lines += piece.iter().filter(|b| **b == b'\n').count() as u64;
        last = piece.last().copied().unwrap_or(last);
    }
    Ok(Some(FileDigest {
        file: file.to_owned(),
        sha256: hex(hasher.finalize()),
        bytes,
        lines: lines + u64::from(last != b'\n'),
        header: false,
    }))
}

/// Each mini-batch's items and failed items, from the job's report rows (`mini_batch,
/// attempt, result, items, succeeded, failed, …`): the last row of each counts.
pub fn report_items(rows: &[String]) -> HashMap<u64, (u64, u64)> {
    let mut items = HashMap::new();
    for row in rows {
        let mut fields = row.split(',');
        let index = fields.next().and_then(|f| f.parse::<u64>().ok());
        let counted = fields.nth(2).and_then(|f| f.parse::<u64>().ok());
        let failed = fields.nth(1).and_then(|f| f.parse::<u64>().ok());
        if let (Some(index), Some(counted)) = (index, counted) {
            items.insert(index, (counted, failed.unwrap_or(0)));
        }
    }
    items
}

/// The mini-batch entries of a job of `total` mini-batches: their items from the report
/// (`report_items`), their lines from the join (`parts`, whose digests move into the
/// entries); those of `unfinished` (sorted, of an expired job) are marked so, with no items.
pub fn entries(
    total: u64,
    report: &HashMap<u64, (u64, u64)>,
    parts: OutputDigests,
    unfinished: &[u64],
) -> Vec<MiniBatchEntry> {
    let mut parts = parts.parts;
    let mut first = Some(0u64);
    (0..total)
        .map(|index| {
            let left = unfinished.binary_search(&index).is_ok();
            let counted = report.get(&index).filter(|_| !left);
            let items = match (first, counted) {
                (Some(start), Some((n, _))) => {
                    first = Some(start + n);
                    Some([start, start + n])
                }
                _ => {
                    first = None;
                    None
                }
            };
            let (rows, sha256) = parts
                .remove(&index)
                .map_or((0, None), |(lines, sha)| (lines, Some(sha)));
            MiniBatchEntry {
                index,
                items,
                failed: counted.map_or(0, |c| c.1),
                rows,
                sha256,
                unfinished: left,
            }
        })
        .collect()
}

/// Writes `manifest`, signed when a key is configured, to the output in one atomic put;
/// returns its digest.
pub async fn write(output: &dyn Storage, mut manifest: Manifest) -> Result<String, StorageError> {
    if let Some(key) = signing_key() {
        manifest.sign(key.as_bytes());
    }
    let json = manifest.to_json();
    let digest = digest(&json);
    output.put(MANIFEST_KEY, Bytes::from(json)).await?;
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            job_id: "j".into(),
            state: JobState::Completed,
            fingerprint: BTreeMap::new(),
            python: None,
            input: None,
            output: None,
            failed_items: None,
            counts: Counts {
                total_mini_batches: Some(1),
                completed_mini_batches: 1,
                failed_mini_batches: 0,
                succeeded_items: 2,
                failed_items: 0,
            },
            mini_batches: Vec::new(),
            signature: None,
        }
    }

    #[test]
    fn a_signature_holds_for_its_key_and_what_was_signed() {
        let mut m = manifest();
        m.sign(b"key");
        let read = Manifest::decode(&m.to_json()).unwrap();
        assert!(read.signed_by(b"key"));
        assert!(!read.signed_by(b"other"));
        let mut changed = read.clone();
        changed.counts.succeeded_items = 3;
        assert!(!changed.signed_by(b"key"));
        assert!(!manifest().signed_by(b"key"));
    }

    #[test]
    fn items_are_counted_from_the_last_report_row_of_each_mini_batch() {
        let rows = [
            "0,1,error,2,0,0,n,p,t,,,boom".to_owned(),
            "0,2,ok,2,2,0,n,p,t,1,1,".to_owned(),
            "1,1,ok,3,2,1,n,p,t,1,1,".to_owned(),
        ];
        let report = report_items(&rows);
        let mut parts = OutputDigests::default();
        parts.note(Joined::Part {
            index: 0,
            rows: b"a\nb\n",
        });
        assert_eq!(parts.file("out").lines, 2);
        let entries = entries(3, &report, parts, &[]);
        assert_eq!(entries[0].items, Some([0, 2]));
        assert_eq!((entries[0].rows, entries[0].failed), (2, 0));
        assert_eq!(entries[1].items, Some([2, 5]));
        assert_eq!((entries[1].rows, entries[1].failed), (0, 1));
        assert_eq!(entries[2].items, None);
    }
}
