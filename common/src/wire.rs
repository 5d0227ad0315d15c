//! Messages on the queue, MessagePack-encoded as named maps so that producers and workers of
//! different versions can read each other during a rolling deploy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The version written into every message. A worker refuses (dead-letters) messages of a
/// version it does not know.
pub const WIRE_VERSION: u32 = 1;

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
    /// name → value); `None` when the job has no `partition_keys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<BTreeMap<String, String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("message does not decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    #[error("message has wire version {0}; this build reads version {WIRE_VERSION}")]
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
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("a MiniBatch always encodes")
    }

    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let m: MiniBatch = rmp_serde::from_slice(body)?;
        if m.v != WIRE_VERSION {
            return Err(WireError::Version(m.v));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let m = MiniBatch::new("j", 3, vec!["a/b.png".into()]);
        assert_eq!(MiniBatch::decode(&m.encode()).unwrap(), m);
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
