//! What one sample becomes on disk: the CSV files' headers and rows (written with the `csv`
//! crate, so a command line with a comma or a quote stays one field), and the `ps`-like
//! listing under `os/`.

use std::fmt::Write as _;

use super::sample::{DiskSample, GpuSample, NodeSample, ProcessSample, Sample, ps_time};

/// `perf/<node>/node_resource_usage.csv`: the node as a whole, one row per sample.
pub const NODE_FILE: &str = "node_resource_usage.csv";
/// `perf/<node>/processes_resource_usage.csv`: one row per process of the job's runners.
pub const PROCESSES_FILE: &str = "processes_resource_usage.csv";
/// `perf/<node>/node_disk_usage.csv`: one row per file system the job writes to or reads.
pub const DISK_FILE: &str = "node_disk_usage.csv";
/// `perf/<node>/node_gpu_usage.csv`: one row per GPU, only on a node where NVML answers.
pub const GPU_FILE: &str = "node_gpu_usage.csv";

pub const NODE_HEADER: &[&str] = &[
    "time",
    "cpu_percent",
    "cpu_count",
    "memory_used_bytes",
    "memory_total_bytes",
    "disk_read_bytes",
    "disk_write_bytes",
    "network_rx_bytes",
    "network_tx_bytes",
];

pub const PROCESSES_HEADER: &[&str] = &[
    "time",
    "process_name",
    "pid",
    "ppid",
    "command",
    "cpu_percent",
    "rss_bytes",
    "read_bytes",
    "write_bytes",
    "threads",
];

pub const DISK_HEADER: &[&str] = &[
    "time",
    "used_for",
    "mount_point",
    "fs_type",
    "total_bytes",
    "used_bytes",
    "free_bytes",
];

pub const GPU_HEADER: &[&str] = &[
    "time",
    "gpu_index",
    "gpu_name",
    "gpu_utilization_percent",
    "memory_utilization_percent",
    "memory_used_bytes",
    "memory_total_bytes",
];

/// The folder of this node's files in the job's log folder.
pub fn perf_dir(node: &str) -> String {
    format!("perf/{node}")
}

/// Where a sample's `ps` listing goes, relative to [`perf_dir`]: `os/%Y%m%d%H/processes_%M`
/// (one file per minute; samples taken within the same minute append to it).
pub fn listing_path(time: &chrono::DateTime<chrono::Utc>) -> String {
    time.format("os/%Y%m%d%H/processes_%M").to_string()
}

/// One CSV record without its line end, as [`crate::logs::JobLogs::csv`] takes it.
pub fn record<I, F>(fields: I) -> String
where
    I: IntoIterator<Item = F>,
    F: AsRef<[u8]>,
{
    let mut writer = csv::WriterBuilder::new().from_writer(Vec::new());
    // Writing to a Vec cannot fail.
    let _ = writer.write_record(fields);
    let bytes = writer.into_inner().unwrap_or_default();
    let mut line = String::from_utf8_lossy(&bytes).into_owned();
    while line.ends_with(['\n', '\r']) {
        line.pop();
    }
    line
}

pub fn header(columns: &[&str]) -> String {
    record(columns)
}

fn percent(value: f64) -> String {
    format!("{value:.1}")
}

fn opt(value: Option<u64>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

pub fn node_row(time: &str, node: &NodeSample) -> String {
    record([
        time.to_owned(),
        percent(node.cpu_percent),
        node.cpu_count.to_string(),
        node.memory_used.to_string(),
        node.memory_total.to_string(),
        node.disk_read.to_string(),
        node.disk_write.to_string(),
        node.network_rx.to_string(),
        node.network_tx.to_string(),
    ])
}

pub fn process_row(time: &str, p: &ProcessSample) -> String {
    record([
        time.to_owned(),
        p.process_name.clone(),
        p.pid.to_string(),
        p.ppid.to_string(),
        p.command.clone(),
        percent(p.cpu_percent),
        p.rss_bytes.to_string(),
        opt(p.read_bytes),
        opt(p.write_bytes),
        p.threads.to_string(),
    ])
}

pub fn disk_row(time: &str, d: &DiskSample) -> String {
    record([
        time.to_owned(),
        d.used_for.join(";"),
        d.mount_point.clone(),
        d.fs_type.clone(),
        d.total_bytes.to_string(),
        d.used_bytes.to_string(),
        d.free_bytes.to_string(),
    ])
}

pub fn gpu_row(time: &str, g: &GpuSample) -> String {
    record([
        time.to_owned(),
        g.index.to_string(),
        g.name.clone(),
        opt(g.utilization_percent.map(u64::from)),
        opt(g.memory_utilization_percent.map(u64::from)),
        opt(g.memory_used_bytes),
        opt(g.memory_total_bytes),
    ])
}

/// The job's processes as `ps -eo uid,pid,ppid,pgid,stat,pcpu,pmem,rss,vsz,time,args`
/// shows them (`%CPU` over each process's life, as `ps` computes it), under a line with the
/// sample's time.
pub fn listing(sample: &Sample) -> String {
    let mut text = format!("# {}\n", sample.time_text);
    let _ = writeln!(
        text,
        "{:>6} {:>7} {:>7} {:>7} {:<4} {:>5} {:>5} {:>10} {:>10} {:>10} COMMAND",
        "UID", "PID", "PPID", "PGID", "STAT", "%CPU", "%MEM", "RSS(KiB)", "VSZ(KiB)", "TIME"
    );
    for p in &sample.listing {
        let _ = writeln!(
            text,
            "{:>6} {:>7} {:>7} {:>7} {:<4} {:>5.1} {:>5.1} {:>10} {:>10} {:>10} {}",
            p.uid.map(|u| u.to_string()).unwrap_or_else(|| "?".into()),
            p.pid,
            p.ppid,
            p.pgid,
            p.state,
            p.lifetime_cpu_percent,
            p.memory_percent,
            p.rss_bytes / 1024,
            p.vsize_bytes / 1024,
            ps_time(p.cpu_seconds),
            p.command
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::sample::ListedProcess;

    fn sample() -> Sample {
        Sample {
            time: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            time_text: "2023-11-14 22:13:20.000".into(),
            node: NodeSample {
                cpu_percent: 12.345,
                cpu_count: 2,
                memory_used: 1000,
                memory_total: 4000,
                disk_read: 5,
                disk_write: 6,
                network_rx: 7,
                network_tx: 8,
            },
            processes: vec![ProcessSample {
                process_name: "process000".into(),
                pid: 42,
                ppid: 1,
                command: "python, \"quoted\"".into(),
                cpu_percent: 99.96,
                rss_bytes: 2048,
                read_bytes: Some(10),
                write_bytes: None,
                threads: 3,
            }],
            disks: vec![DiskSample {
                used_for: vec!["logs".into(), "output".into()],
                mount_point: "/".into(),
                fs_type: "ext4".into(),
                total_bytes: 100,
                used_bytes: 60,
                free_bytes: 40,
            }],
            gpus: vec![GpuSample {
                index: 0,
                name: "Tesla T4".into(),
                utilization_percent: Some(50),
                memory_utilization_percent: None,
                memory_used_bytes: Some(1 << 30),
                memory_total_bytes: Some(16 << 30),
            }],
            listing: vec![ListedProcess {
                uid: Some(1000),
                pid: 42,
                ppid: 1,
                pgid: 42,
                state: 'S',
                lifetime_cpu_percent: 3.26,
                memory_percent: 0.5,
                rss_bytes: 2048,
                vsize_bytes: 4096,
                cpu_seconds: 75.0,
                command: "fleetrun-runner".into(),
            }],
        }
    }

    #[test]
    fn rows_line_up_with_their_headers_and_quote_what_needs_it() {
        let s = sample();
        let t = &s.time_text;
        let node = node_row(t, &s.node);
        assert_eq!(node, "2023-11-14 22:13:20.000,12.3,2,1000,4000,5,6,7,8");
        assert_eq!(node.split(',').count(), NODE_HEADER.len());
        assert_eq!(
            process_row(t, &s.processes[0]),
            "2023-11-14 22:13:20.000,process000,42,1,\"python, \"\"quoted\"\"\",100.0,2048,10,,3"
        );
        let disk = disk_row(t, &s.disks[0]);
        assert_eq!(disk, "2023-11-14 22:13:20.000,logs;output,/,ext4,100,60,40");
        assert_eq!(disk.split(',').count(), DISK_HEADER.len());
        let gpu = gpu_row(t, &s.gpus[0]);
        assert_eq!(
            gpu,
            "2023-11-14 22:13:20.000,0,Tesla T4,50,,1073741824,17179869184"
        );
        assert_eq!(gpu.split(',').count(), GPU_HEADER.len());
        assert_eq!(
            header(PROCESSES_HEADER),
            "time,process_name,pid,ppid,command,cpu_percent,rss_bytes,read_bytes,write_bytes,threads"
        );
    }

    #[test]
    fn the_listing_is_named_after_the_hour_and_minute_and_shows_each_process() {
        let s = sample();
        assert_eq!(listing_path(&s.time), "os/2023111422/processes_13");
        let text = listing(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# 2023-11-14 22:13:20.000");
        assert!(lines[1].contains("PID") && lines[1].ends_with("COMMAND"));
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "1000",
                "42",
                "1",
                "42",
                "S",
                "3.3",
                "0.5",
                "2",
                "4",
                "01:15",
                "fleetrun-runner"
            ]
        );
    }
}
