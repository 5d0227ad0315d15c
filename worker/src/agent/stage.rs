//! Staging a mini-batch's inputs: local files as they are, others copied into a folder of
//! their own in the node's cache.

use std::path::{Path, PathBuf};

use fleetrun_common::storage::Storage;
use fleetrun_common::wire::MiniBatch;

use super::JobContext;
use super::slot::Slot;

pub(super) struct Staged {
    pub(super) paths: Vec<PathBuf>,
    folder: Option<PathBuf>,
}

impl Staged {
    pub(super) async fn clean(self) {
        if let Some(folder) = self.folder {
            let _ = tokio::fs::remove_dir_all(folder).await;
        }
    }
}

impl Slot {
    /// Local paths for the mini-batch's items: the files themselves when the input is a local
    /// folder, else copies in a staging folder of their own.
    pub(super) async fn stage(
        &mut self,
        ctx: &JobContext,
        batch: &MiniBatch,
    ) -> Result<Staged, String> {
        let mut staged = Staged {
            paths: Vec::with_capacity(batch.items.len()),
            folder: None,
        };
        for key in &batch.items {
            if let Some(path) = ctx.input.local_path(key) {
                staged.paths.push(path);
                continue;
            }
            let folder = match &staged.folder {
                Some(folder) => folder,
                None => {
                    self.stagings += 1;
                    let name = format!("{}-slot{}-{}", ctx.id, self.index, self.stagings);
                    staged.folder.insert(self.config().staging_dir.join(name))
                }
            };
            match stage_one(&*ctx.input, key, folder).await {
                Ok(path) => staged.paths.push(path),
                Err(e) => {
                    staged.clean().await;
                    return Err(e);
                }
            }
        }
        Ok(staged)
    }
}

/// Copies the object `key` into `folder`, at the same relative path.
async fn stage_one(input: &dyn Storage, key: &str, folder: &Path) -> Result<PathBuf, String> {
    fleetrun_common::storage::check_key(key).map_err(|e| e.to_string())?;
    let body = input.get(key).await.map_err(|e| e.to_string())?;
    let path = folder.join(key);
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| e.to_string())?;
    }
    tokio::fs::write(&path, &body)
        .await
        .map_err(|e| e.to_string())?;
    Ok(path)
}
