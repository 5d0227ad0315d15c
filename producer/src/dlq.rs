//! The operators' tools on a pool's dead-letter queue (`fleetrun dlq list|show|replay|purge`).
//!
//! The dead-letter queue keeps every dead letter until an operator replays or purges it (the
//! workers count a dead-lettered mini-batch against its job from a copy of their own). Each
//! dead letter has an id an operator can type: `<job>:<index>` for a mini-batch (several
//! dead letters of one mini-batch share it), `raw-<12 hex digits of its SHA-256>` for a
//! message that does not decode.
//!
//! Replaying a mini-batch of a Running job first takes its failure back in the ledger
//! ([`Ledger::forget_failure`]), then publishes it again through the queue, confirmed, and
//! only then removes it from the dead-letter queue: a crash in between leaves a second copy,
//! which the ledger's first recording makes harmless; none is ever lost.

use fleetrun_common::ledger::{Forgot, JobState, LedgerError};
use fleetrun_common::queue::{DeadLetter, DeadLetterHold, QueueError};
use fleetrun_common::wire::MiniBatch;
use fleetrun_worker::job::Fleet;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The most dead letters one command looks at (the oldest).
pub const LIMIT: usize = 10_000;
/// Items a listing shows of each dead letter.
const FIRST_ITEMS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// One dead letter as the tools show it.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterView {
    /// What an operator types to name it.
    pub id: String,
    /// The mini-batch's job, when the message decodes.
    pub job: Option<String>,
    pub mini_batch: Option<u64>,
    /// The job's run that published it.
    pub run: Option<u32>,
    /// `delivery_limit` or `rejected`.
    pub reason: Option<String>,
    /// Deliveries before it was dead-lettered, when known.
    pub deliveries: Option<u32>,
    /// When it was dead-lettered, in seconds since the Unix epoch, when known.
    pub dead_at: Option<f64>,
    /// The message's size.
    pub bytes: usize,
    /// Why the message does not decode, when it does not.
    pub undecodable: Option<String>,
    /// The wire version of a message that decodes.
    pub wire_version: Option<u32>,
    /// Its items (file inputs): all of them in `show`, the first few in `list`.
    pub items: Vec<String>,
    /// How many items (files) or chunks (tabular inputs) it holds.
    pub item_count: usize,
    /// Its chunks (tabular inputs), as logs name them.
    pub chunks: Vec<String>,
    /// Its `partition_keys` values, name → value.
    pub partition: Vec<(String, String)>,
}

impl DeadLetterView {
    pub fn of(letter: &DeadLetter) -> DeadLetterView {
        let mut view = DeadLetterView {
            id: String::new(),
            job: None,
            mini_batch: None,
            run: None,
            reason: letter.reason.clone(),
            deliveries: letter.deliveries,
            dead_at: letter.dead_at,
            bytes: letter.body.len(),
            undecodable: None,
            wire_version: None,
            items: Vec::new(),
            item_count: 0,
            chunks: Vec::new(),
            partition: Vec::new(),
        };
        match MiniBatch::decode(&letter.body) {
            Ok(batch) => {
                view.id = format!("{}:{}", batch.job, batch.index);
                view.item_count = batch.items.len() + batch.chunks.len();
                view.chunks = batch.chunks.iter().map(|c| c.describe()).collect();
                view.partition = batch.partition.map(|p| p.0).unwrap_or_default();
                view.wire_version = Some(batch.v);
                view.run = Some(batch.run);
                view.job = Some(batch.job);
                view.mini_batch = Some(batch.index);
                view.items = batch.items;
            }
            Err(e) => {
                let digest = Sha256::digest(&letter.body);
                let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
                view.id = format!("raw-{hex}");
                view.undecodable = Some(e.to_string());
            }
        }
        view
    }

    /// The same, with only the first few items (a listing's line).
    pub fn brief(mut self) -> DeadLetterView {
        self.items.truncate(FIRST_ITEMS);
        self.chunks.truncate(FIRST_ITEMS);
        self
    }

    /// One line: id, reason, deliveries, size or first items.
    pub fn line(&self) -> String {
        let reason = self.reason.as_deref().unwrap_or("unknown");
        let deliveries = self
            .deliveries
            .map_or_else(|| "?".to_owned(), |n| n.to_string());
        let what = match &self.undecodable {
            Some(_) => format!("does not decode ({} bytes)", self.bytes),
            None => {
                let mut first: Vec<&str> = self.items.iter().map(String::as_str).collect();
                first.extend(self.chunks.iter().map(String::as_str));
                let more = self.item_count.saturating_sub(first.len());
                let more = if more > 0 {
                    format!(" (+{more} more)")
                } else {
                    String::new()
                };
                format!("run {} · {}{more}", self.run.unwrap_or(0), first.join(", "))
            }
        };
        format!(
            "{:<40} {reason:<14} {deliveries:>4} deliveries  {what}",
            self.id
        )
    }
}

/// Which dead letters a command acts on.
#[derive(Debug, Clone)]
pub enum Select {
    Ids(Vec<String>),
    Job(String),
    All,
}

impl Select {
    pub fn picks(&self, view: &DeadLetterView) -> bool {
        match self {
            Select::Ids(ids) => ids.contains(&view.id),
            Select::Job(job) => view.job.as_deref() == Some(job.as_str()),
            Select::All => true,
        }
    }
}

/// What a command did with one dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct Settled {
    pub id: String,
    /// `replayed`, `purged` or `refused`.
    pub action: &'static str,
    /// Why it was refused, or a note on what was done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The pool's dead letters, oldest first (up to [`LIMIT`]), left where they are.
pub async fn list(fleet: &Fleet, job: Option<&str>) -> Result<Vec<DeadLetterView>, DlqError> {
    let letters = fleet.queue.dead_letters(LIMIT).await?;
    Ok(letters
        .iter()
        .map(DeadLetterView::of)
        .filter(|view| job.is_none_or(|job| view.job.as_deref() == Some(job)))
        .collect())
}

/// Removes the chosen dead letters for good; the others stay, in their order.
pub async fn purge(fleet: &Fleet, select: &Select) -> Result<Vec<Settled>, DlqError> {
    let mut hold = fleet.queue.hold_dead(LIMIT).await?;
    let mut settled = Vec::new();
    for (i, view) in views(&*hold).into_iter().enumerate() {
        if select.picks(&view) {
            hold.remove(i).await?;
            settled.push(Settled {
                id: view.id,
                action: "purged",
                why: None,
            });
        }
    }
    hold.release().await?;
    Ok(settled)
}

/// Puts the chosen dead letters back to work (see the module's notes); those it refuses
/// stay, saying why.
pub async fn replay(fleet: &Fleet, select: &Select) -> Result<Vec<Settled>, DlqError> {
    let mut hold = fleet.queue.hold_dead(LIMIT).await?;
    let mut settled = Vec::new();
    for (i, view) in views(&*hold).into_iter().enumerate() {
        if !select.picks(&view) {
            continue;
        }
        let body = hold.letters()[i].body.to_vec();
        let id = view.id.clone();
        match replayable(fleet, &view).await? {
            Replay::Refused(why) => settled.push(Settled {
                id,
                action: "refused",
                why: Some(why),
            }),
            Replay::Go(note) => {
                // Confirmed before the dead letter goes: a crash in between leaves a copy
                // too many, never none.
                let lane = view.job.as_deref().unwrap_or_default();
                fleet.queue.publish(lane, body).await?;
                hold.remove(i).await?;
                settled.push(Settled {
                    id,
                    action: "replayed",
                    why: note,
                });
            }
        }
    }
    hold.release().await?;
    Ok(settled)
}

fn views(hold: &dyn DeadLetterHold) -> Vec<DeadLetterView> {
    hold.letters().iter().map(DeadLetterView::of).collect()
}

/// Whether a dead letter may go back to work (a decision, not an error).
enum Replay {
    /// Its job's ledger is ready for it; with a note for the operator.
    Go(Option<String>),
    /// It may not: why, and what to do instead.
    Refused(String),
}

/// Whether a dead letter may go back to work: [`Replay::Go`] once its job's ledger is ready
/// for it.
async fn replayable(fleet: &Fleet, view: &DeadLetterView) -> Result<Replay, DlqError> {
    let (Some(job), Some(index)) = (&view.job, view.mini_batch) else {
        // Each job's mini-batches have a queue of their own: one that does not say its job
        // has none to go back to.
        return Ok(Replay::Refused(
            "does not decode here, so no job's queue can take it back; purge it".into(),
        ));
    };
    let Some(status) = fleet.ledger.status(job).await? else {
        return Ok(Replay::Refused(format!(
            "job {job} is unknown to this pool's ledger: no worker would take it; purge it"
        )));
    };
    let run = view.run.unwrap_or(0);
    if run < status.run {
        return Ok(Replay::Refused(format!(
            "it is of run {run} of job {job}, which was resumed since (run {}) and published it again; purge it",
            status.run
        )));
    }
    let refusal = |state: JobState| match state {
        JobState::Failed | JobState::Canceled | JobState::Expired => format!(
            "job {job} is {state}: `fleetrun resume {job}` runs its failed mini-batches again"
        ),
        JobState::Completed => format!(
            "job {job} completed with this mini-batch counted failed, and its output is written; `fleetrun retry {job}` runs its failed items as a new job"
        ),
        JobState::Finalizing => format!(
            "job {job} is finalizing with this mini-batch counted failed; once it completed, `fleetrun retry {job}` runs its failed items as a new job"
        ),
        JobState::Running => format!("job {job} is running"),
    };
    if status.state != JobState::Running {
        return Ok(Replay::Refused(refusal(status.state)));
    }
    Ok(match fleet.ledger.forget_failure(job, index).await? {
        Forgot::Forgotten(_) => Replay::Go(None),
        Forgot::NotRecorded => Replay::Go(Some(format!(
            "mini-batch {index} was not counted failed yet: if the pool's workers count this dead letter after the replay ran, the failure stands"
        ))),
        Forgot::NotFailed => Replay::Refused(format!(
            "mini-batch {index} of job {job} is already done; purge it"
        )),
        Forgot::NotRunning(state) => Replay::Refused(refusal(state)),
    })
}

#[cfg(test)]
mod tests {
    use fleetrun_common::ledger::{Limits, Outcome};
    use fleetrun_common::queue::Disposition;

    use super::*;

    fn fleet() -> Fleet {
        crate::fleet::embedded_fleet()
    }

    /// Publishes `body` to `lane` and rejects it into the dead-letter queue.
    async fn dead_letter(fleet: &Fleet, lane: &str, body: Vec<u8>) {
        fleet.queue.publish(lane, body).await.unwrap();
        let mut consumer = fleet.queue.consume(lane, 1).await.unwrap();
        let delivery = consumer.next().await.unwrap();
        delivery.settle(Disposition::DeadLetter).await.unwrap();
    }

    /// Job `job` with mini-batch 0 of its 2 recorded failed, as the recorder counts a dead
    /// letter, and that mini-batch in the dead-letter queue.
    async fn failed_job(fleet: &Fleet, job: &str) {
        let limits = Limits {
            error_threshold: 10,
            ..Limits::NONE
        };
        fleet.ledger.create(job, limits).await.unwrap();
        fleet.ledger.seal(job, 2).await.unwrap();
        let outcome = Outcome::all_failed(1);
        fleet.ledger.record(job, 0, outcome, None).await.unwrap();
        dead_letter(
            fleet,
            job,
            MiniBatch::new(job, 0, vec!["a.txt".into()]).encode(),
        )
        .await;
    }

    fn only(settled: &[Settled]) -> (&str, &str, Option<&str>) {
        assert_eq!(settled.len(), 1, "{settled:?}");
        let one = &settled[0];
        (one.id.as_str(), one.action, one.why.as_deref())
    }

    #[tokio::test]
    async fn a_running_jobs_dead_letter_goes_back_to_work_with_its_failure_taken_back() {
        let fleet = fleet();
        failed_job(&fleet, "run").await;
        let settled = replay(&fleet, &Select::Ids(vec!["run:0".into()]))
            .await
            .unwrap();
        assert_eq!(only(&settled), ("run:0", "replayed", None));
        let status = fleet.ledger.status("run").await.unwrap().unwrap();
        assert_eq!(
            (status.done, status.batches_failed, status.items_failed),
            (0, 0, 0)
        );
        let depth = fleet.queue.depth(&["run".to_owned()]).await.unwrap();
        assert_eq!((depth.ready, depth.dead), (1, 0));
    }

    #[tokio::test]
    async fn a_dead_letter_of_a_job_that_ended_is_refused_and_stays() {
        let fleet = fleet();
        for (job, to, hint) in [
            ("failed", JobState::Failed, "`fleetrun resume failed`"),
            ("done", JobState::Completed, "`fleetrun retry done`"),
        ] {
            failed_job(&fleet, job).await;
            let from = [JobState::Running];
            fleet.ledger.transition(job, &from, to, None).await.unwrap();
            let settled = replay(&fleet, &Select::Job(job.into())).await.unwrap();
            let (_, action, why) = only(&settled);
            assert_eq!(action, "refused");
            assert!(why.unwrap().contains(hint), "{why:?}");
        }
        let lanes = ["failed".to_owned(), "done".to_owned()];
        let depth = fleet.queue.depth(&lanes).await.unwrap();
        assert_eq!((depth.ready, depth.dead), (0, 2));
        let settled = purge(&fleet, &Select::Job("done".into())).await.unwrap();
        assert_eq!(only(&settled), ("done:0", "purged", None));
        let left = list(&fleet, None).await.unwrap();
        assert_eq!(
            left.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
            ["failed:0"]
        );
    }

    #[tokio::test]
    async fn an_unknown_job_or_an_undecodable_message_is_refused_and_stays() {
        let fleet = fleet();
        let stranger = MiniBatch::new("stranger", 3, vec!["x".into()]).encode();
        dead_letter(&fleet, "stranger", stranger).await;
        dead_letter(&fleet, "stranger", b"\xc1 garbage".to_vec()).await;
        let views = list(&fleet, None).await.unwrap();
        assert_eq!(views[0].id, "stranger:3");
        assert!(views[1].id.starts_with("raw-"), "{}", views[1].id);
        assert_eq!(views[1].bytes, 9);
        let settled = replay(&fleet, &Select::All).await.unwrap();
        assert!(settled.iter().all(|s| s.action == "refused"), "{settled:?}");
        assert!(
            settled
                .iter()
                .all(|s| s.why.as_deref().is_some_and(|w| w.contains("purge it")))
        );
        assert_eq!(fleet.queue.ready("stranger").await.unwrap(), 0);
        assert_eq!(fleet.queue.depth(&[]).await.unwrap().dead, 2);
    }
}
