//! A job's state as programs read it: `fleetrun status --json`, `fleetrun jobs --json`,
//! `fleetrun wait --json`, and the text `fleetrun status` prints. One type, so every front
//! door says the same of a job, and says "unknown" of what it cannot know.

use fleetrun_common::events::Counts;
use fleetrun_common::ledger::{FaultNote, JobState, JobTimes, Status};
use fleetrun_common::queue::Depth;
use fleetrun_config::OutputAction;
use fleetrun_worker::agent::HeldAttempt;
use fleetrun_worker::job::{JobRecord, output_location, time_line};
use serde::{Deserialize, Serialize};

use crate::exit;

/// How long a running job may go without a move before its ETA gives way to "no progress
/// since …".
const QUIET_AFTER: f64 = 60.0;

/// One job: what it is, where it stands, where its results are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobSummary {
    pub job_id: String,
    /// The job's name (its file's `name`).
    pub name: String,
    /// The pool that serves it.
    pub pool: String,
    /// Running, Finalizing, Completed, Failed, Canceled or Expired.
    #[schema(value_type = String)]
    pub state: JobState,
    /// Mini-batches (`total_mini_batches`, `completed_mini_batches`, `failed_mini_batches`)
    /// and items (`succeeded_items`, `failed_items`).
    #[schema(value_type = Object)]
    pub counts: Counts,
    /// When it was submitted, in seconds since the Unix epoch.
    pub submitted_at: f64,
    /// When it last moved (entered, a mini-batch recorded, a change of state), in seconds
    /// since the Unix epoch; `None` when the ledger does not say.
    pub updated_at: Option<f64>,
    /// Items done (succeeded or failed) per second, from submission to now, or to its last
    /// move once it ended.
    pub items_per_second: f64,
    /// Seconds left at the rate of its mini-batches so far; `None` when that cannot be
    /// known: the input not fully listed, nothing done yet, the job ended, or no move for a
    /// minute (see `updated_at`).
    pub eta_seconds: Option<f64>,
    /// When a running job last moved, once it has not moved for a minute (it has no ETA
    /// then); in seconds since the Unix epoch.
    pub stalled_since: Option<f64>,
    /// When a job with a deadline expires unless it finished, in seconds since the Unix
    /// epoch; absent without one (and once resumed: a resumed job has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<f64>,
    /// The share of its mini-batches, in percent, that a running job is expected to have
    /// left at its deadline at its rate so far: it is expected to expire. Absent when it is
    /// expected to finish in time, or that cannot be known (see `eta_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_at_deadline: Option<f64>,
    /// Why it failed or was canceled.
    pub cause: Option<String>,
    /// Where its output file is (or its folder, for `summary_only`): a path or an `s3://`
    /// URL.
    pub output: String,
    /// Where `failed_items.csv` is, once the job ended with failed items.
    pub failed_items: Option<String>,
    /// Its pool's queue, when it was asked.
    pub queue: Option<QueueSummary>,
    /// The digest (`sha256:<hex>`) of its `logs/manifest.json`, once it ended with one;
    /// `fleetrun verify` checks the output against that manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// While it runs, the storage faults its pool's nodes met in the last minute, a kind
    /// each, the latest first; absent when they met none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_faults: Vec<StorageFaults>,
    /// Where its runners' time went so far, over every node (as each flushed it, every few
    /// seconds); absent before any runner's time reached the ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<TimeSplit>,
}

/// Where a job's runners' time went: seconds by phase over all its runners, and each
/// phase's share of their total in percent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TimeSplit {
    /// The runners (one per node and slot) whose time is counted.
    pub runners: usize,
    /// Their seconds on the job in all.
    pub total_s: f64,
    /// Starting runners: the process, the interpreter, the script's `init()`.
    pub init_s: f64,
    /// Inside the script's `run()`.
    pub run_s: f64,
    /// Ready with nothing to run: waiting for the queue, or for inputs to be staged.
    pub input_wait_s: f64,
    /// The rest (results recorded, the job's tail).
    pub idle_s: f64,
    pub init_pct: f64,
    pub run_pct: f64,
    pub input_wait_pct: f64,
    pub idle_pct: f64,
    /// `job_result.txt`'s line, e.g. `Runners busy 78%: compute 78%, waiting for input
    /// 15%, init 4%, idle 3% (2 runners, 100.0 s)`.
    pub line: String,
}

impl TimeSplit {
    /// The split of `times` (the ledger's, by runner); `None` when they hold no time.
    pub fn of(times: &JobTimes) -> Option<TimeSplit> {
        let line = time_line(times)?;
        let all = fleetrun_common::ledger::times::sum(times);
        let total_s = all.total();
        let pct = |s: f64| 100.0 * s / total_s;
        Some(TimeSplit {
            runners: times.len(),
            total_s,
            init_s: all.init_s,
            run_s: all.run_s,
            input_wait_s: all.input_wait_s,
            idle_s: all.idle_s,
            init_pct: pct(all.init_s),
            run_pct: pct(all.run_s),
            input_wait_pct: pct(all.input_wait_s),
            idle_pct: pct(all.idle_s),
            line,
        })
    }
}

/// One kind of storage fault a pool's nodes met lately: S3 throttled them, failed on its
/// side or went away, and their requests are being retried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StorageFaults {
    /// `throttled`, `server_error` or `unreachable`.
    pub fault: String,
    /// What `fleetrun status` says of it: `S3 throttled, retrying`.
    pub message: String,
    /// The nodes that met it in the last minute.
    pub nodes: u64,
    /// Seconds since a node last noted it (each notes at most every 5 s).
    pub last_seconds_ago: f64,
}

impl StorageFaults {
    /// The pool's fault `notes` (the registry's, newest first), a kind each, the latest first.
    pub fn of(notes: &[FaultNote]) -> Vec<StorageFaults> {
        let mut kinds: Vec<StorageFaults> = Vec::new();
        for note in notes {
            match kinds.iter_mut().find(|k| k.fault == note.fault.label()) {
                Some(kind) => kind.nodes += 1,
                None => kinds.push(StorageFaults {
                    fault: note.fault.label().to_owned(),
                    message: note.fault.retrying().to_owned(),
                    nodes: 1,
                    last_seconds_ago: note.age.as_secs_f64(),
                }),
            }
        }
        kinds
    }

    /// Its line in `fleetrun status`: `S3 throttled, retrying (2 nodes, last 4 s ago)`.
    pub fn describe(&self) -> String {
        let nodes = match self.nodes {
            1 => "1 node".to_owned(),
            n => format!("{n} nodes"),
        };
        format!(
            "{} ({nodes}, last {:.0} s ago)",
            self.message, self.last_seconds_ago
        )
    }
}

/// A pool's queue as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueSummary {
    pub pool: String,
    /// Mini-batches waiting for a worker.
    pub ready: u64,
    /// Mini-batches workers hold unsettled; `None` without the broker's management API
    /// (`FLEETRUN_AMQP_MANAGEMENT_URL`).
    pub unacknowledged: Option<u64>,
    pub dead_lettered: u64,
}

impl QueueSummary {
    /// Pool `pool`'s queue, as `depth` counts it.
    pub fn of(pool: &str, depth: Depth) -> QueueSummary {
        QueueSummary {
            pool: pool.to_owned(),
            ready: depth.ready,
            unacknowledged: depth.unacked,
            dead_lettered: depth.dead,
        }
    }
}

impl JobSummary {
    /// The summary of job `job_id` from its record and ledger status at `now` (seconds since
    /// the Unix epoch); `depth` is its pool's queue, when known.
    pub fn new(
        job_id: &str,
        record: &JobRecord,
        status: &Status,
        depth: Option<Depth>,
        now: f64,
    ) -> JobSummary {
        let spec = &record.spec;
        let ended = status.state.is_terminal();
        let until = match (ended, status.updated_at) {
            (true, Some(at)) => at,
            _ => now,
        };
        let elapsed = (until - record.submitted_at).max(0.001);
        let processed = status.items_succeeded + status.items_failed;
        let stalled_since = status
            .updated_at
            .filter(|at| now - at > QUIET_AFTER && status.state == JobState::Running);
        let quiet = stalled_since.is_some();
        let eta_seconds = match status.total {
            Some(total) if status.done > 0 && !ended && !quiet => {
                let left = total.saturating_sub(status.done) as f64;
                Some(elapsed / status.done as f64 * left)
            }
            _ => None,
        };
        let deadline_at = spec
            .deadline
            .filter(|_| status.run == 0)
            .map(|deadline| record.submitted_at + deadline as f64);
        let left_at_deadline = match (deadline_at, eta_seconds, status.total) {
            (Some(at), Some(eta), Some(total)) if total > 0 && now + eta > at => {
                // The share of the work left now that the time left until the deadline
                // does not cover, at the same pace.
                let left = total.saturating_sub(status.done) as f64 / total as f64;
                let covered = ((at - now).max(0.0) / eta).min(1.0);
                Some(100.0 * left * (1.0 - covered))
            }
            _ => None,
        };
        let failed_items = (ended && status.items_failed > 0).then(|| {
            let logs = match spec.output_action {
                // The output location names the folder itself.
                OutputAction::SummaryOnly => output_location(spec),
                OutputAction::AppendRow => parent(&output_location(spec)),
            };
            format!("{}/logs/failed_items.csv", logs.trim_end_matches('/'))
        });
        JobSummary {
            job_id: job_id.to_owned(),
            name: spec.name.clone(),
            pool: record.pool.clone(),
            state: status.state,
            counts: Counts::of(status),
            submitted_at: record.submitted_at,
            updated_at: status.updated_at,
            items_per_second: processed as f64 / elapsed,
            eta_seconds,
            stalled_since,
            deadline_at,
            left_at_deadline,
            cause: status.reason.clone(),
            output: output_location(spec),
            failed_items,
            queue: depth.map(|d| QueueSummary::of(&record.pool, d)),
            manifest: None,
            storage_faults: Vec::new(),
            time: None,
        }
    }

    /// The exit code of `status` and `wait` for this job: 0 Completed, 42 Failed,
    /// 43 Canceled, 44 Expired, 75 not ended yet.
    pub fn exit_code(&self) -> u8 {
        exit::of_state(self.state)
    }

    /// The text `fleetrun status JOB` prints, one field a line.
    pub fn describe(&self, now: f64) -> String {
        let c = &self.counts;
        let total = c
            .total_mini_batches
            .map_or_else(|| "? (listing)".to_owned(), |t| t.to_string());
        let mut out = format!(
            "job:           {}\nstate:         {}\nmini-batches:  {} done of {total}, {} failed\nitems:         {} succeeded, {} failed\nrate:          {:.0} items/s\n",
            self.job_id,
            self.state,
            c.completed_mini_batches,
            c.failed_mini_batches,
            c.succeeded_items,
            c.failed_items,
            self.items_per_second,
        );
        match (self.eta_seconds, self.stalled_since) {
            (Some(eta), _) => out.push_str(&format!("eta:           {eta:.0}s\n")),
            (None, Some(at)) => {
                out.push_str(&format!(
                    "eta:           unknown: no progress for {:.0}s\n",
                    now - at
                ));
            }
            _ => {}
        }
        if let (Some(at), JobState::Running) = (self.deadline_at, self.state) {
            let expected = match self.left_at_deadline {
                Some(left) => format!("; expected to expire: {left:.0}% left at the deadline"),
                None => String::new(),
            };
            out.push_str(&format!(
                "deadline:      in {:.0}s{expected}\n",
                (at - now).max(0.0)
            ));
        }
        match &self.queue {
            Some(q) => {
                let unacked = q
                    .unacknowledged
                    .map_or_else(|| "unknown".to_owned(), |n| n.to_string());
                out.push_str(&format!(
                    "pool {}:  {} ready, {unacked} unacknowledged, {} dead-lettered\n",
                    q.pool, q.ready, q.dead_lettered
                ));
            }
            None => out.push_str(&format!("pool {}:  queue unknown\n", self.pool)),
        }
        for faults in &self.storage_faults {
            out.push_str(&format!("storage:       {}\n", faults.describe()));
        }
        if let Some(time) = &self.time {
            out.push_str(&format!("time:          {}\n", time.line));
        }
        if let Some(cause) = &self.cause {
            out.push_str(&format!("cause:         {cause}\n"));
        }
        out.push_str(&format!("output:        {}\n", self.output));
        if let Some(failed) = &self.failed_items {
            out.push_str(&format!("failed items:  {failed}\n"));
        }
        if let Some(manifest) = &self.manifest {
            out.push_str(&format!("manifest:      {manifest}\n"));
        }
        out
    }
}

/// A mini-batch in flight: who runs it, since when, which attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InFlightBatch {
    pub mini_batch: u64,
    /// The worker node that runs it.
    pub node: String,
    /// Its runner process on that node (`processNNN`).
    pub process: String,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// When the attempt started, in seconds since the Unix epoch.
    pub started_at: Option<f64>,
    /// Its first item (a tabular mini-batch's first chunk).
    pub first_item: Option<String>,
}

impl From<HeldAttempt> for InFlightBatch {
    fn from(held: HeldAttempt) -> InFlightBatch {
        InFlightBatch {
            mini_batch: held.index,
            node: held.node,
            process: held.process,
            attempt: held.attempt,
            started_at: held.since,
            first_item: (!held.first.is_empty()).then_some(held.first),
        }
    }
}

/// The folder of a file's path or URL.
fn parent(location: &str) -> String {
    location
        .rsplit_once('/')
        .map_or_else(|| location.to_owned(), |(folder, _)| folder.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(output: &str) -> JobRecord {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("score.py"), "def run(b): return b\n").unwrap();
        let text = format!(
            "name = \"sum\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\n[input]\nfiles = \"s3://bkt/in\"\n[output]\npath = \"{output}\"\n"
        );
        let spec = fleetrun_config::load_str(&text, "job.toml", dir.path(), &[]).unwrap();
        JobRecord {
            spec,
            submitted_at: 1000.0,
            pool: "gpu".to_owned(),
            publication: Default::default(),
        }
    }

    fn status(state: JobState, done: u64, total: Option<u64>, updated_at: f64) -> Status {
        Status {
            state,
            done,
            total,
            items_succeeded: done * 10,
            updated_at: Some(updated_at),
            ..Status::new()
        }
    }

    #[test]
    fn a_running_job_has_a_rate_and_an_eta() {
        let s = JobSummary::new(
            "j",
            &record("s3://bkt/out"),
            &status(JobState::Running, 10, Some(40), 1090.0),
            None,
            1100.0,
        );
        assert_eq!(s.items_per_second, 1.0);
        assert_eq!(s.eta_seconds, Some(300.0));
        assert_eq!(s.stalled_since, None);
        assert_eq!(s.exit_code(), 75);
        assert_eq!(s.output, "s3://bkt/out/parallel_run_step.txt");
        let text = s.describe(1100.0);
        assert!(text.contains("eta:           300s\n"), "{text}");
        assert!(text.contains("pool gpu:  queue unknown\n"), "{text}");
    }

    /// 10 of 40 mini-batches done in 100 s: 300 s left, 100 s of them before a deadline at
    /// 200 s, so two thirds of the 75% left now are left at the deadline.
    #[test]
    fn a_job_that_cannot_finish_by_its_deadline_at_its_rate_says_so() {
        let mut late = record("s3://bkt/out");
        late.spec.deadline = Some(200);
        let running = status(JobState::Running, 10, Some(40), 1090.0);
        let s = JobSummary::new("j", &late, &running, None, 1100.0);
        assert_eq!(s.deadline_at, Some(1200.0));
        let left = s.left_at_deadline.expect("expected to expire");
        assert!((left - 50.0).abs() < 1e-9, "{left}");
        let text = s.describe(1100.0);
        assert!(
            text.contains("deadline:      in 100s; expected to expire: 50% left at the deadline\n"),
            "{text}"
        );
        // In time at its rate: the deadline alone.
        late.spec.deadline = Some(1000);
        let s = JobSummary::new("j", &late, &running, None, 1100.0);
        assert_eq!(s.left_at_deadline, None);
        assert!(s.describe(1100.0).contains("deadline:      in 900s\n"));
        // A resumed job has no deadline.
        let resumed = Status { run: 1, ..running };
        let s = JobSummary::new("j", &late, &resumed, None, 1100.0);
        assert_eq!((s.deadline_at, s.left_at_deadline), (None, None));
    }

    #[test]
    fn a_job_with_no_move_for_a_minute_says_so_instead_of_an_eta() {
        let s = JobSummary::new(
            "j",
            &record("s3://bkt/out"),
            &status(JobState::Running, 10, Some(40), 1030.0),
            None,
            1100.0,
        );
        assert_eq!(s.eta_seconds, None);
        assert_eq!(s.stalled_since, Some(1030.0));
        let text = s.describe(1100.0);
        assert!(
            text.contains("eta:           unknown: no progress for 70s\n"),
            "{text}"
        );
    }

    #[test]
    fn an_ended_jobs_rate_stops_at_its_end_and_it_names_its_failed_items() {
        let mut failed = status(JobState::Failed, 10, Some(40), 1050.0);
        failed.items_failed = 5;
        let s = JobSummary::new("j", &record("s3://bkt/out"), &failed, None, 5000.0);
        assert_eq!(s.items_per_second, 105.0 / 50.0);
        assert_eq!(s.eta_seconds, None);
        assert_eq!(s.exit_code(), 42);
        assert_eq!(
            s.failed_items.as_deref(),
            Some("s3://bkt/out/logs/failed_items.csv")
        );
    }

    #[test]
    fn an_unknown_unacknowledged_count_is_said_unknown() {
        let depth = Depth {
            ready: 3,
            unacked: None,
            dead: 1,
        };
        let s = JobSummary::new(
            "j",
            &record("s3://bkt/out"),
            &status(JobState::Completed, 4, Some(4), 1010.0),
            Some(depth),
            1100.0,
        );
        assert_eq!(s.exit_code(), 0);
        let text = s.describe(1100.0);
        assert!(
            text.contains("pool gpu:  3 ready, unknown unacknowledged, 1 dead-lettered\n"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(json["queue"]["unacknowledged"], serde_json::Value::Null);
        assert_eq!(json["state"], "Completed");
    }

    #[test]
    fn storage_faults_are_said_a_kind_each_latest_first() {
        use fleetrun_common::storage::Fault;
        use std::time::Duration;
        let note = |node: &str, fault, secs| FaultNote {
            node: node.to_owned(),
            fault,
            age: Duration::from_secs(secs),
        };
        let mut s = JobSummary::new(
            "j",
            &record("s3://bkt/out"),
            &status(JobState::Running, 10, Some(40), 1090.0),
            None,
            1100.0,
        );
        let quiet = s.describe(1100.0);
        assert!(!quiet.contains("storage:"), "{quiet}");
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("storage_faults").is_none(), "{json}");
        s.storage_faults = StorageFaults::of(&[
            note("a", Fault::Throttled, 4),
            note("b", Fault::Unreachable, 7),
            note("c", Fault::Throttled, 9),
        ]);
        let text = s.describe(1100.0);
        assert!(
            text.contains(
                "storage:       S3 throttled, retrying (2 nodes, last 4 s ago)\n\
                 storage:       S3 unreachable, retrying (1 node, last 7 s ago)\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["storage_faults"][0]["fault"], "throttled");
        assert_eq!(json["storage_faults"][0]["nodes"], 2);
        assert_eq!(
            json["storage_faults"][1]["message"],
            "S3 unreachable, retrying"
        );
        let back: JobSummary = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
    }
}
