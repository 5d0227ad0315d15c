//! The fleet end to end: `fleetrun submit` against real RabbitMQ, Redis and S3 servers on
//! loopback, served by real `fleetrun-worker` processes.
#![cfg(feature = "services")]

use fleetrun_common::tls::Tls;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fleetrun_common::ledger::redis::RedisLedger;
use fleetrun_common::ledger::{JobRegistry, Ledger, RedisRegistry};
use fleetrun_common::queue::amqp::AmqpQueue;
use fleetrun_common::queue::{Depth, Queue, QueueOptions};
use fleetrun_common::storage::Storage;
use fleetrun_common::storage::s3::{S3Settings, S3Storage};
use fleetrun_common::testing::random_suffix;
use fleetrun_tests::{
    KillOnDrop, POISONED, PrivateRabbitMq, PrivateRedis, RUN_LIMIT, ScriptProcesses,
    assert_failed_alone, code, command, exit_within, expected_lines, files_under,
    first_line_within, kill, lines_within, output_within, pids, pyenv_python, services, wait_for,
};
use futures::TryStreamExt;

#[path = "fleet/chaos.rs"]
mod chaos;
#[path = "fleet/deadline.rs"]
mod deadline;
#[path = "fleet/dlq.rs"]
mod dlq;
#[path = "fleet/failover.rs"]
mod failover;
#[path = "fleet/infrastructure.rs"]
mod infrastructure;
#[path = "fleet/named_outputs.rs"]
mod named_outputs;
#[path = "fleet/observability.rs"]
mod observability;
#[path = "fleet/page.rs"]
mod page;
#[path = "fleet/proof.rs"]
mod proof;
#[path = "fleet/resume.rs"]
mod resume;
#[path = "fleet/runner_times.rs"]
mod runner_times;
#[path = "fleet/s3_faults.rs"]
mod s3_faults;
#[path = "fleet/sharing.rs"]
mod sharing;

fn management_url() -> String {
    std::env::var("FLEETRUN_TEST_AMQP_MANAGEMENT_URL")
        .unwrap_or_else(|_| "http://guest:guest@127.0.0.1:15673".to_owned())
}

/// One test's fleet: its own pool, bucket and folder; its workers are killed on drop.
struct Fleet {
    pool: String,
    amqp_url: String,
    redis_url: String,
    /// `None` on a broker without the management plugin.
    management_url: Option<String>,
    bucket: String,
    dir: tempfile::TempDir,
    workers: Vec<(String, Child)>,
    /// Pools besides `pool` that the test's workers serve; their queues go with the fleet.
    other_pools: Vec<String>,
    /// Variables every process of the fleet gets besides the services'.
    extra_env: Vec<(String, String)>,
    /// The TLS material the fleet's processes are given (`FLEETRUN_TLS_*` in `extra_env`),
    /// for the test's own connections.
    tls: Tls,
    runtime: tokio::runtime::Runtime,
}

/// The pool both binaries use when none is named.
const DEFAULT_POOL: &str = "default";

impl Fleet {
    /// Gives the fleet's processes, and the test's own connections, the client certificate
    /// and CA of `scripts/services.sh`'s TLS servers (`FLEETRUN_TLS_*`).
    fn use_test_certificates(&mut self) {
        let dir = services::tls_dir();
        let files = fleetrun_common::tls::TlsFiles {
            ca_file: Some(dir.join("ca.pem")),
            cert_file: Some(dir.join("client.pem")),
            key_file: Some(dir.join("client.key")),
        };
        self.tls = files
            .load()
            .expect("the test certificates (scripts/services.sh start)");
        for (name, file) in [
            ("FLEETRUN_TLS_CA_FILE", "ca.pem"),
            ("FLEETRUN_TLS_CERT_FILE", "client.pem"),
            ("FLEETRUN_TLS_KEY_FILE", "client.key"),
        ] {
            let path = dir.join(file).display().to_string();
            self.extra_env.push((name.to_owned(), path));
        }
    }
}

impl Fleet {
    fn new(script: &str) -> Fleet {
        Fleet::on_pool(script, format!("t{}", random_suffix()))
    }

    /// A fleet on a broker of the test's own (no management API).
    fn on_broker(script: &str, amqp_url: String) -> Fleet {
        let mut fleet = Fleet::new(script);
        fleet.amqp_url = amqp_url;
        fleet.management_url = None;
        fleet
    }

    fn on_pool(script: &str, pool: String) -> Fleet {
        fleetrun_common::tls::install_crypto_provider();
        let fleet = Fleet {
            pool,
            amqp_url: services::amqp_url(),
            redis_url: services::redis_url(),
            management_url: Some(management_url()),
            bucket: format!("fleet-{}", random_suffix()),
            dir: tempfile::tempdir().unwrap(),
            workers: Vec::new(),
            other_pools: Vec::new(),
            extra_env: Vec::new(),
            tls: Tls::default(),
            runtime: tokio::runtime::Runtime::new().unwrap(),
        };
        std::fs::create_dir_all(fleet.path("code")).unwrap();
        std::fs::write(fleet.path("code/score.py"), script).unwrap();
        fleet.know_pool(&fleet.pool);
        fleet
    }

    /// Makes `pool` known, as a worker of it that started once would: commands refuse a
    /// pool no worker has started, and tests submit before their workers beat.
    fn know_pool(&self, pool: &str) {
        self.runtime.block_on(async {
            // The binaries' key prefix.
            let registry = RedisRegistry::connect(&self.redis_url, "fleetrun", &self.tls)
                .await
                .unwrap();
            registry
                .beat(pool, "test-fixture", Duration::from_millis(1))
                .await
                .unwrap();
        });
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    fn storage(&self, prefix: &str) -> S3Storage {
        let settings = S3Settings {
            endpoint_url: Some(services::s3_endpoint()),
            region: Some("us-east-1".into()),
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
            force_path_style: Some(true),
        };
        self.runtime
            .block_on(S3Storage::new(&self.bucket, prefix, &settings))
            .unwrap()
    }

    /// Writes `n` inputs `fNNNN` to S3 under `in/` and to the local folder `local-in/`.
    fn inputs(&self, n: usize) {
        let s3 = self.storage("in");
        self.runtime.block_on(async {
            s3.create_bucket_if_missing().await.unwrap();
            for i in 0..n {
                let key = format!("g{:02}/f{i:04}.txt", i / 100);
                s3.put(&key, Bytes::from(format!("f{i:04}"))).await.unwrap();
                let local = self.path(&format!("local-in/{key}"));
                std::fs::create_dir_all(local.parent().unwrap()).unwrap();
                std::fs::write(local, format!("f{i:04}")).unwrap();
            }
        });
    }

    /// A job file named, like the job, with a random suffix: job ids start with the name, so
    /// no two tests' jobs share ledger keys on the shared Redis.
    fn job(&self, settings: &str, input: &str, output: &str) -> std::path::PathBuf {
        let suffix = random_suffix();
        let toml = format!(
            "name = \"fleet-{suffix}\"\nentry_script = \"score.py\"\nsource_directory = \"code\"\noutput_action = \"append_row\"\n{settings}\n[input]\nfiles = \"{input}\"\n[output]\npath = \"{output}\"\n"
        );
        let path = self.path(&format!("job-{suffix}.toml"));
        std::fs::write(&path, toml).unwrap();
        path
    }

    /// A job with input and output in this test's bucket.
    fn s3_job(&self, settings: &str) -> std::path::PathBuf {
        let bucket = &self.bucket;
        self.job(
            settings,
            &format!("s3://{bucket}/in"),
            &format!("s3://{bucket}/out"),
        )
    }

    /// `fleetrun submit JOB --wait`, running while the test goes on; killed if the test
    /// ends before it does.
    fn spawn_submit(&self, job: &Path) -> KillOnDrop {
        let mut cmd = command("fleetrun");
        self.env(&mut cmd);
        KillOnDrop(
            cmd.arg("submit")
                .arg(job)
                .arg("--quiet")
                .arg("--wait")
                .spawn()
                .unwrap(),
        )
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("FLEETRUN_AMQP_URL", &self.amqp_url)
            .env("FLEETRUN_REDIS_URL", &self.redis_url)
            .env("AWS_ENDPOINT_URL", services::s3_endpoint())
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("FLEETRUN_CONFIG", "/nonexistent")
            .env_remove("VIRTUAL_ENV");
        match &self.management_url {
            Some(url) => cmd.env("FLEETRUN_AMQP_MANAGEMENT_URL", url),
            None => cmd.env_remove("FLEETRUN_AMQP_MANAGEMENT_URL"),
        };
        // The default pool is the one nobody names.
        if self.pool == DEFAULT_POOL {
            cmd.env_remove("FLEETRUN_POOL");
        } else {
            cmd.env("FLEETRUN_POOL", &self.pool);
        }
        cmd.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
    }

    /// `fleetrun serve` on a free loopback port with API token `token`, logging to
    /// `serve.log`: the process and the base URL it listens on.
    fn serve(&self, token: &str) -> (KillOnDrop, String) {
        let (serve, mut urls) = self.serve_with(token, &[]);
        (serve, urls.remove(0))
    }

    /// `fleetrun serve` with arguments `args` besides its listener: the process and the
    /// URLs of the lines it prints first (its base URL, then its metrics' with
    /// `--metrics-addr`).
    fn serve_with(&self, token: &str, args: &[&str]) -> (KillOnDrop, Vec<String>) {
        let mut cmd = command("fleetrun");
        self.env(&mut cmd);
        let log = std::fs::File::create(self.path("serve.log")).unwrap();
        let mut serve = KillOnDrop(
            cmd.args(["serve", "--listen", "127.0.0.1:0"])
                .args(args)
                .env("FLEETRUN_API_TOKEN", token)
                .stdout(std::process::Stdio::piped())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let printed = if args.contains(&"--metrics-addr") {
            2
        } else {
            1
        };
        let lines = lines_within(&mut serve.0, printed, Duration::from_secs(60));
        let urls = lines
            .iter()
            .map(|l| l.split(" on ").nth(1).unwrap().to_owned())
            .collect();
        (serve, urls)
    }

    fn worker(&mut self, node: &str, processes: usize) {
        self.worker_with(node, processes, &[], &[]);
    }

    /// A worker with variables and arguments besides the fleet's.
    fn worker_with(&mut self, node: &str, processes: usize, env: &[(&str, &str)], args: &[&str]) {
        // `command` leaves out the test run's own settings (its service URLs among them).
        let mut cmd = command("fleetrun-worker");
        self.env(&mut cmd);
        cmd.envs(env.iter().copied()).args(args);
        let log = std::fs::File::create(self.path(&format!("{node}.log"))).unwrap();
        cmd.args(["--node-id", node, "--processes", &processes.to_string()])
            .arg("--cache-dir")
            .arg(self.path(&format!("cache-{node}")))
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.workers.push((
            node.to_owned(),
            cmd.spawn().expect("fleetrun-worker starts"),
        ));
    }

    /// `fleetrun submit JOB ARGS` to its end, bounded by [`RUN_LIMIT`]: past it the
    /// submitter is killed and the test fails.
    fn submit(&self, job: &Path, args: &[&str]) -> Output {
        let mut cmd = command("fleetrun");
        self.env(&mut cmd);
        cmd.arg("submit").arg(job).arg("--quiet").args(args);
        let out = output_within(&mut cmd, RUN_LIMIT);
        eprintln!(
            "--- submit stdout\n{}--- stderr\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn output(&self, key: &str) -> Vec<u8> {
        let s3 = self.storage("");
        self.runtime.block_on(s3.get(key)).unwrap().to_vec()
    }

    /// The pool's queue: the lanes the broker holds for it, and its dead letters.
    fn pool_depth(&self, queue: &AmqpQueue) -> Depth {
        self.runtime.block_on(async {
            let lanes = queue.lanes().await.unwrap();
            queue.depth(&lanes).await.unwrap()
        })
    }

    fn queue(&self) -> Arc<AmqpQueue> {
        let (url, pool, mgmt) = (
            self.amqp_url.clone(),
            self.pool.clone(),
            self.management_url.clone(),
        );
        self.runtime.block_on(async {
            let options = QueueOptions {
                delivery_limit: Some(fleetrun_worker_delivery_limit()),
            };
            Arc::new(
                AmqpQueue::connect(&url, &pool, options, mgmt.as_deref(), &self.tls)
                    .await
                    .unwrap(),
            )
        })
    }
}

/// The pool's delivery limit, as the binaries declare it.
fn fleetrun_worker_delivery_limit() -> u32 {
    101
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (node, child) in &mut self.workers {
            kill(child);
            if std::thread::panicking() {
                let log = std::fs::read_to_string(self.dir.path().join(format!("{node}.log")));
                eprintln!("--- worker {node}\n{}", log.unwrap_or_default());
            }
        }
        // Each test has pools of its own: remove their queues, one per job (every quorum
        // queue holds file handles of the broker's, and the suite runs hundreds of jobs).
        let url = self.amqp_url.clone();
        for pool in std::iter::once(&self.pool).chain(&self.other_pools) {
            let _ = self.runtime.block_on(async {
                AmqpQueue::connect(
                    &url,
                    pool,
                    QueueOptions {
                        delivery_limit: Some(fleetrun_worker_delivery_limit()),
                    },
                    self.management_url.as_deref(),
                    &self.tls,
                )
                .await?
                .delete()
                .await
            });
        }
    }
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::to_owned)
        .collect()
}

const ECHO: &str =
    "import time\ndef run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n";

/// One worker serves jobs of different Pythons, each run by its `environment`'s: 3.10 and
/// 3.12, inputs and output on S3; a 3.8 job is refused once, naming the versions served,
/// and the worker goes on.
#[test]
fn jobs_under_python_3_10_and_3_12_run_on_the_fleet_and_3_8_is_refused() {
    let script = "import sys\ndef run(mini_batch):\n    return ['%d.%d %s' % (sys.version_info[0], sys.version_info[1], open(p).read()) for p in mini_batch]\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(6);
    fleet.worker("w1", 2);
    let bucket = fleet.bucket.clone();
    for minor in ["3.10", "3.12"] {
        let output = format!("out-{minor}");
        let job = fleet.job(
            &format!(
                "mini_batch_size = 2\nenvironment = \"{}\"",
                pyenv_python(minor).display()
            ),
            &format!("s3://{bucket}/in"),
            &format!("s3://{bucket}/{output}"),
        );
        let out = fleet.submit(&job, &["--wait"]);
        assert_eq!(code(&out), 0, "{minor}");
        let expected: Vec<String> = (0..6).map(|i| format!("{minor} f{i:04}")).collect();
        assert_eq!(
            lines(&fleet.output(&format!("{output}/parallel_run_step.txt"))),
            expected
        );
    }
    let job = fleet.job(
        &format!("environment = \"{}\"", pyenv_python("3.8").display()),
        &format!("s3://{bucket}/in"),
        &format!("s3://{bucket}/out-3.8"),
    );
    let out = fleet.submit(&job, &["--wait"]);
    assert_ne!(code(&out), 0);
    let result = fleet.text("out-3.8/logs/job_result.txt");
    assert!(
        result.contains("is Python 3.8.")
            && result.contains("which fleetrun cannot run; it runs CPython 3.9, 3.10, 3.11, 3.12"),
        "{result}"
    );
    // The node's logs reach S3 once the node has let the job go.
    let main_key = "out-3.8/logs/sys/node/w1/_main.txt";
    let s3 = fleet.storage("");
    wait_for("w1's _main.txt on S3", Duration::from_secs(30), || {
        fleet.runtime.block_on(s3.get(main_key)).is_ok()
    });
    let main = fleet.text(main_key);
    assert_eq!(main.matches("Giving up on job").count(), 1, "{main}");
    assert!(
        !main.contains("failed to start"),
        "no runner starts: {main}"
    );
}

/// Three workers, inputs and output on S3: the same bytes `fleetrun run` writes locally.
#[test]
fn s3_job_on_three_workers_matches_a_local_run() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(120);
    for node in ["w1", "w2", "w3"] {
        fleet.worker(node, 1);
    }
    let s3_in = format!("s3://{}/in", fleet.bucket);
    let s3_out = format!("s3://{}/out", fleet.bucket);
    let job = fleet.job("mini_batch_size = 7\nnode_count = 3", &s3_in, &s3_out);
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0);
    let fleet_bytes = fleet.output("out/parallel_run_step.txt");

    assert_eq!(fleet_bytes, fleet.local_run("mini_batch_size = 7"));
    assert_eq!(lines(&fleet_bytes), expected_lines(120, |_| false));
    // Work was spread: the job's one report names more than one node.
    let report = fleet.text("out/logs/sys/job_report/processed_mini-batches.csv");
    let nodes: std::collections::BTreeSet<&str> = report
        .lines()
        .skip(1)
        .filter_map(|row| row.split(',').nth(6))
        .collect();
    assert!(nodes.len() >= 2, "{report}");
    let s3 = fleet.storage("out/logs");
    let keys = || -> Vec<String> {
        fleet
            .runtime
            .block_on(s3.list("").map_ok(|m| m.key).try_collect())
            .unwrap()
    };
    assert!(keys().contains(&"job_result.txt".to_owned()));
    // Each node that ran mini-batches had its resource monitor sample it from its first
    // runner on, and uploads that with its other logs once it sees the job ended.
    for node in nodes {
        let perf = format!("perf/{node}/node_resource_usage.csv");
        wait_for(&perf, Duration::from_secs(20), || keys().contains(&perf));
    }
}

/// A worker killed with SIGKILL while it holds a mini-batch: the job still completes, with
/// every line exactly once. Output on S3 (a part is an object).
#[test]
fn a_worker_killed_mid_job_loses_and_duplicates_nothing() {
    let (fleet, _markers) = kill_a_worker_mid_job(|fleet| {
        fleet.s3_job("mini_batch_size = 5\nrun_max_try = 3\nnode_count = 2")
    });
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(150, |_| false)
    );
}

/// The same with input and output in a local folder the workers share: parts are appended
/// to one segment file per worker, the killed worker's included.
#[test]
fn a_worker_killed_mid_job_with_local_output_loses_and_duplicates_nothing() {
    let (fleet, _markers) = kill_a_worker_mid_job(|fleet| {
        let out = fleet.path("shared-out");
        let input = fleet.path("local-in");
        fleet.job(
            "mini_batch_size = 5\nrun_max_try = 3\nnode_count = 2",
            &input.display().to_string(),
            &out.display().to_string(),
        )
    });
    let out = fleet.path("shared-out");
    let bytes = std::fs::read(out.join("parallel_run_step.txt")).unwrap();
    assert_eq!(lines(&bytes), expected_lines(150, |_| false));
    assert!(
        !out.join("_parts").read_dir().unwrap().any(|_| true),
        "parts removed"
    );
}

/// The same with one attempt per mini-batch and no failure allowed: the attempts lost with
/// the worker are not the script's, so the job completes with every line once, in order,
/// and nothing failed; the job's one report has a row for every attempt, the killed
/// worker's included: those it ended before it died, and those it held as it died, reported
/// lost, naming it, by the worker that found them; each mini-batch succeeded once.
#[test]
fn a_worker_killed_with_one_attempt_costs_no_item_and_reports_every_attempt() {
    let (fleet, markers) = kill_a_worker_mid_job(|fleet| {
        fleet.s3_job("mini_batch_size = 5\nrun_max_try = 1\nerror_threshold = 0\nnode_count = 2")
    });
    let output = lines(&fleet.output("out/parallel_run_step.txt"));
    assert_eq!(output, expected_lines(150, |_| false));
    assert!(
        fleet
            .runtime
            .block_on(fleet.storage("out/logs").get("failed_items.csv"))
            .is_err(),
        "nothing failed"
    );
    let rows = assert_every_run_reported(&fleet, &markers.path().join("runs"), &output);
    for (index, rows) in &rows {
        let succeeded = rows.iter().filter(|(result, _)| result == "succeeded");
        assert_eq!(succeeded.count(), 1, "mini-batch {index}: {rows:?}");
    }
    assert!(
        rows.values()
            .flatten()
            .any(|(result, node)| result == "lost" && node == "victim"),
        "the victim held a mini-batch as it died: {rows:?}"
    );
}

/// Checks the job's one report against the `runs` file its script wrote (a line
/// `<node> <first item>` per `run()` call, mini-batches of 5): every run has a row of its
/// mini-batch naming its node, a row of each mini-batch in the output says it succeeded, and
/// an attempt whose node said nothing is `lost`. Returns each mini-batch's rows (result, node).
fn assert_every_run_reported(
    fleet: &Fleet,
    runs: &Path,
    output: &[String],
) -> BTreeMap<u64, Vec<(String, String)>> {
    let report = fleet.text("out/logs/sys/job_report/processed_mini-batches.csv");
    let mut rows: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    for row in report.lines().skip(1) {
        let fields: Vec<&str> = row.split(',').collect();
        let index: u64 = fields[0].parse().unwrap();
        let row = (fields[2].to_owned(), fields[6].to_owned());
        rows.entry(index).or_default().push(row);
    }
    let out: BTreeSet<&String> = output.iter().collect();
    let runs = std::fs::read_to_string(runs).unwrap();
    for run in runs.lines() {
        let (node, first) = run.split_once(' ').unwrap();
        let n: u64 = first[1..5].parse().unwrap();
        let index = n / 5;
        let of_batch = rows.get(&index).map(Vec::as_slice).unwrap_or_default();
        assert!(
            of_batch.iter().any(|(_, named)| named == node),
            "no row of node {node} for mini-batch {index}:\n{report}"
        );
        let done = out.contains(&format!("f{n:04}"));
        for (result, _) in of_batch {
            match result.as_str() {
                "succeeded" | "lost" => {}
                other => panic!("mini-batch {index}: {other}\n{report}"),
            }
        }
        // Not the converse: a run that succeeded after its mini-batch was recorded failed
        // (lost with the broker) has its row, and its rows are not the output's.
        assert!(
            !done || of_batch.iter().any(|(result, _)| result == "succeeded"),
            "mini-batch {index} is in the output, and no row says it succeeded:\n{report}"
        );
    }
    rows
}

/// Runs the job `make_job` gives on two workers (150 inputs), SIGKILLs one while it runs a
/// mini-batch, and waits for `submit --wait` to exit 0.
fn kill_a_worker_mid_job(make_job: impl Fn(&Fleet) -> PathBuf) -> (Fleet, tempfile::TempDir) {
    let markers = tempfile::tempdir().unwrap();
    let script = format!(
        "import os, time\nMARKS = {:?}\ndef run(mini_batch):\n    node = os.environ['FLEETRUN_NODE_ID']\n    with open(os.path.join(MARKS, 'runs'), 'a') as f:\n        f.write(node + ' ' + os.path.basename(mini_batch[0]) + '\\n')\n    open(os.path.join(MARKS, node + '-' + str(os.getpid())), 'a').close()\n    time.sleep(0.2)\n    return [open(p).read() for p in mini_batch]\n",
        markers.path().display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(150);
    fleet.worker("victim", 2);
    fleet.worker("w2", 1);
    let job = make_job(&fleet);
    let mut submit = fleet.spawn_submit(&job);
    wait_for(
        "the victim to be running a mini-batch",
        Duration::from_secs(60),
        || {
            std::fs::read_dir(markers.path())
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("victim-"))
        },
    );
    let (_, victim) = &mut fleet.workers[0];
    kill(victim);
    let status = submit.exit_within(RUN_LIMIT);
    assert_eq!(status.code(), Some(0));
    (fleet, markers)
}

/// A worker killed outright (SIGKILL) while its script's `run()` waits on a child `sleep`:
/// its runner sees the worker die and kills its process group, so neither the runner nor the
/// child is left.
#[test]
fn a_worker_killed_outright_leaves_no_process_of_its_scripts() {
    let markers = tempfile::tempdir().unwrap();
    let pid_file = markers.path().join("pids");
    let script = format!(
        "import os, subprocess\nPIDS = {:?}\ndef run(mini_batch):\n    child = subprocess.Popen(['sleep', '300'])\n    with open(PIDS, 'a') as f:\n        f.write(f'{{os.getpid()}}\\n{{child.pid}}\\n')\n    child.wait()\n    return []\n",
        pid_file.display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(1);
    fleet.worker("victim", 1);
    let job = fleet.s3_job("");
    let _submit = fleet.spawn_submit(&job);
    wait_for("the runner and its child to start", RUN_LIMIT, || {
        pids(&pid_file).len() == 2
    });
    let processes = ScriptProcesses::read(&pid_file);
    let (_, victim) = &mut fleet.workers[0];
    kill(victim);
    processes.assert_all_gone();
}

#[test]
fn threshold_stops_every_worker_and_leaves_nothing_queued() {
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write(f'{{time.time()}}\\n')\n    time.sleep(0.05)\n    raise RuntimeError('bad model')\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(300);
    for node in ["w1", "w2", "w3"] {
        fleet.worker(node, 1);
    }
    let job =
        fleet.s3_job("mini_batch_size = 1\nrun_max_try = 1\nerror_threshold = 4\nnode_count = 3");
    let out = fleet.submit(&job, &["--wait"]);
    let failed_at = std::time::SystemTime::now();
    assert_eq!(code(&out), 42);
    assert!(String::from_utf8_lossy(&out.stdout).contains("error_threshold exceeded"));
    let queue = fleet.queue();
    wait_for(
        "the job's mini-batches to leave the queue",
        Duration::from_secs(30),
        || {
            let d = fleet.pool_depth(&queue);
            d.ready == 0 && d.unacked == Some(0)
        },
    );
    let result = fleet.job_result("out");
    assert!(result.contains("Result: Failed"), "{result}");
    // Promptly: with nothing left queued or held, no mini-batch started more than a few
    // seconds after `submit --wait` saw the job fail, and far fewer than the 300 ran.
    let failed_at = failed_at.duration_since(std::time::UNIX_EPOCH).unwrap();
    let started: Vec<f64> = std::fs::read_to_string(&runs)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let last = started.iter().copied().fold(0.0, f64::max);
    let late = last - failed_at.as_secs_f64();
    assert!(
        late < 3.0,
        "a mini-batch started {late:.1} s after the job failed"
    );
    assert!(started.len() < 100, "{} mini-batches ran", started.len());
    let status = output_within(
        command("fleetrun").args(["status"]).envs([
            ("FLEETRUN_REDIS_URL", services::redis_url()),
            ("FLEETRUN_AMQP_URL", services::amqp_url()),
            ("FLEETRUN_POOL", fleet.pool.clone()),
            ("FLEETRUN_CONFIG", "/nonexistent".into()),
        ]),
        Duration::from_secs(60),
    );
    let listing = String::from_utf8_lossy(&status.stdout);
    assert!(listing.contains("Failed"), "{listing}");
}

/// A message that does not decode goes to the dead-letter queue; the workers keep serving.
#[test]
fn malformed_message_is_dead_lettered_and_workers_keep_serving() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(20);
    let queue = fleet.queue();
    // Ahead of the job's own mini-batches, in its queue.
    let id = format!("malformed-{}", fleet.pool);
    fleet
        .runtime
        .block_on(queue.publish(&id, b"\xc1 not a mini-batch".to_vec()))
        .unwrap();
    fleet.worker("w1", 1);
    let job = fleet.s3_job("mini_batch_size = 4");
    let out = fleet.submit(&job, &["--wait", "--job-id", &id]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(20, |_| false)
    );
    wait_for(
        "the dead-letter queue to show the message",
        Duration::from_secs(30),
        || fleet.pool_depth(&queue).dead == 1,
    );
}

/// `fleetrun cancel`: the job ends Canceled and its remaining mini-batches leave the queue
/// without running.
#[test]
fn cancel_stops_a_job_and_drops_its_mini_batches() {
    let script = "import time\ndef run(mini_batch):\n    time.sleep(0.2)\n    return [open(p).read() for p in mini_batch]\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(100);
    fleet.worker("w1", 1);
    let job = fleet.s3_job("mini_batch_size = 1");
    let out = fleet.submit(&job, &[]);
    assert_eq!(
        code(&out),
        0,
        "submit without --wait returns once published"
    );
    let id = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_owned();
    let mut cancel = command("fleetrun");
    fleet.env(&mut cancel);
    let cancelled = output_within(cancel.args(["cancel", &id]), Duration::from_secs(60));
    assert_eq!(code(&cancelled), 0);
    assert!(String::from_utf8_lossy(&cancelled.stdout).contains("Canceled"));
    let queue = fleet.queue();
    wait_for(
        "the canceled job's mini-batches to leave the queue",
        Duration::from_secs(30),
        || {
            let d = fleet.pool_depth(&queue);
            d.ready == 0 && d.unacked == Some(0)
        },
    );
    let mut status = command("fleetrun");
    fleet.env(&mut status);
    let shown = output_within(status.args(["status", &id]), Duration::from_secs(60));
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("Canceled"), "{shown}");
    // Far from all 100 one-second-fifth mini-batches ran.
    let done: u64 = shown
        .lines()
        .find_map(|l| l.strip_prefix("mini-batches:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("a mini-batches line");
    assert!(done < 50, "{done} mini-batches ran after the cancel");
}

/// SIGTERM drains a worker: it finishes the mini-batch in hand, takes no more and exits 0;
/// another worker completes the job, with every line exactly once. What the broker had
/// pushed to the draining worker and it did not start goes back untried: with one attempt
/// per mini-batch, none of it fails.
#[test]
fn sigterm_drains_a_worker_without_losing_work() {
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("draining");
    let script = format!(
        "import os, time\nMARKS = {:?}\ndef run(mini_batch):\n    with open(os.path.join(MARKS, os.environ['FLEETRUN_NODE_ID']), 'a') as f:\n        f.write('run\\n')\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n",
        markers.path().display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(60);
    fleet.worker("draining", 1);
    let job = fleet.s3_job("mini_batch_size = 3\nrun_max_try = 1");
    let mut submit = fleet.spawn_submit(&job);
    let started = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    wait_for(
        "the worker to be running a mini-batch",
        Duration::from_secs(60),
        || started() > 0,
    );
    let (_, draining) = &mut fleet.workers[0];
    // SAFETY: kill(2) with SIGTERM on our own child.
    assert_eq!(
        unsafe { libc::kill(draining.id() as i32, libc::SIGTERM) },
        0
    );
    let at_sigterm = started();
    let exit = exit_within(draining, Duration::from_secs(60));
    assert_eq!(exit.code(), Some(0), "a drained worker exits 0");
    // It finishes what it holds (at most its prefetch, 4, with the one it runs), and takes
    // nothing more.
    let after = started() - at_sigterm;
    assert!(after <= 3, "{after} mini-batches started after SIGTERM");
    assert!(started() < 20, "the draining worker ran the whole job");
    fleet.worker("w2", 1);
    assert_eq!(submit.exit_within(RUN_LIMIT).code(), Some(0));
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(60, |_| false)
    );
}

/// A worker lets a job go once, when the job ends: its logs are on S3 when `submit --wait`
/// returns, and a worker stopped later does not copy the logs of every job it ever served
/// again.
#[test]
fn a_stopping_worker_leaves_the_logs_of_ended_jobs_as_they_were_let_go() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(6);
    fleet.worker("w1", 1);
    let job = fleet.s3_job("mini_batch_size = 3");
    assert_eq!(code(&fleet.submit(&job, &["--wait"])), 0);
    let main_key = "out/logs/sys/node/w1/_main.txt";
    let s3 = fleet.storage("");
    assert!(
        fleet.runtime.block_on(s3.get(main_key)).is_ok(),
        "w1's _main.txt was not on S3 when the job returned"
    );
    // What the job's end sent is gone (as an operator tidying the output would leave it).
    fleet
        .runtime
        .block_on(s3.delete_prefix("out/logs/sys/node/w1/"))
        .unwrap();

    let (_, worker) = &mut fleet.workers[0];
    // SAFETY: kill(2) with SIGTERM on our own child.
    assert_eq!(unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(exit_within(worker, Duration::from_secs(60)).code(), Some(0));
    assert!(
        fleet.runtime.block_on(s3.get(main_key)).is_err(),
        "the stopping worker sent the ended job's logs again"
    );
}

/// Every file under `dir`, with its content: what a user finds there at one moment.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    files_under(dir)
        .into_iter()
        .map(|file| {
            (
                file.display().to_string(),
                std::fs::read(dir.join(&file)).unwrap(),
            )
        })
        .collect()
}

/// When `submit --wait` returns, every node that followed the job has let it go: the
/// output folder is whole, and nothing writes to it after. Three workers on one host serve
/// a job with a local output whose script prints in `shutdown()`; the user removes the
/// output folder as soon as the job returns and submits the same job file again, three
/// times; after the last, the workers stop, and the folder is as it was when the job
/// returned, the lines `shutdown()` printed on every node in it.
#[test]
fn the_output_is_whole_when_submit_wait_returns_and_nothing_writes_after() {
    let script = "def run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n\ndef shutdown():\n    print('shutdown ran')\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(30);
    for node in ["w1", "w2", "w3"] {
        fleet.worker(node, 1);
    }
    let out = fleet.path("out");
    let job = fleet.job(
        "mini_batch_size = 1\nprocess_count_per_node = 1",
        &fleet.path("local-in").display().to_string(),
        &out.display().to_string(),
    );
    let mut returned = Default::default();
    for round in 0..3 {
        let submitted = fleet.submit(&job, &["--wait"]);
        assert_eq!(
            code(&submitted),
            0,
            "round {round}; the output folder then held {:#?}",
            tree(&out)
                .into_iter()
                .map(|(name, text)| (name, String::from_utf8_lossy(&text).into_owned()))
                .collect::<BTreeMap<_, _>>()
        );
        returned = tree(&out);
        assert_eq!(
            lines(&returned["parallel_run_step.txt"]),
            expected_lines(30, |_| false)
        );
        if round < 2 {
            std::fs::remove_dir_all(&out).unwrap();
        }
    }
    let stdout: Vec<_> = returned
        .iter()
        .filter(|(name, _)| name.starts_with("logs/user/stdout/"))
        .collect();
    assert!(!stdout.is_empty(), "{:?}", returned.keys());
    for (name, text) in &stdout {
        assert!(
            String::from_utf8_lossy(text).contains("shutdown ran"),
            "{name} was not whole when the job returned"
        );
    }
    for (_, worker) in &mut fleet.workers {
        // SAFETY: kill(2) with SIGTERM on our own child.
        assert_eq!(unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) }, 0);
        assert_eq!(exit_within(worker, Duration::from_secs(60)).code(), Some(0));
    }
    let now = tree(&out);
    let changed: Vec<_> = now
        .keys()
        .chain(returned.keys())
        .filter(|name| now.get(*name) != returned.get(*name))
        .collect();
    assert!(
        changed.is_empty(),
        "written after the job returned: {changed:?}"
    );
}

/// On an S3 output too, the logs are whole when `submit --wait` returns: each node's are
/// uploaded once its runners have ended, here after a `shutdown()` that takes 0.3 s, and the
/// submitter returns only after that.
#[test]
fn an_s3_outputs_logs_are_whole_when_submit_wait_returns() {
    let script = "import time\ndef run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n\ndef shutdown():\n    time.sleep(0.3)\n    print('shutdown ran')\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(8);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    let job = fleet.s3_job("mini_batch_size = 1\nprocess_count_per_node = 1");
    assert_eq!(code(&fleet.submit(&job, &["--wait"])), 0);
    let prefix = "out/logs/user/stdout/";
    let s3 = fleet.storage(prefix);
    let keys: Vec<String> = fleet
        .runtime
        .block_on(s3.list_keys("").try_collect())
        .unwrap();
    let logs: Vec<String> = keys
        .iter()
        .map(|key| format!("{key}: {}", fleet.text(&format!("{prefix}{key}"))))
        .collect();
    assert!(
        !logs.is_empty(),
        "no runner's stdout on S3 when the job returned"
    );
    for log in &logs {
        assert!(
            log.contains("shutdown ran"),
            "not whole when the job returned: {log}"
        );
    }
}

/// A worker told to drain while it runs a job's last mini-batch records it and, as the
/// one that completed the job, finalizes it before it exits: no other
/// worker is needed.
#[test]
fn a_draining_worker_finalizes_the_job_it_completes() {
    let markers = tempfile::tempdir().unwrap();
    let script = format!(
        "import os, time\nMARKS = {:?}\ndef run(mini_batch):\n    if any(p.endswith('f0039.txt') for p in mini_batch):\n        open(os.path.join(MARKS, 'last'), 'a').close()\n        time.sleep(1)\n    return [open(p).read() for p in mini_batch]\n",
        markers.path().display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(40);
    fleet.worker("last", 1);
    let job = fleet.s3_job("mini_batch_size = 1");
    let mut submit = fleet.spawn_submit(&job);
    wait_for(
        "the last mini-batch to run",
        Duration::from_secs(60),
        || markers.path().join("last").exists(),
    );
    let (_, worker) = &mut fleet.workers[0];
    // SAFETY: kill(2) with SIGTERM on our own child.
    assert_eq!(unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(exit_within(worker, Duration::from_secs(60)).code(), Some(0));
    assert_eq!(submit.exit_within(Duration::from_secs(30)).code(), Some(0));
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(40, |_| false)
    );
}

/// The names of the RabbitMQ connections of this test's pool, as the management API lists
/// them (every fleetrun connection is named `fleetrun <pool> pid <pid>`).
fn pool_connections(fleet: &Fleet) -> Vec<(String, String)> {
    let prefix = format!("fleetrun {} ", fleet.pool);
    let url = format!("{}/api/connections", management_url());
    let listed: serde_json::Value = fleet.runtime.block_on(async {
        reqwest::get(&url)
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| {
            let client = c["client_properties"]["connection_name"].as_str()?;
            client
                .starts_with(&prefix)
                .then(|| (c["name"].as_str().unwrap().to_owned(), client.to_owned()))
        })
        .collect()
}

/// Two jobs whose `init()` always fails, served by two workers that each give up on a job
/// after 3 failed starts. The one for two nodes fails once it has run two minutes with
/// 2 × node_count × processes init failures over the fleet (CONTRACT §5 rule 2). The one
/// for five nodes never reaches that count with two workers: it fails once no mini-batch
/// has ended anywhere for as long as a node that could start it would have needed (rule 3:
/// init, then its one 1-second attempt). Neither waits forever for a node that can start it.
#[test]
fn init_failures_over_the_fleet_fail_the_job_after_two_minutes() {
    let script =
        "def init():\n    raise ImportError('no model file')\n\ndef run(mb):\n    return mb\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(10);
    fleet.worker("n1", 1);
    fleet.worker("n2", 1);
    let bucket = fleet.bucket.clone();
    let rule_2 = fleet.s3_job("node_count = 2\nprocess_count_per_node = 1");
    let stalled = fleet.job(
        "node_count = 5\nprocess_count_per_node = 1\nrun_invocation_timeout = 1\nrun_max_try = 1",
        &format!("s3://{bucket}/in"),
        &format!("s3://{bucket}/stalled"),
    );
    let submitted = std::time::Instant::now();
    let mut rule_2 = fleet.spawn_submit(&rule_2);
    let mut stalled = fleet.spawn_submit(&stalled);

    assert_eq!(
        stalled.exit_within(Duration::from_secs(240)).code(),
        Some(42)
    );
    let result = fleet.job_result("stalled");
    assert!(result.contains("Result: Failed"), "{result}");
    assert!(
        result.contains("no mini-batch has ended on any node"),
        "{result}"
    );
    assert!(result.contains("ImportError: no model file"), "{result}");

    assert_eq!(
        rule_2.exit_within(Duration::from_secs(240)).code(),
        Some(42)
    );
    assert!(
        submitted.elapsed() > Duration::from_secs(120),
        "failed only once the job had run two minutes"
    );
    let result = fleet.job_result("out");
    assert!(result.contains("Result: Failed"), "{result}");
    assert!(
        result.contains("runner processes failed to start over the job (the limit is 4"),
        "{result}"
    );
    assert!(result.contains("ImportError: no model file"), "{result}");
}

/// RabbitMQ stops in the middle of a job and starts again seconds later (a node of the
/// test's own; the other tests share theirs): the workers reconnect without being restarted,
/// the mini-batches they held come back, and every line is there exactly once. The job
/// takes 10 s of running, so the broker stops well before its end.
#[test]
fn a_broker_restart_mid_job_loses_and_duplicates_nothing() {
    let (_broker, fleet, _markers) = restart_the_broker_mid_job("run_max_try = 3");
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(200, |_| false)
    );
}

/// With one attempt per mini-batch and no failure allowed, a broker restart costs nothing:
/// the attempts it took were not the script's, so the job completes with every line once,
/// in order, and nothing failed. A mini-batch that succeeded but whose acknowledgement the
/// restart lost comes back and is not run into the output twice. Every run has its row in
/// the report.
#[test]
fn a_broker_restart_with_one_attempt_costs_no_item() {
    let (_broker, fleet, markers) =
        restart_the_broker_mid_job("run_max_try = 1\nerror_threshold = 0");
    let output = lines(&fleet.output("out/parallel_run_step.txt"));
    assert_eq!(output, expected_lines(200, |_| false));
    assert_output_and_failed_items_cover(&fleet, &output, 200);
    assert_every_run_reported(&fleet, &markers.path().join("runs"), &output);
}

/// A worker frozen (SIGSTOP) for longer than `run_invocation_timeout` while its runner's
/// `run()` takes a fraction of it charges nothing to the script: the run's reply waits for
/// the worker, and with one attempt per mini-batch none fails.
#[test]
fn a_frozen_worker_charges_no_timeout_to_a_run_that_returned() {
    let mut fleet = Fleet::new("");
    let started = fleet.path("started");
    let script = format!(
        "import time\nSTARTED = {started:?}\n\ndef run(mini_batch):\n    open(STARTED, 'a').close()\n    time.sleep(1)\n    return [open(p).read() for p in mini_batch]\n"
    );
    std::fs::write(fleet.path("code/score.py"), script).unwrap();
    fleet.inputs(6);
    fleet.worker("w1", 1);
    let job = fleet.s3_job(
        "mini_batch_size = 2\nrun_max_try = 1\nerror_threshold = 0\nrun_invocation_timeout = 3",
    );
    let mut submit = fleet.spawn_submit(&job);
    wait_for("a run() to start", Duration::from_secs(120), || {
        started.exists()
    });
    let pid = fleet.workers[0].1.id() as i32;
    // SAFETY: kill(2) on our own child; its runner is a process of its own and goes on.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(submit.exit_within(RUN_LIMIT).success());
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(6, |_| false)
    );
}

/// Redis frozen (SIGSTOP) for 15 s in the middle of a job with one attempt per mini-batch
/// and no failure allowed (a Redis of the test's own): the workers' ledger calls wait or
/// fail, the work pauses and resumes, and the job completes with every line once, in
/// order, and nothing failed: a ledger that does not answer spends no attempt.
#[test]
fn redis_frozen_for_15_s_with_one_attempt_costs_no_item() {
    let redis = PrivateRedis::start();
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import os, time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write(os.environ['FLEETRUN_NODE_ID'] + ' ' + os.path.basename(mini_batch[0]) + '\\n')\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.redis_url = redis.url();
    fleet.know_pool(&fleet.pool);
    fleet.inputs(200);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    let job =
        fleet.s3_job("mini_batch_size = 5\nrun_max_try = 1\nerror_threshold = 0\nnode_count = 2");
    let mut submit = fleet.spawn_submit(&job);
    let started = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    wait_for("a few mini-batches to run", Duration::from_secs(60), || {
        started() >= 6
    });
    redis.freeze();
    std::thread::sleep(Duration::from_secs(15));
    redis.thaw();
    assert_eq!(submit.exit_within(Duration::from_secs(180)).code(), Some(0));
    let output = lines(&fleet.output("out/parallel_run_step.txt"));
    assert_eq!(output, expected_lines(200, |_| false));
    assert_output_and_failed_items_cover(&fleet, &output, 200);
}

/// The fleet's Redis (`deploy/redis/redis.conf`) killed with SIGKILL in the middle of a job,
/// on a disk whose syncs are slow as a busy disk's are, and started again on its append-only
/// file: every mini-batch whose recording it acknowledged stays counted, so the job completes
/// with every line once. A worker acknowledges a mini-batch's message once its recording is
/// acknowledged; a Redis that answered before its write reached the kernel (`appendfsync
/// everysec` while a sync was slow) lost such recordings with its process, and their jobs
/// never ended (docs/chaos.md).
#[test]
fn a_job_completes_when_its_redis_is_killed_on_a_slow_disk() {
    let mut redis = PrivateRedis::on_slow_disk(Duration::from_millis(1500));
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write(mini_batch[0] + '\\n')\n    time.sleep(0.5)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.redis_url = redis.url();
    fleet.know_pool(&fleet.pool);
    fleet.inputs(24);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    let job = fleet.s3_job("mini_batch_size = 1\nnode_count = 2");
    let mut submit = fleet.spawn_submit(&job);
    let ran = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    // Killed halfway, seconds after the job was entered (which is on disk by then, whatever
    // the settings), with recordings in flight and a sync under way, as one may be at any
    // instant on a busy disk.
    wait_for(
        "half the mini-batches to run",
        Duration::from_secs(120),
        || ran() >= 12,
    );
    redis.kill();
    redis.start_again();
    assert_eq!(submit.exit_within(Duration::from_secs(180)).code(), Some(0));
    let output = lines(&fleet.output("out/parallel_run_step.txt"));
    assert_eq!(output, expected_lines(24, |_| false));
}

/// Checks that the output lines and the items of the job's `failed_items.csv` (none when
/// nothing failed) are each there once, disjoint, and together the `n` inputs.
fn assert_output_and_failed_items_cover(fleet: &Fleet, output: &[String], n: usize) {
    let s3 = fleet.storage("out/logs");
    let text = fleet
        .runtime
        .block_on(s3.get("failed_items.csv"))
        .unwrap_or_default();
    let failed: Vec<String> = String::from_utf8_lossy(&text)
        .lines()
        .skip(1)
        .map(|line| {
            let item = line.split(',').next().unwrap();
            // `g00/f0012.txt` holds, and gives the line, `f0012`.
            let name = item.rsplit('/').next().unwrap();
            name.trim_end_matches(".txt").to_owned()
        })
        .collect();
    let out: BTreeSet<&String> = output.iter().collect();
    let listed: BTreeSet<&String> = failed.iter().collect();
    assert_eq!(out.len(), output.len(), "a line twice");
    assert_eq!(
        listed.len(),
        failed.len(),
        "an item listed twice: {failed:?}"
    );
    assert!(out.is_disjoint(&listed), "listed failed but in the output");
    let covered: BTreeSet<String> = out.union(&listed).map(|s| (*s).clone()).collect();
    let all: BTreeSet<String> = expected_lines(n, |_| false).into_iter().collect();
    assert_eq!(covered, all);
}

/// Two workers on a broker of the test's own, which is stopped and started again while a
/// job of 200 files (mini-batches of 5, half a second each) runs; returns once the job ended
/// with exit 0. Keep the broker until the fleet is dropped.
fn restart_the_broker_mid_job(settings: &str) -> (PrivateRabbitMq, Fleet, tempfile::TempDir) {
    let broker = PrivateRabbitMq::start();
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import os, time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write(os.environ['FLEETRUN_NODE_ID'] + ' ' + os.path.basename(mini_batch[0]) + '\\n')\n    time.sleep(0.5)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::on_broker(&script, broker.url());
    fleet.inputs(200);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    let job = fleet.s3_job(&format!("mini_batch_size = 5\n{settings}\nnode_count = 2"));
    let mut submit = fleet.spawn_submit(&job);
    let started = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    wait_for("a few mini-batches to run", Duration::from_secs(60), || {
        started() >= 6
    });
    broker.stop();
    assert!(started() < 40, "the broker stopped mid-job");
    broker.start_again();
    assert_eq!(submit.exit_within(Duration::from_secs(120)).code(), Some(0));
    (broker, fleet, markers)
}

/// Both workers' connections are closed by the broker in the middle of the job: they
/// reconnect, the job completes, and every line is there exactly once.
#[test]
fn dropped_broker_connections_lose_and_duplicate_nothing() {
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import os, time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write('run\\n')\n    time.sleep(0.2)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(200);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    // The management API lists a connection a few seconds after it opens.
    let mut workers = Vec::new();
    wait_for(
        "the workers' connections to be listed",
        Duration::from_secs(30),
        || {
            workers = pool_connections(&fleet);
            workers.len() >= 2
        },
    );
    let job = fleet.s3_job("mini_batch_size = 5\nrun_max_try = 3\nnode_count = 2");
    let mut submit = fleet.spawn_submit(&job);
    let started = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    wait_for("a few mini-batches to run", Duration::from_secs(60), || {
        started() >= 6
    });
    fleet.runtime.block_on(async {
        for (name, _) in &workers {
            let mut url = reqwest::Url::parse(&management_url()).unwrap();
            url.path_segments_mut()
                .unwrap()
                .extend(["api", "connections", name]);
            let (user, password) = (url.username().to_owned(), url.password().map(str::to_owned));
            url.set_username("").unwrap();
            url.set_password(None).unwrap();
            let closed = reqwest::Client::new()
                .delete(url)
                .basic_auth(user, password)
                .send()
                .await
                .unwrap();
            assert!(closed.status().is_success(), "closing {name}: {closed:?}");
        }
    });
    assert!(started() < 40, "the connections were closed mid-job");
    assert_eq!(submit.exit_within(Duration::from_secs(60)).code(), Some(0));
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(200, |_| false)
    );
    // Both workers came back as new connections under their names.
    wait_for(
        "the workers to be listed again",
        Duration::from_secs(30),
        || {
            let now = pool_connections(&fleet);
            workers
                .iter()
                .all(|(old, client)| now.iter().any(|(name, c)| c == client && name != old))
        },
    );
}

/// A job submitted with `--wait` whose finalizer was SIGKILLed while it joined the parts.
struct FinalizerKilled {
    submit: KillOnDrop,
    redis: redis::Connection,
    /// The job's state hash in the ledger.
    key: String,
    /// The killed worker's index in `Fleet::workers`.
    killed: usize,
}

impl FinalizerKilled {
    /// Submits 300 inputs one per mini-batch (so joining them takes a while), waits for a
    /// worker to claim the finalization and kills the worker the claim names.
    fn new(fleet: &mut Fleet) -> FinalizerKilled {
        let job = fleet.s3_job("mini_batch_size = 1");
        let mut cmd = command("fleetrun");
        fleet.env(&mut cmd);
        let mut submit = KillOnDrop(
            cmd.args(["submit", "--quiet", "--wait"])
                .arg(&job)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let id = first_line_within(&mut submit.0, Duration::from_secs(60));
        let redis = redis::Client::open(services::redis_url())
            .unwrap()
            .get_connection()
            .unwrap();
        let mut killed = FinalizerKilled {
            submit,
            redis,
            key: format!("fleetrun:job:{{{}}}:state", id.trim()),
            killed: usize::MAX,
        };
        let mut owner = None;
        wait_for(
            "a worker to claim the finalization",
            Duration::from_secs(60),
            || {
                owner = killed.field("finalizer");
                owner.is_some()
            },
        );
        // A claim is "<pid>-<random>": kill the worker whose pid it is.
        let pid: u32 = owner.unwrap().split('-').next().unwrap().parse().unwrap();
        killed.killed = fleet
            .workers
            .iter()
            .position(|(_, child)| child.id() == pid)
            .expect("the claim names a worker");
        let (_, child) = &mut fleet.workers[killed.killed];
        kill(child);
        assert_eq!(
            killed.field("state").as_deref(),
            Some("Finalizing"),
            "killed before it finished"
        );
        killed
    }

    /// Waits until a worker has retired the ended job: off the pool's unfinished jobs, its
    /// ledger and record expiring, a week from now.
    fn retired(&mut self, fleet: &Fleet) {
        let job = self.key["fleetrun:job:{".len()..self.key.len() - "}:state".len()].to_owned();
        let unfinished = format!("fleetrun:pool:{}:unfinished", fleet.pool);
        let record = format!("fleetrun:job:{{{job}}}:record");
        let redis = &mut self.redis;
        let mut ttl = |key: &str| -> i64 { redis::cmd("TTL").arg(key).query(redis).unwrap() };
        wait_for("the job to be retired", Duration::from_secs(30), || {
            ttl(&record) > 0
        });
        let week = 7 * 24 * 3600;
        for key in [self.key.clone(), record] {
            let left = ttl(&key);
            assert!(
                week - 60 < left && left <= week,
                "{key} expires in {left} s"
            );
        }
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&unfinished)
            .arg(&job)
            .query(&mut self.redis)
            .unwrap();
        assert_eq!(score, None, "still among the pool's unfinished jobs");
    }

    fn field(&mut self, name: &str) -> Option<String> {
        redis::cmd("HGET")
            .arg(&self.key)
            .arg(name)
            .query(&mut self.redis)
            .unwrap()
    }

    /// Waits for the submitter to report the job completed, and checks that the worker
    /// `fleet.workers[finalizer]` finalized it, with every line once.
    fn completed_by(&mut self, fleet: &Fleet, finalizer: usize) {
        assert_eq!(
            self.submit.exit_within(Duration::from_secs(60)).code(),
            Some(0)
        );
        let pid = fleet.workers[finalizer].1.id();
        assert!(
            self.field("finalizer")
                .unwrap()
                .starts_with(&format!("{pid}-")),
            "{} finalized",
            fleet.workers[finalizer].0
        );
        let output = lines(&fleet.output("out/parallel_run_step.txt"));
        let output: Vec<&str> = output.iter().map(|line| line.trim_end()).collect();
        assert_eq!(output, expected_lines(300, |_| false));
    }
}

/// [`ECHO`] with each row padded past the size of a part the ledger keeps: every part is an
/// object, so joining the parts takes a while.
const PADDED_ECHO: &str =
    "def run(mini_batch):\n    return [open(p).read() + ' ' * 9000 for p in mini_batch]\n";

/// The worker finalizing a job is SIGKILLed while it joins the parts: another worker that
/// served the job takes the finalization over once the dead one's claim runs out, and the
/// output has every line once.
#[test]
fn a_finalizer_killed_mid_join_is_replaced() {
    let mut fleet = Fleet::new(PADDED_ECHO);
    fleet.inputs(300);
    fleet.worker("f1", 1);
    fleet.worker("f2", 1);
    let mut killed = FinalizerKilled::new(&mut fleet);
    let survivor = 1 - killed.killed;
    killed.completed_by(&fleet, survivor);
}

/// The only worker of the pool dies while it finalizes a job: a worker started afterwards,
/// which never saw the job, finds it among the pool's unfinished jobs and finishes it.
#[test]
fn a_job_whose_only_worker_died_finalizing_is_finished_by_a_new_one() {
    let mut fleet = Fleet::new(PADDED_ECHO);
    fleet.inputs(300);
    fleet.worker("only", 2);
    let mut killed = FinalizerKilled::new(&mut fleet);
    fleet.worker("newcomer", 1);
    killed.completed_by(&fleet, 1);
    // Ended: retired by the pool's workers, to be forgotten in a week.
    killed.retired(&fleet);
}

/// With no pool named anywhere, the worker and the submitter meet on the same default pool;
/// `status --watch` follows the job, printing as it goes, and exits once it has ended.
#[test]
fn unnamed_pools_meet_on_the_default_and_status_watch_follows_the_job() {
    let script = "import time\ndef run(mini_batch):\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n";
    // A broker and a Redis of the test's own: on the shared ones, the default pool's queue
    // and unfinished jobs would be every run's that leaves its pool unnamed.
    let (broker, redis) = (PrivateRabbitMq::start(), PrivateRedis::start());
    let mut fleet = Fleet::on_broker(script, broker.url());
    (fleet.pool, fleet.redis_url) = (DEFAULT_POOL.to_owned(), redis.url());
    fleet.know_pool(DEFAULT_POOL);
    fleet.inputs(40);
    fleet.worker("w1", 1);
    let job = fleet.s3_job("mini_batch_size = 2");
    let submitted = fleet.submit(&job, &[]);
    assert_eq!(code(&submitted), 0);
    let id = String::from_utf8(submitted.stdout).unwrap();
    let id = id.lines().next().unwrap().trim().to_owned();
    let mut cmd = command("fleetrun");
    fleet.env(&mut cmd);
    let mut watch = KillOnDrop(
        cmd.args(["status", &id, "--watch"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut printed = watch.0.stdout.take().unwrap();
    let shown = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut printed, &mut text).unwrap();
        text
    });
    assert_eq!(watch.exit_within(Duration::from_secs(60)).code(), Some(0));
    let shown = shown.join().unwrap();
    let states: Vec<&str> = shown
        .lines()
        .filter_map(|l| l.strip_prefix("state:"))
        .map(str::trim)
        .collect();
    assert!(states.len() >= 2, "it printed as the job ran:\n{shown}");
    assert_eq!(states.first(), Some(&"Running"), "{shown}");
    assert_eq!(states.last(), Some(&"Completed"), "{shown}");
    assert!(shown.contains("pool default:"), "{shown}");
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(40, |_| false)
    );
}

impl Fleet {
    /// A worker with default settings, as the README starts one: no node id, no cache
    /// folder; its scratch goes under this test's temp folder.
    fn default_worker(&mut self, name: &str) {
        let pool = self.pool.clone();
        self.default_worker_on(name, &pool);
    }

    /// A worker with default settings serving `pool`.
    fn default_worker_on(&mut self, name: &str, pool: &str) {
        let mut cmd = command("fleetrun-worker");
        self.env(&mut cmd);
        cmd.env("FLEETRUN_POOL", pool);
        let tmp = self.path("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let log = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        cmd.env("TMPDIR", tmp)
            .env_remove("FLEETRUN_NODE_ID")
            .env_remove("FLEETRUN_CACHE_DIR")
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.workers.push((
            name.to_owned(),
            cmd.spawn().expect("fleetrun-worker starts"),
        ));
    }

    /// `fleetrun run` of the same job on the local copy of the inputs: its output file.
    fn local_run(&self, settings: &str) -> Vec<u8> {
        let local = self.job(settings, "local-in", "local-out");
        let run = output_within(
            command("fleetrun").arg("run").arg(&local).arg("--quiet"),
            RUN_LIMIT,
        );
        assert_eq!(code(&run), 0);
        std::fs::read(self.path("local-out/parallel_run_step.txt")).unwrap()
    }

    /// `<out>/logs/job_result.txt`, waited for: whoever ends a job writes its results just
    /// after the ledger says it ended (`job_result.txt` last), so a submitter may be told
    /// first.
    fn job_result(&self, out: &str) -> String {
        let s3 = self.storage(&format!("{out}/logs"));
        wait_for("the job's results", Duration::from_secs(30), || {
            self.runtime.block_on(s3.get("job_result.txt")).is_ok()
        });
        self.text(&format!("{out}/logs/job_result.txt"))
    }

    fn text(&self, key: &str) -> String {
        String::from_utf8_lossy(&self.output(key)).into_owned()
    }
}

/// Three workers with default settings on one host (their node ids and scratch folders
/// their own), one SIGKILLed midway: the output is `fleetrun run`'s, byte for byte.
#[test]
fn three_default_workers_on_one_host_one_killed_match_a_local_run() {
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let mut fleet = Fleet::new(&format!(
        "import time\nRUNS = {:?}\ndef run(mini_batch):\n    time.sleep(0.01)\n    with open(RUNS, 'a') as f:\n        f.write('run\\n')\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    ));
    fleet.inputs(2000);
    for name in ["a", "b", "c"] {
        fleet.default_worker(name);
    }
    let job = fleet.s3_job("mini_batch_size = 10\nrun_max_try = 3\nnode_count = 3");
    let mut submit = fleet.spawn_submit(&job);
    // Kill one worker once the job is well under way.
    wait_for(
        "mini-batches of the job to run",
        Duration::from_secs(120),
        || std::fs::read_to_string(&runs).is_ok_and(|s| s.lines().count() >= 30),
    );
    let (_, victim) = &mut fleet.workers[1];
    kill(victim);
    let status = submit.exit_within(Duration::from_secs(240));
    assert_eq!(status.code(), Some(0));
    let fleet_bytes = fleet.output("out/parallel_run_step.txt");
    assert_eq!(lines(&fleet_bytes), expected_lines(2000, |_| false));

    assert_eq!(fleet_bytes, fleet.local_run("mini_batch_size = 10"));
    // Each worker logged under a node id of its own.
    let nodes: std::collections::HashSet<String> = std::fs::read_dir(fleet.path("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fleetrun-worker-"))
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
}

/// No worker serves the pool: the waiting submitter fails the job on
/// `first_task_creation_timeout`, naming it, and the result says so.
#[test]
fn a_job_no_worker_takes_fails_on_first_task_creation_timeout() {
    let fleet = Fleet::new(ECHO);
    fleet.inputs(5);
    let job = fleet.s3_job("first_task_creation_timeout = 3");
    let started = std::time::Instant::now();
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 42);
    assert!(started.elapsed() < Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("first_task_creation_timeout (3s)"),
        "{stdout}"
    );
    let result = fleet.text("out/logs/job_result.txt");
    assert!(result.contains("Result: Failed"), "{result}");
    assert!(
        result.contains("first_task_creation_timeout (3s)"),
        "{result}"
    );
}

/// A script that hangs (well inside `run_invocation_timeout`): the job fails on
/// `progress_update_timeout`, and the worker goes on to the next job.
#[test]
fn a_hanging_job_fails_on_progress_update_timeout_and_the_worker_goes_on() {
    let script = "import os, time\ndef run(mini_batch):\n    if os.environ.get('HANG'):\n        time.sleep(3600)\n    return [open(p).read() for p in mini_batch]\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(20);
    fleet.worker("w1", 2);
    let hanging = fleet.s3_job(
        "run_invocation_timeout = 600\nprogress_update_timeout = 4\nenvironment_variables = { HANG = \"1\" }",
    );
    let out = fleet.submit(&hanging, &["--wait"]);
    assert_eq!(code(&out), 42);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("progress_update_timeout"), "{stdout}");
    let result = fleet.text("out/logs/job_result.txt");
    assert!(result.contains("stalled"), "{result}");

    let next = fleet.job(
        "mini_batch_size = 5",
        &format!("s3://{}/in", fleet.bucket),
        &format!("s3://{}/next", fleet.bucket),
    );
    let out = fleet.submit(&next, &["--wait"]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        lines(&fleet.output("next/parallel_run_step.txt")),
        expected_lines(20, |_| false)
    );
}

/// `submit --job-id` is idempotent: a submit killed at a random instant is finished by the
/// same command again, every line exactly once; a finished job answers at once; the same id
/// with another job is refused.
#[test]
fn a_submit_killed_midway_is_finished_by_the_same_job_id() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(300);
    fleet.worker("w1", 2);
    let job = fleet.s3_job("mini_batch_size = 1");
    let id = format!("resumable-{}", random_suffix());
    let mut cmd = command("fleetrun");
    fleet.env(&mut cmd);
    let mut first = KillOnDrop(
        cmd.arg("submit")
            .arg(&job)
            .args(["--quiet", "--wait", "--job-id", &id])
            .spawn()
            .unwrap(),
    );
    // Somewhere in its publication (or its wait).
    let instant = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        % 1300;
    std::thread::sleep(Duration::from_millis(200 + u64::from(instant)));
    kill(&mut first.0);

    let again = fleet.submit(&job, &["--wait", "--job-id", &id]);
    assert_eq!(code(&again), 0);
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(300, |_| false)
    );
    // Ended: the same submission answers at once with the result.
    let started = std::time::Instant::now();
    let done = fleet.submit(&job, &["--wait", "--job-id", &id]);
    assert_eq!(code(&done), 0);
    assert!(started.elapsed() < Duration::from_secs(10));
    // Another job under the same id is refused.
    let other = fleet.s3_job("mini_batch_size = 2");
    let refused = fleet.submit(&other, &["--job-id", &id]);
    assert_eq!(code(&refused), 2);
    assert!(String::from_utf8_lossy(&refused.stderr).contains(&id));
}

/// A worker with default settings that stops on SIGTERM removes its scratch folder.
#[test]
fn a_default_worker_leaves_no_scratch_when_it_stops() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(10);
    fleet.default_worker("w");
    let out = fleet.submit(&fleet.s3_job("mini_batch_size = 2"), &["--wait"]);
    assert_eq!(code(&out), 0);
    let tmp = fleet.path("tmp");
    let scratch = || -> Vec<String> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("fleetrun-"))
            .collect()
    };
    assert_eq!(scratch().len(), 1, "the worker's own scratch while it runs");
    let (_, worker) = &mut fleet.workers[0];
    // SAFETY: a signal to a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) }, 0);
    let status = exit_within(worker, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
    assert_eq!(scratch(), Vec::<String>::new());
}

// --- Tabular inputs from S3 -------------------------------------------------------------

impl Fleet {
    /// Uploads local files (`rel` under the test's folder) to keys in the test's bucket,
    /// through one client (making one costs seconds).
    fn upload(&self, files: &[(&str, &str)]) {
        let s3 = self.storage("");
        self.runtime.block_on(async {
            s3.create_bucket_if_missing().await.unwrap();
            for (rel, key) in files {
                let body = Bytes::from(std::fs::read(self.path(rel)).unwrap());
                s3.put(key, body).await.unwrap();
            }
        });
    }

    /// A job over the tabular input `s3://<bucket>/<input>`, output in `s3://<bucket>/<out>`.
    fn tabular_job(&self, settings: &str, input: &str, out: &str) -> PathBuf {
        let bucket = &self.bucket;
        let job = self.job(settings, "unused", &format!("s3://{bucket}/{out}"));
        let toml = std::fs::read_to_string(&job).unwrap().replace(
            "files = \"unused\"",
            &format!("tabular = \"s3://{bucket}/{input}\""),
        );
        std::fs::write(&job, toml).unwrap();
        job
    }
}

/// `N of N mini-batches` from what `submit --wait` printed.
fn mini_batches_done(out: &Output) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    let at = words
        .windows(2)
        .position(|w| w[1] == "of")
        .unwrap_or_else(|| panic!("no count in {text}"));
    words[at].parse().unwrap()
}

fn sorted_lines(bytes: &[u8]) -> Vec<String> {
    let mut lines = lines(bytes);
    lines.sort();
    lines
}

/// A 100,000-row CSV with quoted newlines on S3 at "64KB": workers range-read their chunks,
/// every row's output is there once, in the chunks the byte arithmetic predicts.
#[test]
fn a_csv_on_s3_gives_every_row_once_in_the_predicted_chunks() {
    use fleetrun_tests::tabular;
    let mut fleet = Fleet::new(tabular::ID_AND_LENGTH);
    let rows = 100_000;
    let header = tabular::write_csv(&fleet.path("gen/rows.csv"), 0..rows);
    let size = std::fs::metadata(fleet.path("gen/rows.csv")).unwrap().len();
    fleet.upload(&[("gen/rows.csv", "tab/rows.csv")]);
    fleet.worker("w1", 2);
    fleet.worker("w2", 1);
    let job = fleet.tabular_job("mini_batch_size = \"64KB\"", "tab/rows.csv", "out");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        mini_batches_done(&out),
        tabular::predicted_chunks(size - header, 64 << 10)
    );
    assert_eq!(
        sorted_lines(&fleet.output("out/parallel_run_step.txt")),
        tabular::expected_id_lengths(rows)
    );
}

/// Parquet row groups (sparse staging from range reads) and JSON Lines with
/// `partition_keys`, both from S3 prefixes.
#[test]
fn parquet_and_partitioned_json_lines_on_s3() {
    use fleetrun_tests::tabular::{self, REGIONS};
    let mut fleet = Fleet::new(tabular::ID_AND_LENGTH);
    let rows = 20_000;
    let predicted =
        tabular::write_parquet(&fleet.path("gen/p/rows.parquet"), rows, 1_000, 32 << 10);
    tabular::write_json_lines(&fleet.path("gen/a.jsonl"), 0..1_000);
    tabular::write_json_lines(&fleet.path("gen/b.jsonl"), 1_000..3_000);
    fleet.upload(&[
        ("gen/p/rows.parquet", "pq/rows.parquet"),
        ("gen/p/rows.parquet", "pq/_SUCCESS"),
        ("gen/a.jsonl", "js/a.jsonl"),
        ("gen/b.jsonl", "js/b.jsonl"),
    ]);
    fleet.worker("w1", 2);

    let job = fleet.tabular_job("mini_batch_size = \"32KB\"", "pq", "out-pq");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0);
    assert_eq!(mini_batches_done(&out), predicted);
    assert_eq!(
        sorted_lines(&fleet.output("out-pq/parallel_run_step.txt")),
        tabular::expected_id_lengths(rows)
    );

    // The code is shipped with each job: the second job's script checks its one key.
    std::fs::write(
        fleet.path("code/score.py"),
        "def run(frame):\n    assert len(set(frame['region'])) == 1\n    return [f\"{r} {i}\" for r, i in zip(frame['region'], frame['id'])]\n",
    )
    .unwrap();
    let job = fleet.tabular_job("partition_keys = [\"region\"]", "js", "out-js");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0);
    assert_eq!(mini_batches_done(&out), REGIONS.len() as u64);
    let mut expected: Vec<String> = (0..3_000)
        .map(|i| format!("{} {i}", REGIONS[i % 3]))
        .collect();
    expected.sort();
    assert_eq!(
        sorted_lines(&fleet.output("out-js/parallel_run_step.txt")),
        expected
    );
}

/// An MLTable folder on S3: the submitter reads its `MLTable` from the prefix, workers read
/// the files its pattern selects, with the columns from the path, and `partition_keys` over
/// them makes one mini-batch per store and brand (CONTRACT §2b).
#[test]
fn an_mltable_folder_on_s3_with_columns_from_the_path() {
    let script = r#"
def run(frame, context):
    values = context.partition_key_value
    paths = sorted(set(frame["Path"]))
    return ["%s %d %d %s" % ("/".join(values.values()), len(frame), frame["units"].sum(), " ".join(paths))]
"#;
    let mut fleet = Fleet::new(script);
    let mut files = vec![("gen/MLTable".to_owned(), "oj/MLTable".to_owned())];
    std::fs::create_dir_all(fleet.path("gen")).unwrap();
    std::fs::write(
        fleet.path("gen/MLTable"),
        "type: mltable\npaths:\n  - pattern: ./sales/**/*.csv\ntransformations:\n  - read_delimited:\n      include_path_column: true\n  - extract_columns_from_partition_format:\n      partition_format: '{Store}/{Brand}/{Week}.csv'\n",
    )
    .unwrap();
    let bucket = fleet.bucket.clone();
    let mut expected = Vec::new();
    for (store, brand) in [
        ("1000", "dominicks"),
        ("1000", "tropicana"),
        ("1001", "dominicks"),
    ] {
        let mut rows = 0;
        let mut total = 0;
        let mut paths = Vec::new();
        for week in ["w1", "w2"] {
            let rel = format!("gen/{store}-{brand}-{week}.csv");
            let mut csv = String::from("units,price\n");
            for i in 0..25 {
                csv.push_str(&format!("{},{}.5\n", i + week.len(), i));
                rows += 1;
                total += i + week.len();
            }
            std::fs::write(fleet.path(&rel), csv).unwrap();
            let key = format!("oj/sales/{store}/{brand}/{week}.csv");
            paths.push(format!("s3://{bucket}/{key}"));
            files.push((rel, key));
        }
        expected.push(format!(
            "{store}/{brand} {rows} {total} {}",
            paths.join(" ")
        ));
    }
    // Not selected: another extension, and the MLTable file.
    std::fs::write(fleet.path("gen/notes.txt"), "n\n").unwrap();
    files.push(("gen/notes.txt".to_owned(), "oj/sales/notes.txt".to_owned()));
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    fleet.upload(&files);
    fleet.worker("w1", 2);
    let job = fleet.tabular_job("partition_keys = [\"Store\", \"Brand\"]", "oj/", "out");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mini_batches_done(&out), 3);
    assert_eq!(
        sorted_lines(&fleet.output("out/parallel_run_step.txt")),
        expected
    );

    // An MLTable asking for what fleetrun does not read is refused by the submitter.
    let s3 = fleet.storage("");
    fleet.runtime.block_on(async {
        let text = "paths:\n  - folder: .\ntransformations:\n  - take: 5\n";
        s3.put("bad/MLTable", Bytes::from(text)).await.unwrap();
        s3.put("bad/a.csv", Bytes::from_static(b"a\n1\n"))
            .await
            .unwrap();
    });
    let job = fleet.tabular_job("", "bad/", "out-bad");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let named = format!("s3://{bucket}/bad/MLTable: transformations.take: not supported");
    assert!(stderr.contains(&named), "{stderr}");
}

/// A ParallelRunStep script on two workers: an S3 side input through
/// `${{side_inputs.labels}}`, an S3 model through `Model.get_model_path`, and files written
/// to `EntryScript().output_dir` reaching the S3 output. A second job with the same side
/// inputs finds them in the workers' caches and downloads nothing again.
#[test]
fn side_inputs_models_and_output_dir_on_the_fleet() {
    let script = r#"
import argparse
import os

from azureml_user.parallel_run import EntryScript
from azureml.core import Model


def init():
    global labels, weights
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels")
    args, _ = parser.parse_known_args()
    labels = open(args.labels).read().split()
    weights = open(os.path.join(Model.get_model_path("digits"), "weights.txt")).read().strip()


def run(mini_batch):
    es = EntryScript()
    folder = os.path.join(es.output_dir, "summary")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "%s-%s.txt" % (es.node_id, es.agent_name)), "a") as f:
        for p in mini_batch:
            f.write(os.path.basename(p) + "\n")
    return ["%s,%s,%s" % (open(p).read(), labels[0], weights) for p in mini_batch]
"#;
    let mut fleet = Fleet::new(script);
    fleet.inputs(20);
    let refs = fleet.storage("");
    fleet.runtime.block_on(async {
        refs.put("ref/labels.txt", Bytes::from_static(b"cat\ndog\n"))
            .await
            .unwrap();
        refs.put("models/digits/weights.txt", Bytes::from_static(b"w42\n"))
            .await
            .unwrap();
    });
    for node in ["w1", "w2"] {
        fleet.worker(node, 1);
    }
    let bucket = fleet.bucket.clone();
    let tables = format!(
        "\n[side_inputs]\nlabels = \"s3://{bucket}/ref/labels.txt\"\n\n[models]\ndigits = \"s3://{bucket}/models/digits\"\n"
    );
    let settings = "mini_batch_size = 2\narguments = [\"--labels\", \"${{side_inputs.labels}}\"]";
    for (round, out) in ["out", "out2"].iter().enumerate() {
        let job = fleet.job(
            settings,
            &format!("s3://{bucket}/in"),
            &format!("s3://{bucket}/{out}"),
        );
        let mut text = std::fs::read_to_string(&job).unwrap();
        text.push_str(&tables);
        std::fs::write(&job, text).unwrap();
        let submitted = fleet.submit(&job, &["--wait"]);
        assert_eq!(code(&submitted), 0, "round {round}");
        let mut got = lines(&fleet.output(&format!("{out}/parallel_run_step.txt")));
        got.sort();
        let expected: Vec<String> = expected_lines(20, |_| false)
            .iter()
            .map(|l| format!("{l},cat,w42"))
            .collect();
        assert_eq!(got, expected, "round {round}");

        // output_dir's files are in the output, every input named once across them, by the
        // time the job is Completed.
        let summary = fleet.storage(&format!("{out}/summary"));
        let keys: Vec<String> = fleet
            .runtime
            .block_on(summary.list("").map_ok(|m| m.key).try_collect())
            .unwrap();
        let mut named: Vec<String> = keys
            .iter()
            .flat_map(|k| lines(&fleet.output(&format!("{out}/summary/{k}"))))
            .collect();
        named.sort();
        let inputs: Vec<String> = (0..20).map(|i| format!("f{i:04}.txt")).collect();
        assert_eq!(named, inputs, "round {round}: {keys:?}");
    }
    // Each worker that served the jobs staged the two entries, and the jobs' code, once.
    let mut served = 0;
    for node in ["w1", "w2"] {
        let side = fleet.path(&format!("cache-{node}/side"));
        let Ok(entries) = std::fs::read_dir(&side) else {
            continue;
        };
        served += 1;
        let names: Vec<String> = entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{node}: {names:?}");
    }
    assert!(served >= 1);
}

/// A script that prints `os.environ` in `init()`, as Azure's samples do, writes no password
/// or storage key anywhere in the job's output: its runners do not inherit the worker's
/// service URLs and credentials, and the resource monitor's `ps` listing holds no process
/// but the job's (this worker has its broker URL, password included, on its command line).
/// A job that names a withheld variable in `pass_environment` gets it.
#[test]
fn a_script_printing_its_environment_writes_no_secret() {
    let script = "import os\n\ndef init():\n    print(dict(os.environ))\n\ndef run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(4);
    let secret_key = format!("secret-key-{}", random_suffix());
    let amqp_url = fleet.amqp_url.clone();
    let password = reqwest::Url::parse(&amqp_url)
        .unwrap()
        .password()
        .map(|p| format!(":{p}@"))
        .expect("the broker's URL has a password");
    fleet.worker_with(
        "w1",
        1,
        &[("AWS_SECRET_ACCESS_KEY", &secret_key)],
        &["--amqp-url", &amqp_url],
    );
    let bucket = fleet.bucket.clone();
    // The whole log folder, once the node has uploaded what this test looks at.
    let logs = |out: &str| -> BTreeMap<String, String> {
        let s3 = fleet.storage(&format!("{out}/logs"));
        let keys = || -> Vec<String> {
            fleet
                .runtime
                .block_on(s3.list("").map_ok(|m| m.key).try_collect())
                .unwrap()
        };
        wait_for("the node's logs", Duration::from_secs(30), || {
            let keys = keys();
            ["user/stdout/w1/", "perf/w1/os/"]
                .iter()
                .all(|start| keys.iter().any(|k| k.starts_with(start)))
        });
        keys()
            .into_iter()
            .map(|k| {
                let text = fleet.text(&format!("{out}/logs/{k}"));
                (k, text)
            })
            .collect()
    };

    let job = fleet.s3_job("");
    assert_eq!(code(&fleet.submit(&job, &["--wait"])), 0);
    let mut texts = logs("out");
    texts.insert(
        "parallel_run_step.txt".into(),
        fleet.text("out/parallel_run_step.txt"),
    );
    let stdout: Vec<&String> = texts
        .iter()
        .filter(|(k, _)| k.starts_with("user/stdout/"))
        .map(|(_, text)| text)
        .collect();
    assert!(
        stdout.iter().any(|t| t.contains("FLEETRUN_JOB_ID")),
        "the script printed its environment: {stdout:?}"
    );
    for (key, text) in &texts {
        for secret in [
            secret_key.as_str(),
            &password,
            &amqp_url,
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "FLEETRUN_AMQP_URL",
            "FLEETRUN_REDIS_URL",
        ] {
            assert!(!text.contains(secret), "{key} shows {secret}:\n{text}");
        }
    }

    let job = fleet.job(
        "pass_environment = [\"AWS_SECRET_ACCESS_KEY\"]",
        &format!("s3://{bucket}/in"),
        &format!("s3://{bucket}/out2"),
    );
    assert_eq!(code(&fleet.submit(&job, &["--wait"])), 0);
    let texts = logs("out2");
    assert!(
        texts
            .iter()
            .any(|(k, text)| k.starts_with("user/stdout/") && text.contains(&secret_key)),
        "a job that names the variable gets it"
    );
}

/// A side input that cannot be staged fails the job, naming it, instead of being retried
/// forever.
#[test]
fn a_side_input_that_cannot_be_staged_fails_the_job() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(4);
    fleet.worker("w1", 1);
    let bucket = fleet.bucket.clone();
    let job = fleet.s3_job("");
    let mut text = std::fs::read_to_string(&job).unwrap();
    text.push_str(&format!(
        "\n[side_inputs]\nlabels = \"s3://{bucket}/no/such/prefix\"\n"
    ));
    std::fs::write(&job, text).unwrap();
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 42);
    let result = fleet.job_result("out");
    assert!(
        result.contains("side_inputs or models cannot be staged on node w1")
            && result.contains("no/such/prefix"),
        "{result}"
    );
}

/// A local side input of a job with an S3 output is shipped beside its code: workers on
/// other machines, which cannot read the submitter's disk, still get it.
#[test]
fn a_local_side_input_is_shipped_for_workers_elsewhere() {
    let script = r#"
import sys

labels = open(sys.argv[2]).read().split()

def run(mini_batch):
    return ["%s,%s" % (open(p).read(), labels[-1]) for p in mini_batch]
"#;
    let mut fleet = Fleet::new(script);
    fleet.inputs(6);
    std::fs::write(fleet.path("labels.txt"), "cat\ndog\n").unwrap();
    let job = fleet
        .s3_job("mini_batch_size = 3\narguments = [\"--labels\", \"${{side_inputs.labels}}\"]");
    let mut text = std::fs::read_to_string(&job).unwrap();
    text.push_str("\n[side_inputs]\nlabels = \"labels.txt\"\n");
    std::fs::write(&job, text).unwrap();
    let mut submit = fleet.spawn_submit(&job);
    let shipped = fleet.storage("out/_fleetrun/side");
    wait_for("the side input shipped", Duration::from_secs(30), || {
        let keys: Vec<String> = fleet
            .runtime
            .block_on(shipped.list("").map_ok(|m| m.key).try_collect())
            .unwrap_or_default();
        keys.iter().any(|k| k.ends_with("/labels.txt"))
    });
    // Gone from the submitter's disk before any worker looks: only the shipped copy is left.
    std::fs::remove_file(fleet.path("labels.txt")).unwrap();
    fleet.worker("w1", 1);
    assert!(submit.exit_within(Duration::from_secs(120)).success());
    let mut got = lines(&fleet.output("out/parallel_run_step.txt"));
    got.sort();
    let expected: Vec<String> = expected_lines(6, |_| false)
        .iter()
        .map(|l| format!("{l},dog"))
        .collect();
    assert_eq!(got, expected);
}

/// A job with `process_count_per_node = 2` on a worker with 4 slots runs 2 runners there,
/// not 4: the mini-batch report names exactly two processes.
#[test]
fn a_worker_runs_the_jobs_process_count_not_its_slots() {
    let script = "import time\ndef run(mini_batch):\n    time.sleep(0.1)\n    return [open(p).read() for p in mini_batch]\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(24);
    fleet.worker("w4", 4);
    let job = fleet.s3_job("mini_batch_size = 1\nprocess_count_per_node = 2");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(24, |_| false)
    );
    // One report for the job, written before it completed.
    let key = "out/logs/sys/job_report/processed_mini-batches.csv";
    let s3 = fleet.storage("");
    wait_for("the node's report", Duration::from_secs(30), || {
        fleet.runtime.block_on(s3.get(key)).is_ok()
    });
    let report = fleet.text(key);
    let mut processes: Vec<&str> = report
        .lines()
        .skip(1)
        .filter_map(|row| row.split(',').nth(7))
        .collect();
    processes.sort();
    processes.dedup();
    assert_eq!(processes, ["process000", "process001"], "{report}");
}

/// `node_count = 1` on a pool of two workers: one worker takes the job and runs every
/// mini-batch while it lives; killed with SIGKILL, it frees its place once its lease runs
/// out, and the other worker finishes the job, every line exactly once.
#[test]
fn node_count_nodes_serve_a_job_at_once_and_another_takes_a_dead_ones_place() {
    let markers = tempfile::tempdir().unwrap();
    let script = format!(
        "import os, time\nMARKS = {:?}\ndef run(mini_batch):\n    with open(os.path.join(MARKS, os.environ['FLEETRUN_NODE_ID']), 'a') as f:\n        f.write('run\\n')\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n",
        markers.path().display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    fleet.inputs(60);
    fleet.worker("a", 1);
    fleet.worker("b", 1);
    let job = fleet.s3_job("mini_batch_size = 1\nnode_count = 1\nrun_max_try = 3");
    let mut submit = fleet.spawn_submit(&job);
    let runs = |node: &str| {
        std::fs::read_to_string(markers.path().join(node)).map_or(0, |s| s.lines().count())
    };
    wait_for("a few mini-batches to run", Duration::from_secs(60), || {
        runs("a") + runs("b") >= 8
    });
    let (serving, idle) = if runs("a") > 0 {
        ("a", "b")
    } else {
        ("b", "a")
    };
    assert_eq!(runs(idle), 0, "one node serves the job");
    let index = fleet
        .workers
        .iter()
        .position(|(n, _)| n == serving)
        .unwrap();
    let (_, worker) = &mut fleet.workers[index];
    kill(worker); // SIGKILL: its place runs out, it is not given up
    assert_eq!(submit.exit_within(Duration::from_secs(120)).code(), Some(0));
    assert!(runs(idle) > 0, "the other node took the job over");
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(60, |_| false)
    );
}

/// Runs small default jobs (50 files: five mini-batches of the default ten) on the pools'
/// workers: `one_by_one` jobs, each submitted when the one before ended, then `at_once` jobs
/// together, spread over `pools` in turn. Every job completes with every line once, and each
/// pool's queue holds nothing, unacknowledged or ready, once the pools are idle.
fn small_default_jobs_all_finish(
    fleet: &Fleet,
    pools: &[String],
    settings: &str,
    one_by_one: usize,
    at_once: usize,
) {
    fleet.inputs(50);
    let bucket = &fleet.bucket;
    let submit = |n: usize| {
        let job = fleet.job(
            settings,
            &format!("s3://{bucket}/in"),
            &format!("s3://{bucket}/out-{n}"),
        );
        let mut cmd = command("fleetrun");
        fleet.env(&mut cmd);
        cmd.env("FLEETRUN_POOL", &pools[n % pools.len()])
            .args(["submit", "--quiet", "--wait"])
            .arg(job);
        KillOnDrop(cmd.spawn().unwrap())
    };
    let expected = expected_lines(50, |_| false);
    let check = |n: usize, mut submitted: KillOnDrop| {
        let status = submitted.exit_within(Duration::from_secs(90));
        assert_eq!(status.code(), Some(0), "job {n} did not complete");
        let out = fleet.output(&format!("out-{n}/parallel_run_step.txt"));
        assert_eq!(lines(&out), expected, "job {n}");
    };
    for n in 0..one_by_one {
        check(n, submit(n));
    }
    let together: Vec<_> = (one_by_one..one_by_one + at_once)
        .map(|n| (n, submit(n)))
        .collect();
    for (n, submitted) in together {
        check(n, submitted);
    }
    for pool in pools {
        let queue = fleet.runtime.block_on(AmqpQueue::connect(
            &fleet.amqp_url,
            pool,
            QueueOptions {
                delivery_limit: Some(fleetrun_worker_delivery_limit()),
            },
            fleet.management_url.as_deref(),
            &fleet.tls,
        ));
        let queue = queue.unwrap();
        let mut last = None;
        wait_for(
            "the idle pool's queue to empty",
            Duration::from_secs(60),
            || {
                let depth = fleet.pool_depth(&queue);
                last = Some(depth);
                depth.unacked == Some(0) && depth.ready == 0
            },
        );
    }
}

/// Three default workers, small default jobs: no slot holds a mini-batch it does not run.
#[test]
fn small_default_jobs_on_three_default_workers_all_finish() {
    let mut fleet = Fleet::new(ECHO);
    for name in ["a", "b", "c"] {
        fleet.default_worker(name);
    }
    let pools = [fleet.pool.clone()];
    small_default_jobs_all_finish(&fleet, &pools, "", 20, 10);
}

/// The same with each job on two nodes of three.
#[test]
fn small_jobs_on_two_nodes_of_three_default_workers_all_finish() {
    let mut fleet = Fleet::new(ECHO);
    for name in ["a", "b", "c"] {
        fleet.default_worker(name);
    }
    let pools = [fleet.pool.clone()];
    small_default_jobs_all_finish(&fleet, &pools, "node_count = 2", 10, 10);
}

/// The same over two pools served by default workers on one host.
#[test]
fn small_default_jobs_on_two_pools_all_finish() {
    let mut fleet = Fleet::new(ECHO);
    let other = format!("{}-b", fleet.pool);
    fleet.other_pools.push(other.clone());
    fleet.know_pool(&other);
    fleet.default_worker("a");
    fleet.default_worker("b");
    fleet.default_worker_on("c", &other);
    fleet.default_worker_on("d", &other);
    let pools = [fleet.pool.clone(), other];
    small_default_jobs_all_finish(&fleet, &pools, "", 10, 10);
}

/// Mistakes in where the data is are said before anything is submitted: an empty prefix and
/// a bucket that does not exist each give exit 2 and one line naming the location.
#[test]
fn an_empty_input_and_a_missing_bucket_are_refused_in_one_line() {
    let fleet = Fleet::new(ECHO);
    fleet.inputs(1);
    let bucket = &fleet.bucket;
    let cases = [
        (
            fleet.job(
                "",
                &format!("s3://{bucket}/nothing-here"),
                &format!("s3://{bucket}/out"),
            ),
            format!("input.files: s3://{bucket}/nothing-here lists no file"),
        ),
        (
            fleet.job(
                "",
                "s3://fleetrun-no-such-bucket/in",
                &format!("s3://{bucket}/out"),
            ),
            "s3://fleetrun-no-such-bucket: no such bucket".to_owned(),
        ),
        (
            fleet.job(
                "",
                &format!("s3://{bucket}/in"),
                "s3://fleetrun-no-such-bucket/out",
            ),
            "s3://fleetrun-no-such-bucket: no such bucket".to_owned(),
        ),
    ];
    for (job, said) in cases {
        let out = fleet.submit(&job, &[]);
        assert_eq!(code(&out), 2);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(lines[0].starts_with(&format!("error: {said}")), "{stderr}");
    }
}

/// A broker or ledger that cannot be reached, or refuses the password, is said in one line
/// naming the service, with its password hidden.
#[test]
fn unreachable_services_are_said_once_without_their_password() {
    let fleet = Fleet::new(ECHO);
    fleet.inputs(1);
    let job = fleet.s3_job("");
    let mut wrong_password = reqwest::Url::parse(&fleet.amqp_url).unwrap();
    wrong_password.set_password(Some("hunter2-amqp")).unwrap();
    let cases = [
        (
            "FLEETRUN_AMQP_URL",
            wrong_password.to_string(),
            "RabbitMQ at amqp://",
        ),
        (
            "FLEETRUN_AMQP_URL",
            "amqp://guest:hunter2-amqp@127.0.0.1:1/%2f".to_owned(),
            "RabbitMQ at amqp://guest:***@127.0.0.1:1/",
        ),
        (
            "FLEETRUN_REDIS_URL",
            "redis://:hunter2-redis@127.0.0.1:1/".to_owned(),
            "Redis at redis://:***@127.0.0.1:1/",
        ),
    ];
    for (var, url, said) in cases {
        let mut cmd = command("fleetrun");
        fleet.env(&mut cmd);
        cmd.env(var, &url).args(["submit", "--quiet"]).arg(&job);
        let out = fleetrun_tests::output_within(&mut cmd, Duration::from_secs(120));
        assert_eq!(code(&out), 1);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(lines[0].starts_with(&format!("error: {said}")), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

/// Three submitters of one job under one id at once: one publishes, the others attach, so
/// each mini-batch runs once (the report has one attempt row per mini-batch).
#[test]
fn concurrent_submits_of_one_job_id_publish_once() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(100);
    fleet.worker("w1", 2);
    let job = fleet.s3_job("mini_batch_size = 1");
    let id = format!("once-{}", random_suffix());
    let submitters: Vec<KillOnDrop> = (0..3)
        .map(|_| {
            let mut cmd = command("fleetrun");
            fleet.env(&mut cmd);
            cmd.args(["submit", "--quiet", "--wait", "--job-id", &id])
                .arg(&job);
            KillOnDrop(cmd.spawn().unwrap())
        })
        .collect();
    for mut submitted in submitters {
        let status = submitted.exit_within(Duration::from_secs(120));
        assert_eq!(status.code(), Some(0));
    }
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(100, |_| false)
    );
    // One report for the job, written before it completed.
    let key = "out/logs/sys/job_report/processed_mini-batches.csv";
    let s3 = fleet.storage("");
    wait_for("the node's report", Duration::from_secs(30), || {
        fleet.runtime.block_on(s3.get(key)).is_ok()
    });
    let report = fleet.text(key);
    assert_eq!(report.lines().count(), 1 + 100, "{report}");
}

/// A service bound to `fleetrun.events` hears each change of its jobs' states once, as
/// JSON: Running, Finalizing, Completed for a job that completes; Running, Failed (and the
/// cause) for one its threshold fails.
#[test]
fn a_listener_bound_to_the_events_exchange_hears_each_change_once() {
    use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let mut fleet = Fleet::new(RAISES_ON_F0003);
    fleet.inputs(20);
    fleet.worker("w1", 2);
    let (_connection, channel, queue) = fleet.runtime.block_on(async {
        let connection =
            lapin::Connection::connect(&fleet.amqp_url, lapin::ConnectionProperties::default())
                .await
                .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..Default::default()
        };
        let queue = channel
            .queue_declare("".into(), options, FieldTable::default())
            .await
            .unwrap();
        let name = queue.name().clone();
        channel
            .queue_bind(
                name.clone(),
                "fleetrun.events".into(),
                "job.#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (connection, channel, name)
    });
    let settings = "mini_batch_size = 5\nrun_max_try = 1";
    let completes = fleet.s3_job(&format!("{settings}\nerror_threshold = -1"));
    let fails = fleet.s3_job(&format!("{settings}\nerror_threshold = 0"));
    assert_eq!(code(&fleet.submit(&completes, &["--wait"])), 0);
    assert_eq!(code(&fleet.submit(&fails, &["--wait"])), 42);

    let name = |job: &Path| {
        let stem = job.file_stem().unwrap().to_string_lossy();
        format!("fleet-{}", stem.trim_start_matches("job-"))
    };
    let mut heard: BTreeMap<String, Vec<(String, serde_json::Value)>> = BTreeMap::new();
    let ended = |heard: &BTreeMap<String, Vec<(String, serde_json::Value)>>| {
        heard
            .values()
            .filter(|events| {
                events
                    .iter()
                    .any(|(key, _)| key == "job.completed" || key == "job.failed")
            })
            .count()
    };
    wait_for("both jobs' ends", Duration::from_secs(30), || {
        while let Some(message) = fleet
            .runtime
            .block_on(channel.basic_get(queue.clone(), BasicGetOptions { no_ack: true }))
            .unwrap()
        {
            let event: serde_json::Value = serde_json::from_slice(&message.data).unwrap();
            let key = message.routing_key.to_string();
            let job = event["name"].as_str().unwrap().to_owned();
            // The exchange carries every job's events on the shared broker: this test's
            // two are the ones it counts.
            if [name(&completes), name(&fails)].contains(&job) {
                heard.entry(job).or_default().push((key, event));
            }
        }
        ended(&heard) == 2
    });
    let keys = |job: &Path| -> Vec<String> {
        heard[&name(job)]
            .iter()
            .map(|(key, _)| key.clone())
            .collect()
    };
    assert_eq!(
        keys(&completes),
        ["job.running", "job.finalizing", "job.completed"]
    );
    assert_eq!(keys(&fails), ["job.running", "job.failed"]);
    let (_, completed) = &heard[&name(&completes)][2];
    assert_eq!(completed["state"], "Completed");
    // The end that wrote a manifest names its digest.
    let manifest = fleet.output("out/logs/manifest.json");
    assert_eq!(
        completed["manifest"],
        proof::digest(&manifest),
        "{completed}"
    );
    assert_eq!(completed["counts"]["total_mini_batches"], 4);
    // f0003 failed alone: its mini-batch's four other files were isolated from it.
    assert_eq!(completed["counts"]["failed_items"], 1);
    assert!(
        completed["output"]
            .as_str()
            .unwrap()
            .ends_with("/out/parallel_run_step.txt"),
        "{completed}"
    );
    let (_, failed) = &heard[&name(&fails)][1];
    let cause = failed["cause"].as_str().unwrap();
    assert!(cause.starts_with("error_threshold exceeded"), "{cause}");
}

/// `fleetrun` as another program drives it: `submit --job-id X --json` answers with the id,
/// `wait` and `status` exit with the job's end (0 completed, 42 failed, 43 canceled, 75
/// not ended), `--json` gives one object a program reads, and `jobs --json` lists the pool.
#[test]
fn programs_submit_wait_and_read_status_as_json_and_exit_codes() {
    let mut fleet = Fleet::new(RAISES_ON_F0003);
    fleet.inputs(20);
    fleet.worker("w1", 2);
    let suffix = random_suffix();
    let idle_pool = format!("idle{suffix}");
    fleet.other_pools.push(idle_pool.clone());
    let fleetrun = |args: &[&str]| -> (i32, String) {
        let mut cmd = command("fleetrun");
        fleet.env(&mut cmd);
        let out = output_within(cmd.args(args), Duration::from_secs(180));
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("fleetrun {args:?}: {stderr}");
        (code(&out), String::from_utf8(out.stdout).unwrap())
    };
    let json = |text: &str| -> serde_json::Value {
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"))
    };
    let settings = "mini_batch_size = 5\nrun_max_try = 1";

    let ok = format!("ok-{suffix}");
    let job = fleet.s3_job(&format!("{settings}\nerror_threshold = -1"));
    let job = job.to_str().unwrap();
    let (code_of, out) = fleetrun(&["submit", job, "--job-id", &ok, "--json", "--quiet"]);
    assert_eq!(code_of, 0);
    assert_eq!(
        json(&out),
        serde_json::json!({"job_id": ok, "attached": false})
    );
    let (code_of, out) = fleetrun(&["wait", &ok, "--timeout", "120", "--json"]);
    assert_eq!(code_of, 0, "{out}");
    assert_eq!(json(&out)["state"], "Completed");
    let (code_of, out) = fleetrun(&["status", &ok, "--json"]);
    assert_eq!(code_of, 0);
    let shown = json(&out);
    assert_eq!(shown["job_id"], ok.as_str());
    assert_eq!(shown["counts"]["total_mini_batches"], 4);
    assert_eq!(shown["counts"]["failed_items"], 1);
    let failed_items = format!("s3://{}/out/logs/failed_items.csv", fleet.bucket);
    assert_eq!(shown["failed_items"], failed_items.as_str());
    assert_eq!(shown["eta_seconds"], serde_json::Value::Null);

    let bad = format!("bad-{suffix}");
    let job = fleet.s3_job(&format!("{settings}\nerror_threshold = 0"));
    let (code_of, _) = fleetrun(&["submit", job.to_str().unwrap(), "--job-id", &bad, "--quiet"]);
    assert_eq!(code_of, 0);
    assert_eq!(fleetrun(&["wait", &bad, "--quiet"]).0, 42);
    let (code_of, out) = fleetrun(&["status", &bad]);
    assert_eq!(code_of, 42, "a failed job's status");
    assert!(
        out.contains("cause:         error_threshold exceeded"),
        "{out}"
    );

    // A job no worker serves (its pool has none) has not ended when the wait runs out.
    let idle = format!("idle-{suffix}");
    let job = fleet.s3_job(settings);
    let args = [
        "submit",
        job.to_str().unwrap(),
        "--job-id",
        &idle,
        "--pool",
        &idle_pool,
        "--create-pool",
    ];
    assert_eq!(fleetrun(&args).0, 0);
    assert_eq!(
        fleetrun(&["wait", &idle, "--timeout", "1", "--quiet"]).0,
        75
    );
    assert_eq!(fleetrun(&["status", &idle]).0, 75);
    let (code_of, out) = fleetrun(&["cancel", &idle, "--json"]);
    assert_eq!(code_of, 0);
    assert_eq!(json(&out)["state"], "Canceled");
    assert_eq!(fleetrun(&["status", &idle]).0, 43);

    let (code_of, out) = fleetrun(&["jobs", "--json"]);
    assert_eq!(code_of, 0);
    let listed: Vec<String> = json(&out)
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(listed.contains(&ok) && listed.contains(&bad), "{listed:?}");
    assert!(!listed.contains(&idle), "another pool's job: {listed:?}");
}

/// What a calling service does, written as one would in Python with only its standard
/// library: it submits over HTTP with its own job id, repeats the POST safely, polls to
/// Completed, and gets 400 for a body that is not a submission, 422 for a job that does not
/// validate, 409 for its id with another job, 404 for an unknown job, 401 without the token.
const API_CLIENT: &str = r#"
import json, sys, time, urllib.error, urllib.request
base, token, job, job_id = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]

def call(method, path, body=None, auth=True):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if auth:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

assert call("GET", "/v1/jobs", auth=False)[0] == 401
status, body = call("POST", "/v1/jobs", {"job_id": job_id, "job": job})
assert (status, body) == (201, {"job_id": job_id, "attached": False}), (status, body)
status, body = call("POST", "/v1/jobs", {"job_id": job_id, "job": job})
assert (status, body["attached"]) == (200, True), (status, body)
deadline = time.time() + 120
while True:
    status, body = call("GET", "/v1/jobs/" + job_id)
    assert status == 200, (status, body)
    if body["state"] in ("Completed", "Failed", "Canceled"):
        break
    assert time.time() < deadline, body
    time.sleep(0.2)
assert body["state"] == "Completed", body
assert body["counts"]["succeeded_items"] == 20, body
assert body["output"].endswith("/out/parallel_run_step.txt"), body
status, body = call("POST", "/v1/jobs", {"job": dict(job, mini_batch_size=0)})
assert status == 422 and "mini_batch_size" in body["error"], (status, body)
status, body = call("POST", "/v1/jobs", {"job": dict(job, mini_bacth_size=5)})
assert status == 422 and 'did you mean "mini_batch_size"' in body["error"], (status, body)
assert call("POST", "/v1/jobs", b"{not json")[0] == 400
assert call("POST", "/v1/jobs", {"job_id": "a b", "job": job})[0] == 400
status, body = call("POST", "/v1/jobs", {"job_id": job_id, "job": dict(job, mini_batch_size=7)})
assert status == 409, (status, body)
assert call("GET", "/v1/jobs/no-such-job")[0] == 404
assert call("GET", "/v1/jobs/no-such-job/in-flight")[0] == 404
status, held = call("GET", "/v1/jobs/" + job_id + "/in-flight")
assert (status, held) == (200, []), (status, held)
assert call("GET", "/v1/queue", auth=False)[0] == 401
status, queue = call("GET", "/v1/queue")
assert status == 200 and queue["ready"] == 0 and queue["dead_lettered"] == 0, (status, queue)
assert call("POST", "/v1/jobs/no-such-job/cancel")[0] == 404
status, listed = call("GET", "/v1/jobs")
assert status == 200 and job_id in [j["job_id"] for j in listed], listed
assert call("GET", "/healthz", auth=False)[0] == 200
status, api = call("GET", "/openapi.json", auth=False)
assert status == 200 and "/v1/jobs/{id}" in api["paths"], api
assert "/v1/queue" in api["paths"] and "/v1/jobs/{id}/in-flight" in api["paths"], api
print("ok")
"#;

#[test]
fn a_service_submits_over_http_and_polls_to_completed() {
    let mut fleet =
        Fleet::new("def run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n");
    fleet.inputs(20);
    fleet.worker("w1", 2);
    let (mut serve, base) = fleet.serve("t0ken");
    let bucket = &fleet.bucket;
    let job = serde_json::json!({
        "name": format!("api-{}", random_suffix()),
        "entry_script": fleet.path("code/score.py"),
        "output_action": "append_row",
        "mini_batch_size": 5,
        "input": {"files": format!("s3://{bucket}/in")},
        "output": {"path": format!("s3://{bucket}/out")},
    });
    let client = fleet.path("client.py");
    std::fs::write(&client, API_CLIENT).unwrap();
    let job_id = format!("api-{}", random_suffix());
    let out = output_within(
        Command::new("python3")
            .arg(&client)
            .args([&base, "t0ken", &job.to_string(), &job_id]),
        RUN_LIMIT,
    );
    let serve_log = std::fs::read_to_string(fleet.path("serve.log")).unwrap();
    assert!(
        out.status.success(),
        "{}\n{}\nserve: {serve_log}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(20, |_| false)
    );
    // SIGTERM stops the server at once, and cleanly.
    // SAFETY: kill(2) with SIGTERM on our own child.
    assert_eq!(unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(serve.exit_within(Duration::from_secs(10)).code(), Some(0));
}

/// `POST /v1/jobs` with `job` under `job_id`: the status and the body.
fn post_job(
    fleet: &Fleet,
    base: &str,
    token: &str,
    job_id: &str,
    job: &serde_json::Value,
) -> (u16, String) {
    fleet.runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let answer = client
            .post(format!("{base}/v1/jobs"))
            .bearer_auth(token)
            .json(&serde_json::json!({"job_id": job_id, "job": job}))
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.text().await.unwrap())
    })
}

/// `fleetrun wait JOB`, bounded by [`RUN_LIMIT`]: its exit code.
fn wait_job(fleet: &Fleet, job_id: &str) -> i32 {
    let mut cmd = command("fleetrun");
    fleet.env(&mut cmd);
    let out = output_within(cmd.args(["wait", job_id, "--quiet"]), RUN_LIMIT);
    eprintln!("fleetrun wait: {}", String::from_utf8_lossy(&out.stderr));
    code(&out)
}

/// A service POSTs a job whose code is already in storage, at `s3://…/code/` as the API
/// documents it: the job completes. Then the script at that prefix changes (same size, new
/// bytes): the same worker, which staged the old one, runs the new one.
#[test]
fn code_in_storage_runs_as_it_is_there_now() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(4);
    fleet.worker("w1", 1);
    let (_serve, base) = fleet.serve("t0ken");
    let bucket = fleet.bucket.clone();
    let code = fleet.storage("code");
    for tag in ["old", "new"] {
        let script = format!(
            "def run(mini_batch):\n    return ['{tag} ' + open(p).read() for p in mini_batch]\n"
        );
        fleet
            .runtime
            .block_on(code.put("score.py", Bytes::from(script)))
            .unwrap();
        let job = serde_json::json!({
            "name": format!("code-{}", random_suffix()),
            "source_directory": format!("s3://{bucket}/code/"),
            "entry_script": "score.py",
            "output_action": "append_row",
            "mini_batch_size": 2,
            "input": {"files": format!("s3://{bucket}/in")},
            "output": {"path": format!("s3://{bucket}/out-{tag}")},
        });
        let job_id = format!("code-{tag}-{}", random_suffix());
        let (status, body) = post_job(&fleet, &base, "t0ken", &job_id, &job);
        assert_eq!(status, 201, "{body}");
        assert_eq!(wait_job(&fleet, &job_id), 0, "{tag}");
        let expected: Vec<String> = (0..4).map(|i| format!("{tag} f{i:04}")).collect();
        assert_eq!(
            lines(&fleet.output(&format!("out-{tag}/parallel_run_step.txt"))),
            expected
        );
    }
}

/// `fleetrun serve` SIGKILLed while it publishes a job of 20,000 files it answered 201 for:
/// a serve started after it (as a restarted instance, or another behind the same address)
/// finishes the publication once the dead one's claim runs out, and the job completes with
/// every line once. The caller never repeats the POST.
#[test]
fn a_job_answered_201_is_published_whole_though_its_serve_dies() {
    const FILES: usize = 20_000;
    let mut fleet = Fleet::new(ECHO);
    let input = fleet.path("local-in");
    for i in 0..FILES {
        let file = input.join(format!("g{:03}/f{i:05}.txt", i / 100));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, format!("f{i:05}")).unwrap();
    }
    fleet
        .runtime
        .block_on(fleet.storage("out").create_bucket_if_missing())
        .unwrap();
    fleet.worker("w1", 2);
    fleet.worker("w2", 2);
    let (mut first, base) = fleet.serve("t0ken");
    let bucket = fleet.bucket.clone();
    let job = serde_json::json!({
        "name": format!("durable-{}", random_suffix()),
        "entry_script": fleet.path("code/score.py"),
        "output_action": "append_row",
        "mini_batch_size": 10,
        "input": {"files": input},
        "output": {"path": format!("s3://{bucket}/out")},
    });
    let job_id = format!("durable-{}", random_suffix());
    let (status, body) = post_job(&fleet, &base, "t0ken", &job_id, &job);
    assert_eq!(status, 201, "{body}");
    // Stopped at once, then killed: its publication of 2,000 mini-batches had begun and had
    // not ended.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(first.0.id() as i32, libc::SIGSTOP) }, 0);
    let ledger = fleet.runtime.block_on(async {
        RedisLedger::connect(&fleet.redis_url, "fleetrun", &Tls::default())
            .await
            .unwrap()
    });
    let at_kill = fleet
        .runtime
        .block_on(ledger.status(&job_id))
        .unwrap()
        .expect("the job is in the ledger");
    kill(&mut first.0);
    assert_eq!(at_kill.total, None, "killed before the job was sealed");
    let (_second, _) = fleet.serve("t0ken");
    assert_eq!(wait_job(&fleet, &job_id), 0);
    let mut output = lines(&fleet.output("out/parallel_run_step.txt"));
    output.sort();
    let expected: Vec<String> = (0..FILES).map(|i| format!("f{i:05}")).collect();
    assert_eq!(output, expected);
    let log = std::fs::read_to_string(fleet.path("serve.log")).unwrap();
    assert!(log.contains("Finishing a publication"), "{log}");
}

/// A webhook receiver, in Python: checks each POST's signature with the secret, answers 503
/// to the first POST of each job (so the fleet must retry), 204 after, and notes each in a
/// file: `<verified|FORGED|refused> <event> <job name> <state> <manifest digest or ->`.
const WEBHOOK_RECEIVER: &str = r#"
import hashlib, hmac, http.server, json, sys
secret, out = sys.argv[1].encode(), sys.argv[2]
seen = set()

class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        event = json.loads(body)
        expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        signed = hmac.compare_digest(expected, self.headers.get("X-Fleetrun-Signature", ""))
        first = event["name"] not in seen
        seen.add(event["name"])
        word = "refused" if first else ("verified" if signed else "FORGED")
        with open(out, "a") as f:
            manifest = event.get("manifest") or "-"
            f.write(f"{word} {self.headers['X-Fleetrun-Event']} {event['name']} {event['state']} {manifest}\n")
        self.send_response(503 if first else 204)
        self.end_headers()

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
print(server.server_port, flush=True)
server.serve_forever()
"#;

/// A job's `notify_url` gets a POST of its end, signed with `FLEETRUN_WEBHOOK_SECRET`, and
/// retried when the receiver fails: once for a job that completes, once for one that fails.
/// The completed job's POST carries the digest of the manifest it wrote, which the receiver
/// checks against the manifest it fetches.
#[test]
fn a_webhook_receiver_gets_a_signed_post_of_each_end() {
    let mut fleet = Fleet::new(RAISES_ON_F0003);
    let secret = "wh-s3cret";
    fleet
        .extra_env
        .push(("FLEETRUN_WEBHOOK_SECRET".into(), secret.into()));
    fleet.inputs(20);
    fleet.worker("w1", 2);
    let receiver = fleet.path("receiver.py");
    std::fs::write(&receiver, WEBHOOK_RECEIVER).unwrap();
    let heard = fleet.path("heard.txt");
    let mut server = KillOnDrop(
        Command::new("python3")
            .arg(&receiver)
            .arg(secret)
            .arg(&heard)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let url = format!(
        "http://127.0.0.1:{}/hook",
        first_line_within(&mut server.0, Duration::from_secs(60))
    );
    let settings = format!("mini_batch_size = 5\nrun_max_try = 1\nnotify_url = \"{url}\"");
    let completes = fleet.s3_job(&format!("{settings}\nerror_threshold = -1"));
    let fails = fleet.s3_job(&format!("{settings}\nerror_threshold = 0"));
    assert_eq!(code(&fleet.submit(&completes, &["--wait"])), 0);
    let manifest = proof::digest(&fleet.output("out/logs/manifest.json"));
    assert_eq!(code(&fleet.submit(&fails, &["--wait"])), 42);

    let name = |job: &Path| {
        let stem = job.file_stem().unwrap().to_string_lossy();
        format!("fleet-{}", stem.trim_start_matches("job-"))
    };
    let read = || std::fs::read_to_string(&heard).unwrap_or_default();
    wait_for("both ends delivered", Duration::from_secs(60), || {
        read()
            .lines()
            .filter(|l| l.starts_with("verified "))
            .count()
            == 2
    });
    let heard = read();
    for (job, key, state) in [
        (&completes, "job.completed", "Completed"),
        (&fails, "job.failed", "Failed"),
    ] {
        let name = name(job);
        let lines: Vec<&str> = heard
            .lines()
            .filter(|l| l.contains(&name))
            .map(|l| l.rsplit_once(' ').unwrap().0)
            .collect();
        assert_eq!(
            lines,
            [
                format!("refused {key} {name} {state}"),
                format!("verified {key} {name} {state}")
            ],
            "{heard}"
        );
    }
    let completed = heard
        .lines()
        .find(|l| l.starts_with("verified job.completed"))
        .unwrap();
    assert!(
        completed.ends_with(&format!(" {manifest}")),
        "the POST carries the manifest's digest {manifest}: {completed}"
    );
    assert!(!heard.contains("FORGED"), "{heard}");
}

/// Three poison files among a thousand on a fleet of two workers, inputs and output on S3:
/// each costs only itself. The output holds the other 997 lines in input order and
/// `failed_items.csv` names exactly the three, with their own errors.
#[test]
fn poison_files_are_isolated_on_a_fleet() {
    let script = "POISON = {'f0017', 'f0333', 'f0998'}\n\ndef run(mini_batch):\n    names = [open(p).read() for p in mini_batch]\n    bad = POISON.intersection(names)\n    if bad:\n        raise ValueError('poison ' + min(bad))\n    return names\n";
    let mut fleet = Fleet::new(script);
    fleet.inputs(1000);
    fleet.worker("w1", 2);
    fleet.worker("w2", 1);
    let job = fleet.s3_job("mini_batch_size = 10\nrun_max_try = 1\nerror_threshold = -1");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    fleet.job_result("out");
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(1000, |i| POISONED.contains(&i))
    );
    let failed = fleet.output("out/logs/failed_items.csv");
    assert_failed_alone(&String::from_utf8_lossy(&failed), &POISONED);
}

/// A script whose `run()` raises for the mini-batch holding `f0003`.
const RAISES_ON_F0003: &str = "def run(mini_batch):\n    if any('f0003' in p for p in mini_batch):\n        raise ValueError('bad f0003')\n    return [open(p).read() for p in mini_batch]\n";

/// The address a worker's log says its metrics are served on (`Metrics on http://ADDR.`).
fn metrics_url(fleet: &Fleet, node: &str) -> String {
    let log = fleet.path(&format!("{node}.log"));
    let mut url = None;
    wait_for(
        "the worker to serve its metrics",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            url = text.split("Metrics on ").nth(1).and_then(|rest| {
                let end = rest.find(|c: char| c.is_whitespace() || c == '"')?;
                Some(rest[..end].trim_end_matches('.').to_owned())
            });
            url.is_some()
        },
    );
    url.unwrap()
}

/// A GET: the status and the body.
fn http_get(fleet: &Fleet, url: &str) -> (u16, String, String) {
    fleet.runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let answer = client.get(url).send().await.unwrap();
        let status = answer.status().as_u16();
        let content_type = answer
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (status, content_type, answer.text().await.unwrap())
    })
}

/// The value of the sample `series` in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// After a job, the worker's `/metrics` counts its mini-batches, items and runs; `/healthz`
/// answers 200 while the ledger and the broker do, and 503 naming the ledger once Redis is
/// gone.
#[test]
fn a_worker_serves_its_metrics_and_its_health() {
    let redis = PrivateRedis::start();
    let mut fleet = Fleet::new(ECHO);
    fleet.redis_url = redis.url();
    fleet.know_pool(&fleet.pool);
    fleet.inputs(30);
    fleet.worker_with("m1", 2, &[], &["--metrics-addr", "127.0.0.1:0"]);
    let base = metrics_url(&fleet, "m1");
    let (status, content_type, text) = http_get(&fleet, &format!("{base}/metrics"));
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let succeeded = "fleetrun_mini_batches_total{result=\"succeeded\"}";
    assert_eq!(sample(&text, succeeded), Some(0.0), "{text}");

    let job = fleet.s3_job("mini_batch_size = 4");
    assert_eq!(code(&fleet.submit(&job, &["--wait"])), 0);
    let (status, _, text) = http_get(&fleet, &format!("{base}/metrics"));
    assert_eq!(status, 200);
    // 30 items in mini-batches of 4: 8 mini-batches, every one run here.
    assert_eq!(sample(&text, succeeded), Some(8.0), "{text}");
    let value = |series| sample(&text, series);
    assert_eq!(
        value("fleetrun_items_total{result=\"succeeded\"}"),
        Some(30.0)
    );
    assert_eq!(value("fleetrun_items_total{result=\"failed\"}"), Some(0.0));
    assert_eq!(value("fleetrun_run_seconds_count"), Some(8.0), "{text}");
    assert!(value("fleetrun_runner_starts_total") >= Some(1.0), "{text}");
    assert_eq!(value("fleetrun_mini_batches_in_flight"), Some(0.0));
    assert_eq!(value("fleetrun_ledger_errors_total"), Some(0.0));

    let (status, _, body) = http_get(&fleet, &format!("{base}/healthz"));
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    drop(redis);
    let (status, _, body) = http_get(&fleet, &format!("{base}/healthz"));
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("ledger: "), "{body}");
    assert!(!body.contains("broker"), "{body}");
}

/// With `FLEETRUN_LOG_FORMAT=json`, every line a worker writes is a JSON object, and the
/// lines of its slots name the node.
#[test]
fn a_worker_logging_json_writes_only_json_lines() {
    let mut fleet = Fleet::new(
        "def run(mini_batch):\n    if any(p.endswith('f0003.txt') for p in mini_batch):\n        raise ValueError('bad item')\n    return [open(p).read() for p in mini_batch]\n",
    );
    fleet.inputs(10);
    fleet.worker_with("j1", 1, &[("FLEETRUN_LOG_FORMAT", "json")], &[]);
    // A mini-batch that raises every time: the worker logs its attempts (job, mini_batch).
    let job = fleet.s3_job("mini_batch_size = 2\nrun_max_try = 2\nerror_threshold = -1");
    assert_eq!(code(&fleet.submit(&job, &["--wait"])), 0);
    // Its lines on stopping are part of what it writes.
    let (_, mut worker) = fleet.workers.pop().unwrap();
    // SAFETY: kill(2) with SIGTERM on our own child.
    assert_eq!(unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) }, 0);
    assert!(exit_within(&mut worker, Duration::from_secs(60)).success());
    let log = std::fs::read_to_string(fleet.path("j1.log")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{log}"))
        })
        .collect();
    let messages: Vec<&str> = lines
        .iter()
        .map(|l| l["message"].as_str().expect("every line has a message"))
        .collect();
    assert!(messages.contains(&"Worker serving."), "{log}");
    assert!(messages.contains(&"Worker stopped."), "{log}");
    let requeued = lines
        .iter()
        .find(|l| l["message"] == "Attempt failed; requeueing.")
        .unwrap_or_else(|| panic!("an attempt failed and was requeued:\n{log}"));
    assert!(requeued["mini_batch"].is_u64(), "{log}");
    assert!(
        requeued["job"].as_str().unwrap().starts_with("fleet-"),
        "{log}"
    );
    assert_eq!(requeued["span"]["node"], "j1", "{log}");
    assert_eq!(requeued["level"], "INFO", "{log}");
}

/// A worker logging JSON that cannot start says why in JSON too.
#[test]
fn a_worker_logging_json_that_cannot_start_says_why_in_json() {
    let fleet = Fleet::new(ECHO);
    let mut cmd = command("fleetrun-worker");
    fleet.env(&mut cmd);
    // Nothing listens on port 1.
    cmd.env("FLEETRUN_REDIS_URL", "redis://127.0.0.1:1/")
        .env("FLEETRUN_LOG_FORMAT", "json")
        .args(["--node-id", "nowhere"])
        .arg("--cache-dir")
        .arg(fleet.path("cache-nowhere"));
    let out = output_within(&mut cmd, Duration::from_secs(120));
    assert_eq!(code(&out), 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let last = lines.last().expect("a line saying why");
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert!(
        last["error"].as_str().unwrap().contains("Redis"),
        "{stderr}"
    );
}

/// A job is refused an output another job that has not ended writes (the same prefix, or
/// one holding the other), naming that job; once that job ended, or with an output of its
/// own, it is taken.
#[test]
fn a_job_is_refused_an_output_another_live_job_writes() {
    let fleet = Fleet::new("def run(mb):\n    return mb\n");
    fleet.inputs(5);
    let bucket = fleet.bucket.clone();
    let input = format!("s3://{bucket}/in");
    let suffix = random_suffix();
    let fleetrun = |args: &[&str]| {
        let mut cmd = command("fleetrun");
        fleet.env(&mut cmd);
        let out = output_within(cmd.args(args), Duration::from_secs(60));
        (
            code(&out),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // No worker serves the pool: the first job runs until it is canceled.
    let first = format!("first-{suffix}");
    let job = fleet.job("", &input, &format!("s3://{bucket}/out"));
    let submit = ["submit", job.to_str().unwrap(), "--quiet", "--job-id"];
    assert_eq!(fleetrun(&[&submit[..], &[&first]].concat()).0, 0);
    // Submitting the same job again attaches to it.
    assert_eq!(fleetrun(&[&submit[..], &[&first]].concat()).0, 0);

    for output in ["out", "out/", "out/inner"] {
        let job = fleet.job("", &input, &format!("s3://{bucket}/{output}"));
        let (code_of, err) = fleetrun(&["submit", job.to_str().unwrap(), "--quiet"]);
        assert_eq!(code_of, 2, "output {output}: {err}");
        assert!(
            err.contains(&format!("job {first} writes there")),
            "output {output}: {err}"
        );
    }
    let beside = format!("beside-{suffix}");
    let job = fleet.job("", &input, &format!("s3://{bucket}/outer"));
    let submit = ["submit", job.to_str().unwrap(), "--quiet", "--job-id"];
    assert_eq!(fleetrun(&[&submit[..], &[&beside]].concat()).0, 0);

    assert_eq!(fleetrun(&["cancel", &first]).0, 0);
    let inner = format!("inner-{suffix}");
    let job = fleet.job("", &input, &format!("s3://{bucket}/out/inner"));
    let submit = ["submit", job.to_str().unwrap(), "--quiet", "--job-id"];
    let (code_of, err) = fleetrun(&[&submit[..], &[&inner]].concat());
    assert_eq!(code_of, 0, "{err}");
    for job in [beside, inner] {
        assert_eq!(fleetrun(&["cancel", &job]).0, 0);
    }
}

/// A process's memory figure from `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in bytes.
fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kb * 1024
}

/// A large input object is streamed to the node's disk: the worker's memory does not grow
/// with the item (it held 2.7 times the item when it read the object whole). The worker's
/// peak after a job of a small item is the baseline, so its start-up counts for nothing.
#[test]
fn a_large_item_is_staged_without_the_worker_holding_it() {
    const SIZE: usize = 256 << 20;
    const ROOM: u64 = 64 << 20;
    let mut fleet = Fleet::new(
        "import os\n\ndef run(mini_batch):\n    return ['%s %d' % (os.path.basename(p), os.path.getsize(p)) for p in mini_batch]\n",
    );
    let s3 = fleet.storage("");
    fleet.runtime.block_on(async {
        s3.create_bucket_if_missing().await.unwrap();
        s3.put("small/small.bin", Bytes::from(vec![7u8; 1024]))
            .await
            .unwrap();
        s3.put("big/big.bin", Bytes::from(vec![7u8; SIZE]))
            .await
            .unwrap();
    });
    drop(s3);
    fleet.worker("n1", 1);
    let pid = fleet.workers[0].1.id();
    let bucket = fleet.bucket.clone();
    let run = |name: &str, size: usize| {
        let job = fleet.job(
            "",
            &format!("s3://{bucket}/{name}"),
            &format!("s3://{bucket}/out-{name}"),
        );
        assert_eq!(code(&fleet.submit(&job, &["--wait"])), 0);
        assert_eq!(
            lines(&fleet.output(&format!("out-{name}/parallel_run_step.txt"))),
            [format!("{name}.bin {size}")]
        );
        memory_of(pid, "VmHWM")
    };
    let baseline = run("small", 1024);
    let peak = run("big", SIZE);
    assert!(
        peak < baseline + ROOM,
        "the worker's peak went from {} MiB to {} MiB staging a {} MiB item",
        baseline >> 20,
        peak >> 20,
        SIZE >> 20
    );
}

/// A misspelled `--pool` is refused (exit 2) by every command, naming the pool it most
/// likely meant, and declares nothing on the broker; `--create-pool` submits to a new pool
/// on purpose.
#[test]
fn a_misspelled_pool_is_refused_and_declares_no_queue() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(2);
    let typo = format!("{}x", fleet.pool);
    fleet.other_pools.push(typo.clone());
    let job = fleet.s3_job("");
    let job = job.to_str().unwrap();
    let meant = format!("did you mean {}?", fleet.pool);
    let on_typo = |args: &[&str]| {
        let mut cmd = command("fleetrun");
        fleet.env(&mut cmd);
        let out = output_within(
            cmd.args(args).args(["--pool", &typo]),
            Duration::from_secs(60),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (code(&out), out.stdout, stderr)
    };
    for args in [
        &["submit", job, "--quiet"][..],
        &["status"],
        &["jobs"],
        &["dlq", "list"],
    ] {
        let (exit, _, stderr) = on_typo(args);
        assert_eq!(exit, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(&meant), "{args:?}: {stderr}");
    }
    let declared = |queue: &str| {
        let url = format!(
            "{}/api/queues/%2F/fleetrun.{typo}.{queue}",
            management_url()
        );
        fleet.runtime.block_on(async {
            let response = reqwest::get(&url).await.unwrap();
            match response.status().as_u16() {
                200 => true,
                404 => false,
                other => panic!("{url}: {other}"),
            }
        })
    };
    for queue in ["dead", "dead.inbox"] {
        assert!(
            !declared(queue),
            "{queue} was declared for a misspelled pool"
        );
    }
    let (exit, stdout, stderr) = on_typo(&["submit", job, "--quiet", "--create-pool"]);
    assert_eq!(exit, 0, "{stderr}");
    assert!(declared("dead") && declared("dead.inbox"));
    // The pool is known from then on, before any worker of it starts (one scaled from
    // zero by its queue): its job can be followed and canceled.
    let id = String::from_utf8_lossy(&stdout).trim().to_owned();
    for (args, wanted) in [(["status", &id], 75), (["cancel", &id], 0)] {
        let (exit, _, stderr) = on_typo(&args);
        assert_eq!(exit, wanted, "{args:?}: {stderr}");
    }
}

/// A fleet job's local output folder keeps `fleetrun run`'s rules: a file fleetrun did not
/// write where the job would write is refused at submission (exit 2, naming it) and left as
/// it was; what a job wrote is fleetrun's, so the next job replaces its output and its logs;
/// a file put in `logs/` after a job ended is not, and the next job is refused it.
#[test]
fn a_fleet_jobs_local_output_folder_keeps_what_fleetrun_did_not_write() {
    let mut fleet = Fleet::new(ECHO);
    fleet.inputs(5);
    let out = tempfile::tempdir().unwrap();
    let input = format!("s3://{}/in", fleet.bucket);
    let job = fleet.job("", &input, out.path().to_str().unwrap());
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();

    // A file of the user's beside fleetrun's, which no job touches.
    let theirs = out.path().join("their notes.txt");
    std::fs::write(&theirs, "mine\n").unwrap();
    let output = out.path().join("parallel_run_step.txt");
    std::fs::write(&output, "mine\n").unwrap();
    let refused = fleet.submit(&job, &[]);
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(&format!("{} was not written by fleetrun", output.display())),
        "{}",
        stderr(&refused)
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "mine\n");
    std::fs::remove_file(&output).unwrap();

    fleet.worker("n1", 1);
    for run in 0..2 {
        let done = fleet.submit(&job, &["--wait"]);
        assert_eq!(code(&done), 0, "run {run}: {}", stderr(&done));
        assert_eq!(
            lines(&std::fs::read(&output).unwrap()),
            expected_lines(5, |_| false),
            "run {run}"
        );
        assert!(out.path().join("logs/job_result.txt").exists(), "run {run}");
    }

    // Its worker gone, nothing of fleetrun's writes the folder any more.
    let (_, worker) = &mut fleet.workers[0];
    // SAFETY: kill(2) with SIGTERM on our own child.
    assert_eq!(unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(exit_within(worker, Duration::from_secs(60)).code(), Some(0));
    let notes = out.path().join("logs/notes.txt");
    std::fs::write(&notes, "mine\n").unwrap();
    let refused = fleet.submit(&job, &[]);
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("not written by fleetrun"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\n");
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "mine\n");
}
