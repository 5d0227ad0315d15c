//! `EntryScript().output_dir`: where a script writes files of its own (a `summary_only` job's
//! results) so that they reach the job's output folder.
//!
//! On a local output it is the output folder itself. On an `s3://` output it is a folder on
//! the node, `<cache>/jobs/<job>/output/`, whose new or changed files are uploaded under the
//! output prefix after every mini-batch (before the mini-batch is recorded, so a completed
//! job has them all) and once more when the job ends on the node. Names fleetrun keeps for
//! itself (`logs/`, `_parts/`, `_fleetrun/`, `.fleetrun/`, the `append_row` file) are not
//! uploaded; the script is warned in the worker's log.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use fleetrun_common::storage::StorageError;
use fleetrun_config::Location;
use tracing::warn;

use super::JobContext;

/// The folder `EntryScript().output_dir` names on this node.
pub fn local_output_dir(ctx: &JobContext) -> PathBuf {
    match &ctx.job.spec().output {
        Location::Local(dir) => dir.clone(),
        Location::S3 { .. } => ctx
            .logs
            .dir()
            .parent()
            .unwrap_or(ctx.logs.dir())
            .join("output"),
    }
}

/// Uploads the new or changed files of the node's output folder to an S3 output; returns how
/// many. Nothing to do on a local output.
pub async fn sync(ctx: &JobContext) -> Result<usize, StorageError> {
    if ctx.job.spec().output.as_local().is_some() {
        return Ok(0);
    }
    let dir = local_output_dir(ctx);
    let mut uploaded = ctx.node.output_sync.lock().await;
    let files = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || walk(&dir))
            .await
            .unwrap_or_default()
    };
    let mut count = 0;
    for (key, size, mtime) in files {
        if uploaded.get(&key) == Some(&(size, mtime)) {
            continue;
        }
        if reserved(&key, &ctx.job.spec().append_row_file_name) {
            warn!(job = %ctx.job.id(), key, "A file in output_dir has a name fleetrun keeps for itself; not uploaded.");
            uploaded.insert(key, (size, mtime));
            continue;
        }
        let body = tokio::fs::read(dir.join(&key))
            .await
            .map_err(|source| StorageError::Io {
                key: key.clone(),
                source,
            })?;
        ctx.job.output().put(&key, Bytes::from(body)).await?;
        uploaded.insert(key, (size, mtime));
        count += 1;
    }
    Ok(count)
}

/// [`sync`], a failure logged: the next mini-batch or the job's end tries again.
pub async fn sync_logged(ctx: &JobContext) {
    if let Err(e) = sync(ctx).await {
        warn!(job = %ctx.job.id(), error = %e, "Cannot upload output_dir's files to the output.");
    }
}

/// A file's modification time in nanoseconds.
pub(super) fn mtime(meta: &std::fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

fn reserved(key: &str, append_row_file_name: &str) -> bool {
    let first = key.split('/').next().unwrap_or(key);
    matches!(first, "logs" | "_parts" | "_fleetrun" | ".fleetrun") || key == append_row_file_name
}

/// Every file under `dir`: its `/`-separated relative key, size and mtime.
pub(super) fn walk(dir: &Path) -> Vec<(String, u64, i128)> {
    walk_where(dir, |_, _| true)
}

/// [`walk`] over the entries `keep` takes (given the folder each is in): a folder left out is
/// not entered.
pub(super) fn walk_where(
    dir: &Path,
    keep: impl Fn(&Path, &std::fs::DirEntry) -> bool,
) -> Vec<(String, u64, i128)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            if !keep(&folder, &entry) {
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let path = entry.path();
            if meta.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir)
                && let Some(key) = rel.to_str()
            {
                out.push((key.to_owned(), meta.len(), mtime(&meta)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleetruns_own_names_are_not_uploaded() {
        for key in [
            "logs/x.txt",
            "_parts/j/0",
            "_fleetrun/code/x",
            ".fleetrun/lock",
            "out.txt",
        ] {
            assert!(reserved(key, "out.txt"), "{key}");
        }
        for key in ["summary.csv", "sub/logs/x", "logs.txt"] {
            assert!(!reserved(key, "out.txt"), "{key}");
        }
    }
}
