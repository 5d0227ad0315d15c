//! A job's side inputs and models (`[side_inputs]`, `[models]`), and its code when it is in
//! storage: staged whole, once per node, into the node's cache before its first runner
//! starts, and shared by every job that brings the same data.
//!
//! # The cache
//!
//! `<cache>/side/<digest>/` holds one staged location: a side input, a model, or a job's code
//! (`super::code`). The digest is SHA-256 over what the
//! listing says of the data, read without downloading it: every object's key, size and ETag
//! on S3; every file's relative path, size and modification time (nanoseconds) plus the
//! folder's absolute path for a local one. An unchanged side input is therefore never
//! downloaded again, a changed one (new bytes give a new ETag or mtime) is staged anew.
//! A local side input goes through the cache too (a copy), so the script sees the same
//! read-only files in both modes.
//!
//! Staged files are read-only (mode 0444): a script cannot change what the next job reads.
//! Entries are staged into `<digest>.partial-…` and renamed into place whole, so a node
//! never sees half an entry.
//!
//! Every job that uses an entry holds a shared `flock(2)` on the entry's folder until the
//! job ends on this node; eviction takes the lock exclusively without waiting, so an entry
//! in use by any job of any worker sharing the cache is never removed. After each staging,
//! the entries no job uses are evicted, least recently used first, while they take more
//! than [`unused_cap`] bytes.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use fleetrun_common::storage::s3::{S3Settings, S3Storage};
use fleetrun_common::storage::{Storage, check_key, join_key};
use fleetrun_config::{JobSpec, Location, named};
use futures::TryStreamExt;
use sha2::{Digest, Sha256};

use super::error::JobError;

/// The cache's folder under the node's cache folder.
pub const SIDE_DIR: &str = "side";

/// Unused entries kept by default: 10 GiB.
const DEFAULT_UNUSED_CAP: u64 = 10 << 30;

/// The variable that sets how many bytes of unused entries a node keeps.
pub const UNUSED_CAP_VAR: &str = "FLEETRUN_SIDE_CACHE_BYTES";

/// Marks an entry staged whole; its modification time is the entry's last use.
const COMPLETE: &str = ".complete";

/// Bytes of entries no job uses that a node keeps ([`UNUSED_CAP_VAR`], else 10 GiB).
pub fn unused_cap() -> u64 {
    std::env::var(UNUSED_CAP_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_UNUSED_CAP)
}

/// The entries a job uses on this node: held until dropped (the job ended here).
#[derive(Debug, Default)]
pub struct Held {
    /// Each entry, with its shared lock.
    entries: Vec<(PathBuf, File)>,
}

impl Held {
    /// Removes the cache's entries no job uses, past [`unused_cap`] (see [`evict`]).
    pub(super) async fn evict_others(&self, cache: &Path) -> Result<(), JobError> {
        let root = cache.join(SIDE_DIR);
        let in_use: HashSet<PathBuf> = self.entries.iter().map(|(e, _)| e.clone()).collect();
        let cap = unused_cap();
        let evict_root = root.clone();
        tokio::task::spawn_blocking(move || evict(&evict_root, &in_use, cap))
            .await
            .map_err(|e| JobError::io(&root)(io::Error::other(e)))?;
        Ok(())
    }
}

/// Stages `location` into the node's cache unless it is there, holds its entry for the job,
/// and returns the local path of what it names: the entry, or the single file in it.
pub(super) async fn stage_location(
    location: &Location,
    cache: &Path,
    s3: &S3Settings,
    held: &mut Held,
) -> Result<PathBuf, JobError> {
    let root = cache.join(SIDE_DIR);
    tokio::fs::create_dir_all(&root)
        .await
        .map_err(JobError::io(&root))?;
    let (entry, path, lock) = stage_one(location, &root, s3).await?;
    held.entries.push((entry, lock));
    Ok(path)
}

/// Stages the job's side inputs and models into `<cache>/side/`, held in `held`, points the
/// spec at the local copies, and replaces the `${{side_inputs.x}}` / `${{models.x}}`
/// references in its arguments with their paths.
pub(super) async fn stage_side(
    mut spec: JobSpec,
    cache: &Path,
    s3: &S3Settings,
    held: &mut Held,
) -> Result<JobSpec, JobError> {
    for table in [&mut spec.side_inputs, &mut spec.models] {
        for location in table.values_mut() {
            let path = stage_location(location, cache, s3, held).await?;
            *location = Location::Local(path);
        }
    }
    let paths = |table: &BTreeMap<String, Location>| -> BTreeMap<String, PathBuf> {
        table
            .iter()
            .filter_map(|(name, l)| Some((name.clone(), l.as_local()?.to_path_buf())))
            .collect()
    };
    let (side, models) = (paths(&spec.side_inputs), paths(&spec.models));
    let path = |kind: &str, name: &str| {
        let table = match kind {
            named::SIDE_INPUTS => &side,
            named::MODELS => &models,
            _ => return None,
        };
        Some(table.get(name)?.to_string_lossy().into_owned())
    };
    spec.arguments = spec
        .arguments
        .iter()
        .map(|a| named::substitute(a, path))
        .collect();
    Ok(spec)
}

/// Where shipped side inputs and models live, under the job's output location.
pub const SHIPPED_PREFIX: &str = "_fleetrun/side";

/// Ships the job's local side inputs and models to its output storage when the output is on
/// S3 (workers elsewhere cannot read the submitter's disk), as its code is shipped:
/// content-addressed under `_fleetrun/side/<sha256>/`, uploaded once per content, and the
/// spec pointed there. Nothing to do for an S3 entry or a local output.
pub async fn ship_side(mut spec: JobSpec, s3: &S3Settings) -> Result<JobSpec, JobError> {
    let Location::S3 { bucket, prefix } = spec.output.clone() else {
        return Ok(spec);
    };
    let shipped = join_key(&prefix, SHIPPED_PREFIX);
    for table in [&mut spec.side_inputs, &mut spec.models] {
        for location in table.values_mut() {
            let Location::Local(path) = location else {
                continue;
            };
            let listing = {
                let owned = path.clone();
                tokio::task::spawn_blocking(move || list_local(&owned))
                    .await
                    .map_err(|e| JobError::io(&*path)(io::Error::other(e)))??
            };
            let Source::Local(dir) = &listing.source else {
                unreachable!("a local listing")
            };
            let mut hasher = Sha256::new();
            let mut bodies = Vec::with_capacity(listing.files.len());
            for (rel, _, _) in &listing.files {
                let from = dir.join(rel);
                let body = tokio::fs::read(&from).await.map_err(JobError::io(&from))?;
                hasher.update(rel.as_bytes());
                hasher.update([0]);
                hasher.update((body.len() as u64).to_be_bytes());
                hasher.update(&body);
                bodies.push(body);
            }
            let hash = format!("{:x}", hasher.finalize());
            let storage = S3Storage::new(&bucket, &join_key(&shipped, &hash), s3).await?;
            let there: Vec<_> = storage.list("").try_collect().await?;
            if there.len() != listing.files.len() {
                for ((rel, _, _), body) in listing.files.iter().zip(bodies) {
                    storage.put(rel, bytes::Bytes::from(body)).await?;
                }
            }
            let key = match &listing.single {
                Some(name) => join_key(&join_key(&shipped, &hash), name),
                None => join_key(&shipped, &hash),
            };
            *location = Location::S3 {
                bucket: bucket.clone(),
                prefix: key,
            };
        }
    }
    Ok(spec)
}

/// What a location holds, as listed: relative paths (`/`-separated) with their size and
/// version (ETag, or mtime), and the file name when it is a single file.
struct Listing {
    files: Vec<(String, u64, String)>,
    single: Option<String>,
    source: Source,
}

enum Source {
    Local(PathBuf),
    S3 { storage: S3Storage, prefix: String },
}

/// Stages `location` (unless its entry is there) and returns the entry, the local path the
/// script gets (the entry, or the file in it) and the entry's shared lock.
async fn stage_one(
    location: &Location,
    root: &Path,
    s3: &S3Settings,
) -> Result<(PathBuf, PathBuf, File), JobError> {
    let listing = list(location, s3).await?;
    let digest = digest(location, &listing);
    let entry = root.join(&digest);
    let path = match &listing.single {
        Some(name) => entry.join(name),
        None => entry.clone(),
    };
    loop {
        if !entry.join(COMPLETE).exists() {
            fill(&listing, root, &digest, &entry).await?;
        }
        let lock = File::open(&entry).map_err(JobError::io(&entry))?;
        let locked = tokio::task::spawn_blocking(move || lock.lock_shared().map(|()| lock))
            .await
            .map_err(|e| JobError::io(&entry)(io::Error::other(e)))?;
        let lock = locked.map_err(JobError::io(&entry))?;
        // Evicted between the check and the lock: stage it again.
        let marker = entry.join(COMPLETE);
        if marker.exists() {
            if let Ok(file) = File::options().write(true).open(&marker) {
                let _ = file.set_modified(SystemTime::now());
            }
            return Ok((entry, path, lock));
        }
    }
}

async fn list(location: &Location, s3: &S3Settings) -> Result<Listing, JobError> {
    match location {
        Location::Local(path) => {
            let path = path.clone();
            tokio::task::spawn_blocking(move || list_local(&path))
                .await
                .map_err(|e| JobError::io(location.to_string())(io::Error::other(e)))?
        }
        Location::S3 { bucket, prefix } => {
            let storage = S3Storage::new(bucket, "", s3).await?;
            let objects: Vec<_> = storage.list_tagged(prefix).try_collect().await?;
            // A prefix written with a trailing `/` is a folder, whatever object has its key.
            if !prefix.is_empty()
                && !prefix.ends_with('/')
                && let Some((object, etag)) = objects.iter().find(|(o, _)| &o.key == prefix)
            {
                let name = prefix.rsplit('/').next().unwrap_or(prefix).to_owned();
                return Ok(Listing {
                    files: vec![(name.clone(), object.size, etag.clone())],
                    single: Some(name),
                    source: Source::S3 {
                        storage,
                        prefix: prefix.rsplit_once('/').map_or("", |(p, _)| p).to_owned(),
                    },
                });
            }
            // A folder: only what is under `prefix/`, not `prefix-other/`.
            let folder = match prefix.as_str() {
                "" => String::new(),
                p if p.ends_with('/') => p.to_owned(),
                p => format!("{p}/"),
            };
            let files: Vec<_> = objects
                .into_iter()
                .filter_map(|(o, etag)| {
                    let rel = o.key.strip_prefix(&folder)?.to_owned();
                    // A key ending in `/` marks a folder (as consoles create them): no file.
                    (!rel.is_empty() && !rel.ends_with('/')).then_some((rel, o.size, etag))
                })
                .collect();
            if files.is_empty() {
                return Err(JobError::io(location.to_string())(io::Error::new(
                    io::ErrorKind::NotFound,
                    "side input or model: no object at this prefix",
                )));
            }
            Ok(Listing {
                files,
                single: None,
                source: Source::S3 {
                    storage,
                    prefix: folder,
                },
            })
        }
    }
}

fn list_local(path: &Path) -> Result<Listing, JobError> {
    let meta = std::fs::metadata(path).map_err(JobError::io(path))?;
    let version = |m: &std::fs::Metadata| format!("{}.{}", m.mtime(), m.mtime_nsec());
    if meta.is_file() {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "data".to_owned());
        return Ok(Listing {
            files: vec![(name.clone(), meta.len(), version(&meta))],
            single: Some(name),
            source: Source::Local(path.parent().unwrap_or(Path::new("/")).to_path_buf()),
        });
    }
    let mut files = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    // Folders already walked, by device and inode: a link back up (`ln -s .. up`) is not
    // walked again, so a loop ends instead of listing forever.
    let mut walked = std::collections::HashSet::from([(meta.dev(), meta.ino())]);
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(JobError::io(&dir))? {
            let entry = entry.map_err(JobError::io(&dir))?;
            let full = entry.path();
            let meta = std::fs::metadata(&full).map_err(JobError::io(&full))?;
            if meta.is_dir() {
                if walked.insert((meta.dev(), meta.ino())) {
                    stack.push(full);
                } else {
                    tracing::warn!(folder = %full.display(), "Skipping a link to a folder already listed.");
                }
            } else if let Ok(rel) = full.strip_prefix(path) {
                let rel = rel.to_string_lossy().into_owned();
                files.push((rel, meta.len(), version(&meta)));
            }
        }
    }
    files.sort();
    Ok(Listing {
        files,
        single: None,
        source: Source::Local(path.to_path_buf()),
    })
}

/// The entry's name: what the listing says of the data (module docs).
fn digest(location: &Location, listing: &Listing) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"fleetrun-side-v1\0");
    if let Location::Local(path) = location {
        // An mtime says nothing of the bytes: a copy elsewhere is another entry.
        hasher.update(path.as_os_str().as_encoded_bytes());
        hasher.update([0]);
    }
    if let Some(name) = &listing.single {
        hasher.update(b"file\0");
        hasher.update(name.as_bytes());
        hasher.update([0]);
    }
    for (key, size, version) in &listing.files {
        hasher.update(key.as_bytes());
        hasher.update([0]);
        hasher.update(size.to_be_bytes());
        hasher.update(version.as_bytes());
        hasher.update([0]);
    }
    format!("{:x}", hasher.finalize())
}

/// Copies the listing into a partial folder, makes it read-only and renames it into place
/// (another worker sharing the cache may have done so first).
async fn fill(listing: &Listing, root: &Path, digest: &str, entry: &Path) -> Result<(), JobError> {
    let partial = root.join(format!(
        "{digest}.partial-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let result = async {
        // The entry itself first: an empty folder is staged as one.
        tokio::fs::create_dir_all(&partial)
            .await
            .map_err(JobError::io(&partial))?;
        for (rel, _, _) in &listing.files {
            check_key(rel)?;
            let target = partial.join(rel);
            if let Some(parent) = target.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(JobError::io(parent))?;
            }
            match &listing.source {
                Source::Local(dir) => {
                    let from = dir.join(rel);
                    tokio::fs::copy(&from, &target)
                        .await
                        .map_err(JobError::io(&from))?;
                }
                Source::S3 { storage, prefix } => {
                    // A piece at a time: a model of gigabytes never sits in memory.
                    use futures::StreamExt;
                    use tokio::io::AsyncWriteExt;
                    let mut pieces = storage.get_pieces(&join_key(prefix, rel)).await?;
                    let mut file = tokio::fs::File::create(&target)
                        .await
                        .map_err(JobError::io(&target))?;
                    while let Some(piece) = pieces.next().await {
                        file.write_all(&piece?)
                            .await
                            .map_err(JobError::io(&target))?;
                    }
                    file.flush().await.map_err(JobError::io(&target))?;
                }
            }
            tokio::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o444))
                .await
                .map_err(JobError::io(&target))?;
        }
        tokio::fs::write(partial.join(COMPLETE), b"")
            .await
            .map_err(JobError::io(&partial))?;
        Ok::<(), JobError>(())
    }
    .await;
    if let Err(e) = result {
        let _ = tokio::fs::remove_dir_all(&partial).await;
        return Err(e);
    }
    if tokio::fs::rename(&partial, entry).await.is_err() {
        // Staged by another first.
        let _ = tokio::fs::remove_dir_all(&partial).await;
    }
    Ok(())
}

/// Removes entries no job holds, least recently used first, until those left take at most
/// `cap` bytes. Entries in `in_use`, held by any job (a shared lock), or partial are kept.
/// Returns the entries removed.
pub fn evict(root: &Path, in_use: &HashSet<PathBuf>, cap: u64) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut unused = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if in_use.contains(&path) || name.to_string_lossy().contains(".partial-") {
            continue;
        }
        let Ok(lock) = File::open(&path) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        let used = std::fs::metadata(path.join(COMPLETE))
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        unused.push((used, folder_size(&path), path, lock));
    }
    unused.sort_by_key(|(used, ..)| *used);
    let mut total: u64 = unused.iter().map(|(_, size, ..)| size).sum();
    let mut removed = Vec::new();
    for (_, size, path, _lock) in unused {
        if total <= cap {
            break;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(entry = %path.display(), bytes = size, "Evicted an unused side input from the cache.");
                total -= size;
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(entry = %path.display(), error = %e, "Cannot evict a side input from the cache.")
            }
        }
    }
    removed
}

fn folder_size(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with(side: &Path, model: &Path) -> JobSpec {
        let dir = side.parent().unwrap();
        std::fs::write(dir.join("score.py"), "def run(b): return b\n").unwrap();
        let text = format!(
            "name = \"side\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\n\
             arguments = [\"--labels\", \"${{{{side_inputs.labels}}}}\", \"--m=${{{{models.m}}}}\"]\n\
             [input]\nfiles = \"in\"\n[output]\npath = \"out\"\n\
             [side_inputs]\nlabels = {:?}\n[models]\nm = {:?}\n",
            side.display().to_string(),
            model.display().to_string()
        );
        fleetrun_config::load_str(&text, "job.toml", dir, &[]).unwrap()
    }

    async fn stage(spec: JobSpec, cache: &Path) -> (JobSpec, Held) {
        let mut held = Held::default();
        let spec = stage_side(spec, cache, &S3Settings::default(), &mut held)
            .await
            .unwrap();
        (spec, held)
    }

    /// An empty folder (a model folder not yet filled, say) is staged as an empty folder.
    #[tokio::test]
    async fn an_empty_folder_is_staged_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let labels = dir.path().join("labels.txt");
        std::fs::write(&labels, "cat\n").unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        let cache = dir.path().join("cache");
        let spec = spec_with(&labels, &model);
        let (staged, _held) = stage(spec, &cache).await;
        let model_dir = staged.models["m"].as_local().unwrap();
        assert!(model_dir.is_dir());
        let entries: Vec<_> = std::fs::read_dir(model_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|name| name != COMPLETE)
            .collect();
        assert!(entries.is_empty(), "{entries:?}");
    }

    #[tokio::test]
    async fn stages_once_read_only_and_fills_in_the_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let labels = dir.path().join("labels.txt");
        std::fs::write(&labels, "cat\ndog\n").unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir_all(model.join("sub")).unwrap();
        std::fs::write(model.join("sub/w.bin"), "weights").unwrap();
        let cache = dir.path().join("cache");
        let spec = spec_with(&labels, &model);

        let (staged, held) = stage(spec.clone(), &cache).await;
        let local = staged.side_inputs["labels"]
            .as_local()
            .unwrap()
            .to_path_buf();
        assert!(local.starts_with(cache.join(SIDE_DIR)));
        assert_eq!(local.file_name().unwrap(), "labels.txt");
        assert_eq!(std::fs::read_to_string(&local).unwrap(), "cat\ndog\n");
        let mode = std::fs::metadata(&local).unwrap().permissions().mode();
        assert_eq!(mode & 0o222, 0, "read-only: {mode:o}");
        let model_dir = staged.models["m"].as_local().unwrap().to_path_buf();
        assert_eq!(
            std::fs::read_to_string(model_dir.join("sub/w.bin")).unwrap(),
            "weights"
        );
        assert_eq!(
            staged.arguments,
            [
                "--labels".to_owned(),
                local.display().to_string(),
                format!("--m={}", model_dir.display())
            ]
        );

        // Unchanged: the same entry, not copied again.
        let marker = local.parent().unwrap().join(COMPLETE);
        let staged_at = std::fs::metadata(&marker).unwrap().ino();
        let (again, held_again) = stage(spec.clone(), &cache).await;
        assert_eq!(again.side_inputs, staged.side_inputs);
        assert_eq!(std::fs::metadata(&marker).unwrap().ino(), staged_at);

        // Changed: a new entry; the old one is held, so it stays whatever the cap.
        std::fs::write(&labels, "cat\ndog\nbird\n").unwrap();
        let (changed, held_changed) = stage(spec.clone(), &cache).await;
        let new_local = changed.side_inputs["labels"].as_local().unwrap();
        assert_ne!(new_local, local);
        assert_eq!(
            std::fs::read_to_string(new_local).unwrap(),
            "cat\ndog\nbird\n"
        );
        let root = cache.join(SIDE_DIR);
        assert!(evict(&root, &HashSet::new(), 0).is_empty(), "all held");

        // Once no job holds the old entry, it goes when over the cap.
        drop((held, held_again));
        let removed = evict(&root, &HashSet::new(), 0);
        assert_eq!(removed, [local.parent().unwrap().to_path_buf()]);
        assert!(new_local.exists());
        drop(held_changed);
    }

    #[test]
    fn a_link_loop_in_a_side_input_folder_is_listed_once() {
        let dir = tempfile::tempdir().unwrap();
        let side = dir.path().join("labels");
        std::fs::create_dir_all(side.join("sub")).unwrap();
        std::fs::write(side.join("sub/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("..", side.join("sub/up")).unwrap();
        let listing = list_local(&side).unwrap();
        let names: Vec<&str> = listing.files.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["sub/a.txt"]);
    }

    #[test]
    fn eviction_keeps_the_recent_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |name: &str, bytes: usize, age: u64| {
            let entry = dir.path().join(name);
            std::fs::create_dir(&entry).unwrap();
            std::fs::write(entry.join("data"), vec![b'x'; bytes]).unwrap();
            let marker = File::create(entry.join(COMPLETE)).unwrap();
            marker
                .set_modified(SystemTime::now() - std::time::Duration::from_secs(age))
                .unwrap();
            entry
        };
        let old = mk("old", 100, 300);
        let newer = mk("newer", 100, 100);
        let current = mk("current", 100, 500);
        let removed = evict(dir.path(), &HashSet::from([current.clone()]), 150);
        assert_eq!(removed, [old]);
        assert!(newer.exists() && current.exists());
    }
}
