//! Where a job's output parts wait for the finalizer.
//!
//! Each mini-batch's rows are one part, written under the mini-batch's index: a re-run
//! replaces the part instead of adding one, so every successful item lands once. On a fleet
//! parts are storage objects (`_parts/<job>/<index>`), visible to whichever worker
//! finalizes. On one machine they go to a single append-only spool file with an index in
//! memory, sparing the file system thousands of small files.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use fleetrun_common::storage::{Storage, StorageError};
use futures::{StreamExt, TryStreamExt};

use crate::agent::part_key;

/// Parts fetched ahead of the one being written (they are independent objects on S3).
const READ_AHEAD: usize = 16;

#[async_trait]
pub trait Parts: Send + Sync {
    /// Stores (or replaces) the part of mini-batch `index`.
    async fn put(&self, index: u64, body: Bytes) -> Result<(), String>;
    /// Forgets the part of mini-batch `index` (it failed after an attempt wrote one).
    async fn remove(&self, index: u64) -> Result<(), String>;
    /// Writes the parts of mini-batches `0..total` in order into `file_name` of `output`
    /// (a failed mini-batch has none) and removes them. Returns the output's size.
    async fn join_into(
        &self,
        output: &dyn Storage,
        file_name: &str,
        total: u64,
    ) -> Result<u64, String>;
}

/// Parts as objects of the job's output storage.
pub struct StorageParts {
    pub storage: Arc<dyn Storage>,
    pub job: String,
}

#[async_trait]
impl Parts for StorageParts {
    async fn put(&self, index: u64, body: Bytes) -> Result<(), String> {
        self.storage
            .put(&part_key(&self.job, index), body)
            .await
            .map_err(|e| e.to_string())
    }

    async fn remove(&self, index: u64) -> Result<(), String> {
        self.storage
            .delete_prefix(&part_key(&self.job, index))
            .await
            .map_err(|e| e.to_string())
    }

    async fn join_into(
        &self,
        output: &dyn Storage,
        file_name: &str,
        total: u64,
    ) -> Result<u64, String> {
        let storage = &*self.storage;
        let mut writer = output.writer(file_name).await.map_err(|e| e.to_string())?;
        let mut parts = futures::stream::iter(0..total)
            .map(|index| async move {
                match storage.get(&part_key(&self.job, index)).await {
                    Ok(body) => Ok(Some(body)),
                    Err(StorageError::NotFound(_)) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .buffered(READ_AHEAD);
        while let Some(part) = parts.try_next().await.map_err(|e| e.to_string())? {
            if let Some(body) = part {
                writer.write(body).await.map_err(|e| e.to_string())?;
            }
        }
        let size = writer.finish().await.map_err(|e| e.to_string())?;
        storage
            .delete_prefix(&format!("_parts/{}/", self.job))
            .await
            .map_err(|e| e.to_string())?;
        Ok(size)
    }
}

/// Parts in one local spool file; the index (offset and length per mini-batch, 12 bytes
/// each) lives in memory, as only this process writes and reads them.
pub struct SpoolParts {
    path: PathBuf,
    spool: Mutex<Spool>,
}

struct Spool {
    file: File,
    len: u64,
    /// By mini-batch index: where its latest part is.
    index: Vec<Option<(u64, u32)>>,
}

impl SpoolParts {
    pub fn create(path: PathBuf) -> std::io::Result<SpoolParts> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(SpoolParts {
            path,
            spool: Mutex::new(Spool {
                file,
                len: 0,
                index: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spool> {
        self.spool.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Parts for SpoolParts {
    async fn put(&self, index: u64, body: Bytes) -> Result<(), String> {
        let len = u32::try_from(body.len()).map_err(|_| "a part over 4 GiB".to_owned())?;
        let mut spool = self.lock();
        let offset = spool.len;
        spool
            .file
            .write_all_at(&body, offset)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        spool.len += u64::from(len);
        let slot = index as usize;
        if spool.index.len() <= slot {
            spool.index.resize(slot + 1, None);
        }
        spool.index[slot] = Some((offset, len));
        Ok(())
    }

    async fn remove(&self, index: u64) -> Result<(), String> {
        if let Some(slot) = self.lock().index.get_mut(index as usize) {
            *slot = None;
        }
        Ok(())
    }

    async fn join_into(
        &self,
        output: &dyn Storage,
        file_name: &str,
        total: u64,
    ) -> Result<u64, String> {
        let mut writer = output.writer(file_name).await.map_err(|e| e.to_string())?;
        for index in 0..total {
            let body = {
                let spool = self.lock();
                match spool.index.get(index as usize).copied().flatten() {
                    Some((offset, len)) => {
                        let mut buf = vec![0u8; len as usize];
                        spool
                            .file
                            .read_exact_at(&mut buf, offset)
                            .map_err(|e| e.to_string())?;
                        Some(buf)
                    }
                    None => None,
                }
            };
            if let Some(body) = body {
                writer
                    .write(Bytes::from(body))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        let size = writer.finish().await.map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(&self.path);
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use fleetrun_common::storage::LocalStorage;

    use super::*;

    async fn joined(parts: &dyn Parts, total: u64) -> String {
        let dir = tempfile::tempdir().unwrap();
        let out = LocalStorage::new(dir.path());
        parts.join_into(&out, "out.txt", total).await.unwrap();
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap()
    }

    /// Both kinds: index order, the latest write of a part wins, removed parts are gone.
    async fn behaves(parts: &dyn Parts) {
        parts.put(2, Bytes::from("c\n")).await.unwrap();
        parts.put(0, Bytes::from("first run\n")).await.unwrap();
        parts.put(0, Bytes::from("a\n")).await.unwrap();
        parts.put(1, Bytes::from("stale\n")).await.unwrap();
        parts.remove(1).await.unwrap();
        parts.put(3, Bytes::from("d1\nd2\n")).await.unwrap();
        assert_eq!(joined(parts, 4).await, "a\nc\nd1\nd2\n");
    }

    #[tokio::test]
    async fn spool_parts_keep_the_latest_of_each_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let parts = SpoolParts::create(dir.path().join("spool")).unwrap();
        behaves(&parts).await;
        assert!(
            !dir.path().join("spool").exists(),
            "the spool is removed once joined"
        );
    }

    #[tokio::test]
    async fn storage_parts_keep_the_latest_of_each_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(LocalStorage::new(dir.path()));
        let parts = StorageParts {
            storage,
            job: "j".into(),
        };
        behaves(&parts).await;
        assert!(!dir.path().join("_parts/j").exists());
    }

    #[tokio::test]
    async fn no_parts_make_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let parts = SpoolParts::create(dir.path().join("spool")).unwrap();
        assert_eq!(joined(&parts, 0).await, "");
    }
}
