//! CONTRACT §5 rule 3 with real runner processes: `fleetrun run` on a script whose `init()`
//! never returns.

use std::time::{Duration, Instant};

use fleetrun_tests::{JobDir, code};

/// Every process stuck in `init()`: the job fails for lack of progress once
/// `3 × run_invocation_timeout + 30` seconds (33 s) have passed, not after rule 1's three
/// stuck starts per process (99 s).
#[test]
fn every_process_stuck_in_init_fails_the_job_after_the_init_limit() {
    let script = "import time\ndef init():\n    time.sleep(3600)\n\ndef run(mini_batch):\n    return mini_batch\n";
    let job = JobDir::new(
        script,
        "run_invocation_timeout = 1\nprocess_count_per_node = 2",
    );
    job.inputs(4);
    let started = Instant::now();
    let out = job.run(&[]);
    let took = started.elapsed();
    assert_eq!(code(&out), 42);
    assert!(
        (Duration::from_secs(33)..Duration::from_secs(60)).contains(&took),
        "failed after {took:?}"
    );
    let result = job.log("job_result.txt");
    assert!(result.contains("Result: Failed"), "{result}");
    assert!(
        result.contains("every runner process on node 0 was stuck in init()"),
        "{result}"
    );
    assert!(result.contains("did not finish within 33s"), "{result}");
}
