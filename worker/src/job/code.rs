//! A job's code: shipped by the submitter to the job's S3 output, content-addressed, and
//! staged into each worker's cache by the digest of what storage holds.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use fleetrun_common::storage::s3::{S3Settings, S3Storage};
use fleetrun_common::storage::{Storage, join_key};
use fleetrun_config::{JobSpec, Location};
use sha2::{Digest, Sha256};

use super::error::JobError;
use super::side::{Held, stage_location};

/// Where shipped code lives, under the job's output location.
pub const CODE_PREFIX: &str = "_fleetrun/code";

/// Ships a job's code to its output storage when the output is on S3 (workers elsewhere
/// cannot read the submitter's disk): the source directory (or the entry script alone)
/// goes under `_fleetrun/code/<sha256>/`, and the spec is rewritten to point there.
/// Content-addressed: the same code is stored once, whatever number of jobs run it.
pub async fn ship_code(mut spec: JobSpec, s3: &S3Settings) -> Result<JobSpec, JobError> {
    let Location::S3 { bucket, prefix } = &spec.output else {
        return Ok(spec);
    };
    let Some((root, files)) = local_code(&spec)? else {
        return Ok(spec);
    };
    let Location::Local(entry) = &spec.entry_script else {
        return Ok(spec);
    };
    let rel_entry = entry
        .strip_prefix(&root)
        .map_err(|_| JobError::EntryOutsideSource {
            entry: entry.clone(),
            root: root.clone(),
        })?
        .to_string_lossy()
        .replace('\\', "/");
    let (hash, contents) = hash_code(&root, &files)?;
    let code_prefix = join_key(&join_key(prefix, CODE_PREFIX), &hash);
    let storage = S3Storage::new(bucket, &code_prefix, s3).await?;
    for (rel, body) in files.iter().zip(contents) {
        storage.put(rel, Bytes::from(body)).await?;
    }
    spec.entry_script = Location::S3 {
        bucket: bucket.clone(),
        prefix: join_key(&code_prefix, &rel_entry),
    };
    spec.source_directory = Some(Location::S3 {
        bucket: bucket.clone(),
        prefix: code_prefix,
    });
    Ok(spec)
}

/// The digest of a job's code (its source directory, or its entry script alone) as it is
/// on this machine now; `None` when its code is not local.
pub fn code_digest(spec: &JobSpec) -> Result<Option<String>, JobError> {
    let Some((root, files)) = local_code(spec)? else {
        return Ok(None);
    };
    Ok(Some(hash_code(&root, &files)?.0))
}

/// A job's local code: the folder it is in and its files there; `None` when it is not local.
fn local_code(spec: &JobSpec) -> Result<Option<(PathBuf, Vec<String>)>, JobError> {
    let Location::Local(entry) = &spec.entry_script else {
        return Ok(None);
    };
    Ok(Some(match &spec.source_directory {
        Some(Location::Local(dir)) => (dir.clone(), list_code(dir).map_err(JobError::io(dir))?),
        Some(Location::S3 { .. }) => return Ok(None),
        None => {
            let dir = entry.parent().unwrap_or(Path::new("/")).to_path_buf();
            let name = entry
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (dir, vec![name])
        }
    }))
}

/// The SHA-256 of code files (each one's name, length and bytes), and their contents.
fn hash_code(root: &Path, files: &[String]) -> Result<(String, Vec<Vec<u8>>), JobError> {
    let mut hasher = Sha256::new();
    let mut contents = Vec::with_capacity(files.len());
    for rel in files {
        let body = std::fs::read(root.join(rel)).map_err(JobError::io(root.join(rel)))?;
        hasher.update(rel.as_bytes());
        hasher.update([0]);
        hasher.update((body.len() as u64).to_be_bytes());
        hasher.update(&body);
        contents.push(body);
    }
    Ok((format!("{:x}", hasher.finalize()), contents))
}

/// The files of a source directory, relative, in a stable order; caches and virtualenvs
/// are left behind.
fn list_code(dir: &Path) -> std::io::Result<Vec<String>> {
    const SKIP: [&str; 5] = ["__pycache__", ".git", ".venv", "venv", ".mypy_cache"];
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if SKIP.contains(&name.as_str()) {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Brings a job's code in storage to this machine and points the spec at it: its
/// `source_directory` (or its entry script alone) staged into the node's cache by the digest
/// of what is there (every object's key, size and ETag; `super::side`), and held there for
/// the job. Code changed at the same prefix is a new entry, so a node never runs a stale copy;
/// code shipped by `fleetrun submit` is staged the same way.
pub(super) async fn stage_code(
    mut spec: JobSpec,
    cache: &Path,
    s3: &S3Settings,
    held: &mut Held,
) -> Result<JobSpec, JobError> {
    let Location::S3 {
        prefix: entry_key, ..
    } = &spec.entry_script
    else {
        return Ok(spec);
    };
    match &spec.source_directory {
        Some(
            root @ Location::S3 {
                prefix: root_key, ..
            },
        ) => {
            let rel_entry = entry_key
                .strip_prefix(root_key.trim_end_matches('/'))
                .unwrap_or(entry_key)
                .trim_start_matches('/')
                .to_owned();
            let local_root = stage_location(root, cache, s3, held).await?;
            spec.entry_script = Location::Local(local_root.join(rel_entry));
            spec.source_directory = Some(Location::Local(local_root));
        }
        _ => {
            let script = stage_location(&spec.entry_script, cache, s3, held).await?;
            spec.entry_script = Location::Local(script);
        }
    }
    Ok(spec)
}
