//! Named outputs (`[outputs]`, AML v2's `${{outputs.name}}`): each runner writes into local
//! folders of its own, `<cache>/work/<job>/<node>/_outputs/<process>/<name>/`, given to the
//! script in `arguments`; their files reach the named location after every mini-batch (before
//! it is recorded) and once more when the job ends on the node.
//!
//! # Rules
//!
//! - A file reaches a local destination whole: copied beside its name
//!   (`.<name>.fleetrun-<pid>.tmp`) and renamed into place. On S3 it is one `PutObject`.
//! - After a mini-batch, only files last modified before its `run()` returned are delivered
//!   (the runner may already be writing the next mini-batch's); the others go with the next
//!   delivery, and at the job's end.
//! - What an attempt that did not succeed (it raised, timed out, or its runner died) left
//!   undelivered is withheld ([`withhold`]): moved out of the runner's folder into the job's
//!   logs before the runner's next attempt or mini-batch, so it is never delivered and no
//!   later attempt finds it there (a retry's file is never replaced by a failed attempt's
//!   half-written one, and a retry that saves into a fresh folder finds it fresh). A file
//!   that cannot be moved stays, not delivered while it is unchanged.
//! - The last writer of a name wins. A file fleetrun delivered for this job from another
//!   runner or node is replaced with a warning in the node's `_main.txt`; one fleetrun
//!   delivered for an earlier job is replaced as a re-run replaces its output.
//! - A file fleetrun did not deliver is never replaced, deleted or touched: the script's file
//!   of that name stays behind, is kept in the job's logs when the job ends, and the node's
//!   `_main.txt` says so. fleetrun knows its files by a record on a local destination
//!   (`.fleetrun/outputs.json`: each file's writer and identity, so a file the user put in
//!   its place is not fleetrun's), and by the object's metadata on S3
//!   ([`WRITER_METADATA`](fleetrun_common::storage::s3::WRITER_METADATA)).
//! - Files a script leaves in its working folder are kept when the job ends on the node:
//!   moved to `logs/user/working_dir/<node>/<process>/`, counted in `_main.txt`.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use fleetrun_common::storage::StorageError;
use fleetrun_config::{JobSpec, named};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::JobContext;
use super::named_outputs::FileKey;
pub use super::named_outputs::{Destination, NamedOutputs};
use super::outdir::{mtime, walk, walk_where};
use crate::logs::JobLogs;

/// The folder, beside the runners' working folders, that holds their named-output folders.
pub const OUTPUTS_DIR: &str = "_outputs";
/// fleetrun's record of what it delivered to a local named output, inside it.
const RECORD: &str = ".fleetrun/outputs.json";
/// Where files left in working folders are kept, under the job's log folder.
pub const KEPT_WORKING_DIR: &str = "user/working_dir";
/// Where named-output files that could not be delivered are kept, under the job's log folder.
pub const KEPT_OUTPUTS: &str = "user/outputs";

/// Why a named output's files could not be delivered.
#[derive(Debug, thiserror::Error)]
pub enum NamedOutputError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> NamedOutputError + '_ {
    move |source| NamedOutputError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What one delivery did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// Files delivered.
    pub delivered: usize,
    /// Files whose name is taken by a file fleetrun did not write: not delivered.
    pub refused: usize,
}

/// The runner `process`'s folder of named outputs, under the node's working folders `work`.
pub fn runner_folder(work: &Path, process: &str) -> PathBuf {
    work.join(OUTPUTS_DIR).join(process)
}

/// The job's `arguments` for runner `process`: each `${{outputs.name}}` becomes the runner's
/// own folder for it, made here.
pub fn arguments(spec: &JobSpec, folder: &Path) -> io::Result<Vec<String>> {
    for name in spec.outputs.keys() {
        std::fs::create_dir_all(folder.join(name))?;
    }
    let path = |kind: &str, name: &str| {
        (kind == named::OUTPUTS && spec.outputs.contains_key(name))
            .then(|| folder.join(name).to_string_lossy().into_owned())
    };
    Ok(spec
        .arguments
        .iter()
        .map(|a| named::substitute(a, path))
        .collect())
}

/// The file system's clock now, as a file in `folder` last modified now shows it (the clock
/// file modification times are compared with), in nanoseconds.
pub fn clock(folder: &Path) -> Option<i128> {
    let probe = folder.join(".clock");
    std::fs::write(&probe, b"").ok()?;
    std::fs::metadata(&probe).ok().map(|m| mtime(&m))
}

/// Delivers the named-output files of runner `process` last modified before `before` (all of
/// them when `None`), and logs what it did.
pub async fn deliver(
    ctx: &JobContext,
    node: &str,
    process: &str,
    before: Option<i128>,
) -> Result<Delivery, NamedOutputError> {
    let outputs = &ctx.node.named;
    let (Some(work), false) = (&outputs.work, outputs.destinations.is_empty()) else {
        return Ok(Delivery::default());
    };
    let folder = runner_folder(work, process);
    let writer = format!("{}/{node}/{process}", ctx.job.id());
    let mut delivered = outputs.delivered.lock().await;
    let mut done = Delivery::default();
    for (name, destination) in &outputs.destinations {
        let source = folder.join(name);
        let files = {
            let source = source.clone();
            tokio::task::spawn_blocking(move || walk(&source))
                .await
                .unwrap_or_default()
        };
        // A local destination's record; an S3 one keeps it in each object's metadata.
        let mut record = match destination {
            Destination::Local(dir) => Record::load(dir),
            Destination::S3(_) => Record::default(),
        };
        let delivered_before = done.delivered;
        for (rel, size, modified) in files {
            if before.is_some_and(|cutoff| modified >= cutoff) {
                continue;
            }
            let key = (process.to_owned(), name.clone(), rel.clone());
            let stamp = Some(&(size, modified));
            if delivered.sent.get(&key) == stamp || delivered.withheld.get(&key) == stamp {
                continue;
            }
            let owner = match destination {
                Destination::Local(dir) => record.owner(dir, &rel),
                Destination::S3(storage) => match storage.written_by(&rel).await? {
                    None => Owner::Nobody,
                    Some(None) => Owner::NotFleetrun,
                    Some(Some(writer)) => Owner::Fleetrun(writer),
                },
            };
            match owner {
                Owner::NotFleetrun => {
                    delivered.sent.insert(key.clone(), (size, modified));
                    if delivered.refused.insert(key) {
                        let line = format!(
                            "outputs.{name}: {rel} from {process} not delivered: the file of \
                             that name there was not written by fleetrun, which never replaces \
                             one; the script's file is kept in logs/{KEPT_OUTPUTS}/{name}/{node}/{process}/ \
                             when the job ends."
                        );
                        warn!(job = %ctx.job.id(), output = %name, file = %rel, "A named output's file is not delivered: its name is taken by a file fleetrun did not write.");
                        ctx.logs.log(JobLogs::node_main(node), &line);
                    }
                    done.refused += 1;
                    continue;
                }
                Owner::Fleetrun(other)
                    if other != writer && other.starts_with(&format!("{}/", ctx.job.id())) =>
                {
                    let line = format!(
                        "outputs.{name}: {rel} from {process} replaces the one {other} delivered \
                         (the last writer of a name wins)."
                    );
                    warn!(job = %ctx.job.id(), output = %name, file = %rel, previous = %other, "Two runners wrote one named-output file; the last writer wins.");
                    ctx.logs.log(JobLogs::node_main(node), &line);
                }
                Owner::Fleetrun(_) | Owner::Nobody => {}
            }
            put(destination, &mut record, &source.join(&rel), &rel, &writer).await?;
            delivered.refused.remove(&key);
            delivered.withheld.remove(&key);
            delivered.sent.insert(key, (size, modified));
            done.delivered += 1;
        }
        if let Destination::Local(dir) = destination
            && done.delivered > delivered_before
        {
            record.save(dir)?;
        }
    }
    Ok(done)
}

/// Puts the runner's file `from` at `rel` in `destination`, written by `writer` (a local
/// destination's `record` notes it).
async fn put(
    destination: &Destination,
    record: &mut Record,
    from: &Path,
    rel: &str,
    writer: &str,
) -> Result<(), NamedOutputError> {
    match destination {
        Destination::Local(dir) => {
            let (from, to) = (from.to_path_buf(), dir.join(rel));
            let identity = tokio::task::spawn_blocking(move || copy_then_rename(&from, &to))
                .await
                .map_err(|e| io_at(dir)(io::Error::other(e)))??;
            record.files.insert(
                rel.to_owned(),
                Written {
                    writer: writer.to_owned(),
                    identity,
                },
            );
        }
        Destination::S3(storage) => {
            let body = tokio::fs::read(from).await.map_err(io_at(from))?;
            storage
                .put_written_by(rel, Bytes::from(body), writer)
                .await?;
        }
    }
    Ok(())
}

/// After an attempt of runner `process` that did not succeed (`mini_batch`'s attempt
/// `attempt`): the named-output files it left undelivered, last modified before `before` (all
/// when `None`: the runner is gone or idle), are withheld: moved out of the runner's folder
/// to `logs/user/outputs/<name>/<node>/<process>/` (folders they leave empty go too), so no
/// later attempt there sees them; one that cannot be moved stays, not delivered while it is
/// unchanged. The node's `_main.txt` says how many. Returns how many.
pub async fn withhold(
    ctx: &JobContext,
    node: &str,
    process: &str,
    failed: (u64, u32),
    before: Option<i128>,
) -> usize {
    let outputs = &ctx.node.named;
    let (Some(work), false) = (&outputs.work, outputs.destinations.is_empty()) else {
        return 0;
    };
    let folder = runner_folder(work, process);
    let names: Vec<String> = outputs.destinations.keys().cloned().collect();
    let found = tokio::task::spawn_blocking(move || {
        names
            .into_iter()
            .flat_map(|name| {
                walk(&folder.join(&name))
                    .into_iter()
                    .map(move |(rel, size, modified)| (name.clone(), rel, size, modified))
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    let mut delivered = outputs.delivered.lock().await;
    let left: Vec<(FileKey, (u64, i128))> = found
        .into_iter()
        .filter(|(_, _, _, modified)| before.is_none_or(|cutoff| *modified < cutoff))
        .map(|(name, rel, size, modified)| ((process.to_owned(), name, rel), (size, modified)))
        .filter(|(key, stamp)| {
            // Delivered as it is, or withheld already (it could not be moved): not this
            // attempt's.
            delivered.sent.get(key) != Some(stamp) && delivered.withheld.get(key) != Some(stamp)
        })
        .collect();
    let withheld = left.len();
    let keys: Vec<FileKey> = left.iter().map(|(key, _)| key.clone()).collect();
    let (work, logs, node_owned) = (work.clone(), ctx.logs.dir().to_path_buf(), node.to_owned());
    let moved = tokio::task::spawn_blocking(move || {
        keys.iter()
            .map(|key| keep_output(&work, key, &logs, &node_owned).is_ok())
            .collect::<Vec<bool>>()
    })
    .await
    .unwrap_or_else(|_| vec![false; withheld]);
    let mut stayed = 0;
    for ((key, stamp), moved) in left.into_iter().zip(moved) {
        if moved {
            delivered.withheld.remove(&key);
            delivered.kept += 1;
        } else {
            delivered.withheld.insert(key, stamp);
            stayed += 1;
        }
    }
    if withheld > 0 {
        let (index, attempt) = failed;
        let stayed = if stayed > 0 {
            format!(
                "; {stayed} could not be moved and stay in its folder, not delivered while \
                 unchanged"
            )
        } else {
            String::new()
        };
        let line = format!(
            "{withheld} named-output files of {process} are not delivered: mini-batch {index}'s \
             attempt {attempt}, which did not succeed, left them; they are moved to \
             logs/{KEPT_OUTPUTS}/<name>/{node}/{process}/, out of the runner's folder{stayed}."
        );
        warn!(job = %ctx.job.id(), process, mini_batch = index, attempt, files = withheld, "A failed attempt's named-output files are withheld.");
        ctx.logs.log(JobLogs::node_main(node), &line);
    }
    withheld
}

/// [`deliver`], a failure logged in the node's `_main.txt`: the next delivery tries again.
pub async fn deliver_logged(ctx: &JobContext, node: &str, process: &str, before: Option<i128>) {
    if let Err(e) = deliver(ctx, node, process, before).await {
        warn!(job = %ctx.job.id(), process, error = %e, "Cannot deliver the named outputs' files.");
        ctx.logs.log(
            JobLogs::node_main(node),
            &format!("The named outputs' files of {process} could not be delivered: {e}"),
        );
    }
}

/// When the job ends on the node: delivers every runner's named-output files a last time (not
/// those withheld), then keeps what is left in the working folders (and the files that were not
/// delivered) in the job's logs, and says how many in the node's `_main.txt`.
pub async fn finish(ctx: &JobContext, node: &str) {
    let Some(work) = ctx.node.named.work.clone() else {
        return;
    };
    if ctx
        .node
        .named
        .finished
        .swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        return;
    }
    let processes = runner_names(&work);
    for process in &processes {
        deliver_logged(ctx, node, process, None).await;
    }
    let (undelivered, kept_before): (Vec<FileKey>, usize) = {
        let delivered = ctx.node.named.delivered.lock().await;
        let mut left = Vec::new();
        for process in &processes {
            for name in ctx.node.named.destinations.keys() {
                let source = runner_folder(&work, process).join(name);
                for (rel, size, modified) in walk(&source) {
                    let key = (process.clone(), name.clone(), rel.clone());
                    let sent = delivered.sent.get(&key) == Some(&(size, modified));
                    if !sent || delivered.refused.contains(&key) {
                        left.push(key);
                    }
                }
            }
        }
        (left, delivered.kept)
    };
    let logs = ctx.logs.dir().to_path_buf();
    let node_owned = node.to_owned();
    let kept = tokio::task::spawn_blocking(move || {
        keep_leftovers(&work, &processes, &undelivered, &logs, &node_owned)
    })
    .await
    .unwrap_or_default();
    if kept.working > 0 {
        let line = format!(
            "{} files the script left in its working folders were kept in logs/{KEPT_WORKING_DIR}/{node}/ \
             (the working folders go when the job ends).",
            kept.working
        );
        warn!(job = %ctx.job.id(), files = kept.working, "Files left in the runners' working folders were kept in the job's logs.");
        ctx.logs.log(JobLogs::node_main(node), &line);
    }
    // The failed attempts' files, moved there as they were withheld, count among them.
    let kept_outputs = kept.outputs + kept_before;
    if kept_outputs > 0 {
        let line = format!(
            "{kept_outputs} named-output files that were not delivered were kept in logs/{KEPT_OUTPUTS}/."
        );
        ctx.logs.log(JobLogs::node_main(node), &line);
    }
}

/// What [`keep_leftovers`] moved.
#[derive(Debug, Default)]
struct Kept {
    working: usize,
    outputs: usize,
}

/// Moves the files left in the runners' working folders, and the named-output files in
/// `undelivered`, into the job's log folder.
fn keep_leftovers(
    work: &Path,
    processes: &[String],
    undelivered: &[FileKey],
    logs: &Path,
    node: &str,
) -> Kept {
    let mut kept = Kept::default();
    for process in processes {
        let folder = work.join(process);
        for rel in left_in(&folder) {
            let to = logs
                .join(KEPT_WORKING_DIR)
                .join(node)
                .join(process)
                .join(&rel);
            if move_file(&folder.join(&rel), &to).is_ok() {
                kept.working += 1;
            }
        }
    }
    for key in undelivered {
        if keep_output(work, key, logs, node).is_ok() {
            kept.outputs += 1;
        }
    }
    kept
}

/// Moves runner `process`'s file `rel` of output `name` to
/// `logs/user/outputs/<name>/<node>/<process>/<rel>`, and removes the folders of the
/// runner's output folder it leaves empty.
fn keep_output(
    work: &Path,
    (process, name, rel): &FileKey,
    logs: &Path,
    node: &str,
) -> io::Result<()> {
    let root = runner_folder(work, process).join(name);
    let from = root.join(rel);
    let to = logs
        .join(KEPT_OUTPUTS)
        .join(name)
        .join(node)
        .join(process)
        .join(rel);
    move_file(&from, &to)?;
    let mut folder = from.parent();
    while let Some(dir) = folder.filter(|dir| *dir != root && dir.starts_with(&root)) {
        if std::fs::remove_dir(dir).is_err() {
            break;
        }
        folder = dir.parent();
    }
    Ok(())
}

/// The runners' names: the folders under `work` other than [`OUTPUTS_DIR`].
fn runner_names(work: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(work)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name != OUTPUTS_DIR)
        .collect();
    names.sort();
    names
}

/// The files the script made in its working folder: everything but the links to the source
/// directory at its top and Python's `__pycache__` folders.
fn left_in(folder: &Path) -> Vec<String> {
    let keep = |dir: &Path, entry: &std::fs::DirEntry| {
        let link = dir == folder && entry.file_type().is_ok_and(|t| t.is_symlink());
        !link && entry.file_name() != "__pycache__"
    };
    let mut found: Vec<String> = walk_where(folder, keep)
        .into_iter()
        .map(|(rel, _, _)| rel)
        .collect();
    found.sort();
    found
}

/// Moves a file, copying across file systems.
fn move_file(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(_) => {
            copy_then_rename(from, to).map_err(io::Error::other)?;
            std::fs::remove_file(from)
        }
    }
}

/// Who wrote the file at a name in a destination.
#[derive(Debug, PartialEq, Eq)]
enum Owner {
    Nobody,
    NotFleetrun,
    /// fleetrun, for this writer (`<job>/<node>/<process>`).
    Fleetrun(String),
}

/// fleetrun's record of the files it delivered to a local named output.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    files: BTreeMap<String, Written>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Written {
    writer: String,
    identity: Identity,
}

/// Which file is at a name: a file put there by anyone else has another identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    modified: i128,
}

impl Identity {
    fn of(meta: &std::fs::Metadata) -> Identity {
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            modified: mtime(meta),
        }
    }
}

impl Record {
    /// The record in `dir`; an unreadable one is empty (nothing there is taken as fleetrun's).
    fn load(dir: &Path) -> Record {
        std::fs::read(dir.join(RECORD))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn save(&self, dir: &Path) -> Result<(), NamedOutputError> {
        let path = dir.join(RECORD);
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_at(parent))?;
        }
        let body = serde_json::to_vec_pretty(self).expect("a record serializes");
        std::fs::write(&tmp, body).map_err(io_at(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_at(&path))
    }

    fn owner(&self, dir: &Path, rel: &str) -> Owner {
        let Ok(meta) = std::fs::symlink_metadata(dir.join(rel)) else {
            return Owner::Nobody;
        };
        match self.files.get(rel) {
            Some(written) if meta.is_file() && written.identity == Identity::of(&meta) => {
                Owner::Fleetrun(written.writer.clone())
            }
            _ => Owner::NotFleetrun,
        }
    }
}

/// Copies `from` beside `to` and renames it into place: `to` is never seen half written.
fn copy_then_rename(from: &Path, to: &Path) -> Result<Identity, NamedOutputError> {
    let parent = to.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io_at(parent))?;
    let name = to.file_name().unwrap_or_default().to_string_lossy();
    let tmp = parent.join(format!(".{name}.fleetrun-{}.tmp", std::process::id()));
    std::fs::copy(from, &tmp).map_err(io_at(from))?;
    std::fs::rename(&tmp, to).map_err(io_at(to))?;
    let meta = std::fs::metadata(to).map_err(io_at(to))?;
    Ok(Identity::of(&meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_fleetruns_only_while_it_is_the_one_fleetrun_put_there() {
        let dir = tempfile::tempdir().unwrap();
        let (source, dest) = (dir.path().join("src"), dir.path().join("dest"));
        std::fs::create_dir_all(&source).unwrap();
        std::fs::write(source.join("m.bin"), "model").unwrap();
        let identity = copy_then_rename(&source.join("m.bin"), &dest.join("sub/m.bin")).unwrap();
        let mut record = Record::default();
        let writer = "job/node/process000".to_owned();
        record.files.insert(
            "sub/m.bin".into(),
            Written {
                writer: writer.clone(),
                identity,
            },
        );
        record.save(&dest).unwrap();
        let record = Record::load(&dest);
        assert_eq!(record.owner(&dest, "sub/m.bin"), Owner::Fleetrun(writer));
        assert_eq!(record.owner(&dest, "other.bin"), Owner::Nobody);
        // The user's file in its place is not fleetrun's, whatever its name.
        std::fs::remove_file(dest.join("sub/m.bin")).unwrap();
        std::fs::write(dest.join("sub/m.bin"), "the user's model").unwrap();
        assert_eq!(record.owner(&dest, "sub/m.bin"), Owner::NotFleetrun);
        // No copy is left beside it.
        let names: Vec<_> = std::fs::read_dir(dest.join("sub")).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_kept_output_file_leaves_no_folder_it_emptied_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (work, logs) = (dir.path().join("work"), dir.path().join("logs"));
        let root = runner_folder(&work, "process000").join("o");
        std::fs::create_dir_all(root.join("model/deep")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        std::fs::write(root.join("model/deep/m.bin"), "half").unwrap();
        let key = ("process000".into(), "o".into(), "model/deep/m.bin".into());
        keep_output(&work, &key, &logs, "0").unwrap();
        let kept = logs.join("user/outputs/o/0/process000/model/deep/m.bin");
        assert_eq!(std::fs::read_to_string(kept).unwrap(), "half");
        assert!(!root.join("model").exists(), "the folders it emptied go");
        assert!(
            root.join("other").exists(),
            "a folder it did not empty stays"
        );
        assert!(root.exists(), "the output's folder stays");
    }

    #[test]
    fn what_a_script_left_in_its_working_folder_is_found_without_the_source_links() {
        let dir = tempfile::tempdir().unwrap();
        let (code, work) = (dir.path().join("code"), dir.path().join("work"));
        std::fs::create_dir_all(code.join("pkg")).unwrap();
        std::fs::create_dir_all(work.join("__pycache__")).unwrap();
        std::fs::create_dir_all(work.join("made/deep")).unwrap();
        std::os::unix::fs::symlink(code.join("pkg"), work.join("pkg")).unwrap();
        std::fs::write(work.join("__pycache__/x.pyc"), "").unwrap();
        std::fs::write(work.join("scratch.txt"), "").unwrap();
        std::fs::write(work.join("made/deep/a.txt"), "").unwrap();
        assert_eq!(left_in(&work), ["made/deep/a.txt", "scratch.txt"]);
    }
}
