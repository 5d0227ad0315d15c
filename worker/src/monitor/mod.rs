//! The resource monitor (CONTRACT.md §7, `perf/<node_id>/`): every
//! `resource_monitor_interval` seconds of a job, a node samples itself, the job's runner
//! processes (and what their scripts started), the file systems the job uses and its GPUs,
//! and appends the sample to the job's log folder.
//!
//! One monitor per job and node, started with the job's first runner on the node; its first
//! sample is taken as soon as that runner is ready (so a short job still has a row), then
//! one every interval until the job stops on the node or the worker ends. Sampling reads
//! `/proc` on a blocking thread, never on the agent's: the mini-batch path does not wait on
//! it. `resource_monitor_interval = 0` starts no monitor and writes no `perf/<node>/` folder
//! (`perf/runners.csv`, the runners' times, is the job's results', not the monitor's).
//!
//! # Layout
//!
//! - `sample`: what one sample reads (`procfs`, `statvfs`), and the CPU counters it keeps.
//! - `gpu`: the GPUs' part, through NVML when the node has it.
//! - `files`: the CSV files' columns and rows, and the `ps` listing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::logs::JobLogs;

mod files;
mod gpu;
mod sample;

pub use files::{DISK_FILE, GPU_FILE, NODE_FILE, PROCESSES_FILE, perf_dir};
pub use gpu::GpuProbe;
pub use sample::GpuSample;
use sample::{Sample, Sampler};

/// The runner processes of a job on this node, by name and pid (each leads its process
/// group, which the processes its script starts join).
#[derive(Default)]
pub struct Runners {
    list: Mutex<Vec<(String, i32)>>,
    /// Wakes the monitor for its first sample once a runner is ready.
    first: Notify,
}

impl Runners {
    pub fn add(&self, name: &str, pid: i32) {
        self.list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name.to_owned(), pid));
        self.first.notify_one();
    }

    /// The runners still there (`is_alive` by pid); the others are forgotten.
    pub fn alive(&self, is_alive: impl Fn(i32) -> bool) -> Vec<(String, i32)> {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|(_, pid)| is_alive(*pid));
        list.clone()
    }
}

/// What a monitor needs to know about its job and node.
pub struct MonitorSettings {
    /// `resource_monitor_interval`.
    pub interval: Duration,
    pub node: String,
    pub logs: Arc<JobLogs>,
    /// The folders whose file systems are reported, with what the job keeps in each.
    pub folders: Vec<(String, PathBuf)>,
    /// Where each sample's GPU readings are counted for the job's runners (their GPUs'
    /// mean utilisation and peak memory in `perf/runners.csv`), if anywhere.
    pub times: Option<Arc<crate::agent::times::TimesBook>>,
}

/// A job's monitor on one node: the runners it watches and its task.
#[derive(Default)]
pub struct Monitor {
    runners: Arc<Runners>,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Monitor {
    /// Starts the monitor unless it runs already (or ran: a stopped monitor stays stopped).
    /// It ends by itself when `job_stop` fires.
    pub fn start_once(
        &self,
        settings: impl FnOnce() -> MonitorSettings,
        job_stop: CancellationToken,
    ) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_some() || self.stop.is_cancelled() {
            return;
        }
        let settings = settings();
        let interval = settings.interval;
        if interval.is_zero() {
            return;
        }
        let probe = NodeProbe {
            sampler: None,
            runners: self.runners.clone(),
            settings,
        };
        let stop = self.stop.clone();
        let runners = self.runners.clone();
        *task = Some(tokio::spawn(async move {
            // Either stop ends the watch between two samples, never in the middle of one.
            let stopped = CancellationToken::new();
            let forward = async {
                tokio::select! {
                    _ = job_stop.cancelled() => {}
                    _ = stop.cancelled() => {}
                }
                stopped.cancel();
                std::future::pending::<()>().await
            };
            tokio::select! {
                _ = watch(interval, &runners.first, probe, &stopped) => {}
                _ = forward => {}
            }
        }));
    }

    /// Notes a runner of the job that is ready on this node.
    pub fn runner_started(&self, name: &str, pid: u32) {
        self.runners.add(name, pid as i32);
    }

    /// Stops the monitor and waits until it wrote its last sample: nothing writes the log
    /// folder after this returns.
    pub async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Takes and records one sample.
#[async_trait]
trait Probe: Send {
    async fn take(&mut self);
}

/// The monitor's clock: the first sample once a runner is ready (or one interval after the
/// start, if none gets ready), then one every `interval`, until `stop` (a sample under way
/// is finished first). A sample that takes
/// longer than the interval delays the next rather than bunching them up.
async fn watch(
    interval: Duration,
    first_runner: &Notify,
    mut probe: impl Probe,
    stop: &CancellationToken,
) {
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = first_runner.notified() => {}
        _ = tokio::time::sleep(interval) => {}
    }
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        probe.take().await;
    }
}

/// The real probe: samples the node on a blocking thread and appends to the job's logs.
struct NodeProbe {
    /// Made on the first sample (opening NVML may take a moment), then kept.
    sampler: Option<Sampler>,
    runners: Arc<Runners>,
    settings: MonitorSettings,
}

#[async_trait]
impl Probe for NodeProbe {
    async fn take(&mut self) {
        let sampler = self.sampler.take();
        let runners = self.runners.clone();
        let folders = self.settings.folders.clone();
        let logs = self.settings.logs.clone();
        let node = self.settings.node.clone();
        let times = self.settings.times.clone();
        let taken = tokio::task::spawn_blocking(move || {
            let mut sampler = sampler.unwrap_or_else(|| Sampler::new(runners, folders));
            let sample = sampler.sample();
            write(&logs, &node, &sample);
            if let Some(times) = times {
                times.gpus_sampled(&sample.gpus);
            }
            sampler
        });
        match taken.await {
            Ok(sampler) => self.sampler = Some(sampler),
            Err(e) => tracing::warn!(error = %e, "A resource sample failed."),
        }
    }
}

/// Appends a sample to `perf/<node>/`.
fn write(logs: &JobLogs, node: &str, sample: &Sample) {
    let dir = perf_dir(node);
    let time = &sample.time_text;
    logs.csv(
        format!("{dir}/{NODE_FILE}"),
        &files::header(files::NODE_HEADER),
        &files::node_row(time, &sample.node),
    );
    let rows = [
        (
            PROCESSES_FILE,
            files::PROCESSES_HEADER,
            sample
                .processes
                .iter()
                .map(|p| files::process_row(time, p))
                .collect::<Vec<_>>(),
        ),
        (
            DISK_FILE,
            files::DISK_HEADER,
            sample
                .disks
                .iter()
                .map(|d| files::disk_row(time, d))
                .collect(),
        ),
        (
            GPU_FILE,
            files::GPU_HEADER,
            sample
                .gpus
                .iter()
                .map(|g| files::gpu_row(time, g))
                .collect(),
        ),
    ];
    for (file, columns, rows) in rows {
        let header = files::header(columns);
        for row in rows {
            logs.csv(format!("{dir}/{file}"), &header, &row);
        }
    }
    let listing = logs.path(format!("{dir}/{}", files::listing_path(&sample.time)));
    if let Err(e) = append(&listing, &files::listing(sample)) {
        tracing::warn!(path = %listing.display(), error = %e, "Cannot write a process listing.");
    }
}

/// Appends to a file of its own (opened and closed each time: one per minute, too many to
/// keep open through a long job).
fn append(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use tokio::time::Instant;

    use super::*;

    struct Counting(Arc<Mutex<Vec<Instant>>>);

    #[async_trait]
    impl Probe for Counting {
        async fn take(&mut self) {
            self.0.lock().unwrap().push(Instant::now());
        }
    }

    fn offsets(times: &Mutex<Vec<Instant>>, start: Instant) -> Vec<u64> {
        times
            .lock()
            .unwrap()
            .iter()
            .map(|t| (*t - start).as_secs())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn samples_start_with_the_first_runner_then_follow_the_interval_until_stopped() {
        let start = Instant::now();
        let times = Arc::new(Mutex::new(Vec::new()));
        let runners = Arc::new(Runners::default());
        let stop = CancellationToken::new();
        let task = {
            let (runners, stop, probe) = (runners.clone(), stop.clone(), Counting(times.clone()));
            tokio::spawn(async move {
                watch(Duration::from_secs(10), &runners.first, probe, &stop).await
            })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        runners.add("process000", 1);
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(offsets(&times, start), [3, 13, 23]);
        stop.cancel();
        task.await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            offsets(&times, start),
            [3, 13, 23],
            "nothing after the stop"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_ready_runner_the_first_sample_comes_one_interval_in() {
        let start = Instant::now();
        let times = Arc::new(Mutex::new(Vec::new()));
        let runners = Arc::new(Runners::default());
        let stop = CancellationToken::new();
        let probe = Counting(times.clone());
        tokio::select! {
            _ = watch(Duration::from_secs(10), &runners.first, probe, &stop) => unreachable!(),
            _ = tokio::time::sleep(Duration::from_secs(15)) => {}
        }
        assert_eq!(offsets(&times, start), [10]);
    }

    #[tokio::test]
    async fn a_monitor_writes_every_file_and_stops_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let logs = Arc::new(JobLogs::new(dir.path()));
        let monitor = Monitor::default();
        let job_stop = CancellationToken::new();
        let settings = || MonitorSettings {
            interval: Duration::from_secs(3600),
            node: "n1".into(),
            logs: logs.clone(),
            folders: vec![("logs".into(), dir.path().to_owned())],
            times: None,
        };
        // A process in a group of its own plays the runner.
        let mut runner = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        monitor.start_once(settings, job_stop.clone());
        monitor.runner_started("process000", runner.id());
        let perf = dir.path().join("perf/n1");
        let node_csv = perf.join(NODE_FILE);
        for _ in 0..500 {
            logs.flush();
            if std::fs::read_to_string(&node_csv).is_ok_and(|t| t.lines().count() >= 2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        monitor.stop().await;
        runner.kill().unwrap();
        runner.wait().unwrap();
        logs.flush();
        for file in [NODE_FILE, PROCESSES_FILE, DISK_FILE] {
            let text = std::fs::read_to_string(perf.join(file)).unwrap();
            assert_eq!(
                text.lines().count(),
                2,
                "{file}: a header and one row\n{text}"
            );
        }
        let processes = std::fs::read_to_string(perf.join(PROCESSES_FILE)).unwrap();
        assert!(processes.contains(&format!(",process000,{},", runner.id())));
        let hours: Vec<_> = std::fs::read_dir(perf.join("os")).unwrap().collect();
        assert_eq!(hours.len(), 1, "one hour folder");
        // The listing holds the runner's group alone: not this test, nor anything else.
        let hour = hours.into_iter().next().unwrap().unwrap().path();
        let minute = std::fs::read_dir(hour).unwrap().next().unwrap().unwrap();
        let listing = std::fs::read_to_string(minute.path()).unwrap();
        let groups: Vec<&str> = listing
            .lines()
            .skip(2)
            .map(|line| line.split_whitespace().nth(3).unwrap())
            .collect();
        assert_eq!(groups, [runner.id().to_string()], "{listing}");
        // Stopped is stopped: a later start does nothing.
        monitor.start_once(settings, job_stop);
        assert!(monitor.task.lock().unwrap().is_none());
    }
}
