//! Staging a mini-batch's inputs: local files as they are, others copied into a folder of
//! their own in the node's cache.

use std::path::{Path, PathBuf};

use fleetrun_common::protocol::{RunContext, StagedTable};
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_common::wire::MiniBatch;

use super::JobContext;
use super::stage_error::StageError;
use crate::process::Batch;
use crate::scratch::FolderError;

pub(super) struct Staged {
    pub(super) paths: Vec<PathBuf>,
    /// A tabular input's chunks, staged (`paths` is then empty).
    pub(super) tables: Vec<StagedTable>,
    folder: Option<PathBuf>,
}

impl Staged {
    /// Sends the mini-batch to `runner`, with its context: its paths, or its staged chunks.
    pub(super) async fn send(
        &mut self,
        runner: &mut dyn crate::process::Runner,
        ctx: &JobContext,
        batch: &MiniBatch,
    ) -> std::io::Result<()> {
        runner
            .submit(Batch {
                index: batch.index,
                items: std::mem::take(&mut self.paths),
                tables: std::mem::take(&mut self.tables),
                context: run_context(ctx, batch),
            })
            .await
    }

    pub(super) async fn clean(self) {
        if let Some(folder) = self.folder {
            let _ = tokio::fs::remove_dir_all(folder).await;
        }
    }
}

/// A slot's staging: each mini-batch's inputs get a folder of their own in the node's
/// staging folder, named after the job, the slot and a count.
pub(super) struct Stager {
    staging: PathBuf,
    slot: usize,
    /// Stagings so far.
    stagings: u64,
}

impl Stager {
    pub(super) fn new(staging: PathBuf, slot: usize) -> Stager {
        Stager {
            staging,
            slot,
            stagings: 0,
        }
    }

    /// Local paths for the mini-batch's items: the files themselves when the input is a local
    /// folder, else copies in a staging folder of their own.
    /// Staging that takes longer than the job's `task_overhead_timeout` is given up, its
    /// copies removed.
    pub(super) async fn stage(
        &mut self,
        ctx: &JobContext,
        batch: &MiniBatch,
    ) -> Result<Staged, StageError> {
        let limit = ctx.job.spec().task_overhead_timeout;
        let staging = self.staging.clone();
        let name = format!("{}-slot{}-{}", ctx.job.id(), self.slot, self.stagings + 1);
        let within = std::time::Duration::from_secs(limit);
        match tokio::time::timeout(within, self.stage_now(ctx, batch, &name)).await {
            Ok(staged) => staged,
            Err(_) => {
                for folder in [staging.join(&name), super::tabular::folder(&staging, &name)] {
                    let _ = tokio::fs::remove_dir_all(folder).await;
                }
                Err(StageError::Overran(limit))
            }
        }
    }

    async fn stage_now(
        &mut self,
        ctx: &JobContext,
        batch: &MiniBatch,
        name: &str,
    ) -> Result<Staged, StageError> {
        let staging = &self.staging;
        if !batch.chunks.is_empty() {
            let folder = super::tabular::folder(staging, name);
            self.stagings += 1;
            let tables =
                match super::tabular::stage_chunks(&*ctx.input, &batch.chunks, &folder, staging)
                    .await
                {
                    Ok(tables) => tables,
                    Err(e) => {
                        let _ = tokio::fs::remove_dir_all(&folder).await;
                        return Err(e);
                    }
                };
            return Ok(Staged {
                paths: Vec::new(),
                tables,
                folder: Some(folder),
            });
        }
        let staged = stage(&*ctx.input, &batch.items, staging, name).await?;
        if staged.folder.is_some() {
            self.stagings += 1;
        }
        Ok(staged)
    }
}

/// Stages `items`: copies of those that are not local files go into `staging/<name>/`.
async fn stage(
    input: &dyn Storage,
    items: &[String],
    staging: &Path,
    name: &str,
) -> Result<Staged, StageError> {
    let mut staged = Staged {
        paths: Vec::with_capacity(items.len()),
        tables: Vec::new(),
        folder: None,
    };
    for key in items {
        if let Some(path) = input.local_path(key) {
            staged.paths.push(path);
            continue;
        }
        let folder = match &staged.folder {
            Some(folder) => folder,
            None => {
                let folder = staging.join(name);
                if let Err(e) = tokio::fs::create_dir_all(&folder).await {
                    return Err(FolderError::new(staging, e).into());
                }
                staged.folder.insert(folder)
            }
        };
        match stage_one(input, key, folder, staging).await {
            Ok(path) => staged.paths.push(path),
            Err(e) => {
                staged.clean().await;
                return Err(e);
            }
        }
    }
    Ok(staged)
}

/// Copies the object `key` into `folder`, at the same relative path.
async fn stage_one(
    input: &dyn Storage,
    key: &str,
    folder: &Path,
    staging: &Path,
) -> Result<PathBuf, StageError> {
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;

    fleetrun_common::storage::check_key(key)?;
    // Streamed to the file a piece at a time: a worker's memory does not grow with an
    // item's size.
    let mut pieces = input.get_pieces(key).await?;
    let path = folder.join(key);
    let mut file = {
        let opened = async {
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent).await?;
            }
            tokio::fs::File::create(&path).await
        };
        match opened.await {
            Ok(file) => file,
            Err(e) => return Err(write_failed(staging, key, e)),
        }
    };
    while let Some(piece) = pieces.next().await {
        if let Err(e) = file.write_all(&piece?).await {
            return Err(write_failed(staging, key, e));
        }
    }
    match file.flush().await {
        Ok(()) => Ok(path),
        Err(e) => Err(write_failed(staging, key, e)),
    }
}

/// A write into the staging folder that failed: the folder out of room, or no file there.
fn write_failed(staging: &Path, key: &str, e: std::io::Error) -> StageError {
    match FolderError::of_write(staging, e) {
        Ok(full) => full.into(),
        // Not a file there: `a` and `a/b` are both objects, say.
        Err(source) => StorageError::Io {
            key: key.to_owned(),
            source,
        }
        .into(),
    }
}

/// What `run(mini_batch, mini_batch_context)` receives with `batch`.
fn run_context(ctx: &JobContext, batch: &MiniBatch) -> RunContext {
    RunContext {
        partition_key_value: batch.partition.clone(),
        dataset: ctx.job.spec().input.location().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bytes::Bytes;
    use fleetrun_common::storage::{Fault, ObjectMeta, ObjectWriter};
    use futures::stream::BoxStream;

    use super::*;

    /// A remote store of objects: every item is copied. An object whose body is
    /// [`UNAVAILABLE`] cannot be read for the store's fault (it throttles).
    struct Objects(HashMap<String, Bytes>);

    const UNAVAILABLE: &str = "<unavailable>";

    impl Objects {
        fn new(objects: &[(&str, &str)]) -> Objects {
            Objects(
                objects
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Bytes::from(v.to_string())))
                    .collect(),
            )
        }
    }

    #[async_trait::async_trait]
    impl Storage for Objects {
        fn list<'a>(&'a self, _: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
            unimplemented!()
        }
        async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
            match self.0.get(key) {
                Some(body) if body == UNAVAILABLE => Err(StorageError::Unavailable {
                    what: key.to_owned(),
                    fault: Fault::Throttled,
                    detail: "SlowDown".to_owned(),
                    source: "SlowDown".into(),
                }),
                Some(body) => Ok(body.clone()),
                None => Err(StorageError::NotFound(key.to_owned())),
            }
        }
        async fn get_range(&self, _: &str, _: u64, _: u64) -> Result<Bytes, StorageError> {
            unimplemented!()
        }
        async fn put(&self, _: &str, _: Bytes) -> Result<(), StorageError> {
            unimplemented!()
        }
        async fn writer(&self, _: &str) -> Result<Box<dyn ObjectWriter>, StorageError> {
            unimplemented!()
        }
        async fn delete_prefix(&self, _: &str) -> Result<(), StorageError> {
            unimplemented!()
        }
        fn local_path(&self, _: &str) -> Option<PathBuf> {
            None
        }
    }

    fn items(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| (*k).to_owned()).collect()
    }

    #[tokio::test]
    async fn copies_land_in_a_folder_of_their_own_and_go_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let input = Objects::new(&[("a/x.txt", "x")]);
        let staging = dir.path().join("staging");
        let staged = stage(&input, &items(&["a/x.txt"]), &staging, "b1")
            .await
            .unwrap();
        assert_eq!(staged.paths, [staging.join("b1/a/x.txt")]);
        assert_eq!(std::fs::read(&staged.paths[0]).unwrap(), b"x");
        staged.clean().await;
        assert!(!staging.join("b1").exists());
    }

    #[tokio::test]
    async fn a_missing_input_is_the_items_failure() {
        let dir = tempfile::tempdir().unwrap();
        let input = Objects::new(&[("here.txt", "x")]);
        let staging = dir.path().join("staging");
        let e = stage(&input, &items(&["here.txt", "gone.txt"]), &staging, "b1")
            .await
            .err()
            .unwrap();
        assert!(
            matches!(e, StageError::Input(StorageError::NotFound(_))),
            "{e:?}"
        );
        assert!(!staging.join("b1").exists(), "what was staged is removed");
    }

    #[tokio::test]
    async fn a_storage_that_does_not_answer_is_no_items_failure() {
        let dir = tempfile::tempdir().unwrap();
        let input = Objects::new(&[("here.txt", "x"), ("busy.txt", UNAVAILABLE)]);
        let staging = dir.path().join("staging");
        let e = stage(&input, &items(&["here.txt", "busy.txt"]), &staging, "b1")
            .await
            .err()
            .unwrap();
        assert!(
            matches!(&e, StageError::Unavailable(e) if e.is_transient()),
            "{e:?}"
        );
        assert!(!staging.join("b1").exists(), "what was staged is removed");
    }

    #[tokio::test]
    async fn an_object_that_cannot_be_a_file_there_is_the_items_failure() {
        let dir = tempfile::tempdir().unwrap();
        // On S3 `a` and `a/b` may both exist; a file system cannot hold both.
        let input = Objects::new(&[("a", "file a"), ("a/b", "file a/b")]);
        let e = stage(&input, &items(&["a", "a/b"]), &dir.path().join("s"), "b1")
            .await
            .err()
            .unwrap();
        assert!(
            matches!(&e, StageError::Input(StorageError::Io { key, .. }) if key == "a/b"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn an_unusable_staging_folder_is_the_nodes_error_and_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let input = Objects::new(&[("x.txt", "x")]);
        std::fs::write(dir.path().join("file"), "").unwrap();
        let staging = dir.path().join("file/staging");
        match stage(&input, &items(&["x.txt"]), &staging, "b1").await {
            Err(StageError::Scratch(e)) => {
                assert_eq!(e.folder, staging);
                assert_eq!(e.source.raw_os_error(), Some(libc::ENOTDIR));
            }
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("staged under a file"),
        }
    }
}
