//! `deadline`: a fleet job still running at its deadline ends Expired, with the rows of
//! every mini-batch it finished in its output, and `fleetrun resume` completes it.

use super::*;

/// A job of a minute's work (62 items of a second each on one runner) with a deadline of
/// 20 s ends Expired (exit 44, its own state in `status`): its output holds every finished
/// mini-batch's rows once, in input order, `unfinished_mini_batches.csv` and the manifest
/// name the others, and `verify` accepts it. `resume` then runs only those, completes the
/// job, and `verify` passes. Two inputs with identical content under different names, one
/// finished before the deadline and one left unfinished, are both in the completed output.
#[test]
fn a_fleet_job_past_its_deadline_expires_and_resume_completes_it() {
    let script = "import time\n\ndef run(mini_batch):\n    time.sleep(len(mini_batch))\n    return [open(p).read() for p in mini_batch]\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(60);
    let s3 = fleet.storage("in");
    fleet.runtime.block_on(async {
        s3.put("g00/dup-a.txt", Bytes::from("same")).await.unwrap();
        s3.put("g99/dup-b.txt", Bytes::from("same")).await.unwrap();
    });
    // In input order: the first and the last item have the same content.
    let items: Vec<String> = std::iter::once("same".to_owned())
        .chain(expected_lines(60, |_| false))
        .chain(std::iter::once("same".to_owned()))
        .collect();
    fleet.worker("w1", 1);
    let job = fleet.s3_job("mini_batch_size = 2\nrun_max_try = 1\ndeadline = \"20s\"");
    let job = job.to_str().unwrap();
    let id = format!("deadline-{}", random_suffix());
    let started = std::time::Instant::now();
    let (expired, said, stderr) =
        fleet.fleetrun(&["submit", job, "--job-id", &id, "--wait", "--quiet"]);
    assert_eq!(expired, 44, "{said}{stderr}");
    assert!(said.contains("expired"), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the job ran past its deadline: {:?}",
        started.elapsed()
    );
    let shown = fleet.status_json(&id);
    assert_eq!(shown["state"], "Expired", "{shown}");
    let cause = shown["cause"].as_str().unwrap_or_default();
    assert!(cause.contains("deadline"), "{cause}");
    let (status, _, _) = fleet.fleetrun(&["status", &id]);
    assert_eq!(status, 44);

    let unfinished: BTreeSet<usize> = lines(&fleet.output("out/logs/unfinished_mini_batches.csv"))
        .iter()
        .skip(1)
        .map(|index| index.parse().unwrap())
        .collect();
    // 31 mini-batches of 2 s each: the last is left, and some are done.
    assert!(unfinished.contains(&30), "{unfinished:?}");
    assert!(!unfinished.contains(&0), "{unfinished:?}");
    let finished: Vec<String> = items
        .chunks(2)
        .enumerate()
        .filter(|(index, _)| !unfinished.contains(index))
        .flat_map(|(_, rows)| rows.to_vec())
        .collect();
    assert_eq!(lines(&fleet.output("out/parallel_run_step.txt")), finished);
    let manifest: serde_json::Value =
        serde_json::from_slice(&fleet.output("out/logs/manifest.json")).unwrap();
    assert_eq!(manifest["state"], "Expired");
    let marked: BTreeSet<usize> = manifest["mini_batches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["unfinished"] == true)
        .map(|entry| entry["index"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(marked, unfinished);
    let out = format!("s3://{}/out", fleet.bucket);
    let (verified, said, _) = fleet.fleetrun(&["verify", &out]);
    assert_eq!(verified, 0, "{said}");
    assert!(said.contains("unfinished"), "{said}");

    let (resumed, said, stderr) = fleet.fleetrun(&["resume", &id, "--wait", "--quiet"]);
    assert_eq!(resumed, 0, "{said}{stderr}");
    let output = lines(&fleet.output("out/parallel_run_step.txt"));
    assert_eq!(output, items);
    assert_eq!(output.iter().filter(|line| *line == "same").count(), 2);
    assert_eq!(fleet.status_json(&id)["state"], "Completed");
    let (verified, said, _) = fleet.fleetrun(&["verify", &out]);
    assert_eq!(verified, 0, "{said}");
    assert!(
        said.contains("62 lines, 31 mini-batches, 62 items"),
        "{said}"
    );
}
