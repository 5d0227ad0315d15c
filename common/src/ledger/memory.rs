//! The embedded ledger: one mutex around a map of jobs.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::journal::{Entry, Journal};
use super::{
    Forgot, InFlight, JobState, JobTimes, Ledger, LedgerError, Limits, Outcome, Recorded, Reopened,
    RunnerId, RunnerTimes, Started, Status, unix_now,
};

#[derive(Default)]
pub struct MemoryLedger {
    jobs: Mutex<HashMap<String, Job>>,
    /// Where the first recordings of one job are kept, to be replayed by a resumed run.
    journal: Option<Journal>,
}

struct Job {
    limits: Limits,
    status: Status,
    done: HashSet<u64>,
    parts: Refs,
    /// The bytes of parts the job keeps in its references ([`Ledger::reserve_part_bytes`]).
    part_bytes: u64,
    /// Set by [`Ledger::forget_parts`].
    parts_forgotten: bool,
    /// Who runs an attempt of each mini-batch not yet recorded.
    holders: HashMap<u64, String>,
    /// The attempts each mini-batch spent on the script's faults.
    spent: HashMap<u64, u32>,
    /// The outcome of each mini-batch recorded with failures, to be taken back if the job
    /// is reopened.
    failed: HashMap<u64, Outcome>,
    /// The job's report rows, in the order they were kept.
    report: Rows,
    /// Who finalizes the job, and until when.
    finalizer: Option<(String, Instant)>,
    /// Who publishes the job, and until when.
    publisher: Option<(String, Instant)>,
    /// When the ledger forgets the job (set once it has ended and is retired).
    forget_at: Option<Instant>,
    /// Each runner's times on the job ([`Ledger::add_runner_times`]).
    times: std::collections::BTreeMap<RunnerId, RunnerTimes>,
}

impl MemoryLedger {
    pub fn new() -> Self {
        Self::default()
    }

    /// An embedded ledger that writes the first recordings of the journal's job to it.
    pub fn journaled(journal: Journal) -> Self {
        MemoryLedger {
            journal: Some(journal),
            ..Self::default()
        }
    }

    /// Takes the recordings a journal kept for `job` (entered with [`Ledger::create`]) as
    /// its own: each mini-batch recorded whole is done again, with its counts, its part and
    /// its report row. One that failed, whole or in part, is left to run again. Returns how
    /// many were taken.
    pub fn replay(&self, job: &str, entries: &[Entry]) -> Result<u64, LedgerError> {
        self.with_job(job, |j| {
            let mut taken = 0;
            for entry in entries.iter().filter(|e| !e.batch_failed && e.failed == 0) {
                if !j.done.insert(entry.index) {
                    continue;
                }
                taken += 1;
                if let Some(part) = &entry.part {
                    j.parts.insert(entry.index, part);
                }
                if let Some(row) = &entry.row {
                    j.report.push(row);
                }
                j.status.done += 1;
                j.status.items_succeeded += entry.succeeded;
            }
            taken
        })
    }

    /// The jobs, with those whose time has come forgotten.
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Job>> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        jobs.retain(|_, j| j.forget_at.is_none_or(|at| at > now));
        jobs
    }

    fn with_job<T>(&self, job: &str, f: impl FnOnce(&mut Job) -> T) -> Result<T, LedgerError> {
        let mut jobs = self.jobs();
        let entry = jobs
            .get_mut(job)
            .ok_or_else(|| LedgerError::UnknownJob(job.to_owned()))?;
        Ok(f(entry))
    }
}

impl Job {
    /// The one place the state moves on counts: a limit exceeded fails the job, everything
    /// done finalizes it. Returns true if the state moved.
    fn settle_state(&mut self) -> bool {
        let s = &mut self.status;
        if s.state != JobState::Running {
            return false;
        }
        if let Some(reason) = self
            .limits
            .exceeded(s.items_failed, s.batches_failed, s.total)
        {
            s.state = JobState::Failed;
            s.reason = Some(reason);
            return true;
        }
        if s.total == Some(s.done) {
            s.state = JobState::Finalizing;
            return true;
        }
        false
    }
}

#[async_trait]
impl Ledger for MemoryLedger {
    async fn create(&self, job: &str, limits: Limits) -> Result<(), LedgerError> {
        let mut jobs = self.jobs();
        if jobs.contains_key(job) {
            return Err(LedgerError::JobExists(job.to_owned()));
        }
        jobs.insert(
            job.to_owned(),
            Job {
                limits,
                status: Status {
                    updated_at: Some(unix_now()),
                    ..Status::new()
                },
                done: HashSet::new(),
                parts: Refs::default(),
                part_bytes: 0,
                parts_forgotten: false,
                holders: HashMap::new(),
                spent: HashMap::new(),
                failed: HashMap::new(),
                report: Rows::default(),
                finalizer: None,
                publisher: None,
                forget_at: None,
                times: Default::default(),
            },
        );
        Ok(())
    }

    async fn seal(&self, job: &str, total: u64) -> Result<Recorded, LedgerError> {
        self.with_job(job, |j| {
            let first = j.status.total.is_none();
            if first {
                j.status.total = Some(total);
            }
            let transitioned = first && j.settle_state();
            if transitioned {
                j.status.updated_at = Some(unix_now());
            }
            Recorded {
                first,
                transitioned,
                status: j.status.clone(),
            }
        })
    }

    async fn record_attempt(
        &self,
        job: &str,
        index: u64,
        outcome: Outcome,
        part: Option<&str>,
        row: Option<&str>,
    ) -> Result<Recorded, LedgerError> {
        let journal = self.journal.as_ref();
        let recorded = self.with_job(job, |j| {
            j.holders.remove(&index);
            if let Some(row) = row {
                j.report.push(row);
            }
            let first = j.done.insert(index);
            let mut transitioned = false;
            if first {
                if let Some(part) = part {
                    j.parts.insert(index, part);
                }
                let s = &mut j.status;
                s.updated_at = Some(unix_now());
                s.done += 1;
                s.items_succeeded += outcome.succeeded;
                s.items_failed += outcome.failed;
                s.batches_failed += u64::from(outcome.batch_failed);
                if outcome.failed > 0 || outcome.batch_failed {
                    j.failed.insert(index, outcome);
                }
                transitioned = j.settle_state();
            }
            Recorded {
                first,
                transitioned,
                status: j.status.clone(),
            }
        })?;
        // Written once the ledger is let go: a write never holds up another recording.
        if recorded.first
            && let Some(journal) = journal.filter(|journal| journal.job() == job)
        {
            journal.write(&Entry {
                index,
                succeeded: outcome.succeeded,
                failed: outcome.failed,
                batch_failed: outcome.batch_failed,
                part: part.map(str::to_owned),
                row: row.map(str::to_owned),
            });
        }
        Ok(recorded)
    }

    async fn attempt_started(
        &self,
        job: &str,
        index: u64,
        holder: &str,
    ) -> Result<Started, LedgerError> {
        self.with_job(job, |j| Started {
            lost: j
                .holders
                .insert(index, holder.to_owned())
                .filter(|before| before != holder),
            spent: j.spent.get(&index).copied().unwrap_or(0),
        })
    }

    async fn attempt_ended(
        &self,
        job: &str,
        index: u64,
        row: Option<&str>,
        charged: bool,
    ) -> Result<Option<String>, LedgerError> {
        self.with_job(job, |j| {
            if let Some(row) = row {
                j.report.push(row);
            }
            if charged {
                *j.spent.entry(index).or_default() += 1;
            }
            j.holders.remove(&index)
        })
    }

    async fn in_flight(&self, job: &str) -> Result<Vec<InFlight>, LedgerError> {
        self.with_job(job, |j| {
            let mut held: Vec<InFlight> = j
                .holders
                .iter()
                .map(|(index, holder)| InFlight {
                    index: *index,
                    holder: holder.clone(),
                    spent: j.spent.get(index).copied().unwrap_or(0),
                })
                .collect();
            held.sort_unstable_by_key(|h| h.index);
            held
        })
    }

    async fn report(&self, job: &str, row: &str) -> Result<(), LedgerError> {
        self.with_job(job, |j| j.report.push(row))
    }

    async fn report_rows(
        &self,
        job: &str,
        start: u64,
        count: u64,
    ) -> Result<Vec<String>, LedgerError> {
        self.with_job(job, |j| j.report.range(start, count))
    }

    async fn recorded(&self, job: &str, indices: Range<u64>) -> Result<Vec<bool>, LedgerError> {
        self.with_job(job, |j| indices.map(|i| j.done.contains(&i)).collect())
    }

    async fn parts(
        &self,
        job: &str,
        indices: Range<u64>,
    ) -> Result<Vec<Option<String>>, LedgerError> {
        self.with_job(job, |j| {
            if j.parts_forgotten {
                return Err(LedgerError::PartsForgotten(job.to_owned()));
            }
            Ok(indices.map(|i| j.parts.get(i)).collect())
        })?
    }

    async fn reserve_part_bytes(
        &self,
        job: &str,
        bytes: u64,
        budget: u64,
    ) -> Result<bool, LedgerError> {
        self.with_job(job, |j| {
            j.part_bytes = j.part_bytes.saturating_add(bytes);
            j.part_bytes <= budget
        })
    }

    async fn forget_parts(&self, job: &str) -> Result<(), LedgerError> {
        self.with_job(job, |j| {
            j.parts = Refs::default();
            j.parts_forgotten = true;
        })
    }

    async fn transition(
        &self,
        job: &str,
        from: &[JobState],
        to: JobState,
        reason: Option<&str>,
    ) -> Result<(bool, Status), LedgerError> {
        self.with_job(job, |j| {
            let moved = from.contains(&j.status.state);
            if moved {
                j.status.state = to;
                j.status.updated_at = Some(unix_now());
                if let Some(reason) = reason {
                    j.status.reason = Some(reason.to_owned());
                }
            }
            (moved, j.status.clone())
        })
    }

    async fn claim_finalization(
        &self,
        job: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LedgerError> {
        self.with_job(job, |j| {
            j.status.state == JobState::Finalizing && take_lease(&mut j.finalizer, owner, lease)
        })
    }

    async fn claim_publication(
        &self,
        job: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, LedgerError> {
        self.with_job(job, |j| {
            j.status.state == JobState::Running
                && j.status.total.is_none()
                && take_lease(&mut j.publisher, owner, lease)
        })
    }

    async fn created(&self, job: &str, mini_batches: u64) -> Result<(), LedgerError> {
        self.with_job(job, |j| {
            j.status.created = j.status.created.max(mini_batches);
        })
    }

    async fn started(&self, job: &str) -> Result<(), LedgerError> {
        self.with_job(job, |j| j.status.started = true)
    }

    async fn status(&self, job: &str) -> Result<Option<Status>, LedgerError> {
        Ok(self.jobs().get(job).map(|j| j.status.clone()))
    }

    async fn reopen(&self, job: &str) -> Result<Reopened, LedgerError> {
        self.with_job(job, |j| {
            let state = j.status.state;
            if !state.is_resumable() {
                return Err(LedgerError::NotResumable {
                    job: job.to_owned(),
                    state,
                });
            }
            let s = &mut j.status;
            for (index, outcome) in j.failed.drain() {
                if j.done.remove(&index) {
                    j.parts.remove(index);
                    s.done -= 1;
                    s.items_succeeded -= outcome.succeeded;
                    s.items_failed -= outcome.failed;
                    s.batches_failed -= u64::from(outcome.batch_failed);
                }
            }
            j.holders.clear();
            j.spent.clear();
            j.finalizer = None;
            j.publisher = None;
            j.forget_at = None;
            s.state = JobState::Running;
            s.reason = None;
            s.run += 1;
            s.updated_at = Some(unix_now());
            let transitioned = j.settle_state();
            Ok(Reopened {
                done: j.done.iter().copied().collect(),
                recorded: Recorded {
                    first: true,
                    transitioned,
                    status: j.status.clone(),
                },
            })
        })?
    }

    async fn forget_failure(&self, job: &str, index: u64) -> Result<Forgot, LedgerError> {
        // A journaled run needs no entry for it: a resumed run replays only recordings
        // without failures, and the mini-batch's next recording is a first one again.
        self.with_job(job, |j| {
            if j.status.state != JobState::Running {
                return Forgot::NotRunning(j.status.state);
            }
            let Some(outcome) = j.failed.remove(&index) else {
                return if j.done.contains(&index) {
                    Forgot::NotFailed
                } else {
                    Forgot::NotRecorded
                };
            };
            j.done.remove(&index);
            j.parts.remove(index);
            j.holders.remove(&index);
            j.spent.remove(&index);
            let s = &mut j.status;
            s.done -= 1;
            s.items_succeeded -= outcome.succeeded;
            s.items_failed -= outcome.failed;
            s.batches_failed -= u64::from(outcome.batch_failed);
            s.updated_at = Some(unix_now());
            Forgot::Forgotten(j.status.clone())
        })
    }

    async fn add_runner_times(
        &self,
        job: &str,
        runner: &RunnerId,
        times: &RunnerTimes,
    ) -> Result<(), LedgerError> {
        self.with_job(job, |j| {
            j.times.entry(runner.clone()).or_default().add_all(times);
        })
    }

    async fn runner_times(&self, job: &str) -> Result<JobTimes, LedgerError> {
        self.with_job(job, |j| {
            j.times.iter().map(|(id, t)| (id.clone(), *t)).collect()
        })
    }

    async fn retire(&self, job: &str, keep: Duration) -> Result<bool, LedgerError> {
        self.with_job(job, |j| {
            let ended = j.status.state.is_terminal();
            if ended {
                j.forget_at = Some(Instant::now() + keep);
            }
            ended
        })
    }
}

/// Gives `owner` the lease (until `lease` from now) unless another holds it unexpired.
fn take_lease(held: &mut Option<(String, Instant)>, owner: &str, lease: Duration) -> bool {
    let now = Instant::now();
    if let Some((holder, until)) = held
        && holder != owner
        && *until > now
    {
        return false;
    }
    *held = Some((owner.to_owned(), now + lease));
    true
}

/// A job's report rows in one buffer: a running job keeps one row per mini-batch, and a
/// `String` each would cost a third more than the rows' own bytes (a local run's memory is
/// mostly these and the part references, docs/benchmarks.md).
#[derive(Default)]
struct Rows {
    text: String,
    /// Where each row ends in `text`.
    ends: Vec<usize>,
}

impl Rows {
    fn push(&mut self, row: &str) {
        self.text.push_str(row);
        self.ends.push(self.text.len());
    }

    /// Rows `start..start + count` (those of them there are).
    fn range(&self, start: u64, count: u64) -> Vec<String> {
        let first = usize::try_from(start).unwrap_or(usize::MAX);
        let last = first.saturating_add(usize::try_from(count).unwrap_or(usize::MAX));
        (first..last.min(self.ends.len()))
            .map(|i| {
                let from = if i == 0 { 0 } else { self.ends[i - 1] };
                self.text[from..self.ends[i]].to_owned()
            })
            .collect()
    }
}

/// A job's part references by mini-batch, in one buffer (see [`Rows`]). A reference taken
/// back leaves its bytes behind, which only a reopened job's failed mini-batches do.
#[derive(Default)]
struct Refs {
    text: String,
    /// Where each mini-batch's reference is in `text`.
    spans: HashMap<u64, (usize, usize)>,
}

impl Refs {
    fn insert(&mut self, index: u64, part: &str) {
        let start = self.text.len();
        self.text.push_str(part);
        self.spans.insert(index, (start, self.text.len()));
    }

    fn get(&self, index: u64) -> Option<String> {
        let &(start, end) = self.spans.get(&index)?;
        Some(self.text[start..end].to_owned())
    }

    fn remove(&mut self, index: u64) {
        self.spans.remove(&index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a job keeps per recorded mini-batch (its report row, its part's reference) is
    /// packed: no allocation of its own, however many mini-batches it has.
    #[test]
    fn recordings_are_kept_without_an_allocation_each() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ledger = MemoryLedger::new();
        runtime
            .block_on(ledger.create(
                "j",
                Limits {
                    error_threshold: -1,
                    allowed_failed_count: None,
                    allowed_failed_percent: 100.0,
                },
            ))
            .unwrap();
        let n = 10_000;
        let kept = crate::allocation::kept_during(|| {
            runtime.block_on(async {
                for index in 0..n {
                    let outcome = Outcome {
                        succeeded: 10,
                        failed: 0,
                        batch_failed: false,
                    };
                    let part = format!("0-writer-000@{}+180", index * 180);
                    let row = format!("{index},1,succeeded,10,10,0,0,process000,2026-11-27 12:14:45.691,0.001,0.000,");
                    ledger
                        .record_attempt("j", index, outcome, Some(&part), Some(&row))
                        .await
                        .unwrap();
                }
            });
        });
        assert!(kept < 100, "{kept} allocations kept for {n} recordings");
        let rows = runtime.block_on(ledger.report_rows("j", 9_999, 5)).unwrap();
        assert_eq!(rows.len(), 1);
        assert!(rows[0].starts_with("9999,1,succeeded"), "{rows:?}");
        let parts = runtime.block_on(ledger.parts("j", 4..6)).unwrap();
        assert_eq!(
            parts,
            [
                Some("0-writer-000@720+180".to_owned()),
                Some("0-writer-000@900+180".to_owned())
            ]
        );
    }
}
