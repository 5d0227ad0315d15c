//! `fleetrun serve --metrics-addr`: the pool's jobs as Prometheus metrics, for dashboards,
//! alerts and the autoscaler.
//!
//! | series | labels | what |
//! | --- | --- | --- |
//! | `fleetrun_job_work_seconds_left` | job_id, pool | expected seconds of work left ([`WorkLeft`]) |
//! | `fleetrun_job_mini_batches_left` | job_id, pool | mini-batches not yet recorded |
//! | `fleetrun_job_runners_serving` | job_id, pool | runner processes holding one of its mini-batches |
//! | `fleetrun_job_mini_batches` | job_id, pool, status (`all`, `done`, `failed`) | its mini-batches (`all` once listed) |
//! | `fleetrun_job_items` | job_id, pool, result (`succeeded`, `failed`) | its items recorded |
//! | `fleetrun_job_progress_ratio` | job_id, pool | mini-batches done ÷ all, once listed |
//! | `fleetrun_job_eta_seconds` | job_id, pool | its summary's ETA, when it has one |
//! | `fleetrun_job_seconds_since_progress` | job_id, pool | a Running job's time since it last moved |
//! | `fleetrun_job_error_threshold` | job_id, pool | failed items tolerated (absent for `-1`) |
//! | `fleetrun_job_allowed_failed_mini_batches` | job_id, pool | failed mini-batches tolerated (absent: no limit) |
//! | `fleetrun_job_deadline_seconds_left` | job_id, pool | a Running job's time until its deadline, when it has one |
//! | `fleetrun_job_left_at_deadline_percent` | job_id, pool | the share of its mini-batches it is expected to leave at its deadline, when it cannot finish in time |
//! | `fleetrun_job_state` | job_id, pool, state | 1 for its state (`Expired` for a job its deadline ended) |
//! | `fleetrun_pool_work_seconds_left` | pool | the sum over its jobs |
//! | `fleetrun_pool_jobs_active` | pool | its jobs Running or Finalizing |
//!
//! A job is labelled `job_id`, not `job`: Prometheus gives every series it scrapes a `job`
//! label of its own (the scrape job's name) and would rename a `job` label of the target's to
//! `exported_job`.
//!
//! The jobs are the pool's unfinished ones (Running, Finalizing, and ended ones until the
//! pool's workers retire them, within seconds): a scrape reads each one's record, status
//! and attempts in flight from the registry and the ledger, never anything on a
//! mini-batch's path, and costs nothing per job that ended. What the scrapes saw of each job's done count is kept between them
//! (a [`Window`]) to measure its recent rate. A scrape whose ledger does not answer is
//! answered 503, so Prometheus marks the target down instead of storing zeros.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fleetrun_common::ledger::JobState;
use fleetrun_common::report::one_line;
use fleetrun_worker::agent::held_attempts;
use fleetrun_worker::job::{self, Fleet};
use fleetrun_worker::metrics::CONTENT_TYPE;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::fleet::{self as fleet_cmd, FleetError, PoolJob};
use crate::pace::{Sample, Window};
use crate::summary::JobSummary;
use crate::work_left::WorkLeft;

/// The stretch of scrapes a job's recent rate is measured over.
const WINDOW: Duration = Duration::from_secs(120);

/// Reads the pool's jobs at each scrape, keeping each one's recent counts between scrapes.
pub struct Scraper {
    fleet: Fleet,
    windows: Mutex<HashMap<String, Window>>,
}

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    job_id: String,
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

impl Scraper {
    pub fn new(fleet: Fleet) -> Scraper {
        Scraper {
            fleet,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Every series, as OpenMetrics text.
    pub async fn scrape(&self) -> Result<String, FleetError> {
        let fleet = &self.fleet;
        let unfinished = fleet.registry.unfinished(&fleet.pool).await?;
        let jobs = fleet_cmd::pool_jobs(fleet, unfinished).await?;
        let mut in_flight = Vec::with_capacity(jobs.len());
        for j in &jobs {
            let held = match j.status.state {
                JobState::Running => held_attempts(&self.fleet.ledger.in_flight(&j.id).await?),
                _ => Vec::new(),
            };
            in_flight.push(held);
        }
        let rates = self.note(&jobs, Instant::now());
        let now = job::unix_now();
        let mut families = Families::new(&self.fleet.pool);
        for ((j, held), rate) in jobs.iter().zip(&in_flight).zip(rates) {
            let summary = j.summary(now);
            let left = WorkLeft::of(&summary, j.status.created, rate, held, now);
            families.job(j, &summary, &left, now);
        }
        Ok(families.encode())
    }

    /// Notes each job's counts of `at`, forgets the jobs gone from the registry, and returns
    /// each job's recent mini-batches per second.
    fn note(&self, jobs: &[PoolJob], at: Instant) -> Vec<Option<f64>> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        windows.retain(|id, _| jobs.iter().any(|j| &j.id == id));
        jobs.iter()
            .map(|j| {
                let window = windows
                    .entry(j.id.clone())
                    .or_insert_with(|| Window::new(WINDOW));
                window.note(Sample {
                    at,
                    done: j.status.done,
                    processed: j.status.items_succeeded + j.status.items_failed,
                });
                window.rates(at).map(|r| r.batches_per_second)
            })
            .collect()
    }
}

/// One scrape's series.
struct Families {
    registry: Registry,
    pool: String,
    gauges: HashMap<&'static str, Family<JobLabels, FloatGauge>>,
    mini_batches: Family<LabelledJob, FloatGauge>,
    items: Family<LabelledJob, FloatGauge>,
    state: Family<LabelledJob, FloatGauge>,
    pool_seconds: FloatGauge,
    pool_active: FloatGauge,
}

/// A job's series with one more label, named by its family.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct LabelledJob {
    job_id: String,
    pool: String,
    name: &'static str,
    value: String,
}

impl EncodeLabelSet for LabelledJob {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let labels = [
            ("job_id", self.job_id.as_str()),
            ("pool", self.pool.as_str()),
            (self.name, self.value.as_str()),
        ];
        EncodeLabelSet::encode(&labels, encoder)
    }
}

/// The per-job gauges with only the job's labels: name and help.
const JOB_GAUGES: [(&str, &str); 10] = [
    (
        "job_work_seconds_left",
        "Expected seconds until the job's last mini-batch is recorded: backlog × mini-batch seconds ÷ serving runners (0 once it is not Running).",
    ),
    (
        "job_mini_batches_left",
        "Mini-batches of the job not yet recorded (in flight, queued, not yet published).",
    ),
    (
        "job_runners_serving",
        "Runner processes holding one of the job's mini-batches.",
    ),
    (
        "job_progress_ratio",
        "Mini-batches done ÷ all of them, once the input is listed.",
    ),
    (
        "job_eta_seconds",
        "The job's ETA as `fleetrun status` says it, when it has one.",
    ),
    (
        "job_seconds_since_progress",
        "Seconds since a Running job last moved (a mini-batch recorded, a change of state).",
    ),
    (
        "job_error_threshold",
        "Failed items the job tolerates (its error_threshold; absent for -1).",
    ),
    (
        "job_allowed_failed_mini_batches",
        "Failed mini-batches the job tolerates (its allowed_failed_count; absent for no limit).",
    ),
    (
        "job_deadline_seconds_left",
        "Seconds until a Running job with a deadline expires unless it finished.",
    ),
    (
        "job_left_at_deadline_percent",
        "The share of its mini-batches a Running job is expected to have left at its deadline, at its rate so far (absent when it is expected to finish in time).",
    ),
];

impl Families {
    fn new(pool: &str) -> Families {
        let mut registry = Registry::with_prefix("fleetrun");
        let gauges = JOB_GAUGES
            .iter()
            .map(|(name, help)| {
                let family = Family::<JobLabels, FloatGauge>::default();
                registry.register(*name, *help, family.clone());
                (*name, family)
            })
            .collect();
        let mut labelled = |name: &str, help: &str| {
            let family = Family::<LabelledJob, FloatGauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let mini_batches = labelled(
            "job_mini_batches",
            "The job's mini-batches: all of them (once the input is listed), done, failed.",
        );
        let items = labelled("job_items", "The job's items recorded, by result.");
        let state = labelled("job_state", "1 for the job's state.");
        // The pool's series exist at 0 with no job, so a query on them always has an answer.
        let mut gauge = |name: &str, help: &str| {
            let family = Family::<PoolLabels, FloatGauge>::default();
            registry.register(name, help, family.clone());
            let labels = PoolLabels {
                pool: pool.to_owned(),
            };
            family.get_or_create(&labels).clone()
        };
        let pool_seconds = gauge(
            "pool_work_seconds_left",
            "The sum of fleetrun_job_work_seconds_left over the pool's jobs: the autoscaling signal.",
        );
        let pool_active = gauge(
            "pool_jobs_active",
            "The pool's jobs Running or Finalizing: a worker may be needed while it is above 0.",
        );
        Families {
            registry,
            pool: pool.to_owned(),
            gauges,
            mini_batches,
            items,
            state,
            pool_seconds,
            pool_active,
        }
    }

    fn set(&self, name: &'static str, j: &PoolJob, value: f64) {
        let labels = JobLabels {
            job_id: j.id.clone(),
            pool: self.pool.clone(),
        };
        self.gauges[name].get_or_create(&labels).set(value);
    }

    fn set_labelled(
        &self,
        family: &Family<LabelledJob, FloatGauge>,
        j: &PoolJob,
        (name, value): (&'static str, &str),
        to: f64,
    ) {
        let labels = LabelledJob {
            job_id: j.id.clone(),
            pool: self.pool.clone(),
            name,
            value: value.to_owned(),
        };
        family.get_or_create(&labels).set(to);
    }

    fn job(&mut self, j: &PoolJob, summary: &JobSummary, left: &WorkLeft, now: f64) {
        let c = &summary.counts;
        self.set("job_work_seconds_left", j, left.seconds);
        self.set("job_mini_batches_left", j, left.mini_batches as f64);
        self.set("job_runners_serving", j, left.runners as f64);
        if let Some(total) = c.total_mini_batches {
            let ratio = if total == 0 {
                1.0
            } else {
                c.completed_mini_batches as f64 / total as f64
            };
            self.set("job_progress_ratio", j, ratio);
            self.set_labelled(&self.mini_batches, j, ("status", "all"), total as f64);
        }
        if let Some(eta) = summary.eta_seconds {
            self.set("job_eta_seconds", j, eta);
        }
        if let (JobState::Running, Some(at)) = (summary.state, summary.deadline_at) {
            self.set("job_deadline_seconds_left", j, (at - now).max(0.0));
        }
        if let Some(left) = summary.left_at_deadline {
            self.set("job_left_at_deadline_percent", j, left);
        }
        if let (JobState::Running, Some(at)) = (summary.state, summary.updated_at) {
            self.set("job_seconds_since_progress", j, (now - at).max(0.0));
        }
        let spec = &j.record.spec;
        if spec.error_threshold >= 0 {
            self.set("job_error_threshold", j, spec.error_threshold as f64);
        }
        if let Some(allowed) = spec.allowed_failed_count {
            self.set("job_allowed_failed_mini_batches", j, allowed as f64);
        }
        let done = c.completed_mini_batches as f64;
        self.set_labelled(&self.mini_batches, j, ("status", "done"), done);
        let failed = c.failed_mini_batches as f64;
        self.set_labelled(&self.mini_batches, j, ("status", "failed"), failed);
        let succeeded = c.succeeded_items as f64;
        self.set_labelled(&self.items, j, ("result", "succeeded"), succeeded);
        let failed = c.failed_items as f64;
        self.set_labelled(&self.items, j, ("result", "failed"), failed);
        let state = summary.state.to_string();
        self.set_labelled(&self.state, j, ("state", &state), 1.0);
        self.pool_seconds.inc_by(left.seconds);
        if matches!(summary.state, JobState::Running | JobState::Finalizing) {
            self.pool_active.inc();
        }
    }

    fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    scraper: Arc<Scraper>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .with_state(scraper);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn metrics(State(scraper): State<Arc<Scraper>>) -> Response {
    match scraper.scrape().await {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, one_line(&e) + "\n").into_response(),
    }
}
