//! Whether the kernel's out-of-memory killer ended a runner: the kernel counts the processes
//! it kills for lack of memory in each memory cgroup (v2 `memory.events`, v1
//! `memory.oom_control`: `oom_kill`), and host-wide (`/proc/vmstat`). A runner is in its
//! worker's cgroup, so a runner killed by SIGKILL while that count grew was killed for
//! memory: its cause says so, with the cgroup's limit, instead of a bare `returncode -9`.
//!
//! [`watch`] takes the count when the agent starts; each death of a runner by SIGKILL
//! compares it with the last one seen ([`killed_for_memory`]).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Mutex;

/// The count of OOM kills last seen, and where it is read; `None` before [`watch`] or where
/// no count can be read.
static SEEN: Mutex<Option<Counter>> = Mutex::new(None);

#[derive(Debug, Clone)]
struct Counter {
    /// The file holding `oom_kill`.
    file: PathBuf,
    /// The file holding the cgroup's memory limit, if the count is a cgroup's.
    limit: Option<PathBuf>,
    kills: u64,
}

/// Takes the count of OOM kills as it is now, for [`killed_for_memory`] to compare with.
pub fn watch() {
    let counter = find(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"));
    *SEEN.lock().unwrap_or_else(|e| e.into_inner()) = counter;
}

/// For a process that ended by SIGKILL while the count of OOM kills grew: how to say it,
/// `killed by the kernel's out-of-memory killer (memory limit 512 MiB)`. `None` for any
/// other end, or where no count can be read.
pub fn killed_for_memory(status: &ExitStatus) -> Option<String> {
    if status.signal() != Some(libc::SIGKILL) {
        return None;
    }
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let counter = seen.as_mut()?;
    let kills = read_kills(&counter.file)?;
    if kills <= counter.kills {
        return None;
    }
    counter.kills = kills;
    let limit = counter
        .limit
        .as_deref()
        .and_then(read_limit)
        .map(|bytes| format!(" (memory limit {})", mebibytes(bytes)))
        .unwrap_or_default();
    Some(format!(
        "killed by the kernel's out-of-memory killer{limit}"
    ))
}

/// The counter of this process's memory cgroup (its line in `proc_cgroup`, under the
/// cgroup file systems at `root`), else the host's.
fn find(proc_cgroup: &Path, root: &Path) -> Option<Counter> {
    let lines = std::fs::read_to_string(proc_cgroup).unwrap_or_default();
    let mut candidates = Vec::new();
    for line in lines.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2; a container sees its own cgroup as the root.
            for dir in [root.join(path), root.to_path_buf()] {
                candidates.push((dir.join("memory.events"), dir.join("memory.max")));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let memory = root.join("memory");
            for dir in [memory.join(path), memory] {
                candidates.push((
                    dir.join("memory.oom_control"),
                    dir.join("memory.limit_in_bytes"),
                ));
            }
        }
    }
    let cgroup = candidates.into_iter().find_map(|(file, limit)| {
        read_kills(&file).map(|kills| Counter {
            file,
            limit: Some(limit),
            kills,
        })
    });
    cgroup.or_else(|| {
        let file = PathBuf::from("/proc/vmstat");
        read_kills(&file).map(|kills| Counter {
            file,
            limit: None,
            kills,
        })
    })
}

/// The `oom_kill` count of a `memory.events`, `memory.oom_control` or `/proc/vmstat`.
fn read_kills(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// A cgroup's memory limit in bytes; `None` without one (`max`, or v1's huge default).
fn read_limit(file: &Path) -> Option<u64> {
    let bytes: u64 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    (bytes < 1 << 60).then_some(bytes)
}

fn mebibytes(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_v2_cgroups_count_and_limit_are_found_from_proc_self_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let proc_cgroup = dir.path().join("cgroup");
        write(&proc_cgroup, "0::/pods/worker\n");
        let root = dir.path().join("sys");
        write(
            &root.join("pods/worker/memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n",
        );
        write(&root.join("pods/worker/memory.max"), "536870912\n");
        let counter = find(&proc_cgroup, &root).unwrap();
        assert_eq!(counter.kills, 2);
        assert_eq!(read_limit(counter.limit.as_deref().unwrap()), Some(1 << 29));
    }

    #[test]
    fn a_v1_memory_cgroup_is_read_and_a_container_root_stands_in_for_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let proc_cgroup = dir.path().join("cgroup");
        write(
            &proc_cgroup,
            "5:cpu,cpuacct:/x\n4:memory:/host/path\n0::/\n",
        );
        let root = dir.path().join("sys");
        // The container sees its own cgroup at the mount's root.
        write(
            &root.join("memory/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n",
        );
        write(
            &root.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        let counter = find(&proc_cgroup, &root).unwrap();
        assert_eq!(counter.kills, 7);
        assert_eq!(read_limit(counter.limit.as_deref().unwrap()), None);
    }
}
