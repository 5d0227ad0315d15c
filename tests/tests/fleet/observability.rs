//! What operators and autoscalers read of a fleet: `fleetrun serve --metrics-addr`'s series
//! (each job's seconds of work left among them).

use serde_json::Value;

use super::*;

/// A script whose every mini-batch takes a third of a second.
const SLOW_ECHO: &str = "import time\ndef run(mini_batch):\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n";

/// `fleetrun submit JOB --wait --job-id ID`, running while the test goes on.
pub(super) fn spawn_submit_as(fleet: &Fleet, job: &Path, id: &str) -> KillOnDrop {
    let mut cmd = command("fleetrun");
    fleet.env(&mut cmd);
    KillOnDrop(
        cmd.arg("submit")
            .arg(job)
            .args(["--quiet", "--wait", "--job-id", id])
            .spawn()
            .unwrap(),
    )
}

/// While a job runs, `serve`'s `/metrics` gives its expected seconds of work left (and the
/// pool's sum, and the runners serving it); once it completed, no work is left, no job is
/// active and its counts are its final ones.
#[test]
fn serve_exports_each_jobs_seconds_of_work_left() {
    let mut fleet = Fleet::new(SLOW_ECHO);
    fleet.inputs(40);
    let (_serve, urls) = fleet.serve_with("t0ken", &["--metrics-addr", "127.0.0.1:0"]);
    let metrics = urls[1].clone();
    let pool = fleet.pool.clone();
    let (status, content_type, text) = http_get(&fleet, &metrics);
    assert_eq!(status, 200, "{text}");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    // No job yet: the pool's series are there, at 0.
    let pool_left = format!("fleetrun_pool_work_seconds_left{{pool=\"{pool}\"}}");
    let pool_active = format!("fleetrun_pool_jobs_active{{pool=\"{pool}\"}}");
    assert_eq!(sample(&text, &pool_left), Some(0.0), "{text}");
    assert_eq!(sample(&text, &pool_active), Some(0.0), "{text}");

    fleet.worker("w1", 2);
    let id = format!("left-{}", random_suffix());
    let job = fleet.s3_job("mini_batch_size = 1");
    let mut submit = spawn_submit_as(&fleet, &job, &id);
    let labels = format!("job_id=\"{id}\",pool=\"{pool}\"");
    let job_left = format!("fleetrun_job_work_seconds_left{{{labels}}}");
    let serving = format!("fleetrun_job_runners_serving{{{labels}}}");
    let mut seen = String::new();
    wait_for(
        "the running job's work left and its runners",
        Duration::from_secs(60),
        || {
            seen = http_get(&fleet, &metrics).2;
            sample(&seen, &job_left).is_some_and(|s| s > 0.0)
                && sample(&seen, &serving).is_some_and(|r| r >= 1.0)
        },
    );
    let value = |series: &str| sample(&seen, series);
    assert_eq!(value(&pool_left), value(&job_left), "{seen}");
    assert_eq!(value(&pool_active), Some(1.0), "{seen}");
    let running = format!("fleetrun_job_state{{{labels},state=\"Running\"}}");
    assert_eq!(value(&running), Some(1.0), "{seen}");
    let left = value(&format!("fleetrun_job_mini_batches_left{{{labels}}}")).unwrap();
    assert!(left > 0.0 && left <= 40.0, "{seen}");

    let done = format!("fleetrun_job_mini_batches{{{labels},status=\"done\"}}");
    let all = format!("fleetrun_job_mini_batches{{{labels},status=\"all\"}}");
    assert_eq!(value(&all), Some(40.0), "{seen}");
    assert!(value(&done).unwrap() < 40.0, "{seen}");

    assert!(submit.exit_within(RUN_LIMIT).success());
    // Once the job ended: no work left in the pool, no job active; the job's series go
    // once the workers retire it, and until then say it completed with nothing left.
    wait_for(
        "the pool to have no active job",
        Duration::from_secs(30),
        || {
            seen = http_get(&fleet, &metrics).2;
            sample(&seen, &pool_active) == Some(0.0)
        },
    );
    let value = |series: &str| sample(&seen, series);
    assert_eq!(value(&pool_left), Some(0.0), "{seen}");
    if value(&job_left).is_some() {
        assert_eq!(value(&job_left), Some(0.0), "{seen}");
        let completed = format!("fleetrun_job_state{{{labels},state=\"Completed\"}}");
        assert_eq!(value(&completed), Some(1.0), "{seen}");
        assert_eq!(value(&done), Some(40.0), "{seen}");
    }
}

/// A Prometheus server of the test's own (Debian's `prometheus`) on a free loopback port,
/// with its configuration and storage in a temporary folder; killed and reaped when dropped,
/// on every way out of the test. A machine without it fails the test:
/// scripts/install-deps.sh installs it.
struct Prometheus {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Prometheus {
    fn start(config: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start prometheus ({e}): scripts/install-deps.sh installs it")
            });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = {
            let _in_runtime = runtime.enter();
            reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap()
        };
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
            runtime,
            client,
        };
        let ready = format!("{}/-/ready", prometheus.url);
        wait_for("Prometheus to be ready", Duration::from_secs(60), || {
            let answer = prometheus
                .runtime
                .block_on(async { prometheus.client.get(&ready).send().await });
            answer.is_ok_and(|a| a.status() == 200)
        });
        prometheus
    }

    /// `GET /api/v1/<path>` with `params`: the answer's `data`, once its status is success.
    fn api(&self, path: &str, params: &[(&str, String)]) -> Value {
        let url = format!("{}/api/v1/{path}", self.url);
        let body: Value = self.runtime.block_on(async {
            let answer = self.client.get(&url).query(params).send().await.unwrap();
            answer.json().await.unwrap()
        });
        assert_eq!(body["status"], "success", "{path} {params:?}: {body}");
        body["data"].clone()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        kill(&mut self.child);
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("prometheus.log"));
            eprintln!("--- prometheus\n{}", log.unwrap_or_default());
        }
    }
}

/// The repository's file `rel`.
fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// `host:port` of a URL such as `http://127.0.0.1:9464/metrics`.
fn host_port(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or(url);
    rest.split('/').next().unwrap().to_owned()
}

/// A script that raises for the mini-batches holding `f0003` or `f0017` (isolated down to
/// those two items), half a second a mini-batch: the job's queue lives longer than
/// RabbitMQ's statistics interval (5 s), so its plugin reports it.
const FAILS_TWO: &str = "import time\ndef run(mini_batch):\n    time.sleep(0.5)\n    if any(p.endswith(('f0003.txt', 'f0017.txt')) for p in mini_batch):\n        raise ValueError('bad item')\n    return [open(p).read() for p in mini_batch]\n";

/// Every panel of deploy/grafana/fleetrun.json returns data from a real Prometheus that
/// scraped a fleet (two workers and `serve` with --metrics-addr, RabbitMQ's plugin) while it
/// ran a job with failed items, over the time of the test as Grafana asks for it
/// (`query_range`, `$pool` set to the fleet's pool); and the rules of
/// deploy/prometheus/alerts.yml load and evaluate without error.
#[test]
fn every_dashboard_panel_returns_data_from_prometheus_scraping_a_fleet() {
    let mut fleet = Fleet::new(FAILS_TWO);
    fleet.inputs(60);
    let metrics = ["--metrics-addr", "127.0.0.1:0"];
    fleet.worker_with("p1", 2, &[], &metrics);
    fleet.worker_with("p2", 1, &[], &metrics);
    let workers = [metrics_url(&fleet, "p1"), metrics_url(&fleet, "p2")];
    let (_serve, urls) = fleet.serve_with("t0ken", &metrics);
    let rabbitmq = std::env::var("FLEETRUN_TEST_RABBITMQ_PROMETHEUS")
        .unwrap_or_else(|_| "127.0.0.1:15693".to_owned());
    let quoted = |urls: &[&str]| {
        let quoted: Vec<String> = urls
            .iter()
            .map(|u| format!("\"{}\"", host_port(u)))
            .collect();
        quoted.join(", ")
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - \"{alerts}\"\nscrape_configs:\n  - job_name: fleetrun-workers\n    static_configs:\n      - targets: [{workers}]\n  - job_name: fleetrun-serve\n    static_configs:\n      - targets: [{serve}]\n  - job_name: rabbitmq\n    metrics_path: /metrics/detailed\n    params:\n      family: [queue_coarse_metrics]\n    static_configs:\n      - targets: [\"{rabbitmq}\"]\n",
        alerts = repo_file("deploy/prometheus/alerts.yml").display(),
        workers = quoted(&[&workers[0], &workers[1]]),
        serve = quoted(&[&urls[1]]),
    );
    let prometheus = Prometheus::start(&config);
    wait_for("every target up", Duration::from_secs(60), || {
        let up = prometheus.api("query", &[("query", "up == 1".to_owned())]);
        up["result"].as_array().unwrap().len() == 4
    });
    let start = fleetrun_common::ledger::unix_now();

    let id = format!("dash-{}", random_suffix());
    let job = fleet.s3_job(
        "mini_batch_size = 2\nrun_max_try = 1\nerror_threshold = 10\nallowed_failed_count = 10",
    );
    let mut submit = spawn_submit_as(&fleet, &job, &id);
    assert!(submit.exit_within(RUN_LIMIT).success(), "the job completes");
    // Prometheus has scraped the pool with no job active, after the job's end.
    let idle = format!("fleetrun_pool_jobs_active{{pool=\"{}\"}} == 0", fleet.pool);
    wait_for(
        "Prometheus to see the job end",
        Duration::from_secs(30),
        || {
            let ended = prometheus.api("query", &[("query", idle.clone())]);
            !ended["result"].as_array().unwrap().is_empty()
        },
    );
    let failed =
        format!("max_over_time(fleetrun_job_items{{job_id=\"{id}\",result=\"failed\"}}[5m])");
    let failed = prometheus.api("query", &[("query", failed)]);
    assert_eq!(failed["result"][0]["value"][1], "2", "{failed}");

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("deploy/grafana/fleetrun.json")).unwrap(),
    )
    .unwrap();
    let end = fleetrun_common::ledger::unix_now();
    let mut empty = Vec::new();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$pool", &fleet.pool);
            assert!(
                !expr.contains('$'),
                "a dashboard variable left unset in {expr}"
            );
            let data = prometheus.api(
                "query_range",
                &[
                    ("query", expr.clone()),
                    ("start", format!("{start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", "1".to_owned()),
                ],
            );
            queries += 1;
            let series = data["result"].as_array().unwrap();
            if series
                .iter()
                .all(|s| s["values"].as_array().unwrap().is_empty())
            {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
        }
    }
    assert!(queries >= 13, "{queries} queries");
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );

    // Every alert rule has been evaluated, without error.
    let alerts = std::fs::read_to_string(repo_file("deploy/prometheus/alerts.yml"))
        .unwrap()
        .lines()
        .filter(|line| line.trim_start().starts_with("- alert:"))
        .count();
    assert!(alerts >= 7, "{alerts} alert rules");
    wait_for("the alert rules evaluated", Duration::from_secs(30), || {
        let rules = prometheus.api("rules", &[]);
        let all: Vec<&Value> = rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        all.len() == alerts && all.iter().all(|r| r["health"] == "ok")
    });
}
