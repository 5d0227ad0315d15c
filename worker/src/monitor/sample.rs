//! One look at the node through `/proc` (the `procfs` crate), `statvfs(2)` (`rustix`) and
//! NVML: what a sample holds, and the [`Sampler`] that keeps the previous counters so CPU
//! percentages cover the time since the last sample.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use procfs::process::{Process, Stat};
use procfs::{Current, CurrentSI};

use super::Runners;
use super::gpu::GpuProbe;

/// One sample of the node, the job's runner processes, its file systems and GPUs.
pub struct Sample {
    pub time: chrono::DateTime<chrono::Utc>,
    /// `time` as the CSV files show it.
    pub time_text: String,
    pub node: NodeSample,
    pub processes: Vec<ProcessSample>,
    pub disks: Vec<DiskSample>,
    pub gpus: Vec<GpuSample>,
    /// The job's processes (the runners' process groups), for the `ps` listing. Never the
    /// node's others: their command lines are not the job's to read (a worker started with
    /// `--amqp-url` shows its password there).
    pub listing: Vec<ListedProcess>,
}

pub struct NodeSample {
    /// Busy share of all cores since the previous sample (since boot for the first), 0–100.
    pub cpu_percent: f64,
    pub cpu_count: usize,
    /// `MemTotal − MemAvailable`.
    pub memory_used: u64,
    pub memory_total: u64,
    /// Bytes read from / written to the node's physical disks since boot (kernel counters).
    pub disk_read: u64,
    pub disk_write: u64,
    /// Bytes received / sent on every interface but loopback since boot (kernel counters).
    pub network_rx: u64,
    pub network_tx: u64,
}

pub struct ProcessSample {
    /// The runner (`processNNN`) this process belongs to: the runner itself or a process its
    /// script started (its process group).
    pub process_name: String,
    pub pid: i32,
    pub ppid: i32,
    pub command: String,
    /// CPU time over wall time since the previous sample (since the process started for
    /// its first); above 100 when it keeps several cores busy.
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    /// Bytes the process caused to be read from / written to storage since it started
    /// (`/proc/<pid>/io`); `None` when the kernel does not say.
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    pub threads: i64,
}

pub struct DiskSample {
    /// What the job keeps there: `logs`, `output`, `input`, `scratch`, `tmp`.
    pub used_for: Vec<String>,
    pub mount_point: String,
    pub fs_type: String,
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// Free to an unprivileged user (`f_bavail`).
    pub free_bytes: u64,
}

pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub utilization_percent: Option<u32>,
    pub memory_utilization_percent: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
}

/// A line of the `ps` listing.
pub struct ListedProcess {
    pub uid: Option<u32>,
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub state: char,
    /// CPU time over the process's life, as `ps` shows it.
    pub lifetime_cpu_percent: f64,
    pub memory_percent: f64,
    pub rss_bytes: u64,
    pub vsize_bytes: u64,
    pub cpu_seconds: f64,
    pub command: String,
}

/// Takes samples, keeping what the next one needs (the previous CPU counters, NVML).
pub struct Sampler {
    runners: Arc<Runners>,
    /// The folders whose file systems `node_disk_usage.csv` reports, with what each holds.
    folders: Vec<(String, PathBuf)>,
    gpus: GpuProbe,
    ticks_per_second: f64,
    page_size: u64,
    /// The node's (busy, total) CPU ticks at the previous sample.
    node_cpu: Option<(u64, u64)>,
    /// Each job process's CPU ticks at the previous sample, by (pid, start time).
    process_cpu: HashMap<(i32, u64), u64>,
    last: Option<Instant>,
}

impl Sampler {
    pub fn new(runners: Arc<Runners>, folders: Vec<(String, PathBuf)>) -> Sampler {
        Sampler {
            runners,
            folders,
            gpus: GpuProbe::open(),
            ticks_per_second: procfs::ticks_per_second().max(1) as f64,
            page_size: procfs::page_size(),
            node_cpu: None,
            process_cpu: HashMap::new(),
            last: None,
        }
    }

    /// Reads everything once. A source that cannot be read leaves its part empty (zeros, no
    /// rows): the monitor never fails a job.
    pub fn sample(&mut self) -> Sample {
        let time = chrono::Utc::now();
        let now = Instant::now();
        let since_last = self.last.map(|t| now.duration_since(t).as_secs_f64());
        self.last = Some(now);
        let uptime = procfs::Uptime::current().map(|u| u.uptime).unwrap_or(0.0);
        let memory = procfs::Meminfo::current().ok();
        let memory_total = memory.as_ref().map_or(0, |m| m.mem_total);
        let memory_available = memory
            .as_ref()
            .map_or(0, |m| m.mem_available.unwrap_or(m.mem_free));

        let processes = all_processes();
        let runners = self.runners.alive(|pid| {
            processes
                .iter()
                .any(|(_, stat)| stat.pid == pid && stat.pgrp == pid)
        });
        let listing = processes
            .iter()
            .filter(|(_, stat)| runners.iter().any(|(_, leader)| stat.pgrp == *leader))
            .map(|(process, stat)| self.listed(process, stat, uptime, memory_total))
            .collect();
        let job_processes = self.job_processes(&processes, runners, uptime, since_last);
        Sample {
            time_text: time.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            time,
            node: NodeSample {
                cpu_percent: self.node_cpu_percent(),
                cpu_count: std::thread::available_parallelism().map_or(1, |n| n.get()),
                memory_used: memory_total.saturating_sub(memory_available),
                memory_total,
                disk_read: disk_bytes(|d| d.sectors_read),
                disk_write: disk_bytes(|d| d.sectors_written),
                network_rx: network_bytes(|d| d.recv_bytes),
                network_tx: network_bytes(|d| d.sent_bytes),
            },
            processes: job_processes,
            disks: disks(&self.folders),
            gpus: self.gpus.sample(),
            listing,
        }
    }

    fn node_cpu_percent(&mut self) -> f64 {
        let Ok(stats) = procfs::KernelStats::current() else {
            return 0.0;
        };
        let t = &stats.total;
        let idle = t.idle + t.iowait.unwrap_or(0);
        let total = t.user
            + t.nice
            + t.system
            + idle
            + t.irq.unwrap_or(0)
            + t.softirq.unwrap_or(0)
            + t.steal.unwrap_or(0);
        let busy = total - idle;
        let (busy_before, total_before) = self.node_cpu.replace((busy, total)).unwrap_or((0, 0));
        let spent = total.saturating_sub(total_before);
        if spent == 0 {
            return 0.0;
        }
        100.0 * busy.saturating_sub(busy_before) as f64 / spent as f64
    }

    /// The runners' processes and what each started (its process group), from the runners
    /// still there (by name and pid).
    fn job_processes(
        &mut self,
        processes: &[(Process, Stat)],
        runners: Vec<(String, i32)>,
        uptime: f64,
        since_last: Option<f64>,
    ) -> Vec<ProcessSample> {
        let mut seen = HashMap::new();
        let mut rows = Vec::new();
        for (name, leader) in runners {
            for (process, stat) in processes.iter().filter(|(_, s)| s.pgrp == leader) {
                let ticks = stat.utime + stat.stime;
                let key = (stat.pid, stat.starttime);
                let cpu_percent = match (self.process_cpu.get(&key), since_last) {
                    (Some(before), Some(wall)) if wall > 0.0 => {
                        100.0 * ticks.saturating_sub(*before) as f64 / self.ticks_per_second / wall
                    }
                    _ => self.lifetime_cpu_percent(stat, uptime),
                };
                seen.insert(key, ticks);
                let io = process.io().ok();
                rows.push(ProcessSample {
                    process_name: name.clone(),
                    pid: stat.pid,
                    ppid: stat.ppid,
                    command: stat.comm.clone(),
                    cpu_percent,
                    rss_bytes: stat.rss * self.page_size,
                    read_bytes: io.as_ref().map(|io| io.read_bytes),
                    write_bytes: io.as_ref().map(|io| io.write_bytes),
                    threads: stat.num_threads,
                });
            }
        }
        self.process_cpu = seen;
        rows
    }

    fn lifetime_cpu_percent(&self, stat: &Stat, uptime: f64) -> f64 {
        let alive = uptime - stat.starttime as f64 / self.ticks_per_second;
        if alive <= 0.0 {
            return 0.0;
        }
        100.0 * (stat.utime + stat.stime) as f64 / self.ticks_per_second / alive
    }

    fn listed(
        &self,
        process: &Process,
        stat: &Stat,
        uptime: f64,
        memory_total: u64,
    ) -> ListedProcess {
        let rss_bytes = stat.rss * self.page_size;
        let command = match process.cmdline() {
            Ok(args) if !args.is_empty() => args.join(" "),
            _ => format!("[{}]", stat.comm),
        };
        ListedProcess {
            uid: process.uid().ok(),
            pid: stat.pid,
            ppid: stat.ppid,
            pgid: stat.pgrp,
            state: stat.state,
            lifetime_cpu_percent: self.lifetime_cpu_percent(stat, uptime),
            memory_percent: if memory_total == 0 {
                0.0
            } else {
                100.0 * rss_bytes as f64 / memory_total as f64
            },
            rss_bytes,
            vsize_bytes: stat.vsize,
            cpu_seconds: (stat.utime + stat.stime) as f64 / self.ticks_per_second,
            command,
        }
    }
}

/// Every process `/proc` shows, with its `stat`; those that end while being read are left out.
fn all_processes() -> Vec<(Process, Stat)> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    let mut processes: Vec<(Process, Stat)> = all
        .filter_map(Result::ok)
        .filter_map(|p| p.stat().ok().map(|s| (p, s)))
        .collect();
    processes.sort_by_key(|(_, s)| s.pid);
    processes
}

/// Bytes moved on the node's physical disks (those with a `device` under `/sys/block`, so
/// partitions, device-mapper and loop devices do not count twice).
fn disk_bytes(sectors: impl Fn(&procfs::DiskStat) -> u64) -> u64 {
    let Ok(stats) = procfs::diskstats() else {
        return 0;
    };
    stats
        .iter()
        .filter(|d| {
            Path::new("/sys/block")
                .join(&d.name)
                .join("device")
                .exists()
        })
        .map(|d| sectors(d) * 512)
        .sum()
}

fn network_bytes(bytes: impl Fn(&procfs::net::DeviceStatus) -> u64) -> u64 {
    procfs::net::dev_status().map_or(0, |devices| {
        devices.values().filter(|d| d.name != "lo").map(bytes).sum()
    })
}

/// The file systems holding `folders`, one row each, naming what the job keeps there.
fn disks(folders: &[(String, PathBuf)]) -> Vec<DiskSample> {
    let mounts: Vec<procfs::process::MountInfo> = Process::myself()
        .and_then(|p| p.mountinfo())
        .map(|m| m.into_iter().collect())
        .unwrap_or_default();
    let mut rows: Vec<DiskSample> = Vec::new();
    for (role, folder) in folders {
        let Some(path) = existing(folder) else {
            continue;
        };
        let mount = mounts
            .iter()
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len());
        let mount_point = mount.map_or_else(
            || path.display().to_string(),
            |m| m.mount_point.display().to_string(),
        );
        if let Some(row) = rows.iter_mut().find(|r| r.mount_point == mount_point) {
            if !row.used_for.contains(role) {
                row.used_for.push(role.clone());
            }
            continue;
        }
        let Ok(vfs) = rustix::fs::statvfs(&path) else {
            continue;
        };
        let block = vfs.f_frsize.max(1);
        rows.push(DiskSample {
            used_for: vec![role.clone()],
            mount_point,
            fs_type: mount.map(|m| m.fs_type.clone()).unwrap_or_default(),
            total_bytes: vfs.f_blocks * block,
            used_bytes: vfs.f_blocks.saturating_sub(vfs.f_bfree) * block,
            free_bytes: vfs.f_bavail * block,
        });
    }
    rows
}

/// The folder, or its nearest ancestor that exists, with links resolved.
fn existing(folder: &Path) -> Option<PathBuf> {
    folder.ancestors().find_map(|p| p.canonicalize().ok())
}

/// CPU seconds as `ps` shows TIME: `MM:SS`, or `H:MM:SS` past an hour.
pub fn ps_time(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m:02}:{s:02}")
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn a_real_sample_finds_the_runner_and_its_child_by_process_group() {
        // A shell leading a group of its own plays the runner; the `sleep` it starts, its script's child.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let runners = Arc::new(Runners::default());
        runners.add("process007", pid);
        let dir = tempfile::tempdir().unwrap();
        let mut sampler = Sampler::new(
            runners.clone(),
            vec![("logs".into(), dir.path().join("not/yet"))],
        );
        let mut samples = Vec::new();
        // Bounded: the shell starts its child within moments.
        for _ in 0..500 {
            let s = sampler.sample();
            let started = s.processes.iter().any(|p| p.command == "sleep");
            samples.push(s);
            if started && samples.len() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: signals the group this test started and has not reaped yet.
        unsafe { libc::killpg(pid, libc::SIGKILL) };
        child.wait().unwrap();
        let after = sampler.sample();

        let last = samples.last().unwrap();
        let runner = last
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .expect("runner row");
        assert_eq!(
            (runner.process_name.as_str(), runner.command.as_str()),
            ("process007", "sh")
        );
        assert!(runner.rss_bytes > 0);
        let sleep = last
            .processes
            .iter()
            .find(|p| p.command == "sleep")
            .expect("child row");
        assert_eq!(
            (sleep.process_name.as_str(), sleep.ppid),
            ("process007", pid)
        );
        assert!(
            last.listing
                .iter()
                .any(|p| p.pid == pid && p.command == "sh -c sleep 30 & wait")
        );
        assert!(last.node.memory_total > 0 && last.node.memory_used > 0);
        assert!((0.0..=100.0).contains(&last.node.cpu_percent));
        assert_eq!(
            last.disks.len(),
            1,
            "the folder's nearest existing ancestor"
        );
        assert_eq!(last.disks[0].used_for, ["logs"]);
        assert!(last.disks[0].total_bytes >= last.disks[0].free_bytes);
        assert!(
            after.processes.is_empty(),
            "a runner that is gone has no rows"
        );
        assert!(runners.alive(|_| true).is_empty(), "and is forgotten");
    }

    #[test]
    fn ps_time_is_minutes_and_seconds_then_hours() {
        assert_eq!(ps_time(75.9), "01:15");
        assert_eq!(ps_time(3725.0), "1:02:05");
    }
}
