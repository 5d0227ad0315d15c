//! A storage whose listings hold only the keys a rule selects: an input folder of which only
//! some files are the input (an MLTable's `paths`). Reads and writes are those of the storage
//! it wraps.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::{ObjectMeta, ObjectWriter, Storage, StorageError};

/// Which keys a [`SelectedStorage`] lists.
pub type Selection = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// `inner`, listing only the keys `selects` keeps.
pub struct SelectedStorage {
    inner: Arc<dyn Storage>,
    selects: Selection,
}

impl SelectedStorage {
    pub fn new(inner: Arc<dyn Storage>, selects: Selection) -> Self {
        SelectedStorage { inner, selects }
    }
}

#[async_trait]
impl Storage for SelectedStorage {
    fn list<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectMeta, StorageError>> {
        self.inner
            .list(prefix)
            .try_filter(move |object| futures::future::ready((self.selects)(&object.key)))
            .boxed()
    }

    fn list_keys<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<String, StorageError>> {
        self.inner
            .list_keys(prefix)
            .try_filter(move |key| futures::future::ready((self.selects)(key)))
            .boxed()
    }

    fn list_keys_any_order<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxStream<'a, Result<String, StorageError>> {
        self.inner
            .list_keys_any_order(prefix)
            .try_filter(move |key| futures::future::ready((self.selects)(key)))
            .boxed()
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, StorageError> {
        self.inner.get_range(key, start, end).await
    }

    async fn put(&self, key: &str, body: Bytes) -> Result<(), StorageError> {
        self.inner.put(key, body).await
    }

    async fn writer(&self, key: &str) -> Result<Box<dyn ObjectWriter>, StorageError> {
        self.inner.writer(key).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<(), StorageError> {
        self.inner.delete_prefix(prefix).await
    }

    fn local_path(&self, key: &str) -> Option<PathBuf> {
        self.inner.local_path(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::LocalStorage;

    #[tokio::test]
    async fn listings_hold_only_the_selected_keys() {
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStorage::new(dir.path());
        for key in ["MLTable", "a.csv", "d/b.csv", "d/c.txt"] {
            local.put(key, Bytes::from_static(b"x")).await.unwrap();
        }
        let selected =
            SelectedStorage::new(Arc::new(local), Arc::new(|key: &str| key.ends_with(".csv")));
        let keys: Vec<String> = selected.list_keys("").try_collect().await.unwrap();
        assert_eq!(keys, ["a.csv", "d/b.csv"]);
        let listed: Vec<ObjectMeta> = selected.list("d/").try_collect().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            &selected.get("MLTable").await.unwrap()[..],
            b"x",
            "reads are whole"
        );
    }
}
