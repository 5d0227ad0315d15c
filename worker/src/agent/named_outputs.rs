//! A job's named outputs on this node ([`NamedOutputs`]): where each goes, and what was
//! delivered of them (`named` delivers them).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use fleetrun_common::storage::StorageError;
use fleetrun_common::storage::s3::S3Storage;
use fleetrun_config::{JobSpec, Location};

/// Where a named output's files go.
pub enum Destination {
    Local(PathBuf),
    S3(S3Storage),
}

/// A job's named outputs on this node, and what was delivered of them.
#[derive(Default)]
pub struct NamedOutputs {
    pub(super) destinations: BTreeMap<String, Destination>,
    /// The node's folder of the job's working folders (`None` in tests that make none).
    pub(super) work: Option<PathBuf>,
    /// What was delivered, so an unchanged file is not sent again.
    pub(super) delivered: tokio::sync::Mutex<Delivered>,
    /// Set once the job's end on the node was handled (`named::finish`).
    pub(super) finished: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
pub(super) struct Delivered {
    /// (process, output, relative path) → (size, mtime) of the file as delivered, or as
    /// refused.
    pub(super) sent: HashMap<FileKey, (u64, i128)>,
    /// The files refused: their name is taken by a file fleetrun did not write.
    pub(super) refused: HashSet<FileKey>,
    /// Files an attempt that did not succeed left undelivered and that could not be moved
    /// out of the runner's folder, with their (size, mtime) then: not delivered while they
    /// are unchanged.
    pub(super) withheld: HashMap<FileKey, (u64, i128)>,
    /// How many withheld files were moved into the job's logs.
    pub(super) kept: usize,
}

/// A runner's file of a named output: (process, output, relative path).
pub(super) type FileKey = (String, String, String);

impl NamedOutputs {
    /// The job's named outputs, opened; `work` is the node's folder of its working folders.
    pub async fn open(
        spec: &JobSpec,
        work: PathBuf,
        s3: &fleetrun_common::storage::s3::S3Settings,
    ) -> Result<NamedOutputs, StorageError> {
        let mut destinations = BTreeMap::new();
        for (name, location) in &spec.outputs {
            let destination = match location {
                Location::Local(dir) => Destination::Local(dir.clone()),
                Location::S3 { bucket, prefix } => {
                    Destination::S3(S3Storage::new(bucket, prefix, s3).await?)
                }
            };
            destinations.insert(name.clone(), destination);
        }
        Ok(NamedOutputs {
            destinations,
            work: Some(work),
            delivered: Default::default(),
            finished: Default::default(),
        })
    }
}
