//! A bad job file gets one line naming the field and the rule, and exit code 2, before
//! anything runs.

use fleetrun_tests::{JobDir, code};

const SCRIPT: &str = "def run(mb):\n    return mb\n";

fn refused(settings: &str, args: &[&str]) -> String {
    let job = JobDir::new(SCRIPT, settings);
    let out = job.run(args);
    assert_eq!(code(&out), 2, "a bad job file exits 2");
    assert!(!job.path("out").exists(), "nothing ran");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    stderr
}

#[test]
fn misspelt_key_gets_a_suggestion() {
    let e = refused("mini_bacth_size = 5", &[]);
    assert!(
        e.contains("mini_bacth_size") && e.contains("did you mean \"mini_batch_size\""),
        "{e}"
    );
}

#[test]
fn out_of_range_value_names_field_rule_and_value() {
    let e = refused("mini_batch_size = 0", &[]);
    assert!(
        e.contains("mini_batch_size") && e.contains("at least 1") && e.contains('0'),
        "{e}"
    );
    let e = refused("error_threshold = -2", &[]);
    assert!(e.contains("error_threshold") && e.contains("-2"), "{e}");
}

#[test]
fn wrong_type_is_named() {
    let e = refused("run_max_try = \"three\"", &[]);
    assert!(
        e.contains("run_max_try") && e.contains("integer") && e.contains("three"),
        "{e}"
    );
}

#[test]
fn bad_override_is_refused_like_the_file() {
    let e = refused("", &["--set", "mini_batch_size=-5"]);
    assert!(e.contains("mini_batch_size") && e.contains("-5"), "{e}");
    let e = refused("", &["--set", "eror_threshold=1"]);
    assert!(e.contains("did you mean \"error_threshold\""), "{e}");
}

#[test]
fn missing_input_folder_is_refused() {
    let job = JobDir::new(SCRIPT, "");
    std::fs::remove_dir_all(job.path("data")).unwrap();
    let out = job.run(&[]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("input.files"));
}

#[test]
fn bad_name_is_refused() {
    let e = refused("", &["--set", "name=\"Bad_Name\""]);
    assert!(e.contains("name") && e.contains("Bad_Name"), "{e}");
}
