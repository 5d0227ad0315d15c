//! `fleetrun dlq`: the pool's dead letters listed while workers run, replayed back to work
//! (their failure taken back from the job's counts), and purged.

use fleetrun_common::queue::Disposition;

use super::*;

/// The ids, reasons and sizes `dlq list --json` shows.
fn listed(fleet: &Fleet) -> Vec<serde_json::Value> {
    let (status, out, _) = fleet.fleetrun(&["dlq", "list", "--json"]);
    assert_eq!(status, 0);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// A mini-batch dead-lettered while its job runs (as a worker that cannot run it rejects
/// it) is counted failed by the workers and stays listed for operators; once replayed it
/// runs again with its failure taken back, and the job completes with its rows exactly
/// once and no failure. A message that does not decode is listed by digest and purged, not
/// without --yes off a terminal.
#[test]
fn a_dead_letter_is_listed_while_workers_run_and_replayed_back_to_work() {
    let mut fleet = Fleet::new("");
    // Every mini-batch waits while the marker is there (bounded), so the job is still
    // running when the dead letter is replayed.
    let hold = fleet.path("hold");
    std::fs::write(&hold, "").unwrap();
    let script = format!(
        "import os, time\nHOLD = {hold:?}\n\ndef run(mini_batch):\n    deadline = time.time() + 120\n    while os.path.exists(HOLD) and time.time() < deadline:\n        time.sleep(0.05)\n    return [open(p).read() for p in mini_batch]\n"
    );
    std::fs::write(fleet.path("code/score.py"), script).unwrap();
    fleet.inputs(6);
    let job_file = fleet.s3_job("mini_batch_size = 2\nerror_threshold = 10");
    let out = fleet.submit(&job_file, &[]);
    assert_eq!(code(&out), 0);
    let job = String::from_utf8_lossy(&out.stdout).trim().to_owned();

    // No worker yet: reject the first mini-batch to the dead-letter queue.
    let queue = fleet.queue();
    fleet.runtime.block_on(async {
        let mut consumer = queue.consume(&job, 1).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .unwrap()
            .unwrap();
        assert!(first.settle(Disposition::DeadLetter).await.unwrap());
        consumer.pause().await.unwrap();
    });
    fleet.worker("w1", 1);
    let id = format!("{job}:0");
    wait_for(
        "the workers to count the dead letter as a failed mini-batch",
        Duration::from_secs(60),
        || fleet.status_json(&job)["counts"]["failed_mini_batches"] == 1,
    );
    let letters = listed(&fleet);
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["id"], id.as_str());
    assert_eq!(letters[0]["reason"], "rejected");
    let (status, text, _) = fleet.fleetrun(&["dlq", "list"]);
    assert_eq!(status, 0);
    assert!(
        text.contains(&id) && text.contains("g00/f0000.txt"),
        "{text}"
    );
    let (status, shown, _) = fleet.fleetrun(&["dlq", "show", &id, "--json"]);
    assert_eq!(status, 0);
    let shown: serde_json::Value = serde_json::from_str(shown.trim()).unwrap();
    assert_eq!(
        shown[0]["items"],
        serde_json::json!(["g00/f0000.txt", "g00/f0001.txt"])
    );
    assert_eq!(fleet.fleetrun(&["dlq", "show", "no-such:1"]).0, 2);

    let (status, replayed, _) = fleet.fleetrun(&["dlq", "replay", &id, "--json"]);
    assert_eq!(status, 0);
    assert!(replayed.contains("\"replayed\""), "{replayed}");
    assert_eq!(fleet.status_json(&job)["counts"]["failed_mini_batches"], 0);
    assert!(listed(&fleet).is_empty());

    // The script is fixed: the job completes with every row once, nothing failed.
    std::fs::remove_file(&hold).unwrap();
    let (status, _, _) = fleet.fleetrun(&["wait", &job, "--quiet"]);
    assert_eq!(status, 0);
    let summary = fleet.status_json(&job);
    assert_eq!(summary["counts"]["failed_items"], 0);
    assert_eq!(summary["counts"]["completed_mini_batches"], 3);
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(6, |_| false)
    );

    // A message that does not decode, dead-lettered as a worker does: listed by digest.
    fleet.runtime.block_on(async {
        let lane = format!("garbage-{}", fleet.pool);
        queue
            .publish(&lane, b"\xc1 not a mini-batch".to_vec())
            .await
            .unwrap();
        let mut consumer = queue.consume(&lane, 1).await.unwrap();
        let garbage = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .unwrap()
            .unwrap();
        assert!(garbage.settle(Disposition::DeadLetter).await.unwrap());
    });
    wait_for(
        "the undecodable message to be listed",
        Duration::from_secs(30),
        || listed(&fleet).len() == 1,
    );
    // Only now: a quorum queue dead-letters at least once, after the delete would drop it.
    let lane = format!("garbage-{}", fleet.pool);
    fleet.runtime.block_on(queue.close_lane(&lane)).unwrap();
    let letters = listed(&fleet);
    let raw = letters[0]["id"].as_str().unwrap().to_owned();
    assert!(raw.starts_with("raw-"), "{raw}");
    assert_eq!(letters[0]["bytes"], 18);
    assert_eq!(fleet.fleetrun(&["dlq", "purge", "--all"]).0, 2);
    assert_eq!(listed(&fleet).len(), 1);
    let (status, purged, _) = fleet.fleetrun(&["dlq", "purge", &raw, "--yes"]);
    assert_eq!(status, 0);
    assert!(purged.contains("purged"), "{purged}");
    assert!(listed(&fleet).is_empty());
    assert_eq!(fleet.pool_depth(&queue).dead, 0);
}
