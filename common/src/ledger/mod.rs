//! The ledger: a job's count, changed only by atomic, idempotent steps.
//!
//! Every step that decides something — record a mini-batch's outcome once, check the
//! thresholds, seal the total, detect completion, flip the state — is one atomic operation
//! of the implementation (a Lua script on Redis, a mutex in process), so two workers can
//! never both see "first completion" or both flip the state. The state moves
//! `Running → Finalizing → Completed`, or to `Failed`/`Canceled`/`Expired`, and never back
//! (but by a resume, which reopens a job that failed, was canceled or expired).

mod endpoint;
pub mod journal;
mod memory;
pub mod redis;
mod registry;
mod replicas;
pub mod times;

pub use registry::{FaultNote, JobRegistry, MemoryRegistry, RedisRegistry};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use memory::MemoryLedger;
pub use times::{JobTimes, RunnerId, RunnerTimes};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("job {0} is not in the ledger")]
    UnknownJob(String),
    #[error("job {0} is already in the ledger")]
    JobExists(String),
    #[error("job {job} is {state}: only a job that failed, was canceled or expired can be resumed")]
    NotResumable { job: String, state: JobState },
    #[error("job {0} is Completed: its parts went once its output was written")]
    PartsForgotten(String),
    /// A Redis call failed (after its retries, when a new try might have passed); `step`
    /// says which.
    #[error("ledger backend: redis {step}: {source}")]
    Redis {
        step: &'static str,
        #[source]
        source: ::redis::RedisError,
    },
    /// A field of the job's state in the ledger does not read as what it holds.
    #[error("ledger backend: job {job}: bad ledger field {field}")]
    Corrupt { job: String, field: String },
    /// A count too large for the ledger's signed 64-bit counters.
    #[error("ledger backend: count {0} out of range")]
    OutOfRange(u64),
    /// The TLS handshake with the ledger's Redis failed: `redis` is its URL, redacted.
    #[error("TLS with Redis {redis} failed: {cause}")]
    Tls {
        redis: String,
        cause: crate::tls::TlsCause,
    },
}

impl LedgerError {
    /// Whether a later try of the same call may pass: Redis dropped the connection, timed
    /// out, or asked to wait (loading, failing over). What the ledger answers about a job,
    /// a corrupt field and a failed TLS handshake are not.
    pub fn is_transient(&self) -> bool {
        match self {
            LedgerError::Redis { source, .. } => redis::is_transient(source),
            LedgerError::UnknownJob(_)
            | LedgerError::JobExists(_)
            | LedgerError::NotResumable { .. }
            | LedgerError::PartsForgotten(_)
            | LedgerError::Corrupt { .. }
            | LedgerError::OutOfRange(_)
            | LedgerError::Tls { .. } => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Mini-batches are being created and processed.
    Running,
    /// Every mini-batch is done; the finalizer is writing the output.
    Finalizing,
    Completed,
    Failed,
    Canceled,
    /// Its deadline passed before it finished: the rows of every finished mini-batch are in
    /// its output, the others are listed as unfinished, and a resume runs only those.
    Expired,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Canceled | JobState::Expired
        )
    }

    /// True for an ended job that a resume may continue: one that failed, was canceled or
    /// expired.
    pub fn is_resumable(self) -> bool {
        matches!(
            self,
            JobState::Failed | JobState::Canceled | JobState::Expired
        )
    }

    /// True while workers should still process the job's mini-batches.
    pub fn accepts_work(self) -> bool {
        self == JobState::Running
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "Running",
            JobState::Finalizing => "Finalizing",
            JobState::Completed => "Completed",
            JobState::Failed => "Failed",
            JobState::Canceled => "Canceled",
            JobState::Expired => "Expired",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        [
            JobState::Running,
            JobState::Finalizing,
            JobState::Completed,
            JobState::Failed,
            JobState::Canceled,
            JobState::Expired,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stop rules of CONTRACT.md §2: the job fails as soon as any is exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Failed items tolerated; -1 = no limit.
    pub error_threshold: i64,
    /// Failed mini-batches tolerated; `None` = no limit.
    pub allowed_failed_count: Option<u64>,
    /// Failed mini-batches tolerated, as a percentage of all mini-batches.
    pub allowed_failed_percent: f64,
}

impl Limits {
    /// No limit at all.
    pub const NONE: Limits = Limits {
        error_threshold: -1,
        allowed_failed_count: None,
        allowed_failed_percent: 100.0,
    };

    /// Which limit the counts exceed, as the reason the job failed. `total` is the number of
    /// mini-batches once sealed (the percentage is judged only then).
    pub fn exceeded(
        &self,
        failed_items: u64,
        failed_batches: u64,
        total: Option<u64>,
    ) -> Option<String> {
        if self.error_threshold >= 0 && failed_items > self.error_threshold as u64 {
            return Some(format!(
                "error_threshold exceeded: {failed_items} failed items > {}",
                self.error_threshold
            ));
        }
        if let Some(allowed) = self.allowed_failed_count
            && failed_batches > allowed
        {
            return Some(format!(
                "allowed_failed_count exceeded: {failed_batches} failed mini-batches > {allowed}"
            ));
        }
        if let Some(total) = total
            && total > 0
            && failed_batches as f64 * 100.0 > self.allowed_failed_percent * total as f64
        {
            return Some(format!(
                "allowed_failed_percent exceeded: {failed_batches} of {total} mini-batches failed (> {}%)",
                self.allowed_failed_percent
            ));
        }
        None
    }
}

/// What one mini-batch came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Items that succeeded (returned elements, at most the items given).
    pub succeeded: u64,
    /// Items that failed.
    pub failed: u64,
    /// The mini-batch failed: it raised, timed out or returned fewer elements than it got.
    pub batch_failed: bool,
}

impl Outcome {
    /// A mini-batch that failed whole: every one of its `items` failed.
    pub const fn all_failed(items: u64) -> Outcome {
        Outcome {
            succeeded: 0,
            failed: items,
            batch_failed: true,
        }
    }
}

/// A job's count at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub state: JobState,
    /// Mini-batches in the job; `None` until the producer has sealed it.
    pub total: Option<u64>,
    /// Mini-batches recorded so far.
    pub done: u64,
    /// Mini-batches the producer has published so far, as it last said (see
    /// [`Ledger::created`]); the stop rules watch it move.
    pub created: u64,
    /// A runner has started one of the job's mini-batches (`first_task_creation_timeout` is
    /// met).
    pub started: bool,
    pub items_succeeded: u64,
    pub items_failed: u64,
    pub batches_failed: u64,
    /// Why the job failed or was canceled.
    pub reason: Option<String>,
    /// When the job last moved: entered, a mini-batch recorded for the first time, or a
    /// change of state; seconds since the Unix epoch, by the ledger's clock.
    #[serde(default)]
    pub updated_at: Option<f64>,
    /// How many times the job was resumed ([`Ledger::reopen`]): 0 for its first run. The
    /// mini-batches published by each run carry its number, so a worker tells a resumed
    /// job's work from what an earlier run left in the queue.
    #[serde(default)]
    pub run: u32,
}

impl Status {
    pub fn new() -> Status {
        Status {
            state: JobState::Running,
            total: None,
            done: 0,
            created: 0,
            started: false,
            items_succeeded: 0,
            items_failed: 0,
            batches_failed: 0,
            reason: None,
            updated_at: None,
            run: 0,
        }
    }
}

/// What [`Ledger::attempt_started`] learned of a mini-batch's attempts before this one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Started {
    /// The holder of an attempt that ended with no word (lost with its worker), if any.
    pub lost: Option<String>,
    /// Attempts the mini-batch spent on the script's faults (see [`Ledger::attempt_ended`]).
    pub spent: u32,
}

/// A mini-batch in flight (see [`Ledger::in_flight`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub index: u64,
    /// Who holds it, as noted by [`Ledger::attempt_started`].
    pub holder: String,
    /// Attempts it spent on the script's faults before this one.
    pub spent: u32,
}

/// What [`Ledger::reopen`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Reopened {
    /// The mini-batches that stay done (recorded whole), in no order: the others run again.
    pub done: Vec<u64>,
    /// The job after: Running in its new run, or Finalizing (`transitioned`) when every
    /// mini-batch of its sealed total stays done.
    pub recorded: Recorded,
}

/// What [`Ledger::forget_failure`] found of a mini-batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Forgot {
    /// Its failure was taken back: it is not done, and runs again with a fresh budget of
    /// attempts. The job's status after.
    Forgotten(Status),
    /// It was recorded without a failure: there is nothing to take back.
    NotFailed,
    /// It has not been recorded.
    NotRecorded,
    /// The job is not Running: its counts stand.
    NotRunning(JobState),
}

/// Now, in seconds since the Unix epoch: the embedded ledger's clock.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl Default for Status {
    fn default() -> Self {
        Status::new()
    }
}

/// The answer to a recording step.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// True the first time this mini-batch was recorded; a repeat changes nothing.
    pub first: bool,
    /// True when this very step moved the job's state (to Finalizing or Failed): its caller
    /// owns what follows (finalizing, or announcing the failure).
    pub transitioned: bool,
    pub status: Status,
}

#[async_trait]
pub trait Ledger: Send + Sync {
    /// Enters a new job, Running, with its limits.
    async fn create(&self, job: &str, limits: Limits) -> Result<(), LedgerError>;
    /// Seals the number of mini-batches; the job moves to Finalizing if all are done.
    async fn seal(&self, job: &str, total: u64) -> Result<Recorded, LedgerError>;
    /// Records a mini-batch's outcome once, adds its failures and checks the limits. `part`
    /// names where the mini-batch's output part is (see [`Ledger::parts`]); only the first
    /// recording's is kept, so the output holds the rows that were counted.
    async fn record(
        &self,
        job: &str,
        index: u64,
        outcome: Outcome,
        part: Option<&str>,
    ) -> Result<Recorded, LedgerError> {
        self.record_attempt(job, index, outcome, part, None).await
    }
    /// [`Ledger::record`] for the attempt that ends the mini-batch, in the same step: keeps
    /// the attempt's `row` of the job's report (every attempt's, first or not; a retried
    /// call's once) and forgets who holds the mini-batch. A row is kept if and only if its
    /// attempt was recorded, so an attempt whose worker died before its recording is the
    /// next holder's to report lost.
    async fn record_attempt(
        &self,
        job: &str,
        index: u64,
        outcome: Outcome,
        part: Option<&str>,
        row: Option<&str>,
    ) -> Result<Recorded, LedgerError>;
    /// Notes that `holder` (an opaque text that names who runs it, unique per attempt) runs
    /// an attempt of mini-batch `index`. Returns the holder noted before, if any, other than
    /// `holder` (an attempt that ended with neither [`Ledger::attempt_ended`] nor a
    /// recording, lost with whoever held it), and the attempts the mini-batch has spent.
    async fn attempt_started(
        &self,
        job: &str,
        index: u64,
        holder: &str,
    ) -> Result<Started, LedgerError>;
    /// Notes that an attempt of mini-batch `index` ended unrecorded (it failed, and another
    /// follows): keeps its `row` of the job's report, counts it among the mini-batch's spent
    /// attempts when it was the script's fault (`charged`), and forgets who holds the
    /// mini-batch, returning the holder noted, if any. A retried call counts once.
    async fn attempt_ended(
        &self,
        job: &str,
        index: u64,
        row: Option<&str>,
        charged: bool,
    ) -> Result<Option<String>, LedgerError>;
    /// The attempts in flight: each mini-batch someone holds (noted by
    /// [`Ledger::attempt_started`], not yet ended or recorded), by index.
    async fn in_flight(&self, job: &str) -> Result<Vec<InFlight>, LedgerError>;
    /// Keeps a row of the job's report that no attempt's end brings (an attempt lost with
    /// its worker, noted by the next holder).
    async fn report(&self, job: &str, row: &str) -> Result<(), LedgerError>;
    /// The job's report rows `start..start + count`, in the order they were kept.
    async fn report_rows(
        &self,
        job: &str,
        start: u64,
        count: u64,
    ) -> Result<Vec<String>, LedgerError>;
    /// Whether each mini-batch of `indices` is recorded, in order: what an expired job
    /// finished, and what it left.
    async fn recorded(
        &self,
        job: &str,
        indices: std::ops::Range<u64>,
    ) -> Result<Vec<bool>, LedgerError>;
    /// The part recorded for each mini-batch of `indices`, in order (`None`: not recorded,
    /// or recorded without a part).
    async fn parts(
        &self,
        job: &str,
        indices: std::ops::Range<u64>,
    ) -> Result<Vec<Option<String>>, LedgerError>;
    /// Counts `bytes` more of the job's parts kept in the ledger itself (small parts travel
    /// in their references, [`Ledger::parts`]): true while the job's total stays within
    /// `budget`, so the ledger's memory does not grow with the job. A refused reservation
    /// is still counted: once over its budget, a job's parts go elsewhere.
    async fn reserve_part_bytes(
        &self,
        job: &str,
        bytes: u64,
        budget: u64,
    ) -> Result<bool, LedgerError>;
    /// Forgets the part references of a Completed job, whose output is written: the parts
    /// they name are removed with them. [`Ledger::parts`] is then an error
    /// ([`LedgerError::PartsForgotten`]), so a finalizer that lost its lease can never
    /// write an output without them.
    async fn forget_parts(&self, job: &str) -> Result<(), LedgerError>;
    /// Moves the job to `to` if its state is one of `from`, keeping `reason`. Returns whether
    /// it moved, and the status after.
    async fn transition(
        &self,
        job: &str,
        from: &[JobState],
        to: JobState,
        reason: Option<&str>,
    ) -> Result<(bool, Status), LedgerError>;
    /// Notes that the producer has published `mini_batches` so far; the ledger keeps the
    /// highest number it was told, so a producer that starts over never moves it back.
    async fn created(&self, job: &str, mini_batches: u64) -> Result<(), LedgerError>;
    /// Notes that a runner started one of the job's mini-batches.
    async fn started(&self, job: &str) -> Result<(), LedgerError>;
    /// The job's status, or `None` if the ledger does not know the job.
    async fn status(&self, job: &str) -> Result<Option<Status>, LedgerError>;
    /// Claims, or renews, the finalization of a Finalizing job for `owner` until `lease`
    /// from now. True if `owner` holds it. Another owner's claim stands until its lease runs
    /// out: a finalizer that keeps renewing keeps it, and one that died is replaced.
    async fn claim_finalization(
        &self,
        job: &str,
        owner: &str,
        lease: std::time::Duration,
    ) -> Result<bool, LedgerError>;
    /// Claims, or renews, the publication of a Running job that is not sealed yet for
    /// `owner` until `lease` from now: true if `owner` holds it. One submitter publishes a
    /// job at a time; others with the same id attach, and take over only once the holder's
    /// lease runs out (it died). A sealed or ended job is claimed by no one.
    async fn claim_publication(
        &self,
        job: &str,
        owner: &str,
        lease: std::time::Duration,
    ) -> Result<bool, LedgerError>;
    /// Reopens a job that failed, was canceled or expired, to continue it: each mini-batch recorded
    /// whole stays done with its counts, part and report rows; each that failed, whole or in
    /// part, is forgotten with its counts and part, to run again; every attempt's holder
    /// and spent count, the reason and the leases go; the job is Running again in its next
    /// run ([`Status::run`]) and kept until it ends again (a retired job's expiry is
    /// lifted). A job of all its sealed total done moves on to Finalizing (`transitioned`).
    /// [`LedgerError::NotResumable`] for a job in another state; a retried call answers as
    /// the first did.
    async fn reopen(&self, job: &str) -> Result<Reopened, LedgerError>;
    /// Takes back the failure of mini-batch `index` of a Running job, to run it again (a
    /// dead letter replayed): as [`Ledger::reopen`] does for each failed mini-batch, it is no
    /// longer done, its counts, part, holder and spent attempts are forgotten, and its report
    /// rows stay. Anything else ([`Forgot`]) changes nothing; a retried call answers as the
    /// first did.
    async fn forget_failure(&self, job: &str, index: u64) -> Result<Forgot, LedgerError>;
    /// Keeps an ended job (Completed, Failed, Canceled, Expired) `keep` longer, then forgets it: from
    /// then on the ledger does not know the job. True if the job has ended; a Running or
    /// Finalizing job is left as it is.
    async fn retire(&self, job: &str, keep: std::time::Duration) -> Result<bool, LedgerError>;
    /// Adds `times` (seconds a runner spent since its node's last flush, by phase) to
    /// `runner`'s times on the job. Nodes flush what their runners accumulate every few
    /// seconds, never per mini-batch; the times go with the job when it is retired. Not
    /// idempotent: a retried call may count twice, which costs a flush's seconds at most.
    async fn add_runner_times(
        &self,
        job: &str,
        runner: &RunnerId,
        times: &RunnerTimes,
    ) -> Result<(), LedgerError>;
    /// Every runner's times on the job, by runner (empty before any flush).
    async fn runner_times(&self, job: &str) -> Result<JobTimes, LedgerError>;
}
