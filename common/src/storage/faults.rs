//! Faults of the storage service: what kind each is, and how many of each this process met.
//!
//! The S3 client counts every attempt of a request that met a fault, the ones it retried
//! and the last one it gave up after ([`faults`]): the worker's metrics read the counts
//! (`fleetrun_storage_faults_total{fault}`), and a warning says, at most every
//! [`WARN_EVERY_SECS`] seconds, that S3 throttles or fails and requests are retried.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A kind of fault of the storage service, as an operator tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// The service asked for fewer requests (S3's 503 SlowDown, 429).
    Throttled,
    /// The service failed on its side (S3's 500 InternalError, 502, 504).
    ServerError,
    /// No answer: the connection was refused, reset or timed out.
    Unreachable,
}

impl Fault {
    pub const ALL: [Fault; 3] = [Fault::Throttled, Fault::ServerError, Fault::Unreachable];

    /// The fault an answer of the service says, from its HTTP status and error code;
    /// `None` for an answer about the request itself (a missing object, a refusal).
    pub fn of_answer(status: u16, code: Option<&str>) -> Option<Fault> {
        const THROTTLING: [&str; 5] = [
            "SlowDown",
            "Throttling",
            "ThrottlingException",
            "RequestLimitExceeded",
            "TooManyRequests",
        ];
        const SERVER: [&str; 3] = ["InternalError", "ServiceUnavailable", "RequestTimeout"];
        match (status, code) {
            (_, Some(code)) if THROTTLING.contains(&code) => Some(Fault::Throttled),
            (_, Some(code)) if SERVER.contains(&code) => Some(Fault::ServerError),
            (429 | 503, _) => Some(Fault::Throttled),
            (500 | 502 | 504, _) => Some(Fault::ServerError),
            _ => None,
        }
    }

    /// Its name as a metric's label.
    pub fn label(self) -> &'static str {
        match self {
            Fault::Throttled => "throttled",
            Fault::ServerError => "server_error",
            Fault::Unreachable => "unreachable",
        }
    }

    /// The fault whose [`Fault::label`] is `label`.
    pub fn of_label(label: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.label() == label)
    }

    /// What `fleetrun status` says of a job whose pool's nodes meet this fault.
    pub fn retrying(self) -> &'static str {
        match self {
            Fault::Throttled => "S3 throttled, retrying",
            Fault::ServerError => "S3 failing on its side, retrying",
            Fault::Unreachable => "S3 unreachable, retrying",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Throttled => "throttled",
            Fault::ServerError => "failed on the server's side",
            Fault::Unreachable => "unreachable",
        })
    }
}

/// How often at most the warning that S3 faults are being retried is logged.
pub const WARN_EVERY_SECS: u64 = 10;

/// Counts of the faults this process's storage requests met, by kind.
#[derive(Debug, Default)]
pub struct FaultCounts {
    counts: [AtomicU64; 3],
    /// When the last warning was logged, in seconds since the Unix epoch.
    warned_at: AtomicU64,
}

static FAULTS: FaultCounts = FaultCounts {
    counts: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
    warned_at: AtomicU64::new(0),
};

/// The faults this process met so far.
pub fn faults() -> &'static FaultCounts {
    &FAULTS
}

impl FaultCounts {
    /// How many faults of kind `fault` were met.
    pub fn count(&self, fault: Fault) -> u64 {
        self.counts[fault as usize].load(Ordering::Relaxed)
    }

    /// The counts so far, by kind (in [`Fault::ALL`]'s order).
    pub fn tally(&self) -> Tally {
        Tally(Fault::ALL.map(|f| self.count(f)))
    }

    /// Counts one fault; true when it is time to warn of them (the first in
    /// [`WARN_EVERY_SECS`] seconds, at `now`, seconds since the Unix epoch).
    pub fn note(&self, fault: Fault, now: u64) -> bool {
        self.counts[fault as usize].fetch_add(1, Ordering::Relaxed);
        let last = self.warned_at.load(Ordering::Relaxed);
        now >= last + WARN_EVERY_SECS
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// The fault counts at one moment, to tell which kinds a process met since another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally([u64; 3]);

impl Tally {
    /// The kinds of fault counted between `before` and this tally.
    pub fn met_since(self, before: Tally) -> impl Iterator<Item = Fault> {
        Fault::ALL
            .into_iter()
            .filter(move |&f| self.0[f as usize] > before.0[f as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_told_apart_by_code_then_status() {
        assert_eq!(
            Fault::of_answer(503, Some("SlowDown")),
            Some(Fault::Throttled)
        );
        assert_eq!(Fault::of_answer(503, None), Some(Fault::Throttled));
        assert_eq!(Fault::of_answer(429, None), Some(Fault::Throttled));
        assert_eq!(
            Fault::of_answer(500, Some("InternalError")),
            Some(Fault::ServerError)
        );
        assert_eq!(Fault::of_answer(502, None), Some(Fault::ServerError));
        assert_eq!(
            Fault::of_answer(400, Some("RequestTimeout")),
            Some(Fault::ServerError)
        );
        for (status, code) in [
            (404, Some("NoSuchKey")),
            (403, Some("AccessDenied")),
            (400, Some("EntityTooSmall")),
            (404, None),
        ] {
            assert_eq!(Fault::of_answer(status, code), None, "{status} {code:?}");
        }
    }

    #[test]
    fn faults_are_counted_and_warned_of_once_a_period() {
        let counts = FaultCounts::default();
        assert!(counts.note(Fault::Throttled, 1_000));
        assert!(!counts.note(Fault::Throttled, 1_001));
        assert!(!counts.note(Fault::Unreachable, 1_000 + WARN_EVERY_SECS - 1));
        assert!(counts.note(Fault::ServerError, 1_000 + WARN_EVERY_SECS));
        assert_eq!(counts.count(Fault::Throttled), 2);
        assert_eq!(counts.count(Fault::ServerError), 1);
        assert_eq!(counts.count(Fault::Unreachable), 1);
    }

    #[test]
    fn a_tally_names_the_kinds_met_since_another() {
        let counts = FaultCounts::default();
        let start = counts.tally();
        assert_eq!(counts.tally().met_since(start).count(), 0);
        counts.note(Fault::Unreachable, 1);
        counts.note(Fault::Throttled, 1);
        counts.note(Fault::Throttled, 1);
        let later = counts.tally();
        let met: Vec<Fault> = later.met_since(start).collect();
        assert_eq!(met, [Fault::Throttled, Fault::Unreachable]);
        assert_eq!(counts.tally().met_since(later).count(), 0);
    }

    #[test]
    fn a_fault_is_known_again_by_its_label() {
        for fault in Fault::ALL {
            assert_eq!(Fault::of_label(fault.label()), Some(fault));
        }
        assert_eq!(Fault::of_label("other"), None);
    }
}
