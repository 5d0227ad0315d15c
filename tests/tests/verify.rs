//! `fleetrun verify` against the output of a `fleetrun run`: the job's signed manifest
//! (`logs/manifest.json`) holds, and each change to the output is named.

use std::path::Path;
use std::process::Output;

use fleetrun_tests::{JobDir, RUN_LIMIT, code, command, output_within};

const ECHO: &str = "def run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n";

/// Raises on three files, so that they end in `failed_items.csv`.
const POISON: &str = r#"
POISON = {"f0017", "f0333", "f0998"}

def run(mini_batch):
    names = [open(p).read() for p in mini_batch]
    if POISON.intersection(names):
        raise ValueError("poisoned")
    return names
"#;

const KEY: &str = "manifest-k3y";

/// `fleetrun verify ARGS` with no key in its environment.
fn verify(args: &[&str]) -> (i32, String) {
    let mut cmd = command("fleetrun");
    cmd.env_remove("FLEETRUN_MANIFEST_KEY")
        .env_remove("FLEETRUN_WEBHOOK_SECRET")
        .arg("verify")
        .args(args);
    let out: Output = output_within(&mut cmd, RUN_LIMIT);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("--- verify {args:?}: exit {}\n{text}", code(&out));
    (code(&out), text)
}

/// A completed job of 250 files in mini-batches of 7, its manifest signed with [`KEY`].
fn completed(script: &str, settings: &str) -> JobDir {
    let job = JobDir::new(script, &format!("mini_batch_size = 7\n{settings}"));
    job.inputs(250);
    let mut cmd = job.command(&[]);
    cmd.env("FLEETRUN_MANIFEST_KEY", KEY);
    let out = output_within(&mut cmd, RUN_LIMIT);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    job
}

/// A copy of the job's output folder (its output file and logs) in which `change` edited
/// the output file's lines.
fn changed_copy(job: &JobDir, name: &str, change: impl FnOnce(&mut Vec<String>)) -> String {
    let copy = job.path(name);
    copy_dir(&job.path("out"), &copy);
    let file = copy.join("parallel_run_step.txt");
    let mut lines: Vec<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    change(&mut lines);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, text).unwrap();
    copy.display().to_string()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_completed_jobs_output_verifies_with_its_key_and_its_input() {
    let job = completed(ECHO, "");
    let out = job.path("out").display().to_string();
    let data = job.path("data").display().to_string();
    let (exit, text) = verify(&[&out, "--key", KEY, "--input", &data]);
    assert_eq!(exit, 0, "{text}");
    assert_eq!(
        text.trim(),
        "verified: 250 lines, 36 mini-batches, 250 items (250 succeeded, 0 failed), signature valid"
    );
    // The manifest says what ran and what it produced.
    let manifest: serde_json::Value =
        serde_json::from_str(&job.log("manifest.json")).expect("a JSON manifest");
    assert_eq!(manifest["state"], "Completed");
    assert_eq!(manifest["input"]["count"], 250);
    assert_eq!(manifest["mini_batches"].as_array().unwrap().len(), 36);
    assert_eq!(
        manifest["mini_batches"][1]["items"],
        serde_json::json!([7, 14])
    );
    assert!(
        manifest["python"]["version"]
            .as_str()
            .unwrap()
            .starts_with("3.")
    );
    assert!(
        manifest["signature"]
            .as_str()
            .unwrap()
            .starts_with("sha256=")
    );
    assert!(manifest["fingerprint"]["the script's code"].is_string());
    // No key: the signature is not checked, and said so.
    let (exit, text) = verify(&[&out]);
    assert_eq!(exit, 0, "{text}");
    assert!(text.contains("signature not checked"), "{text}");
    // An input that lists otherwise now.
    std::fs::write(job.path("data/g00/new.txt"), "new").unwrap();
    let (exit, text) = verify(&[&out, "--input", &data]);
    assert_eq!(exit, 1, "{text}");
    assert!(
        text.contains("the input lists 251 files now, otherwise than the 250 the job listed"),
        "{text}"
    );
}

/// An edit of an output file's lines.
type Change = dyn FnOnce(&mut Vec<String>);

#[test]
fn each_change_to_an_output_is_named() {
    let job = completed(ECHO, "");
    // Mini-batch 2 holds items 14-20, lines 15-21.
    let cases: [(&str, Box<Change>, &str); 4] = [
        (
            "deleted",
            Box::new(|l| drop(l.remove(16))),
            "problem: mini-batch 2 (items 14-20): 1 line(s) missing (its rows are at lines 15-20)",
        ),
        (
            "duplicated",
            Box::new(|l| {
                let copy = l[16].clone();
                l.insert(17, copy);
            }),
            "problem: mini-batch 2 (items 14-20): line 18 is a duplicate of line 17",
        ),
        (
            "foreign",
            Box::new(|l| l.insert(17, "not from any item".into())),
            "problem: mini-batch 2 (items 14-20): line 18 is foreign (no mini-batch wrote it)",
        ),
        (
            "changed",
            Box::new(|l| l[16] = "f9999".into()),
            "problem: mini-batch 2 (items 14-20): its rows changed (lines 15-21)",
        ),
    ];
    for (name, change, said) in cases {
        let copy = changed_copy(&job, name, change);
        let (exit, text) = verify(&[&copy, "--key", KEY]);
        assert_eq!(exit, 1, "{name}: {text}");
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [said, "1 problem(s) found"],
            "{name}"
        );
    }
    let out = job.path("out").display().to_string();
    let (exit, text) = verify(&[&out, "--key", "another key"]);
    assert_eq!(exit, 1, "{text}");
    assert!(
        text.contains("problem: signature: does not match the key given"),
        "{text}"
    );
}

#[test]
fn failed_items_are_counted_and_their_file_checked() {
    let job = completed(POISON, "run_max_try = 2\nerror_threshold = -1");
    let out = job.path("out").display().to_string();
    let (exit, text) = verify(&[&out, "--key", KEY]);
    assert_eq!(exit, 0, "{text}");
    // Of the poisoned files, only f0017 is among the 250; it fails alone.
    assert!(
        text.contains("249 lines, 36 mini-batches, 250 items (249 succeeded, 1 failed)"),
        "{text}"
    );
    let csv = job.path("out/logs/failed_items.csv");
    let kept = std::fs::read_to_string(&csv).unwrap();
    std::fs::write(&csv, kept.replacen("f0017", "f0018", 1)).unwrap();
    let (exit, text) = verify(&[&out, "--key", KEY]);
    assert_eq!(exit, 1, "{text}");
    assert!(
        text.contains("problem: logs/failed_items.csv: changed"),
        "{text}"
    );
}
