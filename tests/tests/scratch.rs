//! `fleetrun run` with folders that cannot take what the node writes: a system error of the
//! node that fails the job (exit 42) and names the folder, with no item blamed.
//!
//! With a local input nothing is staged: the agent hands the runner the input files' own
//! paths, and the `append_row` parts' segment goes to the output folder's `_parts/` (removed
//! at the end). So `fleetrun run` needs nothing of its scratch folder (`TMPDIR`), and a full
//! output folder is what fails it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use fleetrun_tests::{JobDir, RUN_LIMIT, code, output_within};

/// Every element 100 KB: the first part is larger than the room a full scratch has left.
const BIG_ROWS: &str = r#"
def init():
    pass

def run(mini_batch):
    return ["x" * 100_000 for _ in mini_batch]
"#;

/// A folder that is nearly full: a small tmpfs filled but for 128 KB when this process may
/// mount one (real ENOSPC on a larger write), else a file size limit on `fleetrun` (EFBIG
/// on any write past 64 KB, SIGXFSZ ignored), which needs no privilege.
enum FullScratch {
    Tmpfs(PathBuf),
    FileSizeLimit(PathBuf),
}

impl FullScratch {
    fn new(job: &JobDir) -> FullScratch {
        let dir = job.path("full");
        std::fs::create_dir_all(&dir).unwrap();
        let c_dir = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated strings for mount(2).
        let mounted = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                c_dir.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                c"size=512k".as_ptr().cast(),
            )
        } == 0;
        if !mounted {
            return FullScratch::FileSizeLimit(dir);
        }
        let full = FullScratch::Tmpfs(dir.clone());
        let mut filler = std::fs::File::create(dir.join("filler")).unwrap();
        let block = [0u8; 4096];
        while std::io::Write::write_all(&mut filler, &block).is_ok() {}
        // Room for the guard's files and the logs, not for a part of 200 KB.
        let size = filler.metadata().unwrap().len();
        filler.set_len(size.saturating_sub(128 * 1024)).unwrap();
        full
    }

    fn dir(&self) -> &Path {
        match self {
            FullScratch::Tmpfs(dir) | FullScratch::FileSizeLimit(dir) => dir,
        }
    }

    /// `fleetrun run` with this folder as its `TMPDIR`.
    fn run(&self, job: &JobDir, args: &[&str]) -> Output {
        let mut cmd = job.command(args);
        cmd.env("TMPDIR", self.dir());
        if let FullScratch::FileSizeLimit(_) = self {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    let limit = libc::rlimit {
                        rlim_cur: 64 * 1024,
                        rlim_max: 64 * 1024,
                    };
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        show(output_within(&mut cmd, RUN_LIMIT))
    }
}

impl Drop for FullScratch {
    fn drop(&mut self) {
        if let FullScratch::Tmpfs(dir) = self {
            let c_dir = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
            // SAFETY: a NUL-terminated path.
            unsafe { libc::umount2(c_dir.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn show(out: Output) -> Output {
    eprintln!(
        "--- fleetrun stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The job failed as a system error naming `folder`, and no item was counted as failed.
fn assert_system_error(out: &Output, out_dir: &Path, folder: &Path, what: &str) {
    assert_eq!(code(out), 42, "a system error fails the job");
    let result = std::fs::read_to_string(out_dir.join("logs/job_result.txt")).unwrap();
    assert!(result.contains("Result: Failed"), "{result}");
    let cause = result
        .lines()
        .find_map(|l| l.strip_prefix("Cause: "))
        .unwrap_or_else(|| panic!("no cause in {result}"));
    assert!(cause.starts_with("system error: "), "{cause}");
    assert!(cause.contains(what), "{cause}");
    assert!(
        cause.contains(&folder.display().to_string()),
        "the cause names the folder {}: {cause}",
        folder.display()
    );
    assert!(result.contains(" 0 failed"), "no item is blamed: {result}");
    assert!(!out_dir.join("logs/failed_items.csv").exists());
}

#[test]
fn a_full_output_folder_fails_the_job_as_a_system_error() {
    let job = JobDir::new(BIG_ROWS, "mini_batch_size = 2\nerror_threshold = -1");
    job.inputs(6);
    let full = FullScratch::new(&job);
    let toml = std::fs::read_to_string(job.path("job.toml")).unwrap();
    let out_dir = full.dir().join("out");
    std::fs::write(
        job.path("job.toml"),
        toml.replace(
            "path = \"out\"",
            &format!("path = {:?}", out_dir.display().to_string()),
        ),
    )
    .unwrap();
    let out = full.run(&job, &[]);
    let what = match full {
        FullScratch::Tmpfs(_) => "is full",
        FullScratch::FileSizeLimit(_) => "File too large",
    };
    assert_system_error(&out, &out_dir, full.dir(), what);
}

#[test]
fn a_local_run_needs_no_scratch_folder() {
    let job = JobDir::new(BIG_ROWS, "mini_batch_size = 2");
    job.inputs(6);
    // A folder under a regular file: even root cannot create it (ENOTDIR).
    std::fs::write(job.path("not-a-folder"), "").unwrap();
    let tmp = job.path("not-a-folder/tmp");
    let out = show(output_within(
        job.command(&[]).env("TMPDIR", &tmp),
        RUN_LIMIT,
    ));
    assert_eq!(code(&out), 0);
    assert_eq!(job.output_lines().len(), 6);
}

#[test]
fn a_summary_only_job_writes_nothing_into_scratch() {
    let job = JobDir::new(BIG_ROWS, "mini_batch_size = 2");
    job.inputs(6);
    let full = FullScratch::new(&job);
    let out = full.run(&job, &["--set", "output_action=\"summary_only\""]);
    assert_eq!(
        code(&out),
        0,
        "local inputs are not staged, and no part is kept"
    );
    assert!(job.log("job_result.txt").contains("Result: Completed"));
}
