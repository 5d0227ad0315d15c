//! Messages on the queue, MessagePack-encoded as named maps so that producers and workers of
//! different versions can read each other during a rolling deploy.

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The version written into every message of a file input. A worker refuses (dead-letters)
/// messages of a version it does not know.
pub const WIRE_VERSION: u32 = 1;

/// The version of a message that carries [`Chunk`]s (a tabular input). A worker built before
/// tabular inputs refuses it rather than run it as a mini-batch of no files; during a rolling
/// deploy file jobs keep running on every worker, tabular jobs on the new ones.
pub const WIRE_VERSION_TABULAR: u32 = 2;

/// The version of a tabular message whose chunks carry [`Chunk::columns`] (an MLTable's
/// columns from the path). A worker built before them refuses it rather than hand `run()`
/// rows without those columns.
pub const WIRE_VERSION_COLUMNS: u32 = 3;

/// One mini-batch of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MiniBatch {
    /// Wire version; see [`WIRE_VERSION`].
    pub v: u32,
    /// The job id.
    pub job: String,
    /// The mini-batch's index in the job, from 0, in input order.
    pub index: u64,
    /// Object keys of the input files, relative to the job's input location.
    pub items: Vec<String>,
    /// The `partition_keys` values every item of this mini-batch shares (column or path part
    /// name → value), in the order of `partition_keys`; `None` when the job has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionValues>,
    /// A tabular input's mini-batch: the byte ranges of records it holds, one [`Chunk`] per
    /// file (several only with `partition_keys`). Empty for a file input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<Chunk>,
    /// The job's run that published it (the ledger's `Status::run`): 0 for the first, one
    /// more each time the job is resumed. A worker drops a mini-batch an earlier run left in
    /// the queue: the resumed run publishes again what is still to do.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub run: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The records of one tabular file that belong to a mini-batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// The file's key, relative to the input's folder.
    pub key: String,
    /// How its records are written.
    pub format: ChunkFormat,
    /// The file's size in bytes.
    pub size: u64,
    /// Byte ranges `[start, end)` in file order. CSV and JSON Lines: each starts at a
    /// record's first byte and ends at the next record's (or the file's end). Parquet: the
    /// chosen row groups' column chunks, followed by the footer.
    pub ranges: Vec<[u64; 2]>,
    /// CSV: the header record's bytes, line end included, put before the ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<Vec<u8>>,
    /// Parquet: the row groups, by index in the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub row_groups: Vec<u32>,
    /// The number of records, when the producer counted them (CSV, Parquet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// The first record's number in the file (0-based, header not counted), when counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_row: Option<u64>,
    /// Columns every record of the file gets, name → value, in order: an MLTable's columns
    /// taken from the file's path (`extract_columns_from_partition_format`,
    /// `include_path_column`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<(String, String)>,
}

/// The formats of [`Chunk`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChunkFormat {
    Csv,
    JsonLines,
    Parquet,
}

impl Chunk {
    /// `data/a.csv bytes 0-65536` (`rows 10-19` when counted), as logs name the chunk.
    pub fn describe(&self) -> String {
        let (start, end) = match (self.ranges.first(), self.ranges.last()) {
            (Some(first), Some(last)) => (first[0], last[1]),
            _ => (0, 0),
        };
        let mut text = match self.format {
            ChunkFormat::Parquet => {
                let groups: Vec<String> = self.row_groups.iter().map(u32::to_string).collect();
                format!("{} row groups {}", self.key, groups.join(" "))
            }
            _ => format!("{} bytes {start}-{end}", self.key),
        };
        if let (Some(first), Some(rows)) = (self.first_row, self.rows)
            && rows > 0
        {
            text.push_str(&format!(" rows {first}-{}", first + rows - 1));
        }
        text
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("message does not decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    #[error(
        "message has wire version {0}; this build reads versions {WIRE_VERSION} to {WIRE_VERSION_COLUMNS}"
    )]
    Version(u32),
}

impl MiniBatch {
    pub fn new(job: impl Into<String>, index: u64, items: Vec<String>) -> Self {
        MiniBatch {
            v: WIRE_VERSION,
            job: job.into(),
            index,
            items,
            partition: None,
            chunks: Vec::new(),
            run: 0,
        }
    }

    /// A tabular input's mini-batch of `chunks`.
    pub fn tabular(job: impl Into<String>, index: u64, chunks: Vec<Chunk>) -> Self {
        let columns = chunks.iter().any(|chunk| !chunk.columns.is_empty());
        MiniBatch {
            v: if columns {
                WIRE_VERSION_COLUMNS
            } else {
                WIRE_VERSION_TABULAR
            },
            chunks,
            ..MiniBatch::new(job, index, Vec::new())
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("a MiniBatch always encodes")
    }

    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let m: MiniBatch = rmp_serde::from_slice(body)?;
        if ![WIRE_VERSION, WIRE_VERSION_TABULAR, WIRE_VERSION_COLUMNS].contains(&m.v) {
            return Err(WireError::Version(m.v));
        }
        Ok(m)
    }
}

/// The `partition_keys` values of a mini-batch, name → value, in the order of the job's
/// `partition_keys` (not of the names): a script that builds a path from `.values()` gets
/// `1000/dominicks` for `partition_keys = ["Store", "Brand"]`, as on Azure ML. A map on the
/// wire, in that order, so a reader keeping a map of its own still decodes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionValues(pub Vec<(String, String)>);

impl FromIterator<(String, String)> for PartitionValues {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        PartitionValues(pairs.into_iter().collect())
    }
}

impl Serialize for PartitionValues {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de> Deserialize<'de> for PartitionValues {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = PartitionValues;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of partition key names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // The count is the message's say, not a promise: a corrupt header must not
                // make the worker reserve gigabytes (and abort) before the entries run out.
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some(pair) = map.next_entry()? {
                    pairs.push(pair);
                }
                Ok(PartitionValues(pairs))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let m = MiniBatch::new("j", 3, vec!["a/b.png".into()]);
        assert_eq!(MiniBatch::decode(&m.encode()).unwrap(), m);
        let resumed = MiniBatch {
            run: 2,
            ..m.clone()
        };
        assert_eq!(MiniBatch::decode(&resumed.encode()).unwrap(), resumed);
        // A first run's message says nothing of runs: older workers read it unchanged.
        assert_eq!(
            m.encode().len() + b"\xa3run\x02".len(),
            resumed.encode().len()
        );
    }

    #[test]
    fn tabular_mini_batches_round_trip_with_their_own_version() {
        let chunk = Chunk {
            key: "a.csv".into(),
            format: ChunkFormat::Csv,
            size: 100,
            ranges: vec![[10, 60]],
            header: Some(b"x,y\n".to_vec()),
            row_groups: vec![],
            rows: Some(5),
            first_row: Some(0),
            columns: Vec::new(),
        };
        let m = MiniBatch::tabular("j", 1, vec![chunk.clone()]);
        assert_eq!(m.v, WIRE_VERSION_TABULAR);
        assert_eq!(MiniBatch::decode(&m.encode()).unwrap(), m);
        // Columns from the path need a worker that adds them.
        let with_columns = Chunk {
            columns: vec![("Store".into(), "1000".into())],
            ..chunk
        };
        let m = MiniBatch::tabular("j", 2, vec![with_columns]);
        assert_eq!(m.v, WIRE_VERSION_COLUMNS);
        assert_eq!(MiniBatch::decode(&m.encode()).unwrap(), m);
        assert_eq!(m.chunks[0].describe(), "a.csv bytes 10-60 rows 0-4");
        // A file input's message is what workers before tabular inputs read.
        assert_eq!(MiniBatch::new("j", 0, vec![]).v, 1);
    }

    /// Found by the fuzz target `wire` (fuzz/corpus/wire/crash-partition-count): a
    /// `partition` map whose header claims 3.7 billion entries, in a message of 14 bytes,
    /// made the decoder reserve 180 GB and the worker abort. It is a decode error: the
    /// message is dead-lettered.
    #[test]
    fn a_partition_map_claiming_more_entries_than_it_holds_is_a_decode_error() {
        let body = [140, 4, 223, 223, 1, 0, 0, 0, 0, 0, 0, 82, 115, 219];
        assert!(matches!(
            MiniBatch::decode(&body),
            Err(WireError::Decode(_))
        ));
    }

    #[test]
    fn partition_values_keep_the_order_of_partition_keys_and_are_a_map_on_the_wire() {
        let mut m = MiniBatch::new("j", 0, vec!["x".into()]);
        m.partition = Some(
            [("Store", "1000"), ("Brand", "dominicks")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into_iter()
                .collect(),
        );
        let decoded = MiniBatch::decode(&m.encode()).unwrap();
        assert_eq!(decoded, m);
        let values = decoded.partition.unwrap();
        assert_eq!(values.0[0], ("Store".to_owned(), "1000".to_owned()));
        // A reader that keeps a map of its own (a worker before this order) decodes it.
        #[derive(Deserialize)]
        struct Older {
            partition: std::collections::BTreeMap<String, String>,
        }
        let older: Older = rmp_serde::from_slice(&m.encode()).unwrap();
        assert_eq!(older.partition["Store"], "1000");
    }

    #[test]
    fn refuses_garbage_and_unknown_versions() {
        assert!(matches!(
            MiniBatch::decode(b"\xc1 not msgpack"),
            Err(WireError::Decode(_))
        ));
        let mut m = MiniBatch::new("j", 0, vec![]);
        m.v = 99;
        assert!(matches!(
            MiniBatch::decode(&m.encode()),
            Err(WireError::Version(99))
        ));
    }
}
