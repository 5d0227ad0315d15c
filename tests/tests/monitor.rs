//! `fleetrun run` with the resource monitor (`logs/perf/<node>/`) and the profiling switch
//! (`logs/sys/profile/<node>/`).

use std::path::PathBuf;
use std::process::Command;

use fleetrun_tests::{JobDir, code, files_under, output_within};
use std::time::Duration;

/// Takes a moment per mini-batch and returns the runner's pid, so the job lasts a couple
/// of seconds and says which processes ran it.
const SLOW: &str = r#"
import os, time

def run(mini_batch):
    time.sleep(0.4)
    return [str(os.getpid()) for _ in mini_batch]
"#;

/// A CSV file's header and rows, split on commas (the monitor's fields hold none here).
fn csv(job: &JobDir, rel: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let text = job.log(rel);
    let mut lines = text
        .lines()
        .map(|l| l.split(',').map(str::to_owned).collect());
    let header = lines.next().unwrap_or_default();
    (header, lines.collect())
}

#[test]
fn the_monitor_writes_the_nodes_the_processes_and_the_disks_usage() {
    let job = JobDir::new(
        SLOW,
        "mini_batch_size = 1\nprocess_count_per_node = 1\nresource_monitor_interval = 1",
    );
    job.inputs(5);
    let out = job.run(&[]);
    assert_eq!(code(&out), 0);
    let pid = job.output_lines()[0].clone();

    let (header, rows) = csv(&job, "perf/0/node_resource_usage.csv");
    assert_eq!(
        header,
        [
            "time",
            "cpu_percent",
            "cpu_count",
            "memory_used_bytes",
            "memory_total_bytes",
            "disk_read_bytes",
            "disk_write_bytes",
            "network_rx_bytes",
            "network_tx_bytes"
        ]
    );
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|r| r.len() == header.len()));
    assert!(
        rows.iter().all(|r| r[4].parse::<u64>().unwrap() > 0),
        "memory total"
    );

    let (header, rows) = csv(&job, "perf/0/processes_resource_usage.csv");
    assert_eq!(&header[..3], ["time", "process_name", "pid"]);
    assert!(
        rows.iter().any(|r| r[1] == "process000" && r[2] == pid),
        "a row for process000, pid {pid}: {rows:?}"
    );

    let (header, rows) = csv(&job, "perf/0/node_disk_usage.csv");
    assert_eq!(
        header,
        [
            "time",
            "used_for",
            "mount_point",
            "fs_type",
            "total_bytes",
            "used_bytes",
            "free_bytes"
        ]
    );
    assert!(
        rows.iter().any(|r| r[1].split(';').any(|u| u == "output")),
        "the output's file system: {rows:?}"
    );

    let listings: Vec<PathBuf> = files_under(&job.path("out/logs/perf/0"))
        .into_iter()
        .filter(|p| p.starts_with("os"))
        .collect();
    assert!(!listings.is_empty());
    for listing in &listings {
        let parts: Vec<String> = listing
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        assert_eq!(parts.len(), 3, "os/%Y%m%d%H/processes_%M: {listing:?}");
        assert!(parts[1].len() == 10 && parts[1].bytes().all(|b| b.is_ascii_digit()));
        assert!(
            parts[2]
                .strip_prefix("processes_")
                .is_some_and(|m| m.len() == 2)
        );
    }
    let all: String = listings
        .iter()
        .map(|l| job.log(&format!("perf/0/{}", l.display())))
        .collect();
    assert!(
        all.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(pid.as_str())),
        "the runner in a listing:\n{all}"
    );
}

#[test]
fn a_zero_interval_writes_no_perf_folder() {
    let job = JobDir::new(SLOW, "mini_batch_size = 1\nresource_monitor_interval = 0");
    job.inputs(2);
    assert_eq!(code(&job.run(&[])), 0);
    assert!(job.path("out/logs/sys").is_dir());
    // The runners' times are the results', not the monitor's: no node's folder beside them.
    let perf: Vec<_> = std::fs::read_dir(job.path("out/logs/perf"))
        .map(|dir| dir.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert_eq!(perf, ["runners.csv"], "{perf:?}");
    let csv = job.log("perf/runners.csv");
    assert!(
        csv.lines().nth(1).unwrap().ends_with(",,"),
        "no GPU use: {csv}"
    );
}

#[test]
fn profile_writes_each_runners_stats_for_pstats() {
    let job = JobDir::new(
        SLOW,
        "mini_batch_size = 1\nprocess_count_per_node = 2\nprofile = true",
    );
    job.inputs(6);
    assert_eq!(code(&job.run(&[])), 0);
    let started: Vec<String> = job
        .log("sys/node/0/_main.txt")
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .nth(2)
                .filter(|_| l.contains(" started: pid "))
        })
        .map(str::to_owned)
        .collect();
    assert_eq!(started.len(), 2, "both runners started");
    let dir = job.path("out/logs/sys/profile/0");
    let profiles: Vec<String> = files_under(&dir)
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    // The two runners start side by side: either may log first.
    let mut expected: Vec<String> = started.iter().map(|p| format!("{p}.profile")).collect();
    expected.sort();
    assert_eq!(profiles, expected);
    for profile in &profiles {
        let code = "import pstats, sys\nprint(sorted({name for (_, _, name) in pstats.Stats(sys.argv[1]).stats}))";
        let out = output_within(
            Command::new("python3")
                .args(["-c", code])
                .arg(dir.join(profile)),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let names = String::from_utf8_lossy(&out.stdout);
        assert!(names.contains("'run'"), "{profile}: {names}");
    }
}
