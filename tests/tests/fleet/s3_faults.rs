//! S3 faults are the infrastructure's, not the items': a fleet whose S3 throttles, fails
//! on its side and goes away for a while retries, hands mini-batches back untried, and
//! fails nothing.

use fleetrun_tests::s3_relay::S3Relay;
use futures::StreamExt;

use super::observability::spawn_submit_as;
use super::*;

/// The kinds of storage fault (`throttled`, …) `fleetrun status --json` says the job's
/// nodes met lately.
fn storage_faults(fleet: &Fleet, job: &str) -> Vec<String> {
    let status = fleet.status_json(job);
    status["storage_faults"]
        .as_array()
        .map(|faults| {
            faults
                .iter()
                .map(|f| f["fault"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Inputs of this job: `n` files of about 1 KiB each (a mini-batch's part of ten is an S3
/// object, not kept in the ledger), written a few dozen at a time; returns their lines.
fn padded_inputs(fleet: &Fleet, n: usize) -> Vec<String> {
    let lines: Vec<String> = (0..n)
        .map(|i| format!("f{i:04} {}", "x".repeat(1_000)))
        .collect();
    let s3 = fleet.storage("in");
    fleet.runtime.block_on(async {
        s3.create_bucket_if_missing().await.unwrap();
        futures::stream::iter(lines.iter().enumerate())
            .map(|(i, line)| {
                let key = format!("g{:02}/f{i:04}.txt", i / 100);
                let s3 = &s3;
                async move { s3.put(&key, Bytes::from(line.clone())).await.unwrap() }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    });
    lines
}

/// Two workers, 1,000 files in mini-batches of ten, one attempt per mini-batch, and every S3 request of the
/// fleet's through a relay that answers a fifth of them 503 SlowDown or 500 InternalError
/// and resets every connection for 15 s mid-job: the job completes, nothing failed, every
/// line once and in order; the workers' metrics count the faults and the hand-backs.
/// `fleetrun status` says S3 throttles or fails while it does, that it is unreachable while
/// it is, and nothing of it once the job ended.
#[test]
fn s3_throttling_errors_and_an_outage_cost_no_item() {
    const FILES: usize = 1_000;
    const MINI_BATCHES: usize = FILES / 10;
    let relay = S3Relay::start(&services::s3_endpoint(), 5);
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write(mini_batch[0] + '\\n')\n    time.sleep(0.2)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    let started = std::time::Instant::now();
    let lines = padded_inputs(&fleet, FILES);
    eprintln!("inputs written in {:?}", started.elapsed());
    fleet
        .extra_env
        .push(("AWS_ENDPOINT_URL".to_owned(), relay.url()));
    let metrics = ["--metrics-addr", "127.0.0.1:0"];
    fleet.worker_with("w1", 2, &[], &metrics);
    fleet.worker_with("w2", 2, &[], &metrics);
    let job =
        fleet.s3_job("mini_batch_size = 10\nrun_max_try = 1\nerror_threshold = 0\nnode_count = 2");
    let id = &format!("s3-faults-{}", random_suffix());
    let mut submit = spawn_submit_as(&fleet, &job, id);
    let started = std::time::Instant::now();
    let ran = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    wait_for(
        "a quarter of the job to run",
        Duration::from_secs(120),
        || ran() >= MINI_BATCHES / 4,
    );
    eprintln!(
        "S3 down at {:?}, {} mini-batches run",
        started.elapsed(),
        ran()
    );
    wait_for(
        "status to say S3 throttles or fails",
        Duration::from_secs(30),
        || {
            let faults = storage_faults(&fleet, id);
            faults
                .iter()
                .any(|f| f == "throttled" || f == "server_error")
        },
    );
    relay.down(true);
    let down = std::time::Instant::now();
    wait_for(
        "status to say S3 is unreachable",
        Duration::from_secs(14),
        || {
            storage_faults(&fleet, id)
                .iter()
                .any(|f| f == "unreachable")
        },
    );
    std::thread::sleep(Duration::from_secs(15).saturating_sub(down.elapsed()));
    relay.down(false);
    let during = ran();
    assert_eq!(submit.exit_within(Duration::from_secs(180)).code(), Some(0));
    eprintln!("job ended at {:?}", started.elapsed());
    assert!(
        during < MINI_BATCHES,
        "the outage came after the job's end: {during}"
    );

    let output = super::lines(&fleet.output("out/parallel_run_step.txt"));
    assert_eq!(output, lines, "every line once, in order");
    assert!(
        storage_faults(&fleet, id).is_empty(),
        "an ended job's status says none"
    );
    let logs = fleet.storage("out/logs");
    let failed_items = fleet.runtime.block_on(logs.get("failed_items.csv"));
    assert!(
        failed_items.is_err(),
        "no failed_items.csv: {failed_items:?}"
    );

    let counts = relay.counts();
    eprintln!("relay: {counts:?}");
    assert!(counts.errors > counts.forwarded / 10, "{counts:?}");
    assert!(counts.resets > 0, "{counts:?}");
    let scraped: Vec<String> = ["w1", "w2"]
        .iter()
        .map(|node| http_get(&fleet, &format!("{}/metrics", metrics_url(&fleet, node))).2)
        .collect();
    let total = |series: &str| -> f64 {
        scraped
            .iter()
            .map(|text| sample(text, series).unwrap_or_default())
            .sum()
    };
    let throttled = total("fleetrun_storage_faults_total{fault=\"throttled\"}");
    let unreachable = total("fleetrun_storage_faults_total{fault=\"unreachable\"}");
    let hand_backs = total("fleetrun_storage_hand_backs_total");
    eprintln!("workers: throttled {throttled}, unreachable {unreachable}, hand-backs {hand_backs}");
    assert!(throttled > 0.0 && unreachable > 0.0, "{scraped:?}");
    assert_eq!(
        total("fleetrun_mini_batches_total{result=\"staging_failed\"}"),
        0.0
    );
}
