//! Where a node's runners' time on a job went ([`TimesBook`], one per job in its
//! [`JobContext`]): seconds in `init()`, in `run()`, waiting for input, and idle (the rest of
//! each runner's life on the job), accumulated in memory as runners start, run and stop, and
//! flushed to the ledger ([`flush`]) every few seconds by the job's watcher, when the node
//! lets the job go and before the job's results are written; never per mini-batch.
//!
//! `run()` and the wait for input are the runner's own clocks (`Timing::run_seconds` and
//! `Timing::waited_seconds`: the time it sat ready with nothing to run before each request,
//! so look-ahead staging that overlaps a `run()` is not waiting); `init()` and each runner's
//! life are this node's clock (tokio's, so tests pause it). Idle is the life less the rest,
//! counted as each runner stops, when it is known, so that no phase ever shrinks: a flush
//! carries no negative seconds, and `/metrics`' counters, which cannot take seconds back,
//! add up to the ledger's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fleetrun_common::ledger::{RunnerId, RunnerTimes};
use fleetrun_common::protocol::Timing;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::monitor::GpuSample;

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// How often a job's watcher flushes its runners' times to the ledger.
pub(crate) const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(3);

/// One runner's (one slot's) times on the job, over all the runners it started.
#[derive(Debug, Default)]
struct Entry {
    /// Every phase so far: `init()` (every start, failed ones too), `run()`, the wait for
    /// input, and idle as of the last runner that stopped.
    times: RunnerTimes,
    /// The lives of the runners that stopped, in seconds.
    lived: f64,
    /// When the live runner, if any, was born.
    live_since: Option<Instant>,
    /// What was flushed to the ledger.
    flushed: RunnerTimes,
}

impl Entry {
    /// The live runner's life ended at `end`: idle is every life not accounted for
    /// otherwise. Only then is it known: until a runner stops, its own clocks (its `run()`
    /// and its wait) account for all its life after `init()` but the `run()` under way and
    /// the answers this node has not read yet (it reads them late while it stages the next
    /// mini-batches), so the rest is noise until then. Counting it idle then would take
    /// seconds back from `/metrics`' counters, which cannot.
    fn ended(&mut self, end: Instant) {
        if let Some(since) = self.live_since.take() {
            self.lived += end.saturating_duration_since(since).as_secs_f64();
        }
        let rest = self.times.init_s + self.times.run_s + self.times.input_wait_s;
        self.times.idle_s = self.times.idle_s.max(self.lived - rest);
    }
}

/// A job's runners' times on this node, by runner.
#[derive(Debug, Default)]
pub struct TimesBook {
    runners: Mutex<BTreeMap<RunnerId, Entry>>,
    /// Where flushed seconds are counted for `/metrics`.
    metrics: Option<Arc<Metrics>>,
}

impl TimesBook {
    /// A book whose flushed seconds `metrics` counts.
    pub fn counted_in(metrics: Arc<Metrics>) -> TimesBook {
        TimesBook {
            metrics: Some(metrics),
            ..TimesBook::default()
        }
    }

    fn with<T>(&self, runner: &RunnerId, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut runners = self.runners.lock().unwrap_or_else(|p| p.into_inner());
        // Found without a copy of the id: this is on every mini-batch's path.
        if let Some(entry) = runners.get_mut(runner) {
            return f(entry);
        }
        f(runners.entry(runner.clone()).or_default())
    }

    /// A runner that started at `born` finished its init now: its life goes on until
    /// [`TimesBook::stopped`].
    pub(super) fn started(&self, runner: &RunnerId, born: Instant) {
        let now = Instant::now();
        let init = now.duration_since(born).as_secs_f64();
        self.with(runner, |e| {
            // A runner before it that did not stop yet lived until this one was born.
            e.ended(born);
            e.times.init_s += init;
            e.live_since = Some(born);
        });
    }

    /// A runner that started at `born` failed to: its init was all its life.
    pub(super) fn failed_start(&self, runner: &RunnerId, born: Instant) {
        let init = born.elapsed().as_secs_f64();
        self.with(runner, |e| {
            e.times.init_s += init;
            e.lived += init;
        });
    }

    /// A runner answered a `run()` it was sent: its run and its wait before it.
    pub(super) fn ran(&self, runner: &RunnerId, timing: &Timing) {
        self.with(runner, |e| {
            e.times.run_s += timing.run_seconds.max(0.0);
            e.times.input_wait_s += timing.waited_seconds.max(0.0);
        });
    }

    /// A runner left the job (stopped, killed, or lost).
    pub(super) fn stopped(&self, runner: &RunnerId) {
        let now = Instant::now();
        self.with(runner, |e| {
            e.ended(now);
        });
    }

    /// The job's monitor on this node read its GPUs: each live runner whose GPU is one of
    /// them counts the reading, its utilisation in its GPU's mean and its memory used in its
    /// peak. A runner's GPU is the one whose NVML index its `CUDA_VISIBLE_DEVICES` names; a
    /// MIG instance (named by UUID) is none of them, and stays unknown.
    pub fn gpus_sampled(&self, gpus: &[GpuSample]) {
        if gpus.is_empty() {
            return;
        }
        let mut runners = self.runners.lock().unwrap_or_else(|p| p.into_inner());
        for (id, e) in runners.iter_mut() {
            let gpu = gpus.iter().find(|g| g.index.to_string() == id.gpu);
            let Some(gpu) = gpu.filter(|_| e.live_since.is_some()) else {
                continue;
            };
            if let Some(percent) = gpu.utilization_percent {
                e.times.gpu_samples += 1.0;
                e.times.gpu_util_sum += f64::from(percent);
            }
            if let Some(used) = gpu.memory_used_bytes {
                let mib = used as f64 / MIB;
                e.times.gpu_mem_peak_mib = e.times.gpu_mem_peak_mib.max(mib);
            }
        }
    }

    /// Every runner's times so far (a live runner's idle not yet: see `Entry::ended`).
    pub fn snapshot(&self) -> Vec<(RunnerId, RunnerTimes)> {
        let runners = self.runners.lock().unwrap_or_else(|p| p.into_inner());
        runners
            .iter()
            .map(|(id, e)| (id.clone(), e.times))
            .collect()
    }

    /// What each runner added since the last flush, noted as flushed.
    pub(super) fn take_unflushed(&self) -> Vec<(RunnerId, RunnerTimes)> {
        let mut runners = self.runners.lock().unwrap_or_else(|p| p.into_inner());
        let mut unflushed = Vec::new();
        for (id, e) in runners.iter_mut() {
            let delta = e.times.since(&e.flushed);
            if !delta.is_empty() {
                e.flushed = e.times;
                unflushed.push((id.clone(), delta));
            }
        }
        unflushed
    }

    /// Takes back a flush the ledger did not take: the next one carries it.
    pub(super) fn unflushed(&self, runner: &RunnerId, delta: &RunnerTimes) {
        self.with(runner, |e| {
            e.flushed = e.flushed.since(delta);
        });
    }

    /// Counts `delta`, taken by the ledger, in `/metrics` (when the book has them).
    pub(super) fn counted(&self, delta: &RunnerTimes) {
        if let Some(metrics) = &self.metrics {
            metrics.runner_seconds(delta);
        }
    }
}

/// A runner's part in the book while it lives: it stops when this is dropped, however the
/// runner went (stopped, killed, or lost with its process).
pub(super) struct TimesMark {
    id: RunnerId,
    book: Arc<TimesBook>,
}

impl TimesMark {
    /// Runner `id` of the job whose times `book` keeps, started at `born`, finished its
    /// init now.
    pub(super) fn new(book: &Arc<TimesBook>, id: RunnerId, born: Instant) -> TimesMark {
        book.started(&id, born);
        TimesMark {
            id,
            book: book.clone(),
        }
    }

    /// The runner answered a `run()`.
    pub(super) fn ran(&self, timing: &Timing) {
        self.book.ran(&self.id, timing);
    }
}

impl Drop for TimesMark {
    fn drop(&mut self) {
        self.book.stopped(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn runner() -> RunnerId {
        RunnerId {
            node: "n".into(),
            runner: "process001".into(),
            gpu: String::new(),
        }
    }

    fn timing(run: f64, waited: f64) -> Timing {
        Timing {
            run_seconds: run,
            cpu_seconds: 0.0,
            waited_seconds: waited,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_runners_life_splits_into_its_phases_and_idle_is_the_rest() {
        let book = TimesBook::default();
        let id = runner();
        let born = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        book.started(&id, born);
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            book.ran(&id, &timing(1.0, 0.25));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        book.stopped(&id);
        // Time after the runner stopped is nobody's.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let [(_, t)] = &book.snapshot()[..] else {
            panic!("one runner")
        };
        assert_eq!(t.init_s, 2.0);
        assert_eq!(t.run_s, 4.0);
        assert_eq!(t.input_wait_s, 1.0);
        assert_eq!(t.idle_s, 9.0 - 2.0 - 4.0 - 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn flushes_carry_only_what_was_added_and_a_refused_one_comes_again() {
        let book = TimesBook::default();
        let id = runner();
        book.started(&id, Instant::now());
        tokio::time::sleep(Duration::from_secs(1)).await;
        book.ran(&id, &timing(0.5, 0.0));
        let first = book.take_unflushed();
        assert_eq!((first[0].1.run_s, first[0].1.idle_s), (0.5, 0.0));
        tokio::time::sleep(Duration::from_secs(2)).await;
        book.ran(&id, &timing(1.0, 0.5));
        book.stopped(&id);
        let second = book.take_unflushed();
        assert_eq!((second[0].1.run_s, second[0].1.idle_s), (1.0, 1.0));
        book.unflushed(&id, &second[0].1);
        let third = book.take_unflushed();
        assert_eq!(
            (third[0].1.run_s, third[0].1.idle_s),
            (1.0, 1.0),
            "the refused flush comes again"
        );
        assert!(book.take_unflushed().is_empty(), "nothing new");
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_under_way_is_not_idle_so_no_flush_takes_seconds_back() {
        let book = TimesBook::default();
        let id = runner();
        book.started(&id, Instant::now());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            book.take_unflushed().is_empty(),
            "the run under way is not counted before it answers"
        );
        book.ran(&id, &timing(1.5, 0.5));
        let [(_, t)] = &book.take_unflushed()[..] else {
            panic!("one runner")
        };
        assert_eq!((t.run_s, t.input_wait_s, t.idle_s), (1.5, 0.5, 0.0));
        tokio::time::sleep(Duration::from_secs(1)).await;
        book.stopped(&id);
        let [(_, t)] = &book.take_unflushed()[..] else {
            panic!("one runner")
        };
        assert_eq!(t.seconds(), [0.0, 0.0, 0.0, 1.0], "its last second idle");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_heard_late_adds_no_idle_the_runners_life_does_not_hold() {
        let book = TimesBook::default();
        let id = runner();
        book.started(&id, Instant::now());
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Heard late: the runner's next answer follows at once, its seconds those before.
        book.ran(&id, &timing(0.5, 0.5));
        tokio::time::sleep(Duration::from_millis(100)).await;
        book.ran(&id, &timing(0.5, 0.5));
        tokio::time::sleep(Duration::from_millis(1900)).await;
        book.ran(&id, &timing(1.0, 0.0));
        book.stopped(&id);
        let t = book.snapshot()[0].1;
        assert_eq!((t.idle_s, t.total()), (1.0, 4.0), "{t:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn each_live_runner_counts_its_own_gpus_readings_and_flushes_their_rises() {
        // Fake devices, as NVML would read them: GPU 0 busy, GPU 1 half, GPU 2 refusing.
        let gpu = |index: u32, percent: Option<u32>, mib: Option<u64>| GpuSample {
            index,
            name: "Fake GPU".into(),
            utilization_percent: percent,
            memory_utilization_percent: None,
            memory_used_bytes: mib.map(|m| m << 20),
            memory_total_bytes: Some(16 << 30),
        };
        let book = TimesBook::default();
        let on = |runner: &str, gpu: &str| RunnerId {
            node: "n".into(),
            runner: runner.into(),
            gpu: gpu.into(),
        };
        let (a, b, c, cpu) = (
            on("process001", "0"),
            on("process002", "1"),
            on("process003", "2"),
            on("process004", ""),
        );
        for id in [&a, &b, &c, &cpu] {
            book.started(id, Instant::now());
        }
        book.gpus_sampled(&[
            gpu(0, Some(90), Some(4096)),
            gpu(1, Some(40), Some(1024)),
            gpu(2, None, None),
        ]);
        let first = book.take_unflushed();
        book.gpus_sampled(&[gpu(0, Some(70), Some(2048)), gpu(1, Some(60), Some(3072))]);
        book.stopped(&b);
        // A runner that stopped counts no more readings.
        book.gpus_sampled(&[gpu(1, Some(100), Some(8192))]);
        let t = |id: &RunnerId| {
            book.snapshot()
                .into_iter()
                .find(|(r, _)| r == id)
                .unwrap()
                .1
        };
        assert_eq!(
            (t(&a).gpu_utilization_pct(), t(&a).gpu_memory_peak_mib()),
            (Some(80.0), Some(4096.0))
        );
        assert_eq!(
            (t(&b).gpu_utilization_pct(), t(&b).gpu_memory_peak_mib()),
            (Some(50.0), Some(3072.0))
        );
        assert_eq!(
            (t(&c).gpu_utilization_pct(), t(&c).gpu_memory_peak_mib()),
            (None, None)
        );
        assert!(first.iter().all(|(id, _)| id != &cpu), "no GPU, no reading");
        let second = book.take_unflushed();
        let of = |id: &RunnerId| second.iter().find(|(r, _)| r == id).unwrap().1;
        assert_eq!(of(&a).gpu_mem_peak_mib, 0.0, "no rise of GPU 0's peak");
        assert_eq!(
            of(&b).gpu_mem_peak_mib,
            2048.0,
            "GPU 1's peak rose by 2 GiB"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_start_is_init_and_a_new_runner_adds_to_its_slots_row() {
        let book = TimesBook::default();
        let id = runner();
        let born = Instant::now();
        tokio::time::sleep(Duration::from_secs(3)).await;
        book.failed_start(&id, born);
        let born = Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        book.started(&id, born);
        tokio::time::sleep(Duration::from_secs(1)).await;
        book.stopped(&id);
        let t = book.snapshot()[0].1;
        assert_eq!((t.init_s, t.idle_s, t.total()), (4.0, 1.0, 5.0));
    }
}
