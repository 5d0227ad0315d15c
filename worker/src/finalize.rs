//! The finalizer: joins the parts into the one `append_row` file, in mini-batch order, so
//! the same input gives the same file byte for byte.

use crate::agent::part_key;
use fleetrun_common::storage::{Storage, StorageError};
use futures::{StreamExt, TryStreamExt};

/// Parts fetched ahead of the one being written (they are independent objects on S3).
const READ_AHEAD: usize = 16;

/// Writes `file_name` from the parts of mini-batches `0..total` (a failed mini-batch has
/// none) and removes the parts. Returns the output's size in bytes.
pub async fn join_parts(
    output: &dyn Storage,
    job: &str,
    file_name: &str,
    total: u64,
) -> Result<u64, StorageError> {
    let mut writer = output.writer(file_name).await?;
    let mut parts = futures::stream::iter(0..total)
        .map(|index| async move {
            match output.get(&part_key(job, index)).await {
                Ok(body) => Ok(Some(body)),
                Err(StorageError::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .buffered(READ_AHEAD);
    while let Some(part) = parts.try_next().await? {
        if let Some(body) = part {
            writer.write(body).await?;
        }
    }
    let size = writer.finish().await?;
    output.delete_prefix(&format!("_parts/{job}/")).await?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use fleetrun_common::storage::LocalStorage;

    use super::*;

    #[tokio::test]
    async fn joins_in_index_order_skipping_missing_parts() {
        let dir = tempfile::tempdir().unwrap();
        let out = LocalStorage::new(dir.path());
        for (i, body) in [(2u64, "c\n"), (0, "a\n"), (3, "d1\nd2\n")] {
            out.put(&part_key("j", i), Bytes::from(body)).await.unwrap();
        }
        let size = join_parts(&out, "j", "result.txt", 4).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("result.txt")).unwrap(),
            "a\nc\nd1\nd2\n"
        );
        assert_eq!(size, 10);
        assert!(!dir.path().join("_parts/j").exists());
    }

    #[tokio::test]
    async fn no_parts_make_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = LocalStorage::new(dir.path());
        join_parts(&out, "j", "result.txt", 0).await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("result.txt")).unwrap(), b"");
    }
}
