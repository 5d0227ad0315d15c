//! Staging a tabular input's chunks: each chunk's bytes, read from the input (a local read
//! or an S3 range GET), become one file in the mini-batch's staging folder that pandas
//! reads whole.
//!
//! - CSV: the header record, then the chunk's ranges;
//! - JSON Lines: the chunk's ranges;
//! - Parquet: a sparse file of the object's size holding only the magic bytes, the chunk's
//!   row groups and the footer at their original offsets, so pyarrow reads those row groups
//!   without the rest of the object ever being fetched.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use fleetrun_common::protocol::StagedTable;
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_common::wire::{Chunk, ChunkFormat};

use super::stage_error::StageError;
use crate::scratch::FolderError;

/// The 4 bytes a Parquet file starts (and ends) with.
const PARQUET_MAGIC: &[u8; 4] = b"PAR1";

/// Stages `chunks` into `folder` (created here), as `chunk-<n>.<ext>`.
pub(super) async fn stage_chunks(
    input: &dyn Storage,
    chunks: &[Chunk],
    folder: &Path,
    staging: &Path,
) -> Result<Vec<StagedTable>, StageError> {
    if let Err(e) = tokio::fs::create_dir_all(folder).await {
        return Err(FolderError::new(staging, e).into());
    }
    let mut tables = Vec::with_capacity(chunks.len());
    for (n, chunk) in chunks.iter().enumerate() {
        let path = folder.join(format!("chunk-{n}.{}", extension(chunk.format)));
        stage_chunk(input, chunk, &path)
            .await
            .map_err(|e| match e {
                Staging::Input(e) => StageError::from(e),
                Staging::Write(e) => match FolderError::of_write(staging, e) {
                    Ok(full) => StageError::Scratch(full),
                    Err(source) => StageError::Input(StorageError::Io {
                        key: chunk.key.clone(),
                        source,
                    }),
                },
            })?;
        tables.push(StagedTable {
            path: path.to_string_lossy().into_owned(),
            format: chunk.format,
            row_groups: chunk.row_groups.clone(),
            columns: chunk.columns.clone(),
        });
    }
    Ok(tables)
}

enum Staging {
    Input(StorageError),
    Write(std::io::Error),
}

async fn stage_chunk(input: &dyn Storage, chunk: &Chunk, path: &Path) -> Result<(), Staging> {
    fleetrun_common::storage::check_key(&chunk.key).map_err(Staging::Input)?;
    let mut pieces = Vec::with_capacity(chunk.ranges.len() + 1);
    // Ranges close together are fetched as one span (one range GET on S3): a
    // `partition_keys` chunk may hold a range per record.
    for span in spans(&chunk.ranges) {
        let [start, end] = span.whole;
        let bytes = input
            .get_range(&chunk.key, start, end)
            .await
            .map_err(Staging::Input)?;
        if (bytes.len() as u64) < end - start {
            // The object changed (shrank) since the producer planned it.
            return Err(Staging::Input(StorageError::Changed {
                key: chunk.key.clone(),
                start,
                end,
                read: bytes.len() as u64,
            }));
        }
        for [from, to] in span.ranges {
            let piece = bytes.slice((from - start) as usize..(to - start) as usize);
            pieces.push((from, piece));
        }
    }
    let path = path.to_path_buf();
    let chunk = chunk.clone();
    tokio::task::spawn_blocking(move || write_chunk(&path, &chunk, &pieces))
        .await
        .expect("staging task panicked")
        .map_err(Staging::Write)
}

/// Bytes of gap between two ranges below which they are read as one span.
const SPAN_GAP: u64 = 256 << 10;

/// Ranges read together: `whole` covers every one of `ranges`.
struct Span {
    whole: [u64; 2],
    ranges: Vec<[u64; 2]>,
}

/// `ranges` (in file order) grouped into spans whose gaps stay under [`SPAN_GAP`].
fn spans(ranges: &[[u64; 2]]) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    for &range in ranges {
        match spans.last_mut() {
            Some(span) if range[0] >= span.whole[1] && range[0] - span.whole[1] <= SPAN_GAP => {
                span.whole[1] = range[1];
                span.ranges.push(range);
            }
            _ => spans.push(Span {
                whole: range,
                ranges: vec![range],
            }),
        }
    }
    spans
}

fn write_chunk(path: &Path, chunk: &Chunk, pieces: &[(u64, bytes::Bytes)]) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    match chunk.format {
        ChunkFormat::Parquet => {
            // Sparse: the holes read as zeros and take no space; pyarrow reads only the
            // footer and the row groups it was asked for.
            file.set_len(chunk.size)?;
            file.write_all_at(PARQUET_MAGIC, 0)?;
            for (start, bytes) in pieces {
                file.write_all_at(bytes, *start)?;
            }
        }
        ChunkFormat::Csv | ChunkFormat::JsonLines => {
            use std::io::Write;
            let mut out = std::io::BufWriter::new(file);
            if let Some(header) = &chunk.header {
                out.write_all(header)?;
            }
            for (_, bytes) in pieces {
                out.write_all(bytes)?;
            }
            out.flush()?;
        }
    }
    Ok(())
}

fn extension(format: ChunkFormat) -> &'static str {
    match format {
        ChunkFormat::Csv => "csv",
        ChunkFormat::JsonLines => "jsonl",
        ChunkFormat::Parquet => "parquet",
    }
}

/// The records of a mini-batch whose rows the producer did not count (JSON Lines): its lines
/// that are not blank, read again. `None` when they cannot be read.
pub(super) async fn count_rows(input: &dyn Storage, chunks: &[Chunk]) -> Option<u64> {
    let mut rows = 0;
    for chunk in chunks {
        if let Some(counted) = chunk.rows {
            rows += counted;
            continue;
        }
        for span in spans(&chunk.ranges) {
            let [start, _] = span.whole;
            let bytes = input
                .get_range(&chunk.key, start, span.whole[1])
                .await
                .ok()?;
            for [from, to] in span.ranges {
                let piece = bytes.get((from - start) as usize..(to - start) as usize)?;
                rows += piece
                    .split(|b| *b == b'\n')
                    .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
                    .count() as u64;
            }
        }
    }
    Some(rows)
}

/// The staging folder of a mini-batch's chunks.
pub(super) fn folder(staging: &Path, name: &str) -> PathBuf {
    staging.join(name)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use fleetrun_common::storage::LocalStorage;

    use super::*;

    fn chunk(format: ChunkFormat, ranges: Vec<[u64; 2]>, header: Option<&[u8]>) -> Chunk {
        Chunk {
            key: "t/rows".into(),
            format,
            size: 0,
            ranges,
            header: header.map(<[u8]>::to_vec),
            row_groups: vec![],
            rows: None,
            first_row: None,
            columns: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_csv_chunk_gets_its_header_and_a_parquet_one_keeps_its_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let input = LocalStorage::new(dir.path().join("in"));
        input
            .put("t/rows", Bytes::from_static(b"a,b\n1,2\n3,4\n5,6\n"))
            .await
            .unwrap();
        let staging = dir.path().join("staging");
        let csv = chunk(ChunkFormat::Csv, vec![[8, 12]], Some(b"a,b\n"));
        let mut parquet = chunk(ChunkFormat::Parquet, vec![[4, 8], [12, 16]], None);
        parquet.size = 16;
        let tables = stage_chunks(&input, &[csv, parquet], &staging.join("b1"), &staging)
            .await
            .unwrap();
        assert_eq!(std::fs::read(&tables[0].path).unwrap(), b"a,b\n3,4\n");
        assert!(tables[0].path.ends_with(".csv"));
        assert_eq!(
            std::fs::read(&tables[1].path).unwrap(),
            b"PAR11,2\n\x00\x00\x00\x005,6\n"
        );
    }

    #[test]
    fn close_ranges_are_read_as_one_span() {
        let far = SPAN_GAP + 10;
        let grouped: Vec<([u64; 2], usize)> =
            spans(&[[0, 5], [8, 10], [10 + far, 20 + far], [25 + far, 30 + far]])
                .into_iter()
                .map(|s| (s.whole, s.ranges.len()))
                .collect();
        assert_eq!(grouped, [([0, 10], 2), ([10 + far, 30 + far], 2)]);
    }

    #[tokio::test]
    async fn uncounted_rows_are_counted_from_the_lines() {
        let dir = tempfile::tempdir().unwrap();
        let input = LocalStorage::new(dir.path());
        input
            .put(
                "t/rows",
                Bytes::from_static(b"{\"a\":1}\n{\"a\":2}\n\n{\"a\":3}"),
            )
            .await
            .unwrap();
        let jsonl = chunk(ChunkFormat::JsonLines, vec![[0, 24]], None);
        assert_eq!(count_rows(&input, &[jsonl]).await, Some(3));
    }
}
