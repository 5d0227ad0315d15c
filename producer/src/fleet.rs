//! `fleetrun submit`, `status` and `cancel`: a job on a fleet (RabbitMQ + Redis + S3).
//!
//! Submitting registers the job (its validated spec, with its code shipped to S3 when the
//! output is there), enters it in the ledger, partitions the input onto the pool's queue and
//! seals the total; workers do the rest, and the one that records the last mini-batch
//! finalizes the output. `--wait` follows the ledger until the job ends.

use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fleetrun_common::events::JobEvent;
use fleetrun_common::ledger::{JobState, LedgerError, Limits, Status};
use fleetrun_common::queue::{Consumer, DeadLetterHold, Depth, Queue, QueueError};
use fleetrun_common::storage::{Storage, StorageError};
use fleetrun_config::{JobSpec, Location, MiniBatchSize};
use fleetrun_worker::agent::{JobContext, held_attempts};
use fleetrun_worker::job::{self, Fleet, Job, JobError, JobRecord, Publication, StopRules};
use fleetrun_worker::logs::JobLogs;
use fleetrun_worker::output::{OutputError, OutputGuard};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::partition::{
    PartitionError, Produced, publish_files, publish_items, publish_partitioned_files,
};
use crate::progress::{Figures, Progress};
use crate::publisher::Publisher;
use crate::summary::{InFlightBatch, JobSummary, StorageFaults, TimeSplit};
use crate::tabular::{publish_tabular, settle_format};

/// How often a waiting submitter or `status --watch` reads the ledger (at once, too, when
/// the job changes in this process).
const POLL: Duration = Duration::from_millis(100);

/// What went wrong submitting, following or canceling a job on a fleet.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The id names a job with another spec or pool: the caller reused an id by mistake.
    #[error(
        "job {job} exists and is not this job (its spec or pool differs); choose another --job-id"
    )]
    Conflict { job: String },
    /// Listing the input failed: the job is Failed for it.
    #[error("partitioning the input failed: {0}")]
    Partition(#[from] PartitionError),
    /// Refused before the job is registered: what was asked cannot be done as asked.
    #[error("{0}")]
    Refused(String),
    /// The input cannot be read as the job file says (its tabular format cannot be told):
    /// refused before the job is registered.
    #[error(transparent)]
    Unreadable(#[from] crate::tabular::TabularError),
    /// The input lists no item: most often a misspelled folder or prefix, so the job is
    /// refused unless an empty input was asked for ([`EmptyInput::Accept`]).
    #[error(
        "{field}: {location} lists no {what}; check the path, or pass --allow-empty-input to run the job on an empty input"
    )]
    EmptyInput {
        field: &'static str,
        location: String,
        what: &'static str,
    },
    /// `fleetrun resume` of a job whose input is cut otherwise now than when it ran.
    #[error(
        "job {job}: the input listing changed since the job ran (a file added, removed or renamed), so its kept mini-batches would not be the ones cut now; restore the input, or pass --force to resume anyway"
    )]
    InputChanged { job: String },
    /// Another job that has not ended writes where this one would.
    #[error(
        "output {output}: job {job} writes there (the same place, or one holding the other) and has not ended; give this job another output, or wait for {job} to end"
    )]
    OutputInUse { output: String, job: String },
    /// A job of another pool than the fleet's (`--pool`).
    #[error("job {job} is in pool {pool}; pass --pool {pool}")]
    OtherPool { job: String, pool: String },
    /// The local output folder holds what fleetrun did not write where the job would write.
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Job(#[from] JobError),
    #[error("the broker: {0}")]
    Broker(#[from] QueueError),
}

impl FleetError {
    /// A mistake in what was asked (exit 2), as opposed to a fault of the fleet's services.
    pub fn is_refusal(&self) -> bool {
        match self {
            FleetError::Conflict { .. }
            | FleetError::Refused(_)
            | FleetError::Unreadable(_)
            | FleetError::EmptyInput { .. }
            | FleetError::InputChanged { .. }
            | FleetError::OutputInUse { .. }
            | FleetError::OtherPool { .. }
            | FleetError::Ledger(LedgerError::NotResumable { .. }) => true,
            FleetError::Output(e) => !matches!(e, OutputError::Io { .. }),
            FleetError::Storage(e) | FleetError::Job(JobError::Storage(e)) => {
                matches!(e, StorageError::NoBucket { .. })
            }
            _ => false,
        }
    }
}

/// What to do with an input that lists no item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EmptyInput {
    /// Refuse the job ([`FleetError::EmptyInput`]): the usual sign of a wrong path.
    #[default]
    Refuse,
    /// Run it: it completes at once with an empty output.
    Accept,
}

/// Refuses a job whose input lists no item, unless `empty` accepts it. Reads the first item
/// of a listing in any order only: a local folder is not read whole and sorted for it, as
/// publishing reads it again.
pub async fn check_input(
    spec: &JobSpec,
    s3: &fleetrun_common::storage::s3::S3Settings,
    empty: EmptyInput,
) -> Result<(), FleetError> {
    if empty == EmptyInput::Accept {
        return Ok(());
    }
    let input = job::open_input(spec, s3).await?;
    let (field, what, one) = match &spec.input {
        fleetrun_config::Input::Files(_) => ("input.files", "file", None),
        fleetrun_config::Input::Tabular(tabular) => (
            "input.tabular",
            "table file",
            job::tabular_root(&tabular.location).1,
        ),
    };
    let first = input
        .list_keys_any_order(one.as_deref().unwrap_or(""))
        .next()
        .await
        .transpose()?;
    match first {
        Some(_) => Ok(()),
        None => Err(FleetError::EmptyInput {
            field,
            location: spec.input.location().to_string(),
            what,
        }),
    }
}

/// A registered job: new, or one the same id already named (`attached`).
#[derive(Debug, Clone)]
pub struct Registered {
    pub job: String,
    /// The job's record as the registry holds it (its code shipped; for an attached job,
    /// its first submission's time).
    pub record: JobRecord,
    pub attached: bool,
}

/// A submitted job, every mini-batch published.
pub struct Submitted {
    pub job: String,
    pub produced: Arc<Produced>,
    pub attached: bool,
}

/// How often the submitter tells the ledger how many mini-batches it has created: the stop
/// rules see a submitter that died mid-publish by this count standing still.
const CREATED_EVERY: Duration = Duration::from_secs(1);

/// How long a submitter's claim to publish a job lasts unrenewed (it renews it every
/// [`CREATED_EVERY`]): another submitter of the same id takes over this long after the
/// publishing one died.
const PUBLISH_LEASE: Duration = Duration::from_secs(10);

/// Registers a job and partitions its input; returns once every mini-batch is published.
///
/// `job_id` names the job (else an id is made from its name and the time). Submitting again
/// with the same id and the same job attaches to it: a publication a dead submitter left
/// unfinished is finished (mini-batches published twice run twice and count once), and a
/// sealed or ended job is left as it is. The same id with another job is a
/// [`FleetError::Conflict`].
pub async fn submit(
    spec: JobSpec,
    fleet: &Fleet,
    job_id: Option<&str>,
    empty: EmptyInput,
    on_id: impl FnOnce(&str),
) -> Result<Submitted, FleetError> {
    let mut spec = spec;
    // First: an MLTable's paths say which files are the input.
    settle_input(&mut spec, &fleet.s3).await?;
    check_input(&spec, &fleet.s3, empty).await?;
    let registered = register(spec, fleet, job_id, OutputHold::Fleet, Publication::Input).await?;
    on_id(&registered.job);
    let produced = Arc::new(Produced::default());
    publish(fleet, &registered, &produced).await?;
    Ok(Submitted {
        job: registered.job,
        produced,
        attached: registered.attached,
    })
}

/// Enters the job in the ledger and the registry (see [`submit`] for `job_id`); the input
/// is taken as [`check_input`] left it. `publication` says what the caller will publish.
pub async fn register(
    spec: JobSpec,
    fleet: &Fleet,
    job_id: Option<&str>,
    output: OutputHold,
    publication: Publication,
) -> Result<Registered, FleetError> {
    if spec.output.as_local().is_none()
        && let Some((name, location)) = spec.outputs.iter().find(|(_, l)| l.as_local().is_some())
    {
        return Err(FleetError::Refused(format!(
            "outputs.{name}: a job whose output is on S3 runs on workers elsewhere, where the \
             local folder {location} would be each worker's own; give an s3:// prefix"
        )));
    }
    let job = crate::job_id::given_or_new(job_id, &spec.name);
    check_output_free(fleet, &job, &spec).await?;
    if let (Some(dir), OutputHold::Fleet) = (spec.output.as_local(), output) {
        // The rules of `fleetrun run`'s output folder: nothing fleetrun did not write is
        // overwritten, and what the job writes is recorded as fleetrun's.
        OutputGuard::hand_to_fleet(dir, &spec, &job)?;
    }
    let mut spec = job::ship_code(spec, &fleet.s3).await?;
    settle_input(&mut spec, &fleet.s3).await?;
    let spec = job::ship_side(spec, &fleet.s3).await?;
    let limits = Limits {
        error_threshold: spec.error_threshold,
        allowed_failed_count: spec.allowed_failed_count,
        allowed_failed_percent: spec.allowed_failed_percent,
    };
    // Entered in the ledger first, then registered: a registered job that the ledger does
    // not know has ended (workers take it off the pool's unfinished jobs).
    let entered = match fleet.ledger.create(&job, limits).await {
        Ok(()) => true,
        Err(LedgerError::JobExists(_)) if job_id.is_some() => false,
        Err(e) => return Err(e.into()),
    };
    let record = JobRecord {
        publication,
        ..JobRecord::new(spec, &fleet.pool)
    };
    match fleet
        .registry
        .register(&job, &fleet.pool, &record.encode())
        .await
    {
        Ok(()) => {
            let registered = Registered {
                job,
                record,
                attached: !entered,
            };
            if entered {
                // The job's first state, told once, by the submitter that entered it.
                let status = Status::new();
                registered.job(fleet).await?.announce(&status).await;
            }
            Ok(registered)
        }
        Err(LedgerError::JobExists(_)) if job_id.is_some() => {
            match self::record(fleet, &job).await? {
                Some(known) if known.spec == record.spec && known.pool == record.pool => {
                    Ok(Registered {
                        job,
                        record: known,
                        attached: true,
                    })
                }
                _ => Err(FleetError::Conflict { job }),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Who holds a job's local output folder ([`fleetrun_worker::output`]) while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputHold {
    /// The job's workers: [`register`] claims the folder and hands it to them.
    Fleet,
    /// The caller, which claimed it already (`fleetrun run`'s guard).
    Caller,
}

/// Refuses an output that another job of the fleet, of any pool, writes and that has not
/// ended: the same place, or one holding the other ([`Location::overlaps`]), so two jobs
/// never overwrite each other's output, parts or logs. The job itself (a submission
/// attaching to it) does not count. Checked at submission: two submissions at the same
/// instant are not told apart.
async fn check_output_free(fleet: &Fleet, job: &str, spec: &JobSpec) -> Result<(), FleetError> {
    for other in fleet.registry.jobs().await? {
        if other == job {
            continue;
        }
        let Some(record) = self::record(fleet, &other).await? else {
            continue;
        };
        if !record.spec.output.overlaps(&spec.output) {
            continue;
        }
        let live = fleet
            .ledger
            .status(&other)
            .await?
            .is_some_and(|s| !s.state.is_terminal());
        if live {
            return Err(FleetError::OutputInUse {
                output: spec.output.to_string(),
                job: other,
            });
        }
    }
    Ok(())
}

/// Partitions a registered job's input onto the pool's queue and seals the total, unless
/// the job is sealed already or no longer runs. `produced` counts what the queue took.
///
/// One submitter publishes a job at a time (its claim in the ledger): another submitting
/// the same id waits here until the job is sealed or ended, and takes over only if the
/// publishing one stops renewing its claim (it died).
pub async fn publish(
    fleet: &Fleet,
    registered: &Registered,
    produced: &Arc<Produced>,
) -> Result<(), FleetError> {
    publish_claimed(fleet, registered, produced, None).await
}

/// [`publish`], of `items` (keys relative to the input) instead of the input's listing when
/// given.
async fn publish_claimed(
    fleet: &Fleet,
    registered: &Registered,
    produced: &Arc<Produced>,
    items: Option<&[String]>,
) -> Result<(), FleetError> {
    let Some(owner) = claim(fleet, &registered.job, Claim::Wait).await? else {
        // Published whole already, or over: nothing to add.
        return Ok(());
    };
    let queue = fleet.queue.clone();
    publish_to(fleet, registered, produced, queue, Some(owner), items).await
}

/// Whether [`claim`] waits for another publisher to let the job go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    Wait,
    Once,
}

/// Takes the job's publication claim (see [`publish`]) for a new publisher, whose name it
/// returns; `None` when the job needs no more publishing (sealed, or no longer running), or,
/// taken [`Claim::Once`], while another publisher holds the claim.
async fn claim(fleet: &Fleet, job: &str, how: Claim) -> Result<Option<String>, FleetError> {
    let owner = format!("{}-{:016x}", std::process::id(), rand::random::<u64>());
    loop {
        let status = fleet
            .ledger
            .status(job)
            .await?
            .ok_or_else(|| LedgerError::UnknownJob(job.to_owned()))?;
        if !status.state.accepts_work() || status.total.is_some() {
            return Ok(None);
        }
        if fleet
            .ledger
            .claim_publication(job, &owner, PUBLISH_LEASE)
            .await?
        {
            return Ok(Some(owner));
        }
        if how == Claim::Once {
            return Ok(None);
        }
        tokio::time::sleep(CREATED_EVERY).await;
    }
}

/// A job of the pool whose publication was left unfinished, now claimed for this process:
/// [`Abandoned::finish`] publishes it.
pub struct Abandoned {
    registered: Registered,
    owner: String,
}

/// The job's publication, when its publisher let it go unfinished (it died: its claim ran out
/// unrenewed) and anyone can finish it from the job's record: a job of this pool in its first
/// run that cuts its whole input ([`Publication::Input`], as `submit` and `POST /v1/jobs`
/// publish), not sealed and still running. Claimed for this process when it is.
pub async fn abandoned(fleet: &Fleet, job: &str) -> Result<Option<Abandoned>, FleetError> {
    let Some(record) = record(fleet, job).await? else {
        return Ok(None);
    };
    let first_run = fleet.ledger.status(job).await?.is_some_and(|s| s.run == 0);
    if record.pool != fleet.pool || record.publication != Publication::Input || !first_run {
        return Ok(None);
    }
    let Some(owner) = claim(fleet, job, Claim::Once).await? else {
        return Ok(None);
    };
    let registered = Registered {
        job: job.to_owned(),
        record,
        attached: true,
    };
    Ok(Some(Abandoned { registered, owner }))
}

impl Abandoned {
    pub fn job(&self) -> &str {
        &self.registered.job
    }

    /// Cuts the job's input again from its start and seals it: the mini-batches its last
    /// publisher published are published again, and run twice, counted once.
    pub async fn finish(self, fleet: &Fleet) -> Result<(), FleetError> {
        let produced = Arc::new(Produced::default());
        let queue = fleet.queue.clone();
        let owner = Some(self.owner);
        publish_to(fleet, &self.registered, &produced, queue, owner, None).await
    }
}

/// Partitions the job's input (or only its `items`) onto `queue` and seals the total, as the
/// publisher `owner` (renewing its claim; `None`: the job's one publisher already, as when
/// it resumes); notes the listing's digest in the registry for a later resume.
async fn publish_to(
    fleet: &Fleet,
    registered: &Registered,
    produced: &Arc<Produced>,
    queue: Arc<dyn Queue>,
    owner: Option<String>,
    items: Option<&[String]>,
) -> Result<(), FleetError> {
    let job = &registered.job;
    let spec = &registered.record.spec;
    // Made before the first publish, so that publishes in flight together keep their order.
    queue.open_lane(job).await?;
    let input = job::open_input(spec, &fleet.s3).await?;
    // Stop publishing as soon as the job stops (threshold, cancel); meanwhile tell the
    // ledger how far publication has come.
    let stop = CancellationToken::new();
    let watcher = watch_publication(fleet, job, owner, produced, &stop);
    let published = cut(spec, &*input, items, job, &*queue, produced, &stop).await;
    watcher.abort();
    let total = match published {
        Ok(total) => total,
        Err(e) => {
            let reason = format!("partitioning the input failed: {e}");
            registered.job(fleet).await?.fail(&reason, None).await?;
            return Err(e.into());
        }
    };
    if stop.is_cancelled() {
        // Stopped (the job ended, or another submitter took over): how far the input was
        // cut, covering every mini-batch this one published, for a later resume.
        let cut = produced.cut_now();
        if cut.batches > 0 {
            let partial = format!("{}:{}", cut.batches, cut.listing);
            fleet.registry.note_listing(job, &partial).await?;
        }
        return Ok(());
    }
    seal(fleet, registered, produced, total).await
}

/// While a publisher cuts the job's input: renews its claim (`owner`), notes in the ledger
/// how many mini-batches are made and in the registry how far the input is cut, and
/// cancels `stop` once the job stops taking work or another publisher took over.
fn watch_publication(
    fleet: &Fleet,
    job: &str,
    owner: Option<String>,
    produced: &Arc<Produced>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (ledger, registry, job, stop, produced) = (
        fleet.ledger.clone(),
        fleet.registry.clone(),
        job.to_owned(),
        stop.clone(),
        produced.clone(),
    );
    tokio::spawn(async move {
        let mut beat = tokio::time::interval(CREATED_EVERY);
        let mut noted = None;
        loop {
            beat.tick().await;
            // The claim first: a slow note below must not let the lease run out.
            if let Some(owner) = &owner
                && let Ok(false) = ledger.claim_publication(&job, owner, PUBLISH_LEASE).await
            {
                // Another submitter took over (this one stood still past its lease), or
                // the job ended: it publishes, this one stops.
                stop.cancel();
                return;
            }
            let created = produced.mini_batches.load(Ordering::Relaxed);
            if let Err(e) = ledger.created(&job, created).await {
                tracing::warn!(job = %job, error = %e, "Cannot note the mini-batches created.");
            }
            // How far the input is cut, as `<mini-batches>:<digest>`, for a resume of
            // a job stopped before it is all published (the whole cut replaces it).
            if let Some(cut) = produced.last_cut()
                && noted != Some(cut.batches)
            {
                let partial = format!("{}:{}", cut.batches, cut.listing);
                match registry.note_listing(&job, &partial).await {
                    Ok(()) => noted = Some(cut.batches),
                    Err(e) => {
                        tracing::warn!(job = %job, error = %e, "Cannot note how far the input is cut.");
                    }
                }
            }
            if let Ok(Some(s)) = ledger.status(&job).await
                && !s.state.accepts_work()
            {
                stop.cancel();
                return;
            }
        }
    })
}

/// Seals a job whose input is all cut into `total` mini-batches, noting the whole
/// listing's digest; finalizes it here when every mini-batch was done before the seal.
async fn seal(
    fleet: &Fleet,
    registered: &Registered,
    produced: &Produced,
    total: u64,
) -> Result<(), FleetError> {
    let job = &registered.job;
    let listing = produced.finished(total);
    fleet.registry.note_listing(job, &listing).await?;
    let handle = registered.job(fleet).await?;
    let sealed = handle.seal(total).await?;
    if sealed.status.total != Some(total) {
        tracing::warn!(job = %job, sealed = ?sealed.status.total, now = total, "The input was cut into another number of mini-batches than the job was sealed with.");
    }
    if sealed.transitioned && sealed.status.state == JobState::Finalizing {
        // Every mini-batch was done before the seal (or there were none): finalize here.
        let ctx = context(fleet, handle).await?;
        job::conclude(&*fleet.ledger, &ctx, sealed.status).await;
    }
    Ok(())
}

/// Cuts the job's input (or only `items`, keys relative to the input: a retry's list) into
/// mini-batches as its kind says, and publishes them to `queue` through one [`Publisher`],
/// until done or `stop`. Returns the number of mini-batches published.
pub(crate) async fn cut(
    spec: &JobSpec,
    input: &dyn Storage,
    items: Option<&[String]>,
    job: &str,
    queue: &dyn Queue,
    produced: &Produced,
    stop: &CancellationToken,
) -> Result<u64, PartitionError> {
    let mut publisher = Publisher::new(job, queue, produced);
    let to = &mut publisher;
    match (&spec.input, spec.mini_batch_size, items) {
        (_, MiniBatchSize::Files(size), Some(items)) => {
            publish_items(items, size as usize, to, stop).await?;
        }
        (_, MiniBatchSize::Bytes(_), Some(_)) => unreachable!("retried jobs are of files"),
        (fleetrun_config::Input::Tabular(tabular), MiniBatchSize::Bytes(size), None) => {
            let (root, one) = job::tabular_root(&tabular.location);
            let format = tabular.format.expect("settled when the job was registered");
            let partition_keys = spec.partition_keys.as_deref();
            let mltable = spec.mltable.as_ref().map(|table| (table, &root));
            let one = one.as_deref();
            publish_tabular(
                input,
                one,
                tabular,
                format,
                size,
                partition_keys,
                mltable,
                to,
                stop,
            )
            .await?;
        }
        (_, MiniBatchSize::Files(size), None) => {
            match (&spec.partition_format, &spec.partition_keys) {
                (Some(format), Some(keys)) => {
                    publish_partitioned_files(input, format, keys, to, stop).await?;
                }
                _ => publish_files(input, "", size as usize, to, stop).await?,
            }
        }
        (_, MiniBatchSize::Bytes(_), None) => unreachable!("validated: a file input counts files"),
    }
    Ok(publisher.finish().await?)
}

/// Continues a job that failed, was canceled or expired (`fleetrun resume`): under the same
/// id, with
/// the mini-batches it recorded whole kept, it runs again every other one (failed ones
/// included). Refused when its input would be cut otherwise than when it ran (a file added,
/// removed or renamed), unless `force`. Returns once the rest is published.
pub async fn resume(fleet: &Fleet, job: &str, force: bool) -> Result<Submitted, FleetError> {
    let record = record(fleet, job)
        .await?
        .ok_or_else(|| LedgerError::UnknownJob(job.to_owned()))?;
    if record.pool != fleet.pool {
        return Err(FleetError::OtherPool {
            job: job.to_owned(),
            pool: record.pool,
        });
    }
    let status = fleet
        .ledger
        .status(job)
        .await?
        .ok_or_else(|| LedgerError::UnknownJob(job.to_owned()))?;
    if !status.state.is_resumable() {
        return Err(LedgerError::NotResumable {
            job: job.to_owned(),
            state: status.state,
        }
        .into());
    }
    if !force && let Some(noted) = fleet.registry.listing(job).await? {
        let input = job::open_input(&record.spec, &fleet.s3).await?;
        // Stopped while its input was being published: `<mini-batches>:<digest>` of what
        // was cut by then (at least all it published), else the whole input's digest.
        let partial = noted
            .split_once(':')
            .and_then(|(batches, listing)| Some((batches.parse::<u64>().ok()?, listing)));
        let cuts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let note = {
            let cuts = cuts.clone();
            move |c| cuts.lock().unwrap_or_else(|p| p.into_inner()).push(c)
        };
        let now = match partial {
            Some((batches, _)) => Produced::noting_cuts_at(batches, note),
            None => Produced::noting_cuts(note),
        };
        let never = CancellationToken::new();
        let total = cut(&record.spec, &*input, None, job, &Discard, &now, &never).await?;
        let whole = now.finished(total);
        let same = match partial {
            Some((batches, listing)) => {
                status.created <= batches
                    && cuts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .any(|c| c.batches == batches && c.listing == listing)
            }
            None => whole == noted,
        };
        if !same {
            return Err(FleetError::InputChanged {
                job: job.to_owned(),
            });
        }
    }
    let registered = Registered {
        job: job.to_owned(),
        record,
        attached: false,
    };
    let handle = registered.job(fleet).await?;
    let reopened = handle.reopen().await?;
    // Its pool's workers look after it again (and forget it no sooner than it ends).
    fleet.registry.reopen(job, &registered.record.pool).await?;
    let status = reopened.recorded.status;
    let produced = Arc::new(Produced::default());
    if reopened.recorded.transitioned {
        // Everything was done: only the finalization was left.
        let ctx = context(fleet, handle).await?;
        job::conclude(&*fleet.ledger, &ctx, status).await;
    } else {
        let queue = Arc::new(crate::resume::Unfinished {
            queue: fleet.queue.clone(),
            done: reopened.done.into_iter().collect(),
            run: status.run,
        });
        publish_to(fleet, &registered, &produced, queue, None, None).await?;
    }
    Ok(Submitted {
        job: registered.job,
        produced,
        attached: false,
    })
}

/// Runs a new job over exactly the items job `of` failed (its `failed_items.csv`): the same
/// settings and code, under `job_id` (else a new id), its output in `retries/<id>/` of
/// `of`'s. Only a job of files, without `partition_keys`, that has ended.
pub async fn retry(
    fleet: &Fleet,
    of: &str,
    job_id: Option<&str>,
    on_id: impl FnOnce(&str),
) -> Result<Submitted, FleetError> {
    let known = record(fleet, of)
        .await?
        .ok_or_else(|| LedgerError::UnknownJob(of.to_owned()))?;
    let refused = |why: String| Err(FleetError::Refused(format!("cannot retry job {of}: {why}")));
    if known.pool != fleet.pool {
        return Err(FleetError::OtherPool {
            job: of.to_owned(),
            pool: known.pool,
        });
    }
    let state = fleet.ledger.status(of).await?.map(|s| s.state);
    if !state.is_some_and(JobState::is_terminal) {
        return refused("it has not ended; cancel it or wait for it first".into());
    }
    let mut spec = known.spec;
    if spec.input.tabular().is_some() || spec.partition_keys.is_some() {
        return refused(
            "only a job of files without partition_keys is retried item by item; resume it with `fleetrun resume` instead".into(),
        );
    }
    let items = failed_items(&spec, fleet, of).await?;
    if items.is_empty() {
        return refused("it has no failed items".into());
    }
    let job = crate::job_id::given_or_new(job_id, &spec.name);
    let retries = format!("retries/{job}");
    spec.output = match spec.output {
        Location::Local(dir) => Location::Local(dir.join(retries)),
        Location::S3 { bucket, prefix } => Location::S3 {
            prefix: fleetrun_common::storage::join_key(&prefix, &retries),
            bucket,
        },
    };
    let registered = register(
        spec,
        fleet,
        Some(&job),
        OutputHold::Fleet,
        Publication::Submitter,
    )
    .await?;
    on_id(&registered.job);
    let produced = Arc::new(Produced::default());
    publish_claimed(fleet, &registered, &produced, Some(&items)).await?;
    Ok(Submitted {
        job: registered.job,
        produced,
        attached: registered.attached,
    })
}

/// The items of job `job`'s `logs/failed_items.csv`, once each, in its order.
async fn failed_items(spec: &JobSpec, fleet: &Fleet, job: &str) -> Result<Vec<String>, FleetError> {
    let output = job::open_storage(&spec.output, &fleet.s3).await?;
    let key = format!("logs/{}", fleetrun_worker::logs::FAILED_ITEMS_CSV);
    let body = match output.get(&key).await {
        Ok(body) => body,
        Err(StorageError::NotFound(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut seen = std::collections::HashSet::new();
    let mut items = Vec::new();
    for record in csv::Reader::from_reader(&body[..]).records() {
        let record = record.map_err(|e| {
            FleetError::Refused(format!(
                "cannot retry job {job}: its {key} does not read: {e}"
            ))
        })?;
        if let Some(item) = record.get(0)
            && seen.insert(item.to_owned())
        {
            items.push(item.to_owned());
        }
    }
    Ok(items)
}

/// A queue that takes every message and keeps none: for cutting an input to see its
/// listing.
pub(crate) struct Discard;

#[async_trait::async_trait]
impl Queue for Discard {
    async fn open_lane(&self, _lane: &str) -> Result<(), QueueError> {
        Ok(())
    }

    async fn publish(&self, _lane: &str, _body: Vec<u8>) -> Result<(), QueueError> {
        Ok(())
    }

    async fn consume(&self, _lane: &str, _prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        Err(QueueError::Closed)
    }

    async fn consume_dead(&self, _prefetch: u16) -> Result<Box<dyn Consumer>, QueueError> {
        Err(QueueError::Closed)
    }

    async fn ready(&self, _lane: &str) -> Result<u64, QueueError> {
        Ok(0)
    }

    async fn depth(&self, _lanes: &[String]) -> Result<Depth, QueueError> {
        Ok(Depth::default())
    }

    async fn close_lane(&self, _lane: &str) -> Result<(), QueueError> {
        Ok(())
    }

    async fn hold_dead(&self, _limit: usize) -> Result<Box<dyn DeadLetterHold>, QueueError> {
        Err(QueueError::Closed)
    }
}

/// The pool's queue: the mini-batches of its unfinished jobs, and its dead letters.
pub async fn pool_depth(fleet: &Fleet) -> Result<Depth, FleetError> {
    let lanes = fleet.registry.unfinished(&fleet.pool).await?;
    Ok(fleet.queue.depth(&lanes).await?)
}

/// Settles what the input is before the job is registered: its folder's `MLTable` file
/// ([`crate::mltable::settle`]) and a tabular input's format, so every runner knows how to
/// read it (and whether it needs pyarrow). A spec settled once is left as it is.
pub async fn settle_input(
    spec: &mut JobSpec,
    s3: &fleetrun_common::storage::s3::S3Settings,
) -> Result<(), FleetError> {
    crate::mltable::settle(spec, s3).await?;
    let Some(tabular) = spec.input.tabular() else {
        return Ok(());
    };
    if tabular.format.is_some() {
        return Ok(());
    }
    let input = job::open_input(spec, s3).await?;
    let (_, one) = job::tabular_root(&tabular.location);
    let format = settle_format(tabular, &*input, one.as_deref())
        .await
        .map_err(|e| match e {
            PartitionError::Tabular(e) => FleetError::Unreadable(e),
            other => FleetError::Partition(other),
        })?;
    if let fleetrun_config::Input::Tabular(tabular) = &mut spec.input {
        tabular.format = Some(format);
    }
    Ok(())
}

impl Registered {
    /// The registered job's handle, through which its state moves.
    pub async fn job(&self, fleet: &Fleet) -> Result<Job, FleetError> {
        Ok(Job::open(fleet, &self.job, &self.record).await?)
    }
}

async fn context(fleet: &Fleet, job: Job) -> Result<JobContext, FleetError> {
    let input = job::open_input(job.spec(), &fleet.s3).await?;
    // Its logs are never written: the job's results go to its output.
    let logs = Arc::new(JobLogs::new(
        std::env::temp_dir().join(format!("fleetrun-submit-{}", job.id())),
    ));
    Ok(JobContext::new(job, input, logs))
}

/// Follows the job in the ledger until it ends; `interrupt` stops following (not the job).
/// Meanwhile it watches the job's stop rules like any node that serves it, so a job that no
/// worker takes, or that stalls, ends even when no worker is left to notice.
pub async fn wait(
    fleet: &Fleet,
    job: &str,
    record: &JobRecord,
    produced: Option<&Produced>,
    progress: bool,
    interrupt: &CancellationToken,
) -> Result<Status, FleetError> {
    let tabular = record.spec.input.tabular().is_some();
    let mut bar = progress.then(|| Progress::new(&record.spec.name, tabular));
    let age = Duration::from_secs_f64((job::unix_now() - record.submitted_at).max(0.0));
    let mut rules = StopRules::new(&record.spec, age);
    let mut outage = false;
    // Before the first read, so no change after it goes unseen.
    let mut changes = fleet.events.changes();
    loop {
        let status = match fleet.ledger.status(job).await {
            Ok(Some(status)) => status,
            Ok(None) => return Err(LedgerError::UnknownJob(job.to_owned()).into()),
            Err(e) => {
                // The workers pause through a ledger outage, and so does the waiting.
                if !std::mem::replace(&mut outage, true) {
                    tracing::warn!(job = %job, error = %e, "The ledger does not answer; waiting for it.");
                }
                tokio::select! {
                    _ = interrupt.cancelled() => return Err(e.into()),
                    _ = tokio::time::sleep(POLL) => continue,
                }
            }
        };
        outage = false;
        if status.state.is_terminal() {
            if let Some(b) = &bar {
                b.finish();
            }
            return Ok(status);
        }
        if let Some(stop) = rules.check(&status, job::serving(fleet, &status).await) {
            let handle = Job::open(fleet, job, record).await?;
            let input = job::open_input(&record.spec, &fleet.s3).await?;
            handle.stop(stop, &*input, None).await?;
            continue;
        }
        if let Some(b) = bar.as_mut() {
            let created = produced.map_or(status.created.max(status.total.unwrap_or(0)), |p| {
                p.mini_batches.load(Ordering::Relaxed)
            });
            b.update(Figures {
                status: &status,
                created,
            });
        }
        tokio::select! {
            _ = interrupt.cancelled() => return Ok(status),
            _ = tokio::time::sleep(POLL) => {}
            _ = changed(&mut changes) => {}
        }
    }
}

/// How long the end of a job waits for the nodes that followed it to let it go.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// How often the nodes that still follow an ended job are asked for.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// Waits until every node that followed the ended `job` has let it go: its runners there
/// ended, its logs written and closed, what it wrote in a local output folder recorded. From
/// then on nothing of the fleet writes to the job's logs or output, so they may be read,
/// moved or removed. A node that died is waited for until its note runs out (6 s); one
/// that has not let go in [`SETTLE_LIMIT`] is named in a warning; `interrupt` stops waiting.
pub async fn settle(fleet: &Fleet, job: &str, interrupt: &CancellationToken) {
    let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
    loop {
        let followers = match fleet.registry.followers(job).await {
            Ok(followers) => followers,
            Err(e) => {
                tracing::warn!(job = %job, error = %e, "Cannot tell whether every node let the job go.");
                return;
            }
        };
        if followers.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(job = %job, nodes = %followers.join(", "), "Nodes have not let the job go; its logs may still change.");
            return;
        }
        tokio::select! {
            _ = interrupt.cancelled() => return,
            _ = tokio::time::sleep(SETTLE_POLL) => {}
        }
    }
}

/// Returns when the job may have changed (an event, or events missed), never without
/// events to follow.
async fn changed(changes: &mut Option<broadcast::Receiver<JobEvent>>) {
    match changes {
        Some(receiver) => match receiver.recv().await {
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => {
                *changes = None;
                std::future::pending::<()>().await
            }
        },
        None => std::future::pending().await,
    }
}

/// Cancels a job for `reason`: workers drop its remaining mini-batches.
pub async fn cancel(fleet: &Fleet, job: &str, reason: &str) -> Result<Status, FleetError> {
    let record = record(fleet, job)
        .await?
        .ok_or_else(|| LedgerError::UnknownJob(job.to_owned()))?;
    let handle = Job::open(fleet, job, &record).await?;
    Ok(handle.cancel(reason).await?)
}

/// Job `job` as `status` shows it, `None` when the fleet does not know it. Its pool's
/// queue is counted when it is this fleet's pool (another pool's is not asked: naming a
/// pool would declare its queues).
pub async fn summary(fleet: &Fleet, job: &str) -> Result<Option<JobSummary>, FleetError> {
    let Some(record) = record(fleet, job).await? else {
        return Ok(None);
    };
    let Some(status) = fleet.ledger.status(job).await? else {
        return Ok(None);
    };
    let depth = if record.pool == fleet.pool {
        pool_depth(fleet).await.ok()
    } else {
        None
    };
    let mut summary = JobSummary::new(job, &record, &status, depth, job::unix_now());
    match fleet.ledger.runner_times(job).await {
        Ok(times) => summary.time = TimeSplit::of(&times),
        Err(e) => tracing::warn!(job, error = %e, "Cannot read the job's runner times."),
    }
    if status.state.is_terminal() {
        summary.manifest = manifest_digest(fleet, &record).await;
    } else {
        let notes = fleet.registry.faults(&record.pool).await?;
        summary.storage_faults = StorageFaults::of(&notes);
    }
    Ok(Some(summary))
}

/// The digest of an ended job's manifest, `None` when it has none (or it cannot be read).
async fn manifest_digest(fleet: &Fleet, record: &JobRecord) -> Option<String> {
    let output = job::open_storage(&record.spec.output, &fleet.s3)
        .await
        .ok()?;
    let read = job::manifest::Manifest::read(&*output).await;
    read.ok().map(|(_, digest)| digest)
}

/// A job of this fleet's pool as the registry and the ledger know it.
pub struct PoolJob {
    pub id: String,
    pub record: JobRecord,
    pub status: Status,
}

impl PoolJob {
    /// Its summary at `now` (seconds since the Unix epoch), without its pool's queue.
    pub fn summary(&self, now: f64) -> JobSummary {
        JobSummary::new(&self.id, &self.record, &self.status, None, now)
    }
}

/// The jobs among `ids` (the registry's, in its order) that are this fleet's pool's and
/// that the ledger knows.
pub async fn pool_jobs(fleet: &Fleet, ids: Vec<String>) -> Result<Vec<PoolJob>, FleetError> {
    let mut jobs = Vec::new();
    for job in ids {
        // One record this build cannot read (written by another version) hides no other.
        let record = match record(fleet, &job).await {
            Ok(Some(record)) if record.pool == fleet.pool => record,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(job = %job, error = %e, "Skipping a job whose record does not decode.");
                continue;
            }
        };
        if let Some(status) = fleet.ledger.status(&job).await? {
            jobs.push(PoolJob {
                id: job,
                record,
                status,
            });
        }
    }
    Ok(jobs)
}

/// The jobs of this fleet's pool the registry holds (running ones, and ended ones until
/// they are retired), in the registry's order.
pub async fn summaries(fleet: &Fleet) -> Result<Vec<JobSummary>, FleetError> {
    let jobs = pool_jobs(fleet, fleet.registry.jobs().await?).await?;
    let now = job::unix_now();
    Ok(jobs.iter().map(|j| j.summary(now)).collect())
}

/// The mini-batches of job `job` in flight, longest running first; `None` when the fleet
/// does not know the job.
pub async fn in_flight(fleet: &Fleet, job: &str) -> Result<Option<Vec<InFlightBatch>>, FleetError> {
    if record(fleet, job).await?.is_none() {
        return Ok(None);
    }
    let held = fleet.ledger.in_flight(job).await?;
    Ok(Some(
        held_attempts(&held)
            .into_iter()
            .map(InFlightBatch::from)
            .collect(),
    ))
}

pub async fn record(fleet: &Fleet, job: &str) -> Result<Option<JobRecord>, FleetError> {
    match fleet.registry.record(job).await? {
        Some(bytes) => Ok(Some(JobRecord::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// A fleet on the embedded seams, in the pool `local`, for tests.
#[cfg(test)]
pub(crate) fn embedded_fleet() -> Fleet {
    Fleet::embedded("local")
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetrun_common::events::MemoryEvents;
    use fleetrun_common::ledger::{MemoryLedger, MemoryRegistry};
    use fleetrun_common::queue::{Disposition, MemoryQueue};
    use fleetrun_common::storage::s3::S3Settings;

    /// A memory fleet over `files` inputs `data/fNNN.txt` in mini-batches of one, its queue
    /// holding at most `capacity` messages.
    fn memory_fleet(dir: &std::path::Path, files: usize, capacity: usize) -> (Fleet, JobSpec) {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        for i in 0..files {
            std::fs::write(dir.join(format!("data/f{i:03}.txt")), "x").unwrap();
        }
        std::fs::write(dir.join("score.py"), "def run(b):\n    return b\n").unwrap();
        let job_file = dir.join("job.toml");
        std::fs::write(
            &job_file,
            "name = \"cut\"\nentry_script = \"score.py\"\noutput_action = \"summary_only\"\n\
             mini_batch_size = 1\n[input]\nfiles = \"data\"\n[output]\npath = \"out\"\n",
        )
        .unwrap();
        let spec = fleetrun_config::load(&job_file, &[]).unwrap();
        let fleet = Fleet {
            events: Arc::new(MemoryEvents::new()),
            queue: Arc::new(MemoryQueue::bounded(Default::default(), capacity)),
            ledger: Arc::new(MemoryLedger::new()),
            registry: Arc::new(MemoryRegistry::new()),
            s3: S3Settings::default(),
            pool: "local".to_owned(),
        };
        (fleet, spec)
    }

    /// A job canceled while its input was still being published resumes only if the
    /// mini-batches published by then are cut the same now: the submitter notes how far it
    /// has cut as it goes.
    #[tokio::test(start_paused = true)]
    async fn a_job_stopped_while_published_refuses_a_resume_over_a_changed_input() {
        let dir = tempfile::tempdir().unwrap();
        let (fleet, spec) = memory_fleet(dir.path(), 100, 40);
        let registered = register(
            spec,
            &fleet,
            Some("cut-1"),
            OutputHold::Fleet,
            Publication::Input,
        )
        .await
        .unwrap();
        let produced = Arc::new(Produced::default());
        let publisher = {
            let (fleet, registered, produced) =
                (fleet.clone(), registered.clone(), produced.clone());
            tokio::spawn(async move { publish(&fleet, &registered, &produced).await })
        };
        // The queue takes 40: the submitter waits there, noting how far it has cut.
        for _ in 0..100 {
            if fleet.registry.listing("cut-1").await.unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let noted = fleet.registry.listing("cut-1").await.unwrap();
        assert!(noted.is_some_and(|n| n.contains(':')));
        let handle = registered.job(&fleet).await.unwrap();
        handle.cancel("canceled by the test").await.unwrap();
        // The submitter sees it at its next beat (time is paused: this waits for nothing).
        tokio::time::sleep(CREATED_EVERY * 2).await;
        // Take what is queued until the submitter stops.
        let mut consumer = fleet.queue.consume("cut-1", 200).await.unwrap();
        taking(&mut *consumer, publisher).await.unwrap();
        assert_eq!(
            fleet.ledger.status("cut-1").await.unwrap().unwrap().total,
            None
        );

        // A file in front of all others moves every item to another mini-batch.
        std::fs::write(dir.path().join("data/a-first.txt"), "x").unwrap();
        let refused = resume(&fleet, "cut-1", false).await;
        assert!(
            matches!(refused, Err(FleetError::InputChanged { .. })),
            "{:?}",
            refused.map(|s| s.job)
        );
        // A file after the published ones changes nothing they hold.
        std::fs::remove_file(dir.path().join("data/a-first.txt")).unwrap();
        std::fs::write(dir.path().join("data/z-last.txt"), "x").unwrap();
        let resumed = tokio::spawn({
            let fleet = fleet.clone();
            async move { resume(&fleet, "cut-1", false).await.map(|s| s.job) }
        });
        assert_eq!(taking(&mut *consumer, resumed).await.unwrap(), "cut-1");
    }

    /// `task`'s result, the messages it publishes meanwhile taken off the queue.
    async fn taking<T>(consumer: &mut dyn Consumer, mut task: tokio::task::JoinHandle<T>) -> T {
        loop {
            tokio::select! {
                done = &mut task => return done.unwrap(),
                delivery = consumer.next() => {
                    delivery.unwrap().settle(Disposition::Ack).await.unwrap();
                }
            }
        }
    }

    /// A job that ends in the waiter's own process (a local run) wakes it at once, not at
    /// its next read of the ledger.
    #[tokio::test(start_paused = true)]
    async fn a_job_that_ends_in_the_process_wakes_its_waiter_at_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("data/a.txt"), "a").unwrap();
        std::fs::write(dir.path().join("score.py"), "def run(b):\n    return b\n").unwrap();
        let job_file = dir.path().join("job.toml");
        std::fs::write(
            &job_file,
            "name = \"wake\"\nentry_script = \"score.py\"\noutput_action = \"summary_only\"\n[input]\nfiles = \"data\"\n\
             [output]\npath = \"out\"\n",
        )
        .unwrap();
        let spec = fleetrun_config::load(&job_file, &[]).unwrap();
        let fleet = embedded_fleet();
        let registered = register(
            spec,
            &fleet,
            Some("wake-1"),
            OutputHold::Fleet,
            Publication::Input,
        )
        .await
        .unwrap();
        let record = &registered.record;
        let handle = registered.job(&fleet).await.unwrap();
        let started = tokio::time::Instant::now();
        let ends_at = POLL / 4;
        let interrupt = CancellationToken::new();
        let (status, ()) = tokio::join!(
            wait(&fleet, "wake-1", record, None, false, &interrupt),
            async {
                tokio::time::sleep(ends_at).await;
                handle.cancel("canceled by the test").await.unwrap();
            }
        );
        assert_eq!(status.unwrap().state, JobState::Canceled);
        assert_eq!(
            started.elapsed(),
            ends_at,
            "the waiter slept on after the job ended"
        );
    }
}
