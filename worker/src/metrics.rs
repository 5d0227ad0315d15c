//! A worker's metrics, read by Prometheus from `/metrics` (see [`crate::endpoints`]).
//!
//! Every series is made when the worker starts, at zero, so that a scrape shows what exists
//! before anything happened and a rate over a counter never starts mid-way. Each counter of
//! a labelled family is kept as its own handle: counting a mini-batch is an atomic add, with
//! no lookup and no lock. The GPUs' series (`fleetrun_gpu_…{gpu}`) are read from NVML at
//! each scrape, on a node that has it ([`Metrics::with_gpus`]).

use std::sync::atomic::AtomicU64;

use fleetrun_common::ledger::RunnerTimes;
use fleetrun_common::storage::Fault;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::monitor::{GpuProbe, GpuSample};

/// The content type of [`Metrics::encode`]'s text (OpenMetrics 1.0).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How a `run()` attempt of a mini-batch ended, as its row of the job's report says
/// (`processed_mini-batches.csv`), and `failed_whole` for a mini-batch recorded failed once
/// its attempts were spent or lost. `out_of_gpu_memory` counts `run()` calls (a mini-batch's
/// or a piece's) that ran out of GPU memory, apart from `raised`; `split` the mini-batches
/// then run in pieces.
pub const MINI_BATCH_RESULTS: [&str; 11] = [
    "succeeded",
    "partial",
    "raised",
    "died",
    "out_of_memory",
    "timeout",
    "staging_failed",
    "failed_whole",
    "isolated",
    "out_of_gpu_memory",
    "split",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// The worker's metrics: one per node, shared by its slots and the metrics endpoint.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    mini_batches: [Counter; MINI_BATCH_RESULTS.len()],
    items_succeeded: Counter,
    items_failed: Counter,
    run_seconds: Histogram,
    split_items: Histogram,
    runner_starts: Counter,
    runner_start_failures: Counter,
    runner_deaths: Counter,
    in_flight: Gauge,
    ledger_errors: Counter,
    broker_errors: Counter,
    storage_hand_backs: Counter,
    runner_seconds: [Counter<f64, AtomicU64>; 4],
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fleetrun");
        let mini_batch_family = Family::<ResultLabel, Counter>::default();
        registry.register(
            "mini_batches",
            "Attempts of mini-batches this node ran, by how they ended (failed_whole: recorded failed, its attempts spent).",
            mini_batch_family.clone(),
        );
        let mini_batches = MINI_BATCH_RESULTS.map(|result| {
            mini_batch_family
                .get_or_create(&ResultLabel { result })
                .clone()
        });
        let items = Family::<ResultLabel, Counter>::default();
        registry.register(
            "items",
            "Items of the mini-batches whose run() returned on this node, by result, once recorded in the ledger.",
            items.clone(),
        );
        let item_counter = |result| items.get_or_create(&ResultLabel { result }).clone();
        let (items_succeeded, items_failed) = (item_counter("succeeded"), item_counter("failed"));
        // 10 ms to about 11 minutes.
        let run_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 17));
        registry.register(
            "run_seconds",
            "Seconds each run() call took (returned or raised).",
            run_seconds.clone(),
        );
        // 1 to 4096 items.
        let split_items = Histogram::new(exponential_buckets(1.0, 2.0, 13));
        registry.register(
            "split_piece_items",
            "For each mini-batch run in pieces because it runs out of GPU memory whole, the most items a piece of it held.",
            split_items.clone(),
        );
        let mut counter = |name: &str, help: &str| {
            let counter = Counter::default();
            registry.register(name, help, counter.clone());
            counter
        };
        let runner_starts = counter("runner_starts", "Runner processes started (init() done).");
        let runner_start_failures = counter(
            "runner_start_failures",
            "Runner processes that failed to start (init() raised, timed out, or the process died).",
        );
        let runner_deaths = counter(
            "runner_deaths",
            "Runner processes that died while running a mini-batch.",
        );
        let ledger_errors = counter(
            "ledger_errors",
            "Recordings in the ledger (Redis) of mini-batches whose run() returned that failed; the mini-batch was handed back.",
        );
        let broker_errors = counter(
            "broker_errors",
            "Operations on the broker (RabbitMQ) that failed: consuming, settling a delivery.",
        );
        let storage_hand_backs = counter(
            "storage_hand_backs",
            "Mini-batches handed back untried, no attempt spent, because storage (S3) did not take a request within its retries: staging an input or writing a part.",
        );
        let runner_family = Family::<PhaseLabel, Counter<f64, AtomicU64>>::default();
        registry.register(
            "runner_seconds",
            "Seconds this node's runners spent on their jobs, by phase: init (starting, the script's init()), run (inside run()), input_wait (ready with nothing to run: the queue, staging), idle (the rest of a runner's life, counted when it stops). Counted as the node flushes them to the ledger, every few seconds.",
            runner_family.clone(),
        );
        let runner_seconds = RunnerTimes::PHASES
            .map(|phase| runner_family.get_or_create(&PhaseLabel { phase }).clone());
        registry.register_collector(Box::new(StorageFaults));
        let in_flight = Gauge::default();
        registry.register(
            "mini_batches_in_flight",
            "Mini-batches whose run() attempt is under way on this node.",
            in_flight.clone(),
        );
        Metrics {
            registry,
            mini_batches,
            items_succeeded,
            items_failed,
            run_seconds,
            split_items,
            runner_starts,
            runner_start_failures,
            runner_deaths,
            in_flight,
            ledger_errors,
            broker_errors,
            storage_hand_backs,
            runner_seconds,
        }
    }

    /// Counts the seconds of `times` (a runner's, since its last flush) by phase.
    pub fn runner_seconds(&self, times: &RunnerTimes) {
        for (counter, seconds) in self.runner_seconds.iter().zip(times.seconds()) {
            if seconds > 0.0 {
                counter.inc_by(seconds);
            }
        }
    }

    /// These metrics and, on a node where NVML answers, each GPU's utilisation and memory,
    /// read at each scrape.
    pub fn with_gpus(mut self) -> Metrics {
        let probe = GpuProbe::open();
        if probe.has_nvml() {
            let collector = GpuCollector(Box::new(move || probe.sample()));
            self.registry.register_collector(Box::new(collector));
        }
        self
    }

    /// Notes the most items a piece of a mini-batch run in pieces for GPU memory held.
    pub fn split_into(&self, items: usize) {
        self.split_items.observe(items as f64);
    }

    /// Counts an attempt's end by its report row's `result` (one of [`MINI_BATCH_RESULTS`];
    /// any other is not counted).
    pub fn mini_batch(&self, result: &str) {
        if let Some(i) = MINI_BATCH_RESULTS.iter().position(|r| *r == result) {
            self.mini_batches[i].inc();
        }
    }

    /// Counts the items of a mini-batch whose `run()` returned, once recorded in the ledger
    /// (a repeated recording is not counted again).
    pub fn items(&self, succeeded: u64, failed: u64) {
        self.items_succeeded.inc_by(succeeded);
        self.items_failed.inc_by(failed);
    }

    /// Notes how long a `run()` call took.
    pub fn run_took(&self, seconds: f64) {
        self.run_seconds.observe(seconds);
    }

    pub fn runner_started(&self) {
        self.runner_starts.inc();
    }

    pub fn runner_start_failed(&self) {
        self.runner_start_failures.inc();
    }

    pub fn runner_died(&self) {
        self.runner_deaths.inc();
    }

    pub fn ledger_error(&self) {
        self.ledger_errors.inc();
    }

    pub fn broker_error(&self) {
        self.broker_errors.inc();
    }

    pub fn storage_hand_back(&self) {
        self.storage_hand_backs.inc();
    }

    /// Counts an attempt under way until the returned guard is dropped, whichever way the
    /// attempt ends.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Every series, as OpenMetrics text ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// An attempt counted in `fleetrun_mini_batches_in_flight` while this lives.
#[must_use = "the attempt counts as in flight only while this lives"]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The faults this process's storage requests met (S3 throttling, server errors, no
/// answer), each attempt counted, retried or not: read at each scrape from the storage's
/// own counts.
#[derive(Debug)]
struct StorageFaults;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabel {
    fault: &'static str,
}

impl Collector for StorageFaults {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "storage_faults",
            "Attempts of storage (S3) requests that met a fault, by kind: throttled (503 SlowDown), server_error (500 InternalError), unreachable (connection refused, reset or timed out). Retried with backoff; see storage_hand_backs for those that did not get through.",
            None,
            MetricType::Counter,
        )?;
        let counts = fleetrun_common::storage::faults();
        for fault in Fault::ALL {
            let label = FaultLabel {
                fault: fault.label(),
            };
            family
                .encode_family(&label)?
                .encode_counter::<NoLabelSet, _, u64>(&counts.count(fault), None)?;
        }
        Ok(())
    }
}

/// Each GPU's series, from a reading at each scrape.
struct GpuCollector(Box<dyn Fn() -> Vec<GpuSample> + Send + Sync>);

impl std::fmt::Debug for GpuCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GpuCollector")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabel {
    gpu: u32,
}

impl Collector for GpuCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gpus = (self.0)();
        type Reading = fn(&GpuSample) -> Option<u64>;
        let series: [(&str, &str, Reading); 4] = [
            (
                "gpu_utilization_percent",
                "Percent of the last sample period a kernel ran on the GPU (NVML).",
                |g| g.utilization_percent.map(u64::from),
            ),
            (
                "gpu_memory_utilization_percent",
                "Percent of the last sample period the GPU's memory was read or written (NVML).",
                |g| g.memory_utilization_percent.map(u64::from),
            ),
            ("gpu_memory_used_bytes", "GPU memory in use (NVML).", |g| {
                g.memory_used_bytes
            }),
            ("gpu_memory_total_bytes", "GPU memory in all (NVML).", |g| {
                g.memory_total_bytes
            }),
        ];
        for (name, help, reading) in series {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for gpu in &gpus {
                // A reading the driver refused is left out, not shown as zero.
                if let Some(value) = reading(gpu) {
                    let label = GpuLabel { gpu: gpu.index };
                    family.encode_family(&label)?.encode_gauge(&value)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line that starts with `series ` in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn every_series_is_there_at_zero_before_anything_happened() {
        let text = Metrics::new().encode();
        for result in MINI_BATCH_RESULTS {
            let series = format!("fleetrun_mini_batches_total{{result=\"{result}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{series} in:\n{text}");
        }
        for series in [
            "fleetrun_items_total{result=\"succeeded\"}",
            "fleetrun_items_total{result=\"failed\"}",
            "fleetrun_run_seconds_count",
            "fleetrun_runner_starts_total",
            "fleetrun_runner_start_failures_total",
            "fleetrun_runner_deaths_total",
            "fleetrun_ledger_errors_total",
            "fleetrun_broker_errors_total",
            "fleetrun_storage_hand_backs_total",
            "fleetrun_storage_faults_total{fault=\"throttled\"}",
            "fleetrun_storage_faults_total{fault=\"server_error\"}",
            "fleetrun_storage_faults_total{fault=\"unreachable\"}",
            "fleetrun_mini_batches_in_flight",
        ] {
            assert_eq!(sample(&text, series), Some(0.0), "{series} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn counts_show_in_the_text() {
        let metrics = Metrics::new();
        metrics.mini_batch("succeeded");
        metrics.mini_batch("succeeded");
        metrics.mini_batch("raised");
        metrics.mini_batch("no such result");
        metrics.items(5, 2);
        metrics.run_took(0.5);
        metrics.runner_started();
        metrics.ledger_error();
        let held = metrics.in_flight();
        let text = metrics.encode();
        let value = |series| sample(&text, series);
        assert_eq!(
            value("fleetrun_mini_batches_total{result=\"succeeded\"}"),
            Some(2.0)
        );
        assert_eq!(
            value("fleetrun_mini_batches_total{result=\"raised\"}"),
            Some(1.0)
        );
        assert_eq!(
            value("fleetrun_items_total{result=\"succeeded\"}"),
            Some(5.0)
        );
        assert_eq!(value("fleetrun_items_total{result=\"failed\"}"), Some(2.0));
        assert_eq!(value("fleetrun_run_seconds_count"), Some(1.0));
        assert_eq!(value("fleetrun_run_seconds_sum"), Some(0.5));
        assert_eq!(value("fleetrun_run_seconds_bucket{le=\"0.64\"}"), Some(1.0));
        assert_eq!(value("fleetrun_runner_starts_total"), Some(1.0));
        assert_eq!(value("fleetrun_ledger_errors_total"), Some(1.0));
        assert_eq!(value("fleetrun_mini_batches_in_flight"), Some(1.0));
        drop(held);
        let text = metrics.encode();
        assert_eq!(sample(&text, "fleetrun_mini_batches_in_flight"), Some(0.0));
    }

    #[test]
    fn each_gpu_has_its_series_and_a_refused_reading_none() {
        let mut metrics = Metrics::new();
        let gpus = || {
            vec![
                GpuSample {
                    index: 0,
                    name: "A100".into(),
                    utilization_percent: Some(87),
                    memory_utilization_percent: Some(40),
                    memory_used_bytes: Some(1 << 30),
                    memory_total_bytes: Some(40 << 30),
                },
                GpuSample {
                    index: 1,
                    name: "A100".into(),
                    utilization_percent: None,
                    memory_utilization_percent: None,
                    memory_used_bytes: Some(0),
                    memory_total_bytes: Some(40 << 30),
                },
            ]
        };
        metrics
            .registry
            .register_collector(Box::new(GpuCollector(Box::new(gpus))));
        let text = metrics.encode();
        let value = |series| sample(&text, series);
        assert_eq!(
            value("fleetrun_gpu_utilization_percent{gpu=\"0\"}"),
            Some(87.0),
            "{text}"
        );
        assert_eq!(value("fleetrun_gpu_utilization_percent{gpu=\"1\"}"), None);
        assert_eq!(
            value("fleetrun_gpu_memory_used_bytes{gpu=\"0\"}"),
            Some(1073741824.0)
        );
        assert_eq!(
            value("fleetrun_gpu_memory_used_bytes{gpu=\"1\"}"),
            Some(0.0)
        );
        assert_eq!(
            value("fleetrun_gpu_memory_total_bytes{gpu=\"1\"}"),
            Some(42949672960.0)
        );
        assert!(
            text.contains("# TYPE fleetrun_gpu_utilization_percent gauge"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_node_without_nvml_has_no_gpu_series() {
        if !GpuProbe::open().has_nvml() {
            let text = Metrics::new().with_gpus().encode();
            assert!(!text.contains("fleetrun_gpu_"), "{text}");
        }
    }
}
