//! Partitioning a tabular input (CSV, JSON Lines, Parquet) into mini-batches of byte ranges.
//!
//! # Chunks
//!
//! Every file is planned on its own (a chunk never crosses a file), in key order. With a
//! `mini_batch_size` of `S` bytes, a CSV or JSON Lines file of `size` bytes whose header takes
//! `h` bytes (`h = 0` for JSON Lines) gives
//!
//! ```text
//! chunks = ceil((size - h) / S)        (0 for a file with no record)
//! ```
//!
//! whose nominal ranges are `[h + i·S, h + (i+1)·S)`, the last one ending at `size`. A record
//! belongs to the chunk that holds its first byte, so each nominal edge moves forward to the
//! first record start at or after it: every record is in exactly one chunk, and a record
//! longer than `S` leaves the chunks whose edges fall inside it empty (they still count).
//!
//! - JSON Lines: a raw newline is never inside a JSON string, so a record starts after every
//!   `\n`. The edges are found with one small read at each edge (a range GET on S3), never
//!   reading the rest of the file.
//! - CSV (RFC 4180): a newline inside quotes is not a record end. Whether an offset is inside
//!   quotes is the parity of the `"` bytes before it (an escaped `""` toggles twice), which
//!   only a pass from the file's start can know. The producer makes that pass once per file,
//!   memchr-fast over `"` and `\n`, while it plans: O(file size) bytes read by the producer
//!   (the whole object is streamed once from S3), so workers read exactly their chunk's bytes
//!   and nothing else. The pass also counts each chunk's records, which name failed rows in
//!   `failed_items.csv`. The header record (which may hold quoted newlines too) is read once
//!   and given to every chunk of its file.
//! - Parquet: chunks are runs of whole row groups, planned from the footer alone: row groups
//!   are taken in order while the run's compressed size stays within `S`, and a run holds at
//!   least one (a row group larger than `S` is a chunk of its own).
//!
//! # `partition_keys`
//!
//! Each mini-batch holds exactly the rows of one combination of the keys' values, over all
//! files (one chunk per file that has such rows). The producer parses every record once (the
//! `csv` crate's reader for CSV, `serde_json` for JSON Lines) and keeps, per combination and
//! file, the byte ranges of its records, contiguous ones merged: memory grows with the
//! number of combinations and of runs, not with the rows. Mini-batches are published in the
//! combinations' order. Keys that are an MLTable's columns from the path
//! (`extract_columns_from_partition_format`) take their value from the file's path: keys over
//! the path alone group whole files (one chunk each, any format), without reading a record.
//! Parquet rows are not partitioned by keys yet.
//!
//! # Columns from the path
//!
//! With an MLTable, every chunk of a file carries the columns its path gives
//! ([`Chunk::columns`]), which the runner adds to each row.

use std::collections::BTreeMap;

use fleetrun_common::storage::{ObjectMeta, Storage, StorageError};
use fleetrun_common::wire::{Chunk, ChunkFormat, MiniBatch};
use fleetrun_config::mltable::{MlTable, PATH_COLUMN};
use fleetrun_config::{Location, Tabular, TabularFormat};
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use crate::partition::PartitionError;
use crate::publisher::Publisher;

/// Bytes read at once by the CSV pass and the key scan.
const BLOCK: u64 = 4 << 20;
/// Bytes read at once when looking for the line end after a JSON Lines edge.
const EDGE_WINDOW: u64 = 64 << 10;
/// Edges looked up at once (JSON Lines).
const EDGE_LOOKUPS: usize = 16;
/// The 8 bytes that end a Parquet file: the footer's length and `PAR1`.
const PARQUET_TAIL: u64 = 8;

/// What is wrong with a tabular input, found while planning it.
#[derive(Debug, thiserror::Error)]
pub enum TabularError {
    #[error(
        "input.tabular: {key}: cannot tell the format from its extension (.csv, .jsonl, .json, .parquet); set input.format"
    )]
    UnknownFormat { key: String },
    #[error(
        "input.tabular: {key} is {found}, but the input's format is {expected}; one job reads one format"
    )]
    MixedFormats {
        key: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("{key}: partition_keys names the column {column:?}, which the file does not have")]
    MissingColumn { key: String, column: String },
    #[error("{key}: record at byte {offset} is not valid: {source}")]
    BadRecord {
        key: String,
        offset: u64,
        #[source]
        source: serde_json::Error,
    },
    #[error("{key}: not a Parquet file: {why}")]
    Parquet { key: String, why: String },
    /// A Parquet file whose footer or metadata the reader refuses.
    #[error("{key}: not a Parquet file: {source}")]
    ParquetMetadata {
        key: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("partition_keys is not supported for Parquet inputs yet ({key})")]
    KeysOnParquet { key: String },
    #[error("input.tabular: nothing found at {0}")]
    NotFound(String),
    /// A file the MLTable selects whose path does not end in the shape of its
    /// `extract_columns_from_partition_format`.
    #[error(
        "extract_columns_from_partition_format: the input file {key:?} does not end in {format:?}; move it out of the MLTable's paths or change the format"
    )]
    OffPartitionFormat { key: String, format: String },
}

/// The files of a tabular input, in key order: the one file, or every file under the
/// folder except hidden ones (a name starting with `.` or `_`, as Spark's `_SUCCESS`).
fn files<'a>(
    input: &'a dyn Storage,
    one: Option<&'a str>,
) -> futures::stream::BoxStream<'a, Result<ObjectMeta, StorageError>> {
    let prefix = one.unwrap_or("");
    input
        .list(prefix)
        .try_filter(move |object| {
            let keep = match one {
                Some(key) => object.key == key,
                None => !object
                    .key
                    .split('/')
                    .any(|part| part.starts_with('.') || part.starts_with('_')),
            };
            futures::future::ready(keep)
        })
        .boxed()
}

/// The format the input is read as: `[input] format`, else the extension of the one file or
/// of the first file listed. The submitter settles it before registering the job, so every
/// runner knows it (pyarrow is needed for Parquet).
pub async fn settle_format(
    tabular: &Tabular,
    input: &dyn Storage,
    one: Option<&str>,
) -> Result<TabularFormat, PartitionError> {
    if let Some(format) = tabular.format {
        return Ok(format);
    }
    let first = files(input, one).next().await.transpose()?;
    let Some(first) = first else {
        return Err(TabularError::NotFound(tabular.location.to_string()).into());
    };
    TabularFormat::of_key(&first.key)
        .ok_or_else(|| TabularError::UnknownFormat { key: first.key }.into())
}

/// Publishes one mini-batch of `chunks`, counting their rows (where known).
async fn publish_chunks(
    publisher: &mut Publisher<'_>,
    chunks: Vec<Chunk>,
    partition: Option<fleetrun_common::wire::PartitionValues>,
) -> Result<(), PartitionError> {
    let rows = chunks.iter().filter_map(|c| c.rows).sum::<u64>();
    let mut batch = MiniBatch::tabular(publisher.job(), publisher.next_index(), chunks);
    batch.partition = partition;
    Ok(publisher.publish(batch, rows).await?)
}

/// Plans the tabular input and publishes its mini-batches (see the module's doc), until
/// done or `stop` is cancelled. `format` is the settled one ([`settle_format`]).
#[allow(clippy::too_many_arguments)]
pub async fn publish_tabular(
    input: &dyn Storage,
    one: Option<&str>,
    tabular: &Tabular,
    format: TabularFormat,
    size: u64,
    partition_keys: Option<&[String]>,
    mltable: Option<(&MlTable, &Location)>,
    publisher: &mut Publisher<'_>,
    stop: &CancellationToken,
) -> Result<(), PartitionError> {
    let size = size.max(1);
    // Keys over columns from the path group whole files; the others, their rows.
    let from_path = mltable.map(|(table, _)| table.path_column_names());
    let row_keys: Option<Vec<String>> = partition_keys.map(|keys| {
        keys.iter()
            .filter(|key| !from_path.as_ref().is_some_and(|names| names.contains(key)))
            .cloned()
            .collect()
    });
    let mut by_key: BTreeMap<Vec<String>, Vec<Chunk>> = BTreeMap::new();
    let mut listing = files(input, one);
    while let Some(object) = listing.next().await.transpose()? {
        if stop.is_cancelled() {
            break;
        }
        check_format(&object.key, format)?;
        let columns = match mltable {
            Some((table, root)) => path_columns(table, root, &object.key)?,
            None => Vec::new(),
        };
        let (Some(keys), Some(row_keys)) = (partition_keys, &row_keys) else {
            for mut chunk in plan_file(input, &object, format, size).await? {
                if stop.is_cancelled() {
                    break;
                }
                chunk.columns.clone_from(&columns);
                publish_chunks(publisher, vec![chunk], None).await?;
            }
            continue;
        };
        let groups: Vec<(Vec<String>, Chunk)> = match (row_keys.is_empty(), format) {
            // The whole file is one group: one chunk of all its records.
            (true, _) => plan_file(input, &object, format, u64::MAX)
                .await?
                .into_iter()
                .map(|chunk| (Vec::new(), chunk))
                .collect(),
            (false, TabularFormat::Parquet) => {
                return Err(TabularError::KeysOnParquet { key: object.key }.into());
            }
            (false, _) => scan_keys(input, &object, format, tabular.separator, row_keys).await?,
        };
        for (row_values, mut chunk) in groups {
            chunk.columns.clone_from(&columns);
            let values = keys
                .iter()
                .map(|key| match columns.iter().find(|(name, _)| name == key) {
                    Some((_, value)) => value.clone(),
                    None => {
                        let at = row_keys.iter().position(|k| k == key);
                        at.map(|at| row_values[at].clone()).unwrap_or_default()
                    }
                })
                .collect();
            by_key.entry(values).or_default().push(chunk);
        }
    }
    if let Some(keys) = partition_keys {
        for (values, chunks) in by_key {
            if stop.is_cancelled() {
                break;
            }
            let partition = keys.iter().cloned().zip(values).collect();
            publish_chunks(publisher, chunks, Some(partition)).await?;
        }
    }
    Ok(())
}

/// The columns an MLTable adds to every record of the file `key`: those of
/// `extract_columns_from_partition_format`, then `Path` with `include_path_column`, less
/// those it drops (`drop_columns`; `partition_keys` never name one).
fn path_columns(
    table: &MlTable,
    root: &Location,
    key: &str,
) -> Result<Vec<(String, String)>, TabularError> {
    let mut columns = table
        .path_columns(key)
        .ok_or_else(|| TabularError::OffPartitionFormat {
            key: key.to_owned(),
            format: table.partition_format.clone().unwrap_or_default(),
        })?;
    if table
        .read
        .as_ref()
        .is_some_and(|read| read.include_path_column)
    {
        columns.push((
            PATH_COLUMN.to_owned(),
            crate::mltable::item_location(root, key),
        ));
    }
    columns.retain(|(name, _)| !table.drops(name));
    Ok(columns)
}

/// Refuses a file whose extension names another table format than the job's: the format is
/// settled before the run (from `[input] format`, else the first file's extension), and a
/// `b.parquet` beside `a.csv` would otherwise be read as CSV. A file whose extension names no
/// format is read as the job's.
fn check_format(key: &str, expected: TabularFormat) -> Result<(), TabularError> {
    match TabularFormat::of_key(key) {
        Some(found) if found != expected => Err(TabularError::MixedFormats {
            key: key.to_owned(),
            found: found.as_str(),
            expected: expected.as_str(),
        }),
        _ => Ok(()),
    }
}

fn chunk_format(format: TabularFormat) -> ChunkFormat {
    match format {
        TabularFormat::Csv => ChunkFormat::Csv,
        TabularFormat::JsonLines => ChunkFormat::JsonLines,
        TabularFormat::Parquet => ChunkFormat::Parquet,
    }
}

/// The chunks of one file, in order.
pub async fn plan_file(
    input: &dyn Storage,
    object: &ObjectMeta,
    format: TabularFormat,
    size: u64,
) -> Result<Vec<Chunk>, PartitionError> {
    match format {
        TabularFormat::Csv => plan_csv(input, object, size).await,
        TabularFormat::JsonLines => plan_json_lines(input, object, size).await,
        TabularFormat::Parquet => plan_parquet(input, object, size).await,
    }
}

/// The nominal edges between the chunks of a body `[start, end)`: `ceil(len / size) - 1`
/// offsets.
fn nominal_edges(start: u64, end: u64, size: u64) -> Vec<u64> {
    let len = end.saturating_sub(start);
    let chunks = len.div_ceil(size);
    (1..chunks).map(|i| start + i * size).collect()
}

/// Chunks `[starts[i], starts[i+1])` of a file's body, with `starts` = the body's start and
/// the aligned edges, and `end` its end.
fn chunks_between(
    object: &ObjectMeta,
    format: ChunkFormat,
    body: u64,
    aligned: &[u64],
    header: Option<Vec<u8>>,
    rows: Option<Vec<u64>>,
) -> Vec<Chunk> {
    let starts = std::iter::once(body).chain(aligned.iter().copied());
    let ends = aligned.iter().copied().chain(std::iter::once(object.size));
    let mut first_row = 0;
    starts
        .zip(ends)
        .enumerate()
        .map(|(i, (start, end))| {
            let rows = rows.as_ref().map(|r| r[i]);
            let chunk = Chunk {
                key: object.key.clone(),
                format,
                size: object.size,
                ranges: vec![[start, end]],
                header: header.clone(),
                row_groups: Vec::new(),
                rows,
                first_row: rows.map(|_| first_row),
                columns: Vec::new(),
            };
            first_row += rows.unwrap_or(0);
            chunk
        })
        .collect()
}

async fn plan_json_lines(
    input: &dyn Storage,
    object: &ObjectMeta,
    size: u64,
) -> Result<Vec<Chunk>, PartitionError> {
    if object.size == 0 {
        return Ok(Vec::new());
    }
    let edges = nominal_edges(0, object.size, size);
    let aligned: Vec<u64> = futures::stream::iter(edges)
        .map(|edge| line_start_at_or_after(input, object, edge))
        .buffered(EDGE_LOOKUPS)
        .try_collect()
        .await?;
    Ok(chunks_between(
        object,
        ChunkFormat::JsonLines,
        0,
        &aligned,
        None,
        None,
    ))
}

/// The first offset at or after `edge` where a line starts (or the file's end).
async fn line_start_at_or_after(
    input: &dyn Storage,
    object: &ObjectMeta,
    edge: u64,
) -> Result<u64, StorageError> {
    // A line starts at `edge` when the byte before it ends one.
    let mut at = edge - 1;
    while at < object.size {
        let end = (at + EDGE_WINDOW).min(object.size);
        let bytes = input.get_range(&object.key, at, end).await?;
        if bytes.is_empty() {
            break;
        }
        if let Some(newline) = memchr::memchr(b'\n', &bytes) {
            return Ok(at + newline as u64 + 1);
        }
        at += bytes.len() as u64;
    }
    Ok(object.size)
}

/// The quote-parity pass over a CSV file (see the module's doc).
async fn plan_csv(
    input: &dyn Storage,
    object: &ObjectMeta,
    size: u64,
) -> Result<Vec<Chunk>, PartitionError> {
    let mut quoted = false;
    let mut header_end: Option<u64> = None;
    let mut edges = Vec::new();
    let mut aligned = Vec::new();
    let mut rows: Vec<u64> = Vec::new();
    // Each record start after the header: close the chunks whose edge it passed, count it.
    let record_start = |start: u64,
                        header_end: &mut Option<u64>,
                        edges: &mut Vec<u64>,
                        aligned: &mut Vec<u64>,
                        rows: &mut Vec<u64>| {
        match *header_end {
            None => {
                *header_end = Some(start);
                *edges = nominal_edges(start, object.size, size);
                rows.push(0);
                if start < object.size {
                    rows[0] += 1;
                }
            }
            Some(_) if start >= object.size => {}
            Some(_) => {
                while aligned.len() < edges.len() && start >= edges[aligned.len()] {
                    aligned.push(start);
                    rows.push(0);
                }
                *rows.last_mut().expect("a chunk is open") += 1;
            }
        }
    };
    let mut at = 0;
    while at < object.size {
        let end = (at + BLOCK).min(object.size);
        let block = input.get_range(&object.key, at, end).await?;
        if block.is_empty() {
            break;
        }
        for i in memchr::memchr2_iter(b'"', b'\n', &block) {
            if block[i] == b'"' {
                quoted = !quoted;
            } else if !quoted {
                record_start(
                    at + i as u64 + 1,
                    &mut header_end,
                    &mut edges,
                    &mut aligned,
                    &mut rows,
                );
            }
        }
        at += block.len() as u64;
    }
    let Some(header_end) = header_end else {
        // A header and no record.
        return Ok(Vec::new());
    };
    if header_end >= object.size {
        return Ok(Vec::new());
    }
    // Edges past the last record start end at the file's end.
    while aligned.len() < edges.len() {
        aligned.push(object.size);
        rows.push(0);
    }
    let header = input.get_range(&object.key, 0, header_end).await?.to_vec();
    Ok(chunks_between(
        object,
        ChunkFormat::Csv,
        header_end,
        &aligned,
        Some(header),
        Some(rows),
    ))
}

async fn plan_parquet(
    input: &dyn Storage,
    object: &ObjectMeta,
    size: u64,
) -> Result<Vec<Chunk>, PartitionError> {
    use parquet::file::metadata::{FooterTail, ParquetMetaDataReader};
    let bad = |why: String| TabularError::Parquet {
        key: object.key.clone(),
        why,
    };
    if object.size < 2 * PARQUET_TAIL {
        return Err(bad(format!("{} bytes is too short", object.size)).into());
    }
    let tail = input
        .get_range(&object.key, object.size - PARQUET_TAIL, object.size)
        .await?;
    let tail: [u8; 8] = tail[..]
        .try_into()
        .map_err(|_| bad("the file changed while it was read".into()))?;
    let unreadable = |source| TabularError::ParquetMetadata {
        key: object.key.clone(),
        source,
    };
    let footer = FooterTail::try_from(tail).map_err(unreadable)?;
    let footer_start = (object.size - PARQUET_TAIL)
        .checked_sub(footer.metadata_length() as u64)
        .ok_or_else(|| bad("its footer is longer than the file".into()))?;
    let metadata = input
        .get_range(&object.key, footer_start, object.size - PARQUET_TAIL)
        .await?;
    let metadata = ParquetMetaDataReader::decode_metadata(&metadata).map_err(unreadable)?;

    let mut chunks = Vec::new();
    let mut run: Vec<(u32, [u64; 2], u64)> = Vec::new();
    let mut run_bytes = 0u64;
    let mut first_row = 0u64;
    let flush =
        |run: &mut Vec<(u32, [u64; 2], u64)>, first_row: &mut u64, chunks: &mut Vec<Chunk>| {
            if run.is_empty() {
                return;
            }
            let rows: u64 = run.iter().map(|(_, _, rows)| rows).sum();
            let mut ranges: Vec<[u64; 2]> = Vec::new();
            for (_, range, _) in run.iter() {
                match ranges.last_mut() {
                    Some(last) if last[1] == range[0] => last[1] = range[1],
                    _ => ranges.push(*range),
                }
            }
            ranges.push([footer_start, object.size]);
            chunks.push(Chunk {
                key: object.key.clone(),
                format: ChunkFormat::Parquet,
                size: object.size,
                ranges,
                header: None,
                row_groups: run.iter().map(|(index, _, _)| *index).collect(),
                rows: Some(rows),
                first_row: Some(*first_row),
                columns: Vec::new(),
            });
            *first_row += rows;
            run.clear();
        };
    for (index, group) in metadata.row_groups().iter().enumerate() {
        let mut start = u64::MAX;
        let mut end = 0;
        for column in group.columns() {
            let (offset, len) = column.byte_range();
            start = start.min(offset);
            end = end.max(offset + len);
        }
        if start > end || end > footer_start {
            return Err(bad(format!("row group {index} lies outside the file")).into());
        }
        let bytes = end - start;
        if !run.is_empty() && run_bytes + bytes > size {
            flush(&mut run, &mut first_row, &mut chunks);
            run_bytes = 0;
        }
        run.push((index as u32, [start, end], group.num_rows().max(0) as u64));
        run_bytes += bytes;
    }
    flush(&mut run, &mut first_row, &mut chunks);
    Ok(chunks)
}

/// Reads a CSV or JSON Lines file's records and groups their byte ranges by the values of
/// `keys` (see the module's doc).
async fn scan_keys(
    input: &dyn Storage,
    object: &ObjectMeta,
    format: TabularFormat,
    separator: u8,
    keys: &[String],
) -> Result<Vec<(Vec<String>, Chunk)>, PartitionError> {
    let mut scan = match format {
        TabularFormat::Csv => KeyScan::Csv(Box::new(CsvKeys::new(separator))),
        _ => KeyScan::Json(JsonKeys::default()),
    };
    let mut groups: BTreeMap<Vec<String>, Vec<[u64; 2]>> = BTreeMap::new();
    let mut at = 0;
    while at < object.size {
        let end = (at + BLOCK).min(object.size);
        let block = input.get_range(&object.key, at, end).await?;
        if block.is_empty() {
            break;
        }
        scan.feed(object, keys, &block, at, false, &mut groups)?;
        at += block.len() as u64;
    }
    scan.feed(object, keys, &[], at, true, &mut groups)?;
    let header = match &scan {
        KeyScan::Csv(csv) => match csv.header_end {
            Some(end) => Some(input.get_range(&object.key, 0, end).await?.to_vec()),
            None => return Ok(Vec::new()),
        },
        KeyScan::Json(_) => None,
    };
    Ok(groups
        .into_iter()
        .map(|(values, ranges)| {
            let chunk = Chunk {
                key: object.key.clone(),
                format: chunk_format(format),
                size: object.size,
                ranges,
                header: header.clone(),
                row_groups: Vec::new(),
                rows: None,
                first_row: None,
                columns: Vec::new(),
            };
            (values, chunk)
        })
        .collect())
}

/// Adds the record `[start, end)` to its group, merged with the group's last range when
/// they touch.
fn add_range(
    groups: &mut BTreeMap<Vec<String>, Vec<[u64; 2]>>,
    values: Vec<String>,
    start: u64,
    end: u64,
) {
    let ranges = groups.entry(values).or_default();
    match ranges.last_mut() {
        Some(last) if last[1] == start => last[1] = end,
        _ => ranges.push([start, end]),
    }
}

enum KeyScan {
    Csv(Box<CsvKeys>),
    Json(JsonKeys),
}

impl KeyScan {
    fn feed(
        &mut self,
        object: &ObjectMeta,
        keys: &[String],
        block: &[u8],
        offset: u64,
        last: bool,
        groups: &mut BTreeMap<Vec<String>, Vec<[u64; 2]>>,
    ) -> Result<(), TabularError> {
        match self {
            KeyScan::Csv(csv) => csv.feed(object, keys, block, last, groups),
            KeyScan::Json(json) => json.feed(object, keys, block, offset, last, groups),
        }
    }
}

/// The CSV records of a file, parsed incrementally by the `csv` crate's core reader.
struct CsvKeys {
    reader: csv_core::Reader,
    /// Bytes consumed so far: the next record's first byte.
    consumed: u64,
    record_start: u64,
    fields: Vec<u8>,
    ends: Vec<usize>,
    fields_len: usize,
    ends_len: usize,
    /// Where the header record ends.
    header_end: Option<u64>,
    /// The keys' column indexes, once the header is read.
    columns: Option<Vec<usize>>,
}

impl CsvKeys {
    fn new(separator: u8) -> Self {
        CsvKeys {
            reader: csv_core::ReaderBuilder::new().delimiter(separator).build(),
            consumed: 0,
            record_start: 0,
            fields: vec![0; 1024],
            ends: vec![0; 64],
            fields_len: 0,
            ends_len: 0,
            header_end: None,
            columns: None,
        }
    }

    fn feed(
        &mut self,
        object: &ObjectMeta,
        keys: &[String],
        mut block: &[u8],
        last: bool,
        groups: &mut BTreeMap<Vec<String>, Vec<[u64; 2]>>,
    ) -> Result<(), TabularError> {
        use csv_core::ReadRecordResult;
        loop {
            let (result, read, written, ended) = self.reader.read_record(
                block,
                &mut self.fields[self.fields_len..],
                &mut self.ends[self.ends_len..],
            );
            block = &block[read..];
            self.consumed += read as u64;
            self.fields_len += written;
            self.ends_len += ended;
            match result {
                ReadRecordResult::InputEmpty => {
                    if !last {
                        return Ok(());
                    }
                    // The file's end: the reader ends a last record without a newline.
                }
                ReadRecordResult::OutputFull => {
                    let len = self.fields.len();
                    self.fields.resize(len * 2, 0);
                }
                ReadRecordResult::OutputEndsFull => {
                    let len = self.ends.len();
                    self.ends.resize(len * 2, 0);
                }
                ReadRecordResult::Record => {
                    self.record(object, keys, groups)?;
                }
                ReadRecordResult::End => return Ok(()),
            }
        }
    }

    fn record(
        &mut self,
        object: &ObjectMeta,
        keys: &[String],
        groups: &mut BTreeMap<Vec<String>, Vec<[u64; 2]>>,
    ) -> Result<(), TabularError> {
        let (start, end) = (self.record_start, self.consumed);
        self.record_start = end;
        let fields = &self.fields[..self.fields_len];
        let ends = &self.ends[..self.ends_len];
        let field = |i: usize| {
            let from = if i == 0 { 0 } else { ends[i - 1] };
            String::from_utf8_lossy(&fields[from..ends[i]]).into_owned()
        };
        let blank = ends.len() <= 1 && fields.is_empty();
        match &self.columns {
            None => {
                let names: Vec<String> = (0..ends.len()).map(field).collect();
                let columns = keys
                    .iter()
                    .map(|key| {
                        names.iter().position(|n| n == key).ok_or_else(|| {
                            TabularError::MissingColumn {
                                key: object.key.clone(),
                                column: key.clone(),
                            }
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.columns = Some(columns);
                self.header_end = Some(end);
            }
            Some(_) if blank => {}
            Some(columns) => {
                let values = columns
                    .iter()
                    .map(|&c| {
                        if c < ends.len() {
                            field(c)
                        } else {
                            String::new()
                        }
                    })
                    .collect();
                add_range(groups, values, start, end);
            }
        }
        self.fields_len = 0;
        self.ends_len = 0;
        Ok(())
    }
}

/// The JSON Lines records of a file: each line parsed with `serde_json`.
#[derive(Default)]
struct JsonKeys {
    /// The start of a line that the last block ended inside.
    carry: Vec<u8>,
    carry_start: u64,
}

impl JsonKeys {
    fn feed(
        &mut self,
        object: &ObjectMeta,
        keys: &[String],
        block: &[u8],
        offset: u64,
        last: bool,
        groups: &mut BTreeMap<Vec<String>, Vec<[u64; 2]>>,
    ) -> Result<(), TabularError> {
        let mut line_start = 0;
        for newline in memchr::memchr_iter(b'\n', block) {
            let end = newline + 1;
            if self.carry.is_empty() {
                let line = &block[line_start..end];
                json_line(object, keys, line, offset + line_start as u64, groups)?;
            } else {
                self.carry.extend_from_slice(&block[line_start..end]);
                let line = std::mem::take(&mut self.carry);
                json_line(object, keys, &line, self.carry_start, groups)?;
            }
            line_start = end;
        }
        if line_start < block.len() {
            if self.carry.is_empty() {
                self.carry_start = offset + line_start as u64;
            }
            self.carry.extend_from_slice(&block[line_start..]);
        }
        if last && !self.carry.is_empty() {
            let line = std::mem::take(&mut self.carry);
            json_line(object, keys, &line, self.carry_start, groups)?;
        }
        Ok(())
    }
}

fn json_line(
    object: &ObjectMeta,
    keys: &[String],
    line: &[u8],
    start: u64,
    groups: &mut BTreeMap<Vec<String>, Vec<[u64; 2]>>,
) -> Result<(), TabularError> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let record: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(line).map_err(|source| TabularError::BadRecord {
            key: object.key.clone(),
            offset: start,
            source,
        })?;
    let values = keys
        .iter()
        .map(|key| match record.get(key) {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        })
        .collect();
    add_range(groups, values, start, start + line.len() as u64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use fleetrun_common::storage::LocalStorage;

    use super::*;

    async fn file(dir: &tempfile::TempDir, text: &str) -> (LocalStorage, ObjectMeta) {
        let storage = LocalStorage::new(dir.path());
        storage
            .put("t.csv", Bytes::from(text.to_owned()))
            .await
            .unwrap();
        let object = ObjectMeta {
            key: "t.csv".into(),
            size: text.len() as u64,
        };
        (storage, object)
    }

    fn ranges(chunks: &[Chunk]) -> Vec<[u64; 2]> {
        chunks.iter().flat_map(|c| c.ranges.clone()).collect()
    }

    /// An edge inside a quoted field moves to the first record start after it, whatever
    /// newlines the quotes hold; the edges' count is the byte arithmetic's.
    #[tokio::test]
    async fn csv_edges_inside_quotes_move_to_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        // header 0..2, "a\nb\nc" 2..10, d 10..12, e 12..14.
        let (input, object) = file(&dir, "h\n\"a\nb\nc\"\nd\ne\n").await;
        let chunks = plan_csv(&input, &object, 4).await.unwrap();
        assert_eq!(chunks.len(), 3, "ceil((14 - 2) / 4)");
        assert_eq!(ranges(&chunks), [[2, 10], [10, 10], [10, 14]]);
        let rows: Vec<_> = chunks.iter().map(|c| (c.first_row, c.rows)).collect();
        assert_eq!(
            rows,
            [(Some(0), Some(1)), (Some(1), Some(0)), (Some(1), Some(2))]
        );
        assert!(
            chunks
                .iter()
                .all(|c| c.header.as_deref() == Some(&b"h\n"[..]))
        );
        // Escaped quotes toggle twice: the record after `"x""y"` starts a chunk.
        let (input, object) = file(&dir, "h\n\"x\"\"\ny\"\nz\n").await;
        let chunks = plan_csv(&input, &object, 3).await.unwrap();
        assert_eq!(ranges(&chunks), [[2, 10], [10, 10], [10, 12], [12, 12]]);
        // A header alone, or nothing, is no chunk.
        for text in ["h\n", "h", ""] {
            let (input, object) = file(&dir, text).await;
            assert!(
                plan_csv(&input, &object, 4).await.unwrap().is_empty(),
                "{text:?}"
            );
        }
    }

    #[tokio::test]
    async fn json_lines_edges_move_to_the_next_line_start() {
        let dir = tempfile::tempdir().unwrap();
        let (input, object) = file(&dir, "{}\n{}\n{}\n").await;
        let at = |size| {
            let (input, object) = (&input, &object);
            async move { ranges(&plan_json_lines(input, object, size).await.unwrap()) }
        };
        assert_eq!(
            at(3).await,
            [[0, 3], [3, 6], [6, 9]],
            "edges on line starts"
        );
        assert_eq!(at(4).await, [[0, 6], [6, 9], [9, 9]]);
        assert_eq!(at(100).await, [[0, 9]]);
    }

    #[tokio::test]
    async fn partition_keys_group_ranges_and_merge_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        // A blank line, a record with a quoted newline, then a, b, a.
        let text = "k,v\n\n\"a\",\"1\n\"\na,2\nb,3\na,4\n";
        let (input, object) = file(&dir, text).await;
        let keys = ["k".to_owned()];
        let groups = scan_keys(&input, &object, TabularFormat::Csv, b',', &keys)
            .await
            .unwrap();
        let found: Vec<(Vec<String>, Vec<[u64; 2]>)> = groups
            .into_iter()
            .map(|(values, chunk)| (values, chunk.ranges))
            .collect();
        let a = &found[0];
        assert_eq!(a.0, ["a"]);
        assert_eq!(found[1].0, ["b"]);
        // Each group's bytes, read back, hold exactly its records.
        let read = |ranges: &[[u64; 2]]| {
            ranges
                .iter()
                .map(|[s, e]| &text[*s as usize..*e as usize])
                .collect::<String>()
        };
        assert_eq!(read(&a.1), "\n\"a\",\"1\n\"\na,2\na,4\n");
        assert_eq!(a.1.len(), 2, "neighbouring records merge into one range");
        assert_eq!(read(&found[1].1), "b,3\n");
        let missing = scan_keys(&input, &object, TabularFormat::Csv, b',', &["x".to_owned()]).await;
        assert!(matches!(
            missing,
            Err(PartitionError::Tabular(TabularError::MissingColumn { .. }))
        ));
    }
}
