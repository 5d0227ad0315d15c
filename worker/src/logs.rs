//! The job's log folder (CONTRACT.md §7), written by the node agent and the local driver.
//!
//! Lines are buffered per file and flushed by [`JobLogs::flush`], which the driver calls
//! about once a second and at the end: the per-mini-batch path never waits on a log write.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The header of `sys/job_report/processed_mini-batches.csv`.
pub const REPORT_HEADER: &str = "mini_batch,attempt,result,items,succeeded,failed,node_id,process_name,start,elapsed_s,run_s,error";
/// The header of `failed_items.csv`.
pub const FAILED_ITEMS_HEADER: &str = "item,mini_batch,attempts,cause";

/// The mini-batches an expired job left unfinished, one index a line, for a resume to run.
pub const UNFINISHED_CSV: &str = "unfinished_mini_batches.csv";
/// The header of [`UNFINISHED_CSV`].
pub const UNFINISHED_HEADER: &str = "mini_batch";
/// One file for the job, written when it ends from the rows the ledger kept.
pub const REPORT_CSV: &str = "sys/job_report/processed_mini-batches.csv";
/// One file for the job, joined from every node's failed mini-batches when it ends.
pub const FAILED_ITEMS_CSV: &str = "failed_items.csv";
pub const USER_ERROR: &str = "user/error.txt";
pub const JOB_RESULT: &str = "job_result.txt";
pub const JOB_ERROR: &str = "job_error.txt";
pub const PROGRESS_OVERVIEW: &str = "job_progress_overview.txt";
pub const MASTER_ROLE: &str = "sys/master_role.txt";

/// Files every node of a job appends to; on a fleet each node keeps its own copy.
const SHARED: [&str; 2] = [USER_ERROR, MASTER_ROLE];

pub struct JobLogs {
    dir: PathBuf,
    files: Mutex<HashMap<PathBuf, BufWriter<File>>>,
    /// Set on a fleet: shared files get the node's id in their name
    /// (`user/error.<node>.txt`), as nodes cannot append to one file.
    node: Option<String>,
    /// Set once the node has let the job go: nothing more is written (see [`JobLogs::close`]).
    closed: std::sync::atomic::AtomicBool,
}

impl JobLogs {
    pub fn new(dir: impl Into<PathBuf>) -> JobLogs {
        JobLogs {
            dir: dir.into(),
            files: Mutex::new(HashMap::new()),
            node: None,
            closed: Default::default(),
        }
    }

    /// The logs of one node of a fleet.
    pub fn for_node(dir: impl Into<PathBuf>, node: &str) -> JobLogs {
        JobLogs {
            dir: dir.into(),
            files: Mutex::new(HashMap::new()),
            node: Some(node.to_owned()),
            closed: Default::default(),
        }
    }

    /// Where a line for `rel` goes: `rel` itself, or its per-node name on a fleet.
    fn target(&self, rel: &Path) -> PathBuf {
        match (&self.node, rel.to_str()) {
            (Some(node), Some(name)) if SHARED.contains(&name) => {
                let (stem, ext) = name.rsplit_once('.').unwrap_or((name, "txt"));
                self.dir.join(format!("{stem}.{node}.{ext}"))
            }
            _ => self.dir.join(rel),
        }
    }

    /// The file `rel`'s lines go to: on a fleet, this node's copy of a shared file.
    pub fn file(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.target(rel.as_ref())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn user_stdout(&self, node: &str, process: &str) -> PathBuf {
        self.path(format!("user/stdout/{node}/{process}.stdout.txt"))
    }

    pub fn user_stderr(&self, node: &str, process: &str) -> PathBuf {
        self.path(format!("user/stderr/{node}/{process}.stderr.txt"))
    }

    pub fn node_main(node: &str) -> String {
        format!("sys/node/{node}/_main.txt")
    }

    pub fn node_process(node: &str, process: &str) -> String {
        format!("sys/node/{node}/{process}.txt")
    }

    /// A runner's cProfile stats (`profile = true`).
    pub fn profile(node: &str, process: &str) -> String {
        format!("sys/profile/{node}/{process}.profile")
    }

    /// A node's system errors (`sys/error/<node>/`): a runner's failed start or death, a
    /// timeout kill, a staging failure (by process), a folder that fails the job (`_main`).
    pub fn sys_error(node: &str, process: &str) -> String {
        format!("sys/error/{node}/{process}.txt")
    }

    pub fn user_error(node: &str, process: &str) -> String {
        format!("user/error/{node}/{process}.txt")
    }

    /// Appends one line, prefixed with the time.
    pub fn log(&self, rel: impl AsRef<Path>, line: &str) {
        self.append(rel, &format!("{} {line}", now()), None);
    }

    /// Appends one CSV row, writing `header` first if the file is new.
    pub fn csv(&self, rel: impl AsRef<Path>, header: &str, row: &str) {
        self.append(rel, row, Some(header));
    }

    /// Appends raw text (a traceback, say) with a trailing newline.
    pub fn append_text(&self, rel: impl AsRef<Path>, text: &str) {
        self.append(rel, text.trim_end_matches('\n'), None);
    }

    fn append(&self, rel: impl AsRef<Path>, line: &str, header: Option<&str>) {
        let path = self.target(rel.as_ref());
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_closed() {
            return;
        }
        if !files.contains_key(&path) {
            match open_append(&path) {
                Ok((file, fresh)) => {
                    let mut w = BufWriter::with_capacity(64 << 10, file);
                    if let (true, Some(header)) = (fresh, header) {
                        let _ = writeln!(w, "{header}");
                    }
                    files.insert(path.clone(), w);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "Cannot open a log file.");
                    return;
                }
            }
        }
        let w = files.get_mut(&path).expect("just inserted");
        if let Err(e) = writeln!(w, "{line}") {
            tracing::warn!(path = %path.display(), error = %e, "Cannot write a log file.");
        }
    }

    /// Replaces a whole file (results, overviews).
    pub fn write(&self, rel: impl AsRef<Path>, content: &str) {
        if self.is_closed() {
            return;
        }
        let path = self.path(rel);
        let result = path
            .parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| fs::write(&path, content));
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %e, "Cannot write a log file.");
        }
    }

    pub fn flush(&self) {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        for (path, w) in files.iter_mut() {
            if let Err(e) = w.flush() {
                tracing::warn!(path = %path.display(), error = %e, "Cannot flush a log file.");
            }
        }
    }

    /// Flushes and closes every file, and writes nothing after: the node has let the job
    /// go, and whoever waits for the job's end may read, move or remove its log folder.
    pub fn close(&self) {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for (path, mut w) in files.drain() {
            if let Err(e) = w.flush() {
                tracing::warn!(path = %path.display(), error = %e, "Cannot flush a log file.");
            }
        }
    }

    /// Whether [`JobLogs::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for JobLogs {
    fn drop(&mut self) {
        self.flush();
    }
}

fn open_append(path: &Path) -> std::io::Result<(File, bool)> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let fresh = file.metadata()?.len() == 0;
    Ok((file, fresh))
}

/// The time as log lines show it: `2026-11-27 09:30:00.123`, UTC.
pub fn now() -> String {
    stamp(chrono::Utc::now())
}

/// `at` as log lines show it. The date and time of day are formatted once a second (a log
/// line per mini-batch should not run chrono's formatter each time); the milliseconds are
/// added to them.
fn stamp(at: chrono::DateTime<chrono::Utc>) -> String {
    use std::cell::RefCell;
    use std::fmt::Write;
    thread_local! {
        static SECOND: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }
    SECOND.with_borrow_mut(|(second, formatted)| {
        if *second != at.timestamp() {
            *second = at.timestamp();
            *formatted = at.format("%Y-%m-%d %H:%M:%S").to_string();
        }
        let mut stamp = String::with_capacity(formatted.len() + 4);
        stamp.push_str(formatted);
        // A leap second's milliseconds count past 999: the line shows 999.
        let _ = write!(stamp, ".{:03}", at.timestamp_subsec_millis().min(999));
        stamp
    })
}

/// Quotes a CSV field when it needs it.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cached second gives the same text chrono's formatter gives, across seconds and
    /// back again.
    #[test]
    fn stamps_read_as_chronos_format() {
        use chrono::TimeZone;
        for (secs, millis) in [
            (1_764_000_000, 5),
            (1_764_000_000, 999),
            (1_764_000_001, 0),
            (1_700_000_000, 120),
        ] {
            let at = chrono::Utc
                .timestamp_millis_opt(secs * 1000 + millis)
                .unwrap();
            assert_eq!(stamp(at), at.format("%Y-%m-%d %H:%M:%S%.3f").to_string());
        }
    }

    #[test]
    fn csv_gets_its_header_once_and_lines_land_after_flush() {
        let dir = tempfile::tempdir().unwrap();
        let logs = JobLogs::new(dir.path());
        logs.csv(REPORT_CSV, "a,b", "1,2");
        logs.csv(REPORT_CSV, "a,b", "3,4");
        logs.flush();
        assert_eq!(
            fs::read_to_string(logs.path(REPORT_CSV)).unwrap(),
            "a,b\n1,2\n3,4\n"
        );
    }

    /// Closed logs keep what was written before and write nothing after, not even the
    /// folder a removed log folder would need again.
    #[test]
    fn closed_logs_write_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let logs = JobLogs::new(dir.path().join("logs"));
        logs.log(MASTER_ROLE, "before");
        logs.close();
        assert!(
            fs::read_to_string(logs.path(MASTER_ROLE))
                .unwrap()
                .ends_with(" before\n")
        );
        fs::remove_dir_all(dir.path().join("logs")).unwrap();
        logs.log(MASTER_ROLE, "after");
        logs.write(PROGRESS_OVERVIEW, "after");
        logs.flush();
        drop(logs);
        assert!(!dir.path().join("logs").exists());
    }

    #[test]
    fn fleet_nodes_keep_their_own_shared_files() {
        let dir = tempfile::tempdir().unwrap();
        let logs = JobLogs::for_node(dir.path(), "n1");
        logs.log(USER_ERROR, "raised");
        logs.log(JobLogs::node_main("n1"), "started");
        logs.flush();
        assert!(dir.path().join("user/error.n1.txt").is_file());
        assert!(dir.path().join("sys/node/n1/_main.txt").is_file());
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
