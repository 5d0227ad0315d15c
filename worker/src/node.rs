//! This node as one process: its id in logs, its scratch folder under the temp dir, and the
//! sweep of scratch folders whose process is gone.
//!
//! Several `fleetrun-worker`s (and `fleetrun run`s) may share a host and its temp dir, so a
//! default id and a scratch folder belong to one process, not to the host. A scratch folder's
//! name ends with its owner's pid and start time (`fleetrun-<label>-pid<pid>-<start>`): once
//! that process is gone, whoever starts next removes the folder, even after a `kill -9`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::builder::RangedU64ValueParser;

/// How every scratch folder's name starts.
pub const SCRATCH_PREFIX: &str = "fleetrun-";

/// The most runner processes one node runs (the job file's `process_count_per_node` has the
/// same bound).
pub const MAX_PROCESSES: u64 = 1024;

/// CONTRACT §2's default `process_count_per_node`: 1 on a machine with GPUs, else one per
/// core.
pub fn default_process_count(gpus: usize) -> usize {
    if gpus > 0 {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// A worker's runner slots unless told otherwise: one per GPU on a machine with GPUs (each
/// runner its own), else one per core.
pub fn default_slots(gpus: usize) -> usize {
    if gpus > 0 {
        gpus
    } else {
        default_process_count(0)
    }
}

/// Parses a `--processes` flag: 1 to [`MAX_PROCESSES`].
pub fn processes_parser() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..=MAX_PROCESSES)
}

/// The host's name, or `node` when it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}

/// `<host>-<pid>-<4 hex digits>`: the pid finds the process on its host; the random digits
/// tell apart processes whose host name and pid are alike (containers sharing the host's
/// network each run their worker as pid 1).
pub fn default_node_id() -> String {
    format!(
        "{}-{}-{:04x}",
        hostname(),
        std::process::id(),
        rand::random::<u16>()
    )
}

/// Where a worker keeps code, staged inputs and logs unless told otherwise: this process's
/// scratch folder, named after the node.
pub fn default_cache_dir(temp_dir: &Path, node_id: &str) -> PathBuf {
    scratch_dir(temp_dir, &format!("worker-{node_id}"))
}

/// This process's scratch folder for `label` under `temp_dir` (not created here). Folders
/// named by this function, and only those, are removed by [`sweep_stale_scratch`] once this
/// process is gone.
pub fn scratch_dir(temp_dir: &Path, label: &str) -> PathBuf {
    let pid = std::process::id();
    // This process's own stat is always readable; 0 would only make the folder look stale
    // sooner, never keep another's.
    let start = start_time(pid).unwrap_or(0);
    temp_dir.join(format!("{SCRATCH_PREFIX}{label}-pid{pid}-{start}"))
}

/// Removes the scratch folders under `temp_dir` whose owning process is gone, and returns
/// them. Leaves alone whatever [`scratch_dir`] did not name, a folder of another user, and
/// a folder whose process still runs. Best effort: a folder that cannot be removed is
/// logged and skipped.
pub fn sweep_stale_scratch(temp_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(temp_dir) else {
        return Vec::new();
    };
    // SAFETY: `geteuid` only reads a process attribute.
    let uid = unsafe { libc::geteuid() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let Some((pid, start)) = entry.file_name().to_str().and_then(scratch_owner) else {
            continue;
        };
        // Not followed: a link is not a scratch folder.
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid || owner_runs(pid, start) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(folder = %path.display(), pid, "Removed a stale scratch folder.");
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(folder = %path.display(), error = %e, "Cannot remove a stale scratch folder.")
            }
        }
    }
    removed
}

/// The pid and start time a scratch folder's name ends with, if [`scratch_dir`] named it.
fn scratch_owner(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix(SCRATCH_PREFIX)?;
    let (rest, start) = rest.rsplit_once('-')?;
    let (_label, pid) = rest.rsplit_once("-pid")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(start) {
        return None;
    }
    Some((pid.parse().ok().filter(|&p| p > 0)?, start.parse().ok()?))
}

/// Whether process `pid` runs and is the one that started at `start`; a pid handed to a later
/// process, or a zombie, is not the owner. When `/proc` cannot tell, the owner counts as
/// running, so nothing is removed on a guess.
fn owner_runs(pid: u32, start: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match stat_fields(&stat) {
            Some((state, started)) => state != "Z" && started == start,
            None => true,
        },
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// A process's start time, in clock ticks after boot (`/proc/<pid>/stat`, field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&stat).map(|(_, start)| start)
}

/// The state and start time of a `/proc/<pid>/stat` line. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted after its closing one.
fn stat_fields(stat: &str) -> Option<(&str, u64)> {
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace();
    let state = fields.next()?; // field 3
    let start = fields.nth(18)?.parse().ok()?; // field 22
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn default_ids_and_cache_dirs_differ_per_process() {
        let (a, b) = (default_node_id(), default_node_id());
        assert_ne!(a, b);
        let host = hostname();
        let pid = std::process::id();
        assert!(a.starts_with(&format!("{host}-{pid}-")), "{a}");
        let temp = Path::new("/tmp");
        assert_ne!(default_cache_dir(temp, &a), default_cache_dir(temp, &b));
        // Under a given node id, the folder still names this process, so the sweep knows it.
        let dir = default_cache_dir(temp, "n1");
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("fleetrun-worker-n1-pid"), "{name}");
        assert_eq!(scratch_owner(name), Some((pid, start_time(pid).unwrap())));
    }

    #[test]
    fn names_scratch_owns_and_only_those() {
        assert_eq!(scratch_owner("fleetrun-run-pid12-345"), Some((12, 345)));
        assert_eq!(
            scratch_owner("fleetrun-worker-a-pid-b-pid7-0"),
            Some((7, 0))
        );
        for name in [
            "fleetrun-e2e-20240101-120000-1234",
            "fleetrun-submit-job-pid12",
            "fleetrun-x-pid-1",
            "fleetrun-x-pid0-1",
            "fleetrun-x-pid12-",
            "other-x-pid12-345",
            "fleetrun-x-pid1a-2",
        ] {
            assert_eq!(scratch_owner(name), None, "{name}");
        }
    }

    #[test]
    fn sweep_removes_only_folders_of_gone_processes() {
        let temp = tempfile::tempdir().unwrap();
        let mkdir = |name: &str| {
            let path = temp.path().join(name);
            std::fs::create_dir_all(path.join("staging")).unwrap();
            std::fs::write(path.join("staging/input.txt"), "x").unwrap();
            path
        };
        let gone = mkdir(&format!("fleetrun-worker-n-pid{}-5", dead_pid()));
        let mine = scratch_dir(temp.path(), "run");
        std::fs::create_dir(&mine).unwrap();
        // This pid runs, but started at another time: a pid handed on, so a stale folder.
        let reused = mkdir(&format!("fleetrun-run-pid{}-1", std::process::id()));
        let unmarked = mkdir(&format!("fleetrun-e2e-{}", dead_pid()));
        let foreign = mkdir(&format!("other-pid{}-5", dead_pid()));
        let file = temp.path().join(format!("fleetrun-f-pid{}-5", dead_pid()));
        std::fs::write(&file, "").unwrap();
        let target = mkdir("target");
        let link = temp.path().join(format!("fleetrun-l-pid{}-5", dead_pid()));
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let mut removed = sweep_stale_scratch(temp.path());
        removed.sort();
        let mut expected = vec![gone.clone(), reused.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(!gone.exists() && !reused.exists());
        for kept in [&mine, &unmarked, &foreign, &file, &target, &link] {
            assert!(kept.symlink_metadata().is_ok(), "{} kept", kept.display());
        }
        assert!(target.join("staging/input.txt").is_file());
    }

    #[test]
    fn sweep_of_a_missing_folder_removes_nothing() {
        let temp = tempfile::tempdir().unwrap();
        assert!(sweep_stale_scratch(&temp.path().join("absent")).is_empty());
    }
}
