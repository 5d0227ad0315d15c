//! A job's life: the one handle through which any process moves a job between its states
//! (Running, Finalizing, Completed, Failed, Canceled, Expired) and writes its result files.
//!
//! Every move is one atomic ledger step, so of all the parties that may end a job (a node
//! whose recording breaks a limit or does the last mini-batch, a watcher whose stop rule
//! fires, the finalizer, a cancel, the submitter) exactly one moves it, and only that one
//! writes the results. Nothing outside this file and `common/` calls
//! [`Ledger::transition`], [`Ledger::record_attempt`], [`Ledger::seal`] or
//! [`Ledger::reopen`].

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fleetrun_common::events::{Counts, Events, JobEvent};
use fleetrun_common::ledger::{
    JobState, JobTimes, Ledger, LedgerError, Outcome, Recorded, Reopened, RunnerId, RunnerTimes,
    Started, Status,
};
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_config::{JobSpec, Location, OutputAction};
use futures::future::{Either, MaybeDone, maybe_done, select};
use tracing::{info, warn};

use super::driver::{Ending, Stop};
use super::error::JobError;
use super::manifest::{self, Manifest, OutputDigests};
use super::record::{JobRecord, unix_now};
use super::results;
use super::settings::{Fleet, open_storage};
use crate::logs::{self, JobLogs};
use crate::output::OutputGuard;
use crate::parts::{self, PartError, Parts};

/// Why a job whose mini-batches are all recorded could not have its output written: the
/// message names the file, and becomes the job's failure reason.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("writing the output file failed: {0}")]
    Output(#[source] PartError),
    #[error("writing logs/{file} failed: {0}", file = logs::FAILED_ITEMS_CSV)]
    FailedItems(#[source] PartError),
    #[error("writing logs/{file} failed: {0}", file = logs::REPORT_CSV)]
    Report(#[source] ReportError),
}

/// Why the mini-batch report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Ledger(LedgerError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A job, and the ledger and output through which its life is moved and told.
#[derive(Clone)]
pub struct Job {
    id: String,
    /// The pool whose workers serve it.
    pool: String,
    /// The spec as this process uses it (on a node, with its code and side inputs staged).
    spec: Arc<JobSpec>,
    /// Seconds since the Unix epoch, from the job's record.
    submitted_at: f64,
    ledger: Arc<dyn Ledger>,
    /// Where each change of its state is told.
    events: Arc<dyn Events>,
    output: Arc<dyn Storage>,
    /// Where its mini-batches' rows and failed items wait for the end of the job.
    parts: Arc<dyn Parts>,
    /// Held shared by each call of this process that may end the job, from before it moves
    /// the job's state to after it wrote the results; taken whole by [`Job::quiet`].
    ending: Arc<tokio::sync::RwLock<()>>,
}

impl Job {
    /// The job `id` on `fleet`'s ledger and events; `writer` names this process among the
    /// writers of the job's parts ([`parts::writer_name`]).
    pub fn new(
        id: &str,
        spec: JobSpec,
        submitted_at: f64,
        fleet: &Fleet,
        output: Arc<dyn Storage>,
        writer: &str,
    ) -> Job {
        Job {
            id: id.to_owned(),
            pool: fleet.pool.clone(),
            spec: Arc::new(spec),
            submitted_at,
            ledger: fleet.ledger.clone(),
            events: fleet.events.clone(),
            parts: parts::for_job(output.clone(), fleet.ledger.clone(), id, writer),
            output,
            ending: Arc::default(),
        }
    }

    /// Held while a call ends the job: its state moved, then its results written. Whoever
    /// ends the job outside this type (the finalization, see `finalize::conclude`) holds it
    /// from before the move.
    pub async fn ending(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.ending.read().await
    }

    /// Waits until no call of this process is ending the job, and keeps any from starting
    /// while the guard lives: a node letting the job go writes its last files after the
    /// job's results, never beside them.
    pub async fn quiet(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.ending.write().await
    }

    /// The job of `record` on the fleet, with its output opened, for a process that ends
    /// it or finalizes it but runs none of its mini-batches (a submitter, a watcher of a
    /// job it does not serve).
    pub async fn open(fleet: &Fleet, id: &str, record: &JobRecord) -> Result<Job, JobError> {
        let output = open_storage(&record.spec.output, &fleet.s3).await?;
        let writer = parts::writer_name("submit");
        let spec = record.spec.clone();
        Ok(Job::new(
            id,
            spec,
            record.submitted_at,
            fleet,
            output,
            &writer,
        ))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Seconds since the Unix epoch, from the job's record.
    pub fn submitted_at(&self) -> f64 {
        self.submitted_at
    }

    /// How long ago the job was submitted, by this process's clock.
    pub fn age(&self) -> Duration {
        Duration::from_secs_f64((unix_now() - self.submitted_at).max(0.0))
    }

    /// Where the job's output file and `logs/` go.
    pub fn output(&self) -> &Arc<dyn Storage> {
        &self.output
    }

    /// Where the job's mini-batches' rows and failed items wait for the end of the job.
    pub fn parts(&self) -> &dyn Parts {
        &*self.parts
    }

    /// The job's state and counts, `None` once the ledger forgot it.
    pub async fn status(&self) -> Result<Option<Status>, LedgerError> {
        self.ledger.status(&self.id).await
    }

    /// Records mini-batch `index`'s outcome (and its part, and the report row of the attempt
    /// that ends it); only the first recording counts. A recording that breaks a limit moves
    /// the job to Failed, one that does its last mini-batch moves it to Finalizing:
    /// `transitioned` says this call moved it, and its caller then owns what follows
    /// ([`super::conclude`]).
    pub async fn record(
        &self,
        index: u64,
        outcome: Outcome,
        part: Option<&str>,
        row: Option<&str>,
    ) -> Result<Recorded, LedgerError> {
        let recorded = self
            .ledger
            .record_attempt(&self.id, index, outcome, part, row);
        let recorded = recorded.await?;
        if recorded.transitioned {
            self.announce(&recorded.status).await;
        }
        Ok(recorded)
    }

    /// Notes that `holder` runs an attempt of mini-batch `index`; returns a holder noted
    /// before that ended with no word, and the attempts the mini-batch spent (see
    /// [`Ledger::attempt_started`]).
    pub async fn attempt_started(&self, index: u64, holder: &str) -> Result<Started, LedgerError> {
        self.ledger.attempt_started(&self.id, index, holder).await
    }

    /// Keeps the report `row` of an attempt of mini-batch `index` that ended unrecorded,
    /// spends it when it was the script's fault (`charged`), and forgets its holder,
    /// returning the holder noted, if any.
    pub async fn attempt_ended(
        &self,
        index: u64,
        row: Option<&str>,
        charged: bool,
    ) -> Result<Option<String>, LedgerError> {
        self.ledger
            .attempt_ended(&self.id, index, row, charged)
            .await
    }

    /// Ends a Running job as its stop rules say (`stop`): expires it once its deadline
    /// passed (its manifest lists `input`), else fails it. `logs` are this process's log
    /// files of the job, when it has any. Returns the status after.
    pub async fn stop(
        &self,
        stop: Stop,
        input: &dyn Storage,
        logs: Option<&JobLogs>,
    ) -> Result<Status, LedgerError> {
        if stop.ending == Ending::Expire {
            return self.expire(&stop.reason, input, logs).await;
        }
        let reason = self.stop_reason(stop).await;
        self.fail(&reason, logs).await
    }

    /// [`Job::stop`], for callers that can do nothing more when the ledger cannot be told
    /// than say so: another watcher tries again.
    pub async fn stop_or_warn(&self, stop: Stop, input: &dyn Storage, logs: Option<&JobLogs>) {
        if let Err(e) = self.stop(stop, input, logs).await {
            warn!(job = %self.id, error = %e, "Cannot end the job as its stop rules say.");
        }
    }

    /// The cause to fail the job with for `stop`: a stall's names the mini-batches in flight
    /// (index, first item, node, process, how long), or says none is.
    async fn stop_reason(&self, stop: Stop) -> String {
        if stop.ending != Ending::Stall {
            return stop.reason;
        }
        match self.ledger.in_flight(&self.id).await {
            Ok(held) => format!(
                "{}; {}",
                stop.reason,
                crate::agent::holding::describe_in_flight(&held, unix_now())
            ),
            Err(e) => {
                warn!(job = %self.id, error = %e, "Cannot read what is in flight.");
                stop.reason
            }
        }
    }

    /// Keeps a row of the job's report that no attempt's end brings.
    pub async fn report(&self, row: &str) -> Result<(), LedgerError> {
        self.ledger.report(&self.id, row).await
    }

    /// Seals the job's total once every mini-batch is published; a job whose every
    /// mini-batch is already done moves to Finalizing (`transitioned`).
    pub async fn seal(&self, total: u64) -> Result<Recorded, LedgerError> {
        self.ledger.created(&self.id, total).await?;
        let sealed = self.ledger.seal(&self.id, total).await?;
        if sealed.transitioned {
            self.announce(&sealed.status).await;
        }
        Ok(sealed)
    }

    /// Fails a Running job for `reason` and writes its results, if this call moved it
    /// (exactly one of the processes that watch a job does). `logs` are this process's log
    /// files of the job, when it has any. Returns the status after.
    pub async fn fail(&self, reason: &str, logs: Option<&JobLogs>) -> Result<Status, LedgerError> {
        let _ending = self.ending().await;
        let (moved, status) = self
            .ledger
            .transition(
                &self.id,
                &[JobState::Running],
                JobState::Failed,
                Some(reason),
            )
            .await?;
        if moved {
            info!(job = %self.id, "Job failed: {reason}.");
            self.write_results(logs, &status).await;
            self.announce(&status).await;
        }
        Ok(status)
    }

    /// [`Job::fail`], for callers that can do nothing more when the ledger cannot be told
    /// than say so: another watcher tries again.
    pub async fn fail_or_warn(&self, reason: &str, logs: Option<&JobLogs>) {
        if let Err(e) = self.fail(reason, logs).await {
            warn!(job = %self.id, error = %e, "Cannot fail the job.");
        }
    }

    /// Cancels a Running or Finalizing job for `reason` and writes its results, if this
    /// call moved it. Returns the status after.
    pub async fn cancel(&self, reason: &str) -> Result<Status, LedgerError> {
        let _ending = self.ending().await;
        let (moved, status) = self
            .ledger
            .transition(
                &self.id,
                &[JobState::Running, JobState::Finalizing],
                JobState::Canceled,
                Some(reason),
            )
            .await?;
        if moved {
            info!(job = %self.id, "Job canceled: {reason}.");
            self.write_results(None, &status).await;
            self.announce(&status).await;
        }
        Ok(status)
    }

    /// Expires a Running job whose deadline passed, if this call moved it, and writes what it
    /// finished: the output joined from its finished mini-batches' rows in input order,
    /// `failed_items.csv`, the mini-batches it left unfinished
    /// (`logs/unfinished_mini_batches.csv`), and a manifest (over `input`'s listing) that
    /// says which mini-batch is which; then its results. The parts stay for a resume.
    /// Returns the status after.
    pub async fn expire(
        &self,
        reason: &str,
        input: &dyn Storage,
        logs: Option<&JobLogs>,
    ) -> Result<Status, LedgerError> {
        let _ending = self.ending().await;
        let (moved, status) = self
            .ledger
            .transition(
                &self.id,
                &[JobState::Running],
                JobState::Expired,
                Some(reason),
            )
            .await?;
        if !moved {
            return Ok(status);
        }
        info!(job = %self.id, "Job expired: {reason}.");
        let manifest = self.write_expired(input).await;
        // The counts as the output holds them: a mini-batch recorded while it was joined
        // counts too, and a resume keeps it.
        let status = self.status().await.ok().flatten().unwrap_or(status);
        self.write_result_files(logs, &status).await;
        self.release_output().await;
        self.tell(&status, manifest).await;
        Ok(status)
    }

    /// Writes what an Expired job finished ([`Job::expire`]); returns its manifest's
    /// digest, `None` (and a warning) when the output could not be written whole.
    async fn write_expired(&self, input: &dyn Storage) -> Option<String> {
        let status = self.status().await.ok().flatten()?;
        let seen = status.total.unwrap_or(status.created).max(status.done);
        // Read before the join: a mini-batch recorded meanwhile is in the output too.
        let recorded = match self.ledger.recorded(&self.id, 0..seen).await {
            Ok(recorded) => recorded,
            Err(e) => {
                warn!(job = %self.id, error = %e, "Cannot tell which mini-batches finished.");
                return None;
            }
        };
        let mut outside = pin!(maybe_done(manifest::Outside::gather(&self.spec, input)));
        let digests = match self.join_beside(seen, outside.as_mut()).await {
            Ok(digests) => digests,
            Err(e) => {
                warn!(job = %self.id, error = %e, "Cannot write the expired job's output.");
                return None;
            }
        };
        let unfinished: Vec<u64> = (0..seen)
            .filter(|i| !recorded[*i as usize] && !digests.holds(*i))
            .collect();
        let mut text = format!("{}\n", logs::UNFINISHED_HEADER);
        for index in &unfinished {
            text.push_str(&format!("{index}\n"));
        }
        let key = format!("logs/{}", logs::UNFINISHED_CSV);
        if let Err(e) = self.output.put(&key, Bytes::from(text)).await {
            warn!(job = %self.id, error = %e, "Cannot write the unfinished mini-batches.");
        }
        // The status as joined: the manifest's counts are those of its finished mini-batches.
        let status = self.status().await.ok().flatten().unwrap_or(status);
        outside.as_mut().await;
        let outside = outside.as_mut().take_output().expect("gathered");
        self.write_manifest(outside, &status, digests, &unfinished)
            .await
    }

    /// Reopens a job that failed, was canceled or expired, to continue it in its next run (see
    /// [`Ledger::reopen`]): the last run's `failed_items.csv` goes (the job's end writes its
    /// own), and the job's new state is told. The caller publishes what is left to do, or
    /// finalizes the job when nothing is (`transitioned`).
    pub async fn reopen(&self) -> Result<Reopened, LedgerError> {
        let reopened = self.ledger.reopen(&self.id).await?;
        info!(job = %self.id, run = reopened.recorded.status.run, "Job resumed.");
        let stale = format!("logs/{}", logs::FAILED_ITEMS_CSV);
        if let Err(e) = self.output.delete_prefix(&stale).await {
            warn!(job = %self.id, error = %e, "Cannot remove the last run's failed_items.csv.");
        }
        self.announce(&reopened.recorded.status).await;
        Ok(reopened)
    }

    /// Ends a Finalizing job: joins its counted parts into the output file (`append_row`)
    /// and its failed items into `failed_items.csv`, moves it to Completed, removes the
    /// parts and writes its manifest (over `input`'s listing) last. If those cannot be
    /// written, the job fails, provided `may_fail` still agrees
    /// (on a fleet: this node still holds the finalization claim); else it is left
    /// Finalizing for whoever holds it. Returns the job's state after. The result files are
    /// the caller's to write, once it knows the state holds.
    pub async fn finish<F, Fut>(&self, input: &dyn Storage, may_fail: F) -> JobState
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let total = self.status().await.ok().flatten().and_then(|s| s.total);
        // What the manifest takes from outside the output is asked while the output is
        // joined (the input's listing and the Python's packages take their own time), and
        // waited for only once the job is Completed.
        let mut outside = pin!(maybe_done(manifest::Outside::gather(&self.spec, input)));
        let joined = self.join_beside(total.unwrap_or(0), outside.as_mut()).await;
        let digests = match joined {
            Ok(digests) => digests,
            Err(e) => {
                if !may_fail().await {
                    return JobState::Finalizing;
                }
                let failed = self
                    .ledger
                    .transition(
                        &self.id,
                        &[JobState::Finalizing],
                        JobState::Failed,
                        Some(&e.to_string()),
                    )
                    .await;
                return match failed {
                    Ok((moved, status)) => {
                        if moved {
                            self.announce(&status).await;
                        }
                        status.state
                    }
                    Err(_) => JobState::Failed,
                };
            }
        };
        let completed = self
            .ledger
            .transition(&self.id, &[JobState::Finalizing], JobState::Completed, None)
            .await;
        match completed {
            Ok((moved, status)) => {
                if moved {
                    if let Err(e) = self.parts.clear().await {
                        warn!(job = %self.id, error = %e, "Cannot remove the job's parts.");
                    }
                    outside.as_mut().await;
                    let outside = outside.as_mut().take_output().expect("gathered");
                    let manifest = self.write_manifest(outside, &status, digests, &[]).await;
                    self.tell(&status, manifest).await;
                }
                status.state
            }
            Err(_) => JobState::Failed,
        }
    }

    /// Tells the fleet's events that the job is now in `status`'s state, and its webhook
    /// when it ended: called once per change, by the call that made it. An event that cannot be published is lost, and
    /// the job goes on: the ledger, not the events, is the job's truth.
    pub async fn announce(&self, status: &Status) {
        self.tell(status, None).await;
    }

    /// [`Job::announce`], with the digest of the job's manifest when it wrote one.
    async fn tell(&self, status: &Status, manifest: Option<String>) {
        let event = JobEvent {
            job_id: self.id.clone(),
            name: self.spec.name.clone(),
            pool: self.pool.clone(),
            state: status.state,
            counts: Counts::of(status),
            cause: status.reason.clone(),
            output: output_location(&self.spec),
            time: unix_now(),
            manifest,
        };
        if let Err(e) = self.events.publish(&event).await {
            warn!(job = %self.id, state = %status.state, error = %e, "Cannot publish the job's event.");
        }
        if let (true, Some(url)) = (status.state.is_terminal(), &self.spec.notify_url) {
            super::notify::send(url, &event);
        }
    }

    /// Writes the output file and `failed_items.csv` of a job whose `total` mini-batches
    /// are all recorded, and returns the output's digests; the error says which could not
    /// be written.
    /// [`Job::join`], while `beside` (what else the job's end needs) runs as far as it can.
    async fn join_beside<F: Future>(
        &self,
        total: u64,
        beside: Pin<&mut MaybeDone<F>>,
    ) -> Result<OutputDigests, OutputError> {
        let join = pin!(self.join(total));
        match select(join, beside).await {
            Either::Left((joined, _)) => joined,
            Either::Right(((), join)) => join.await,
        }
    }

    async fn join(&self, total: u64) -> Result<OutputDigests, OutputError> {
        let spec = &self.spec;
        let mut digests = OutputDigests::default();
        if spec.output_action == OutputAction::AppendRow {
            parts::join_parts(
                &*self.parts,
                &*self.ledger,
                &self.id,
                total,
                &*self.output,
                &spec.append_row_file_name,
                spec.append_row_dataframe_header,
                &mut |joined| digests.note(joined),
            )
            .await
            .map_err(OutputError::Output)?;
        }
        self.join_failed_items(total)
            .await
            .map_err(OutputError::FailedItems)?;
        self.write_report().await.map_err(OutputError::Report)?;
        Ok(digests)
    }

    /// Writes the manifest of a job that ended in `status` (see [`super::manifest`]): what
    /// ran, over the input `outside` lists, and what its output holds (`digests`), the
    /// mini-batches `unfinished` (sorted; an expired job's) marked so. Returns its digest,
    /// `None` (and a warning) when it could not be written.
    async fn write_manifest(
        &self,
        outside: manifest::Outside,
        status: &Status,
        digests: OutputDigests,
        unfinished: &[u64],
    ) -> Option<String> {
        let fingerprint = manifest::fingerprint(&self.spec).unwrap_or_else(|e| {
            warn!(job = %self.id, error = %e, "Cannot take the job's fingerprint for its manifest.");
            Default::default()
        });
        let listing = outside.listing.inspect_err(|e| {
            warn!(job = %self.id, error = %e, "Cannot list the input for the job's manifest.");
        });
        let failed_key = format!("logs/{}", logs::FAILED_ITEMS_CSV);
        let (report, failed_items) = tokio::join!(
            self.report_rows(),
            manifest::file_digest(&*self.output, &failed_key)
        );
        // The report's rows are many (one per attempt): only their counts are kept.
        let report = manifest::report_items(&report.unwrap_or_else(|e| {
            warn!(job = %self.id, error = %e, "Cannot read the job's report for its manifest.");
            Vec::new()
        }));
        let total = status
            .total
            .unwrap_or(status.done)
            .max(unfinished.last().map_or(0, |last| last + 1));
        let output = (self.spec.output_action == OutputAction::AppendRow)
            .then(|| digests.file(&self.spec.append_row_file_name));
        let written = Manifest {
            version: manifest::MANIFEST_VERSION,
            job_id: self.id.clone(),
            state: status.state,
            fingerprint,
            python: outside.python,
            input: listing.ok(),
            output,
            failed_items: failed_items.ok().flatten(),
            counts: Counts::of(status),
            mini_batches: manifest::entries(total, &report, digests, unfinished),
            signature: None,
        };
        match manifest::write(&*self.output, written).await {
            Ok(digest) => Some(digest),
            Err(e) => {
                warn!(job = %self.id, error = %e, "Cannot write the job's manifest.");
                None
            }
        }
    }

    /// Adds `times`, what runner `runner` spent since its node's last flush, to the job's.
    pub async fn add_runner_times(
        &self,
        runner: &RunnerId,
        times: &RunnerTimes,
    ) -> Result<(), LedgerError> {
        self.ledger.add_runner_times(&self.id, runner, times).await
    }

    /// Where the time of every runner of the job went, as the nodes flushed it.
    pub async fn runner_times(&self) -> Result<JobTimes, LedgerError> {
        self.ledger.runner_times(&self.id).await
    }

    /// Every row of the job's report the ledger kept, in the order they came.
    pub(super) async fn report_rows(&self) -> Result<Vec<String>, LedgerError> {
        const ROWS_PER_CALL: u64 = 1000;
        let mut rows = Vec::new();
        loop {
            let batch = self
                .ledger
                .report_rows(&self.id, rows.len() as u64, ROWS_PER_CALL)
                .await?;
            if batch.is_empty() {
                return Ok(rows);
            }
            rows.extend(batch);
        }
    }

    /// Writes `logs/sys/job_report/processed_mini-batches.csv` from the rows the ledger kept,
    /// a thousand at a time, in the order they came; nothing when it kept none.
    async fn write_report(&self) -> Result<(), ReportError> {
        const ROWS_PER_CALL: u64 = 1000;
        let rows = |start| async move {
            let rows = self.ledger.report_rows(&self.id, start, ROWS_PER_CALL);
            rows.await.map_err(ReportError::Ledger)
        };
        let mut batch = rows(0).await?;
        if batch.is_empty() {
            return Ok(());
        }
        let key = format!("logs/{}", logs::REPORT_CSV);
        let mut writer = self.output.writer(&key).await?;
        let mut text = format!("{}\n", logs::REPORT_HEADER);
        let mut start = 0;
        while !batch.is_empty() {
            start += batch.len() as u64;
            for row in &batch {
                text.push_str(row);
                text.push('\n');
            }
            let body = Bytes::from(std::mem::take(&mut text));
            writer.write(body).await?;
            batch = rows(start).await?;
        }
        writer.finish().await?;
        Ok(())
    }

    /// Writes `logs/failed_items.csv` from the failed mini-batches the ledger counted among
    /// the first `total`.
    async fn join_failed_items(&self, total: u64) -> Result<bool, PartError> {
        parts::join_failed_items(
            &*self.parts,
            &*self.ledger,
            &self.id,
            total,
            &*self.output,
            &format!("logs/{}", logs::FAILED_ITEMS_CSV),
            logs::FAILED_ITEMS_HEADER,
        )
        .await
    }

    /// Writes an ended job's results into its output's `logs/`: `job_result.txt`, the final
    /// overview and `job_error.txt`, and, for a job that did not complete (a completed
    /// one's was written as it finished), `failed_items.csv` as far as the ledger counted.
    /// `logs` are this process's log files of the job, when it has any (the script errors
    /// it saw).
    pub async fn write_results(&self, logs: Option<&JobLogs>, status: &Status) {
        if status.state != JobState::Completed {
            // Mini-batches may be recorded past the count of those created so far.
            let seen = status.total.unwrap_or(status.created).max(status.done);
            if let Err(e) = self.join_failed_items(seen).await {
                warn!(job = %self.id, error = %e, "Cannot write failed_items.csv.");
            }
            if let Err(e) = self.write_report().await {
                warn!(job = %self.id, error = %e, "Cannot write the mini-batch report.");
            }
        }
        self.write_result_files(logs, status).await;
        self.release_output().await;
    }

    /// The result files of [`results::write`], from what the ledger kept of the job's report
    /// and runner times (what it cannot read is left out, with a warning).
    async fn write_result_files(&self, logs: Option<&JobLogs>, status: &Status) {
        let report_rows = self.report_rows().await.unwrap_or_else(|e| {
            warn!(job = %self.id, error = %e, "Cannot read the job's report for its result.");
            Vec::new()
        });
        let times = self.runner_times().await.unwrap_or_else(|e| {
            warn!(job = %self.id, error = %e, "Cannot read the job's runner times for its result.");
            Vec::new()
        });
        let ended = results::Ended {
            job: &self.id,
            spec: &self.spec,
            elapsed: self.age(),
            report_rows: &report_rows,
            times: &times,
        };
        results::write(&*self.output, &ended, logs, status).await;
    }

    /// On a fleet job's local output folder, once it ended: records what the job wrote
    /// there (its results, this node's logs) as fleetrun's; see
    /// [`OutputGuard::release_fleet`].
    pub async fn release_output(&self) {
        let Location::Local(dir) = &self.spec.output else {
            return;
        };
        let (dir, job) = (dir.clone(), self.id.clone());
        let released =
            tokio::task::spawn_blocking(move || OutputGuard::release_fleet(&dir, &job)).await;
        if let Ok(Err(e)) = released {
            warn!(job = %self.id, error = %e, "Cannot record what the job wrote in its output folder.");
        }
    }
}

/// Where the job's output file is (or its folder, for `summary_only`).
pub fn output_location(spec: &JobSpec) -> String {
    let name = match spec.output_action {
        OutputAction::AppendRow => spec.append_row_file_name.as_str(),
        OutputAction::SummaryOnly => "",
    };
    match &spec.output {
        Location::Local(dir) => dir.join(name).display().to_string(),
        Location::S3 { bucket, prefix } => {
            format!(
                "s3://{bucket}/{}",
                fleetrun_common::storage::join_key(prefix, name)
            )
        }
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("id", &self.id).finish()
    }
}
