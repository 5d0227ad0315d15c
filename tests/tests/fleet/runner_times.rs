//! Where a job's runner time went, as the fleet reports it: `job_result.txt`'s line,
//! `fleetrun status --json`'s `time` and the worker's `fleetrun_runner_seconds_total`.

use fleetrun_tests::s3_relay::S3Relay;

use super::observability::spawn_submit_as;
use super::*;

/// Seconds the script sleeps in `init()`.
const INIT_S: f64 = 5.0;
/// Seconds it sleeps in each `run()`.
const RUN_S: f64 = 0.3;
/// Seconds the relay holds each input's GET: staging, slower than `run()`. Each staging also
/// costs its request and its write, up to a fifth of a second on a loaded machine, which
/// the known wait leaves out: held this long, that stays well inside the tolerance.
const STAGE_S: f64 = 4.0;
/// Mini-batches of one file.
const FILES: usize = 6;

/// The runners' seconds in each phase and in all, as one place says.
#[derive(Debug)]
struct Split {
    place: &'static str,
    init: f64,
    run: f64,
    wait: f64,
    total: f64,
}

impl Split {
    /// The phase's share in percent.
    fn pct(&self, seconds: f64) -> f64 {
        100.0 * seconds / self.total
    }
}

/// `job_result.txt`'s `Runners busy …` line: its shares and total.
fn from_line(line: &str) -> Split {
    let share = |name: &str| -> f64 {
        let at = line
            .find(name)
            .unwrap_or_else(|| panic!("{name} in {line}"))
            + name.len();
        line[at..]
            .split('%')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let total: f64 = line
        .rsplit(", ")
        .next()
        .and_then(|t| t.strip_suffix(" s)"))
        .unwrap_or_else(|| panic!("the total in {line}"))
        .parse()
        .unwrap();
    let seconds = |name: &str| share(name) * total / 100.0;
    Split {
        place: "job_result.txt",
        init: seconds("init "),
        run: seconds("compute "),
        wait: seconds("waiting for input "),
        total,
    }
}

/// One runner whose script sleeps 5 s in `init()` and 0.3 s in each `run()`, its 6 inputs
/// on S3 behind a relay that holds each input's GET 4 s: staging (one input at a time,
/// the look-ahead's) is the bottleneck, so the runner waits for all the staging less the
/// runs it overlapped (every one but the last): 6 × 4 − 5 × 0.3 s. `job_result.txt`'s
/// line, `status --json`'s `time` and the worker's `/metrics` each give init, run and
/// input wait within 10% (relative) of those known times' shares of the total each
/// reports (the rest is idle).
#[test]
fn the_split_of_a_job_with_known_sleeps_and_slow_staging_is_reported_within_ten_percent() {
    let relay = S3Relay::start(&services::s3_endpoint(), 0);
    let script = format!(
        "import time\n\ndef init():\n    time.sleep({INIT_S})\n\ndef run(mini_batch):\n    time.sleep({RUN_S})\n    return [open(p).read() for p in mini_batch]\n"
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(FILES);
    relay.slow_gets(
        &format!("/{}/in/", fleet.bucket),
        Duration::from_secs_f64(STAGE_S),
    );
    fleet
        .extra_env
        .push(("AWS_ENDPOINT_URL".to_owned(), relay.url()));
    fleet.worker_with("t1", 1, &[], &["--metrics-addr", "127.0.0.1:0"]);
    let metrics = format!("{}/metrics", metrics_url(&fleet, "t1"));
    let job = fleet.s3_job("mini_batch_size = 1\nnode_count = 1\nprocess_count_per_node = 1");
    let id = &format!("times-{}", random_suffix());
    let started = std::time::Instant::now();
    let mut submit = spawn_submit_as(&fleet, &job, id);
    assert_eq!(submit.exit_within(Duration::from_secs(90)).code(), Some(0));
    eprintln!("job ended in {:?}", started.elapsed());

    let result = fleet.job_result("out");
    let line = result
        .lines()
        .find(|l| l.starts_with("Runners busy "))
        .unwrap_or_else(|| panic!("no time line in:\n{result}"));
    assert!(line.contains("(1 runner, "), "{line}");
    let status = fleet.status_json(id);
    let time = &status["time"];
    let field = |name: &str| {
        time[name]
            .as_f64()
            .unwrap_or_else(|| panic!("{name} in {time}"))
    };
    let from_status = Split {
        place: "status --json",
        init: field("init_s"),
        run: field("run_s"),
        wait: field("input_wait_s"),
        total: field("total_s"),
    };
    // `status --json`'s shares are of its seconds.
    for (pct, seconds) in [
        ("init_pct", from_status.init),
        ("run_pct", from_status.run),
        ("input_wait_pct", from_status.wait),
    ] {
        assert!(
            (field(pct) - from_status.pct(seconds)).abs() < 0.01,
            "{time}"
        );
    }
    // The worker flushed its last seconds when it let the job go, before the submitter
    // was told; a scrape after that counts them all.
    let scraped = http_get(&fleet, &metrics).2;
    let phase = |name: &str| {
        sample(
            &scraped,
            &format!("fleetrun_runner_seconds_total{{phase=\"{name}\"}}"),
        )
        .unwrap_or_else(|| panic!("{name} in {scraped}"))
    };
    let from_metrics = Split {
        place: "/metrics",
        init: phase("init"),
        run: phase("run"),
        wait: phase("input_wait"),
        total: ["init", "run", "input_wait", "idle"]
            .iter()
            .map(|p| phase(p))
            .sum(),
    };

    // The counters, which never go down, hold the ledger's seconds: idle too.
    assert!(
        (from_metrics.total - from_status.total).abs() < 0.5,
        "{from_metrics:?} {from_status:?}"
    );

    let known_run = FILES as f64 * RUN_S;
    let known_wait = FILES as f64 * STAGE_S - (FILES - 1) as f64 * RUN_S;
    for split in [from_line(line), from_status, from_metrics] {
        eprintln!(
            "{}: init {:.1}% (known {:.1}%), run {:.1}% (known {:.1}%), input wait {:.1}% (known {:.1}%), total {:.1} s",
            split.place,
            split.pct(split.init),
            split.pct(INIT_S),
            split.pct(split.run),
            split.pct(known_run),
            split.pct(split.wait),
            split.pct(known_wait),
            split.total,
        );
        let within = |got: f64, known: f64| {
            let (got, known) = (split.pct(got), split.pct(known));
            (got - known).abs() <= 0.1 * known
        };
        assert!(within(split.init, INIT_S), "init: {split:?}\n{line}");
        assert!(within(split.run, known_run), "run: {split:?}\n{line}");
        assert!(within(split.wait, known_wait), "wait: {split:?}\n{line}");
    }
}
