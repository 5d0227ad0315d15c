//! Messages on the queue, MessagePack-encoded as named maps so that producers and workers of
//! different versions can read each other during a rolling deploy.

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
    /// Attempts spent on the mini-batch before this message was published: a node that
    /// hands a mini-batch back without running it publishes a copy carrying them, so that
    /// handing back costs no attempt while the broker counts the copy's deliveries afresh.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts_spent: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
            attempts_spent: 0,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("a MiniBatch always encodes")
    }

    /// The attempt a delivery of this message is, given the broker's count (1 on the
    /// first delivery).
    pub fn attempt(&self, delivered: u32) -> u32 {
        self.attempts_spent.saturating_add(delivered)
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
    fn a_handed_back_copy_carries_its_spent_attempts() {
        let first = MiniBatch::new("j", 3, vec!["a".into()]);
        assert_eq!(first.attempt(1), 1);
        let copy = MiniBatch {
            attempts_spent: 2,
            ..first.clone()
        };
        let decoded = MiniBatch::decode(&copy.encode()).unwrap();
        assert_eq!(decoded.attempt(1), 3);
        // A message without the field (none spent) is a little shorter and reads as 0.
        assert!(first.encode().len() < copy.encode().len());
        assert_eq!(
            MiniBatch::decode(&first.encode()).unwrap().attempts_spent,
            0
        );
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
