//! `fleetrun run` over a folder holding what a real folder holds: names that are not UTF-8,
//! backslashes, newlines and `%` in names, a dangling symlink, a folder symlink loop, and the
//! job's own output folder.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::symlink;
use std::path::Path;

use fleetrun_tests::{JobDir, code};

const ECHO: &str = "def run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n";

/// Writes `data/<name>` holding `content`; `name` is bytes.
fn input(job: &JobDir, name: &[u8], content: &str) {
    let path = job.path("data").join(OsString::from_vec(name.to_vec()));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each real file's line comes out once, in key order; the dangling symlink is one failed
/// item with its cause; the loop is skipped; nothing fails the job.
#[test]
fn every_legal_name_runs_once_and_symlinks_fail_nothing_but_themselves() {
    let job = JobDir::new(
        ECHO,
        "mini_batch_size = 1\nrun_max_try = 1\nerror_threshold = -1\nprocess_count_per_node = 2",
    );
    input(&job, b"caf\xe9.txt", "not-utf8");
    input(&job, b"a\\b.txt", "backslash");
    input(&job, b"line\nbreak.txt", "newline");
    input(&job, b"100%.txt", "percent");
    input(&job, b"%E9.txt", "escape-lookalike");
    input(&job, b"plain.txt", "plain");
    input(&job, b"sub/deep.txt", "deep");
    symlink("nowhere", job.path("data/dangling")).unwrap();
    symlink("..", job.path("data/sub/loop")).unwrap();

    let out = job.run(&[]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert_eq!(
        job.output_lines(),
        [
            "escape-lookalike",
            "percent",
            "backslash",
            "not-utf8",
            "newline",
            "plain",
            "deep"
        ]
    );
    assert!(
        stdout(&out).contains("7 items succeeded, 1 failed"),
        "{}",
        stdout(&out)
    );
    let failed = job.log("failed_items.csv");
    assert_eq!(failed.lines().count(), 1 + 1, "{failed}");
    assert!(
        failed.contains("dangling") && failed.contains("FileNotFoundError"),
        "{failed}"
    );
}

/// Writes a job whose output folder is `data/out`, inside its input.
fn job_with_output_inside_input() -> JobDir {
    let job = JobDir::new(ECHO, "");
    let toml = "name = \"e2e\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\n\
                mini_batch_size = 3\n[input]\nfiles = \"data\"\n[output]\npath = \"data/out\"\n";
    std::fs::write(job.path("job.toml"), toml).unwrap();
    job
}

fn lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("output file");
    text.lines().map(str::to_owned).collect()
}

/// The job's own logs, parts and output file never become input items, also when a symlink
/// in the input leads to the output folder, and also on a second run that finds the first
/// run's output there.
#[test]
fn an_output_folder_inside_the_input_is_not_input() {
    let job = job_with_output_inside_input();
    let expected: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
    for (i, line) in expected.iter().enumerate() {
        input(&job, format!("f{i}.txt").as_bytes(), line);
    }
    std::fs::create_dir_all(job.path("data/out")).unwrap();
    symlink("out", job.path("data/out-link")).unwrap();
    for _ in 0..2 {
        let out = job.run(&[]);
        assert_eq!(code(&out), 0, "{}", stdout(&out));
        assert_eq!(lines(&job.path("data/out/parallel_run_step.txt")), expected);
        assert!(
            stdout(&out).contains("10 items succeeded, 0 failed"),
            "{}",
            stdout(&out)
        );
    }
}
