//! The flow tier: a worker (`job::serve`: the agent, the job watchers, the dead-letter
//! recorder) on the embedded queue, ledger and registry, with fake runners and paused time.
//! The job is registered and published as `fleetrun submit` does; each test scripts what
//! `init()` and `run()` do and checks what the job comes to: its counts, its state and
//! reason, its log files. Hours of job time pass in moments.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleetrun_common::events::{JobEvent, MemoryEvents};
use fleetrun_common::ledger::{JobState, Limits, MemoryLedger, MemoryRegistry, Status};
use fleetrun_common::queue::{MemoryQueue, QueueOptions};
use fleetrun_common::storage::s3::S3Settings;
use fleetrun_common::wire::MiniBatch;
use fleetrun_config::MiniBatchSize;
use fleetrun_worker::agent::DEFAULT_PREFETCH;
use fleetrun_worker::agent::share::SHARE_PERIOD;
use fleetrun_worker::job::{self, Fleet, JobRecord, WorkerConfig};
use fleetrun_worker::logs;
use fleetrun_worker::metrics::Metrics;
use fleetrun_worker::testing::{FakeLauncher, Init, Run};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NODE: &str = "0";
const POOL: &str = "flow";
const JOB: &str = "flow-job";
/// Longer than any test's job: a job still running then is a failure.
const LONGEST: Duration = Duration::from_secs(24 * 3600);

struct Options {
    /// Runner slots of the worker.
    processes: usize,
    /// Start the runners before taking work, as `fleetrun run` does.
    warm: bool,
    /// Publish the mini-batches and seal the total.
    publish: bool,
    delivery_limit: Option<u32>,
    /// The worker is the job's only node, as in `fleetrun run`.
    sole_node: bool,
    /// Init failures other nodes already counted for the job.
    other_init_failures: u64,
    /// Submit the job once the worker serves its pool, not before it starts.
    submit_late: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            processes: 1,
            warm: true,
            publish: true,
            delivery_limit: None,
            sole_node: true,
            other_init_failures: 0,
            submit_late: false,
        }
    }
}

/// A job served by one worker of an embedded fleet.
struct Flow {
    dir: tempfile::TempDir,
    fleet: Fleet,
    queue: MemoryQueue,
    drain: CancellationToken,
    abort: CancellationToken,
    worker: Option<tokio::task::JoinHandle<()>>,
    started: Instant,
    /// Every event of the job's state, as a service bound to them hears them.
    heard: tokio::sync::broadcast::Receiver<JobEvent>,
    /// What the worker counted, as its `/metrics` shows it.
    metrics: Arc<Metrics>,
}

impl Flow {
    /// A job over `files` input files (`f00.txt`, …), its job file holding `settings`,
    /// registered and (unless told otherwise) published, and a worker serving it.
    async fn start(fake: &FakeLauncher, settings: &str, files: usize, options: Options) -> Flow {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("score.py"), "def run(b): return b\n").unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let names: Vec<String> = (0..files).map(|i| format!("f{i:02}.txt")).collect();
        for name in &names {
            std::fs::write(dir.path().join("data").join(name), name).unwrap();
        }
        let job_file = dir.path().join("job.toml");
        std::fs::write(
            &job_file,
            format!(
                "name = \"flow\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\n{settings}\n[input]\nfiles = \"data\"\n[output]\npath = \"out\"\n"
            ),
        )
        .unwrap();
        let spec = fleetrun_config::load(&job_file, &[]).unwrap();

        let queue = MemoryQueue::new(QueueOptions {
            delivery_limit: options.delivery_limit,
        });
        let events = MemoryEvents::new();
        let heard = events.subscribe();
        let fleet = Fleet {
            events: Arc::new(events.clone()),
            queue: Arc::new(queue.clone()),
            ledger: Arc::new(MemoryLedger::new()),
            registry: Arc::new(MemoryRegistry::new()),
            s3: S3Settings::default(),
            pool: POOL.to_owned(),
        };
        if !options.submit_late {
            submit(&fleet, &spec, &names, &options).await;
        }
        let config = WorkerConfig {
            node_id: NODE.to_owned(),
            processes: options.processes,
            prefetch: DEFAULT_PREFETCH,
            runner_exe: PathBuf::from("fleetrun-runner"),
            launcher: fake.shared(),
            cache_dir: dir.path().join("cache"),
            gpus: 0,
            warm_job: options.warm.then(|| JOB.to_owned()),
            sole_node: options.sole_node,
            metrics: Arc::new(Metrics::new()),
        };
        let metrics = config.metrics.clone();
        let drain = CancellationToken::new();
        let abort = CancellationToken::new();
        let worker = tokio::spawn(job::serve(
            config,
            fleet.clone(),
            drain.clone(),
            abort.clone(),
        ));
        if options.submit_late {
            // The worker serves its pool, and has found it without a job.
            tokio::time::sleep(Duration::from_millis(10)).await;
            submit(&fleet, &spec, &names, &options).await;
        }
        Flow {
            dir,
            fleet,
            queue,
            drain,
            abort,
            worker: Some(worker),
            started: Instant::now(),
            heard,
            metrics,
        }
    }

    /// The value of one of the worker's metrics, as `/metrics` shows it
    /// (`fleetrun_mini_batches_total{result="raised"}`).
    fn metric(&self, series: &str) -> f64 {
        let text = self.metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .parse()
            .unwrap()
    }

    /// The events heard until the job's end was: each state the job moved to, in order.
    async fn heard(&mut self) -> Vec<JobEvent> {
        let mut heard = Vec::new();
        loop {
            match self.heard.try_recv() {
                Ok(event) => {
                    let end = event.state.is_terminal();
                    heard.push(event);
                    if end {
                        return heard;
                    }
                }
                Err(tokio::sync::broadcast::error::TryRecvError::Empty) => {
                    assert!(self.started.elapsed() < LONGEST, "no end heard: {heard:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{e}: {heard:?}"),
            }
        }
    }

    /// Another worker (node `node`, `processes` slots, not the job's only node) serving the
    /// same fleet, with its own fake runners. Cancel the token to stop it at once.
    fn another_worker(
        &self,
        fake: &FakeLauncher,
        node: &str,
        processes: usize,
    ) -> (tokio::task::JoinHandle<()>, CancellationToken) {
        let config = WorkerConfig {
            node_id: node.to_owned(),
            processes,
            prefetch: DEFAULT_PREFETCH,
            runner_exe: PathBuf::from("fleetrun-runner"),
            launcher: fake.shared(),
            cache_dir: self.dir.path().join(format!("cache-{node}")),
            gpus: 0,
            warm_job: None,
            sole_node: false,
            metrics: Default::default(),
        };
        let abort = CancellationToken::new();
        let worker = tokio::spawn(job::serve(
            config,
            self.fleet.clone(),
            self.drain.clone(),
            abort.clone(),
        ));
        (worker, abort)
    }

    /// Stops the first worker at once, as a second signal does: its runners are killed and
    /// what it held goes back to the queue.
    async fn stop_first_worker(&mut self) {
        self.abort.cancel();
        let worker = self.worker.take().unwrap();
        tokio::time::timeout(Duration::from_secs(60), worker)
            .await
            .expect("the worker stops")
            .unwrap();
    }

    async fn status(&self) -> Status {
        self.fleet.ledger.status(JOB).await.unwrap().unwrap()
    }

    /// Waits for the job to end and its results to be written, then drains the worker.
    /// Returns the job's final status and how long (in virtual time) it took to end.
    async fn end(&mut self) -> (Status, Duration) {
        let (status, ended) = loop {
            let status = self.status().await;
            if status.state.is_terminal() {
                break (status, self.started.elapsed());
            }
            assert!(self.started.elapsed() < LONGEST, "never ended: {status:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Whoever ended the job writes its results just after; the error summary last.
        while !self.log_path(logs::JOB_ERROR).is_file() {
            assert!(self.started.elapsed() < LONGEST, "no results: {status:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.drain.cancel();
        if let Some(worker) = self.worker.take() {
            tokio::time::timeout(Duration::from_secs(600), worker)
                .await
                .expect("the worker drains")
                .unwrap();
        }
        (status, ended)
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    fn log_path(&self, rel: &str) -> PathBuf {
        self.out().join("logs").join(rel)
    }

    /// A log file's text.
    fn log(&self, rel: &str) -> String {
        let path = self.log_path(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn output(&self) -> String {
        std::fs::read_to_string(self.out().join("parallel_run_step.txt")).unwrap()
    }
}

/// Registers the job over the files `names` and (unless told otherwise) publishes it, as
/// `fleetrun submit` does: its first state is told to the fleet's events.
async fn submit(
    fleet: &Fleet,
    spec: &fleetrun_config::JobSpec,
    names: &[String],
    options: &Options,
) {
    let limits = Limits {
        error_threshold: spec.error_threshold,
        allowed_failed_count: spec.allowed_failed_count,
        allowed_failed_percent: spec.allowed_failed_percent,
    };
    fleet.ledger.create(JOB, limits).await.unwrap();
    let record = JobRecord::new(spec.clone(), POOL);
    fleet
        .registry
        .register(JOB, POOL, &record.encode())
        .await
        .unwrap();
    // The job's first state, told as the submitter tells it.
    let running = fleetrun_common::testing::events::event(JOB, JobState::Running);
    fleet
        .events
        .publish(&JobEvent {
            pool: POOL.to_owned(),
            ..running
        })
        .await
        .unwrap();
    for _ in 0..options.other_init_failures {
        fleet.registry.add_init_failure(JOB).await.unwrap();
    }
    if options.publish {
        let MiniBatchSize::Files(size) = spec.mini_batch_size else {
            unreachable!("a file input")
        };
        let batches: Vec<_> = names.chunks(size as usize).collect();
        for (index, items) in batches.iter().enumerate() {
            let batch = MiniBatch::new(JOB, index as u64, items.to_vec());
            fleet.queue.publish(JOB, batch.encode()).await.unwrap();
        }
        let total = batches.len() as u64;
        fleet.ledger.created(JOB, total).await.unwrap();
        fleet.ledger.seal(JOB, total).await.unwrap();
    }
}

fn assert_contains(text: &str, wanted: &str) {
    assert!(text.contains(wanted), "{wanted:?} not in:\n{text}");
}

/// The job failed for `reason`, and its result file gives it as the cause.
fn assert_failed(flow: &Flow, status: &Status, reason: &str) {
    assert_eq!(status.state, JobState::Failed, "{status:?}");
    assert_eq!(status.reason.as_deref(), Some(reason));
    let result = flow.log(logs::JOB_RESULT);
    assert_contains(&result, "Result: Failed\n");
    assert_contains(&result, &format!("Cause: {reason}\n"));
}

/// The job ended between `from` and `to` seconds (virtual) after the worker started.
fn assert_ended_within(ended: Duration, from: u64, to: u64) {
    let window = Duration::from_secs(from)..=Duration::from_secs(to);
    assert!(window.contains(&ended), "ended after {ended:?}");
}

fn counts(status: &Status) -> (u64, u64, u64, u64) {
    (
        status.done,
        status.batches_failed,
        status.items_succeeded,
        status.items_failed,
    )
}

/// A `run()` that returns fewer elements than items: with `error_threshold` at 0 or more
/// the gap is failed items and the mini-batch fails (once: it is not retried), its rows are
/// kept and every one of its items is in `failed_items.csv`; with `-1` returns are not
/// checked and the job did what it was asked: nothing failed.
#[tokio::test(start_paused = true)]
async fn short_returns_fail_their_mini_batch_only_when_error_threshold_checks_them() {
    let short = |call: &fleetrun_worker::testing::Call| match call.mini_batch {
        0 => Run::Return(vec!["only-one".into()]),
        1 => Run::Return(Vec::new()),
        _ => Run::Rows,
    };
    let fake = FakeLauncher::new().run(short);
    let checked = "mini_batch_size = 2\nerror_threshold = 10";
    let mut flow = Flow::start(&fake, checked, 6, Options::default()).await;
    let (status, _) = flow.end().await;
    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (3, 2, 3, 3));
    assert_eq!(fake.tries(0).len(), 1, "a short return is not retried");
    assert_eq!(flow.output(), "only-one\nf04.txt\nf05.txt\n");
    assert_eq!(
        flow.log(logs::FAILED_ITEMS_CSV),
        format!(
            "{}\n{}\n{}\n{}\n{}\n",
            logs::FAILED_ITEMS_HEADER,
            "f00.txt,0,1,run() returned 1 elements for 2 items; 1 of them failed (which ones is not known)",
            "f01.txt,0,1,run() returned 1 elements for 2 items; 1 of them failed (which ones is not known)",
            "f02.txt,1,1,run() returned 0 elements for 2 items; 2 of them failed (which ones is not known)",
            "f03.txt,1,1,run() returned 0 elements for 2 items; 2 of them failed (which ones is not known)",
        )
    );

    let fake = FakeLauncher::new().run(short);
    let unchecked = "mini_batch_size = 2\nerror_threshold = -1\nallowed_failed_count = 0";
    let mut flow = Flow::start(&fake, unchecked, 6, Options::default()).await;
    let (status, _) = flow.end().await;
    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (3, 0, 6, 0));
    assert!(!flow.log_path(logs::FAILED_ITEMS_CSV).exists());
    assert_contains(&flow.log(logs::JOB_RESULT), "Items: 6 succeeded, 0 failed");
    assert_contains(
        &flow.log(logs::REPORT_CSV),
        "returned 0 elements for 2 items; not checked (error_threshold = -1)",
    );
}

/// Without isolation (ParallelRunStep's behaviour), a mini-batch raising at every attempt
/// fails whole after exactly `run_max_try` attempts: its items are listed in
/// `failed_items.csv`, the others' rows are the output, and the job completes (no threshold
/// is exceeded).
#[tokio::test(start_paused = true)]
async fn a_mini_batch_raising_every_time_fails_whole_after_run_max_try_attempts() {
    let fake = FakeLauncher::new().run(|call| match call.mini_batch {
        1 => Run::Raise("bad input".into()),
        _ => Run::Rows,
    });
    let settings = "mini_batch_size = 2\nrun_max_try = 3\nisolate_failures = false";
    let mut flow = Flow::start(&fake, settings, 6, Options::default()).await;
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (3, 1, 4, 2));
    let tries = fake.tries(1);
    assert_eq!(tries.len(), 3, "{tries:?}");
    assert!(tries.iter().all(|t| t.result == "raised"), "{tries:?}");
    assert_eq!(fake.tries(0).len(), 1);
    assert_eq!(
        flow.log(logs::FAILED_ITEMS_CSV),
        format!(
            "{}\nf02.txt,1,3,bad input\nf03.txt,1,3,bad input\n",
            logs::FAILED_ITEMS_HEADER
        )
    );
    assert_eq!(flow.output(), "f00.txt\nf01.txt\nf04.txt\nf05.txt\n");
    let result = |r| format!("fleetrun_mini_batches_total{{result=\"{r}\"}}");
    assert_eq!(flow.metric(&result("succeeded")), 2.0);
    assert_eq!(flow.metric(&result("raised")), 3.0);
    assert_eq!(flow.metric(&result("failed_whole")), 1.0);
    // Items are counted for the mini-batches whose run() returned.
    assert_eq!(
        flow.metric("fleetrun_items_total{result=\"succeeded\"}"),
        4.0
    );
    assert_eq!(flow.metric("fleetrun_run_seconds_count"), 5.0);
    assert_eq!(flow.metric("fleetrun_mini_batches_in_flight"), 0.0);
}

/// Whether a `run()` call was given the file `name`.
fn holds(call: &fleetrun_worker::testing::Call, name: &str) -> bool {
    call.items.iter().any(|p| p.ends_with(name))
}

/// One bad file in a mini-batch of ten costs only itself: once the mini-batch has failed its
/// attempts, its halves run again, down to the file that fails alone. The output keeps every
/// other row in input order; `failed_items.csv` names the one file with its own error; the
/// counts see one failed item; the extra `run()` calls stay within `2⌈log₂ 10⌉`.
#[tokio::test(start_paused = true)]
async fn one_bad_file_is_isolated_and_its_mini_batch_keeps_the_other_rows() {
    let fake = FakeLauncher::new().run(|call| {
        if holds(call, "f13.txt") {
            Run::Raise("cannot read f13".into())
        } else {
            Run::Rows
        }
    });
    let settings = "mini_batch_size = 10\nrun_max_try = 2";
    let mut flow = Flow::start(&fake, settings, 20, Options::default()).await;
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (2, 1, 19, 1));
    let expected: String = (0..20)
        .filter(|i| *i != 13)
        .map(|i| format!("f{i:02}.txt\n"))
        .collect();
    assert_eq!(flow.output(), expected);
    assert_eq!(
        flow.log(logs::FAILED_ITEMS_CSV),
        format!(
            "{}\nf13.txt,1,2,cannot read f13\n",
            logs::FAILED_ITEMS_HEADER
        )
    );
    // Two attempts of the whole, then halves in input order, a failed one split before the
    // next is run: 10-14 (fails), 10-12, 13-14 (fails), 13 (fails alone), 14, 15-19.
    let tries = fake.tries(1);
    let sizes: Vec<usize> = tries.iter().map(|t| t.call.items.len()).collect();
    assert_eq!(sizes, [10, 10, 5, 3, 2, 1, 1, 5], "{tries:?}");
    assert!(sizes.len() - 2 <= 2 * 4);
    let report = flow.log(logs::REPORT_CSV);
    assert_contains(&report, "\n1,2,isolated,10,9,1,");
    assert_contains(&report, "isolating items 4-4 of 10: cannot read f13");
    let result = |r| format!("fleetrun_mini_batches_total{{result=\"{r}\"}}");
    assert_eq!(flow.metric(&result("isolated")), 1.0);
    assert_eq!(flow.metric(&result("failed_whole")), 0.0);
    assert_eq!(flow.metric("fleetrun_items_total{result=\"failed\"}"), 1.0);
}

/// A `run()` that runs out of GPU memory above three files spends no attempt and fails no
/// file: its mini-batch runs again at once in pieces (halved until they fit), the node
/// keeps the size, and its next mini-batch starts in pieces of it; the report counts the
/// runs out of memory apart from `raised`.
#[tokio::test(start_paused = true)]
async fn a_mini_batch_that_runs_out_of_gpu_memory_runs_in_pieces_at_the_size_that_fits() {
    let fake = FakeLauncher::new().run(|call| {
        if call.items.len() > 3 {
            Run::Raise("CUDA out of memory. Tried to allocate 2.00 GiB".into())
        } else {
            Run::Rows
        }
    });
    let settings = "mini_batch_size = 10\nrun_max_try = 1\nisolate_failures = false";
    let mut flow = Flow::start(&fake, settings, 80, Options::default()).await;
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (8, 0, 80, 0));
    let expected: String = (0..80).map(|i| format!("f{i:02}.txt\n")).collect();
    assert_eq!(flow.output(), expected);
    // The whole runs out, then its first half; then pieces of 3, the rest cut afresh.
    let sizes = |index| -> Vec<usize> {
        let tries = fake.tries(index);
        tries.iter().map(|t| t.call.items.len()).collect()
    };
    assert_eq!(sizes(0), [10, 5, 3, 3, 3, 1]);
    // The last mini-batch starts at the size that fits (those sent to the runner ahead,
    // before the first ran out, ran whole once).
    assert_eq!(sizes(7), [3, 3, 3, 1]);
    let report = flow.log(logs::REPORT_CSV);
    // One attempt each, none spent on memory, nothing raised.
    assert_contains(&report, "\n0,1,out_of_gpu_memory,10,0,0,");
    assert_contains(&report, "\n0,1,split,10,10,0,");
    assert_contains(
        &report,
        "in pieces of at most 3 items: 5 runs, 1 out of GPU memory;",
    );
    assert!(!report.contains(",raised,"), "{report}");
    let result = |r| format!("fleetrun_mini_batches_total{{result=\"{r}\"}}");
    assert_eq!(flow.metric(&result("raised")), 0.0);
    assert_eq!(flow.metric(&result("split")), 8.0);
    assert!(flow.metric(&result("out_of_gpu_memory")) >= 2.0);
}

/// A file that runs out of GPU memory alone fails as such, even where the job does not
/// isolate failures: the other files of its mini-batch keep their rows.
#[tokio::test(start_paused = true)]
async fn a_file_that_runs_out_of_gpu_memory_alone_fails_alone() {
    let fake = FakeLauncher::new().run(|call| {
        if holds(call, "f04.txt") {
            Run::Raise("CUDA out of memory. Tried to allocate 80.00 GiB".into())
        } else {
            Run::Rows
        }
    });
    let settings = "mini_batch_size = 8\nisolate_failures = false";
    let mut flow = Flow::start(&fake, settings, 8, Options::default()).await;
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (1, 1, 7, 1));
    assert_eq!(
        flow.log(logs::FAILED_ITEMS_CSV),
        format!(
            "{}\nf04.txt,0,1,out of GPU memory alone: CUDA out of memory. Tried to allocate 80.00 GiB\n",
            logs::FAILED_ITEMS_HEADER
        )
    );
}

/// A file whose `run()` hangs is isolated as one that raises: each run holding it is killed
/// at `run_invocation_timeout`, a new runner takes the next piece, and only that file fails.
#[tokio::test(start_paused = true)]
async fn a_file_that_hangs_run_is_isolated_at_the_timeout() {
    let fake = FakeLauncher::new().run(|call| {
        if holds(call, "f02.txt") {
            Run::Hang
        } else {
            Run::Rows
        }
    });
    let settings = "mini_batch_size = 4\nrun_max_try = 1\nrun_invocation_timeout = 60";
    let mut flow = Flow::start(&fake, settings, 4, Options::default()).await;
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (1, 1, 3, 1));
    assert_eq!(flow.output(), "f00.txt\nf01.txt\nf03.txt\n");
    assert_eq!(
        flow.log(logs::FAILED_ITEMS_CSV),
        format!(
            "{}\nf02.txt,0,1,run() exceeded run_invocation_timeout (60s); the process was killed\n",
            logs::FAILED_ITEMS_HEADER
        )
    );
    let results: Vec<&str> = fake.tries(0).iter().map(|t| t.result).collect();
    assert_eq!(
        results,
        ["timed out", "rows", "timed out", "timed out", "rows"]
    );
}

/// A job that asks for ParallelRunStep's behaviour (`isolate_failures = false`) and a
/// mini-batch of one file are never split.
#[tokio::test(start_paused = true)]
async fn a_mini_batch_of_one_file_fails_alone_without_isolation_runs() {
    let fake = FakeLauncher::new().run(|call| {
        if holds(call, "f01.txt") {
            Run::Raise("bad".into())
        } else {
            Run::Rows
        }
    });
    let settings = "mini_batch_size = 1\nrun_max_try = 2";
    let mut flow = Flow::start(&fake, settings, 3, Options::default()).await;
    let (status, _) = flow.end().await;
    assert_eq!(counts(&status), (3, 1, 2, 1));
    assert_eq!(fake.tries(1).len(), 2);
    assert_eq!(flow.output(), "f00.txt\nf02.txt\n");
}

/// A `run()` that hangs is killed at exactly `run_invocation_timeout` and the mini-batch
/// is tried again, on a new process.
#[tokio::test(start_paused = true)]
async fn a_hung_run_is_killed_at_run_invocation_timeout_and_retried() {
    let fake = FakeLauncher::new().run(|call| match call.try_number {
        1 => Run::Hang,
        _ => Run::Rows,
    });
    let settings = "mini_batch_size = 1\nrun_invocation_timeout = 60";
    let mut flow = Flow::start(&fake, settings, 1, Options::default()).await;
    let (status, ended) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (1, 0, 1, 0));
    let tries = fake.tries(0);
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert_eq!(tries[0].result, "timed out");
    assert_eq!(tries[0].ended - tries[0].started, Duration::from_secs(60));
    assert_eq!(tries[1].result, "rows");
    assert_ne!(tries[0].call.process, tries[1].call.process);
    assert_eq!((fake.starts(), fake.kills()), (2, 1));
    assert!(ended >= Duration::from_secs(60), "{ended:?}");
    assert_contains(
        &flow.log(&logs::JobLogs::node_main(NODE)),
        "process000 killed: mini-batch 0 run() exceeded run_invocation_timeout (60s); the process was killed.",
    );
    let report = flow.log(logs::REPORT_CSV);
    assert_contains(&report, "\n0,1,timeout,1,0,0,0,process000,");
    assert_contains(&report, "\n0,2,succeeded,1,1,0,0,process001,");
    assert_eq!(flow.output(), "f00.txt\n");
    let result = |r| format!("fleetrun_mini_batches_total{{result=\"{r}\"}}");
    assert_eq!(flow.metric(&result("timeout")), 1.0);
    assert_eq!(flow.metric(&result("succeeded")), 1.0);
    assert_eq!(flow.metric("fleetrun_runner_starts_total"), 2.0);
    // Killed at the timeout, it did not die of itself.
    assert_eq!(flow.metric("fleetrun_runner_deaths_total"), 0.0);
}

/// Runs four one-file mini-batches, of which 1 and 2 raise, under `settings`.
async fn two_of_four_failing(settings: &str) -> (Flow, Status) {
    let fake = FakeLauncher::new().run(|call| match call.mini_batch {
        1 | 2 => Run::Raise(format!("bad {}", call.mini_batch)),
        _ => Run::Rows,
    });
    let settings = format!("mini_batch_size = 1\nrun_max_try = 1\n{settings}");
    let mut flow = Flow::start(&fake, &settings, 4, Options::default()).await;
    let (status, _) = flow.end().await;
    (flow, status)
}

/// `allowed_failed_count` fails the job once more mini-batches than it allows have
/// failed, with the reason naming the rule; at the limit the job completes.
#[tokio::test(start_paused = true)]
async fn allowed_failed_count_fails_the_job_past_its_limit() {
    let (flow, status) = two_of_four_failing("allowed_failed_count = 1").await;
    let reason = "allowed_failed_count exceeded: 2 failed mini-batches > 1";
    assert_failed(&flow, &status, reason);
    assert_contains(&flow.log(logs::PROGRESS_OVERVIEW), "Result: Failed\n");

    let (_, status) = two_of_four_failing("allowed_failed_count = 2").await;
    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (4, 2, 2, 2));
}

/// Each change of a job's state is heard once, from whoever made it: Finalizing and
/// Completed for a job that completes, Failed (with its cause and counts) for one a limit
/// fails; nothing after the end.
#[tokio::test(start_paused = true)]
async fn every_change_of_a_jobs_state_is_an_event_once() {
    let (mut flow, _) = two_of_four_failing("allowed_failed_count = 2").await;
    let heard = flow.heard().await;
    let states: Vec<JobState> = heard.iter().map(|e| e.state).collect();
    // Running is the submitter's; the worker tells the rest.
    assert_eq!(
        states,
        [JobState::Running, JobState::Finalizing, JobState::Completed]
    );
    let completed = &heard[2];
    assert_eq!(
        (
            completed.job_id.as_str(),
            completed.name.as_str(),
            completed.pool.as_str()
        ),
        (JOB, "flow", POOL)
    );
    assert_eq!(completed.counts.completed_mini_batches, 4);
    assert_eq!(completed.counts.failed_items, 2);
    assert!(
        completed.output.ends_with("out/parallel_run_step.txt"),
        "{completed:?}"
    );
    assert_eq!(completed.routing_key(), "job.completed");

    let (mut flow, _) = two_of_four_failing("allowed_failed_count = 1").await;
    let heard = flow.heard().await;
    assert_eq!(heard.len(), 2, "{heard:?}");
    assert_eq!(heard[1].state, JobState::Failed);
    let cause = heard[1].cause.as_deref().unwrap_or_default();
    assert!(
        cause.starts_with("allowed_failed_count exceeded"),
        "{cause}"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(flow.heard.try_recv().is_err(), "an event after the end");
}

/// `allowed_failed_percent` fails the job once the failed share of all mini-batches is
/// over it, with the reason naming the rule; at the limit the job completes.
#[tokio::test(start_paused = true)]
async fn allowed_failed_percent_fails_the_job_past_its_limit() {
    let (flow, status) = two_of_four_failing("allowed_failed_percent = 25").await;
    let reason = "allowed_failed_percent exceeded: 2 of 4 mini-batches failed (> 25%)";
    assert_failed(&flow, &status, reason);

    let (_, status) = two_of_four_failing("allowed_failed_percent = 50").await;
    assert_eq!(status.state, JobState::Completed, "{status:?}");
}

/// Runners that fail to start (init raises, or the process exits) cost the mini-batch no
/// attempt: with `run_max_try = 1` it still runs, once, on the first runner that starts.
#[tokio::test(start_paused = true)]
async fn init_failures_cost_no_attempt() {
    let fake = FakeLauncher::new().init(|start| match start {
        1 => Init::Fail("no model".into()),
        2 => Init::Die(3),
        _ => Init::Ready,
    });
    // Three failures allowed: 3 × 1 process.
    let settings = "run_max_try = 1\nrun_invocation_timeout = 20";
    let options = Options {
        warm: false,
        ..Options::default()
    };
    let mut flow = Flow::start(&fake, settings, 1, options).await;
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (1, 0, 1, 0));
    assert_eq!(fake.starts(), 3);
    let tries = fake.tries(0);
    assert_eq!(tries.len(), 1, "{tries:?}");
    assert_eq!(tries[0].call.process, "process002");
    let main = flow.log(&logs::JobLogs::node_main(NODE));
    for line in [
        "process000 failed to start: init() failed: no model",
        "process001 failed to start: the process exited with returncode 3 during init",
        "process002 started: pid 1003",
    ] {
        assert_contains(&main, line);
    }
    assert_contains(
        &flow.log(logs::REPORT_CSV),
        "\n0,1,succeeded,1,1,0,0,process002,",
    );
    assert_contains(&flow.log(logs::USER_ERROR), "0 process000 init: no model");
    assert_contains(
        &flow.log(&logs::JobLogs::user_error(NODE, "process000")),
        "Exception: no model",
    );
}

/// An `init()` stuck past `3 × run_invocation_timeout + 30` while another runner of the job
/// is ready is one failed start (CONTRACT §5), not a failed job: its mini-batch goes back
/// untried and runs once, on a ready runner.
#[tokio::test(start_paused = true)]
async fn a_stuck_init_beside_a_ready_runner_is_a_failed_start() {
    let fake = FakeLauncher::new().init(|start| match start {
        1 => Init::Hang,
        _ => Init::Ready,
    });
    let settings = "mini_batch_size = 1\nrun_max_try = 1\nrun_invocation_timeout = 20\nprocess_count_per_node = 2";
    let options = Options {
        processes: 2,
        warm: false,
        ..Options::default()
    };
    let mut flow = Flow::start(&fake, settings, 2, options).await;
    let (status, ended) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (2, 0, 2, 0));
    assert!(ended >= Duration::from_secs(90), "{ended:?}");
    // The mini-batch the stuck process held went back untried at 90 s and ran once, on a
    // ready process.
    let tries: Vec<_> = [fake.tries(0), fake.tries(1)].concat();
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert!(
        tries.iter().all(|t| t.call.process != "process000"),
        "{tries:?}"
    );
    let first = tries.iter().map(|t| t.started).min().unwrap();
    let last = tries.iter().map(|t| t.started).max().unwrap();
    assert!(last - first >= Duration::from_secs(80), "{tries:?}");
    assert_contains(
        &flow.log(&logs::JobLogs::node_main(NODE)),
        "process000 failed to start: init() did not finish within 90s (3 × run_invocation_timeout 20 + 30)",
    );
}

/// CONTRACT §5 rule 3: when every runner process is stuck in `init()` for
/// `3 × run_invocation_timeout + 30` seconds (33 s here), the job fails for lack of
/// progress then, not after rule 1's three stuck starts per process (99 s).
#[tokio::test(start_paused = true)]
async fn every_process_stuck_in_init_fails_the_job_at_the_init_limit() {
    let fake = FakeLauncher::new().init(|_| Init::Hang);
    let settings = "run_invocation_timeout = 1\nprocess_count_per_node = 2";
    let options = Options {
        processes: 2,
        ..Options::default()
    };
    let mut flow = Flow::start(&fake, settings, 4, options).await;
    let (status, ended) = flow.end().await;

    assert_eq!(status.state, JobState::Failed, "{status:?}");
    let reason = status.reason.clone().unwrap();
    assert!(
        reason.starts_with("no progress: every runner process on node 0 was stuck in init()"),
        "{reason}"
    );
    assert_contains(&reason, "init() did not finish within 33s");
    assert_ended_within(ended, 33, 34);
    assert_eq!(status.done, 0);
    assert!(fake.calls().is_empty());
}

/// A node gives up on a job after `3 × process_count_per_node` init failures; on the job's
/// only node that fails the job, with the reason naming the node.
#[tokio::test(start_paused = true)]
async fn a_node_gives_up_after_three_init_failures_per_process() {
    let fake = FakeLauncher::new().init(|_| Init::Fail("no model".into()));
    let options = Options {
        processes: 2,
        ..Options::default()
    };
    let mut flow = Flow::start(&fake, "process_count_per_node = 2", 4, options).await;
    let (status, ended) = flow.end().await;
    // Failures, not time, decide: the job fails as soon as the sixth start fails.
    assert_ended_within(ended, 0, 1);

    let reason = "no runner process could start: 6 runner processes failed to start on node 0; the last: init() failed: no model";
    assert_failed(&flow, &status, reason);
    assert_eq!(fake.starts(), 6);
    assert!(fake.calls().is_empty());
    assert_eq!(status.done, 0);
    assert_contains(
        &flow.log(&logs::JobLogs::node_main(NODE)),
        &format!("Giving up on job {JOB}: 6 runner processes failed to start on node 0"),
    );
}

/// CONTRACT §5 rule 2: with `node_count = 2` and one process per node, 2 × 2 × 1 = 4 failed
/// starts over the job fail it, but only once it has run 2 minutes. Another node counted
/// one; this one gives up after its 3 (rule 1) and leaves the job to the others, and the
/// job fails at 2 minutes.
#[tokio::test(start_paused = true)]
async fn init_failures_over_the_job_fail_it_once_it_has_run_two_minutes() {
    let fake = FakeLauncher::new().init(|_| Init::Fail("no model".into()));
    let options = Options {
        sole_node: false,
        other_init_failures: 1,
        ..Options::default()
    };
    let settings = "node_count = 2\nprocess_count_per_node = 1";
    let mut flow = Flow::start(&fake, settings, 4, options).await;
    let (status, ended) = flow.end().await;

    assert_eq!(status.state, JobState::Failed, "{status:?}");
    let reason = status.reason.clone().unwrap();
    assert!(
        reason.starts_with("4 runner processes failed to start over the job (the limit is 4: 2 × node_count 2 × 1 processes per node)"),
        "{reason}"
    );
    assert_eq!(fake.starts(), 3, "this node gave up after 3");
    assert_ended_within(ended, 120, 122);
}

/// A job submitted while a worker serves its pool idle starts at once: the worker hears the
/// job's first event and shares its slots out then, not at its next period.
#[tokio::test(start_paused = true)]
async fn a_job_submitted_to_an_idle_worker_starts_at_once() {
    let fake = FakeLauncher::new();
    let options = Options {
        warm: false,
        sole_node: false,
        submit_late: true,
        ..Options::default()
    };
    let mut flow = Flow::start(&fake, "mini_batch_size = 1", 2, options).await;
    let submitted = Instant::now();
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    let first = fake.calls().iter().map(|c| c.started).min().unwrap();
    let waited = first.duration_since(submitted);
    assert!(
        waited < SHARE_PERIOD / 10,
        "the first mini-batch started {waited:?} after the job was submitted"
    );
}

/// On a fleet node the job's `process_count_per_node` decides how many runners it gets, not
/// the worker's slots: a worker with 4 slots runs 2 runners for a job that asks for 2.
#[tokio::test(start_paused = true)]
async fn a_fleet_node_runs_the_jobs_process_count_not_its_slots() {
    let fake =
        FakeLauncher::new().run(|_| Run::After(Duration::from_secs(10), Box::new(Run::Rows)));
    let options = Options {
        processes: 4,
        warm: false,
        sole_node: false,
        ..Options::default()
    };
    let settings = "mini_batch_size = 1\nprocess_count_per_node = 2";
    let mut flow = Flow::start(&fake, settings, 12, options).await;
    let (status, ended) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(fake.starts(), 2);
    let mut processes: Vec<String> = fake.calls().into_iter().map(|c| c.call.process).collect();
    processes.sort();
    processes.dedup();
    assert_eq!(processes, ["process000", "process001"]);
    // Two at a time: 12 mini-batches of 10 s take 60 s.
    assert_ended_within(ended, 60, 64);
}

/// `node_count = 1` with two workers: one node takes the job's place and runs every
/// mini-batch while it serves; the other hands the job's mini-batches back untried. When
/// the first node stops, its place goes to the other, which finishes the job.
#[tokio::test(start_paused = true)]
async fn node_count_nodes_take_the_job_and_another_takes_a_stopped_ones_place() {
    let run = |_: &fleetrun_worker::testing::Call| {
        Run::After(Duration::from_secs(10), Box::new(Run::Rows))
    };
    let (first, second) = (FakeLauncher::new().run(run), FakeLauncher::new().run(run));
    let options = Options {
        warm: false,
        sole_node: false,
        ..Options::default()
    };
    let settings = "mini_batch_size = 1\nnode_count = 1\nprocess_count_per_node = 1";
    let mut flow = Flow::start(&first, settings, 6, options).await;
    // The first node has its place before the second starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (other, stop_other) = flow.another_worker(&second, "1", 2);
    tokio::time::sleep(Duration::from_secs(34)).await;
    assert_eq!(first.calls().len(), 3, "the first node's three runs");
    assert_eq!(second.starts(), 0, "the second node ran nothing");
    // The first node stops at once (its mini-batch in hand goes back untried).
    flow.stop_first_worker().await;
    let (status, _) = flow.end().await;
    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (6, 0, 6, 0));
    // The run the first node was killed in is not a call that ended: each ran once.
    assert_eq!(first.calls().len(), 3);
    assert_eq!(second.calls().len(), 3);
    assert_eq!(
        second.starts(),
        1,
        "one runner of the second node's two slots (process_count_per_node)"
    );
    assert_contains(
        &flow.log(&logs::JobLogs::node_main("1")),
        "Node 1 took one of the job's 1 node places (node_count).",
    );
    stop_other.cancel();
    other.await.unwrap();
}

/// A worker lost mid-job spends none of the script's attempts: with `run_max_try = 1` and
/// `error_threshold = 0`, the mini-batches it held (the one running, and those delivered
/// to it but never started) run on the other worker and the job completes with nothing
/// failed. Each mini-batch's report row numbers its attempt from the script's failures
/// only.
#[tokio::test(start_paused = true)]
async fn a_lost_worker_spends_none_of_the_scripts_attempts() {
    let run = |_: &fleetrun_worker::testing::Call| {
        Run::After(Duration::from_secs(10), Box::new(Run::Rows))
    };
    let (first, second) = (FakeLauncher::new().run(run), FakeLauncher::new().run(run));
    let options = Options {
        sole_node: false,
        ..Options::default()
    };
    let settings = "mini_batch_size = 1\nrun_max_try = 1\nerror_threshold = 0";
    let mut flow = Flow::start(&first, settings, 6, options).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(first.calls().len(), 1, "one run ended, the next running");
    flow.stop_first_worker().await;
    let (other, stop_other) = flow.another_worker(&second, "1", 1);
    let (status, _) = flow.end().await;
    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (6, 0, 6, 0));
    assert_eq!(second.calls().len(), 5);
    let report = flow.log(logs::REPORT_CSV);
    assert_eq!(report.matches(",1,succeeded,").count(), 6, "{report}");
    assert!(!flow.log_path(logs::FAILED_ITEMS_CSV).exists());
    stop_other.cancel();
    other.await.unwrap();
}

/// A job whose runs hang longer than `progress_update_timeout` fails as stalled when that
/// much time has passed without a mini-batch completing, and its hung run is killed.
#[tokio::test(start_paused = true)]
async fn a_job_making_no_progress_fails_at_progress_update_timeout() {
    let fake = FakeLauncher::new().run(|_| Run::Hang);
    let settings =
        "mini_batch_size = 1\nrun_invocation_timeout = 1000\nprogress_update_timeout = 300";
    let mut flow = Flow::start(&fake, settings, 2, Options::default()).await;
    let (status, ended) = flow.end().await;

    // The cause names the mini-batch in flight: its index, first item, node, process, how
    // long it has run (by the wall clock the nodes share: not paused here) and its attempt.
    let reason = status.reason.clone().unwrap_or_default();
    let stalled = "stalled: no mini-batch created or completed for 300s (progress_update_timeout); 0 of 2 done; in flight: mini-batch 0 (first item f00.txt) on node 0 process000 for ";
    assert!(reason.starts_with(stalled), "{reason}");
    assert!(reason.ends_with("s, attempt 1"), "{reason}");
    assert_failed(&flow, &status, &reason);
    // The watcher looks once a second.
    assert_ended_within(ended, 300, 303);
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    assert_eq!(fake.kills(), 1, "the hung run is killed once the job stops");
}

/// A job registered but never published (its submitter died first) fails at
/// `first_task_creation_timeout`, failed by a worker that never received one of its
/// mini-batches.
#[tokio::test(start_paused = true)]
async fn a_job_nothing_is_published_for_fails_at_first_task_creation_timeout() {
    let fake = FakeLauncher::new();
    let options = Options {
        warm: false,
        publish: false,
        ..Options::default()
    };
    let mut flow = Flow::start(&fake, "first_task_creation_timeout = 60", 2, options).await;
    let (status, ended) = flow.end().await;

    let reason = "mini-batch creation stopped: none created for 60s (first_task_creation_timeout) after 0, and all of them are done; submit the job again with the same --job-id to finish it";
    assert_failed(&flow, &status, reason);
    // Jobs nobody serves are looked over every 10 s.
    assert_ended_within(ended, 60, 71);
    assert_eq!(fake.starts(), 0);
}

/// A mini-batch the queue dead-letters (here past its delivery limit, before `run_max_try`
/// is reached) is recorded failed in the ledger, so the job ends instead of stalling.
#[tokio::test(start_paused = true)]
async fn a_dead_lettered_mini_batch_is_recorded_failed() {
    let fake = FakeLauncher::new().run(|call| match call.mini_batch {
        0 => Run::Raise("poison".into()),
        _ => Run::Rows,
    });
    let options = Options {
        delivery_limit: Some(1),
        ..Options::default()
    };
    let settings = "mini_batch_size = 1\nrun_max_try = 5";
    let mut flow = Flow::start(&fake, settings, 2, options).await;
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (2, 1, 1, 1));
    assert_eq!(
        fake.tries(0).len(),
        2,
        "delivered twice, then dead-lettered"
    );
    let failed = flow.log(logs::FAILED_ITEMS_CSV);
    assert_contains(&failed, "\nf00.txt,0,");
    assert_contains(&failed, ",dead-lettered by the broker (delivery_limit)\n");
    // Counted against its job, and kept in the dead-letter queue for operators.
    use fleetrun_common::queue::Queue;
    assert_eq!(flow.queue.depth(&[]).await.unwrap().dead, 1);
    assert_eq!(flow.output(), "f01.txt\n");
}

/// Every log file of CONTRACT.md §7 fleetrun writes (the script's own stdout, stderr and
/// logger files aside), by content, for a job where one mini-batch succeeds, one raises
/// once, one's process dies once and one raises at every attempt (and fails whole: this job
/// does not isolate).
#[tokio::test(start_paused = true)]
async fn the_log_files_tell_what_happened() {
    let fake = FakeLauncher::new().run(|call| match (call.mini_batch, call.try_number) {
        (1, 1) => Run::Raise("boom-1".into()),
        (2, 1) => Run::Die,
        (3, _) => Run::Raise("boom-3".into()),
        _ => Run::After(Duration::from_secs(2), Box::new(Run::Rows)),
    });
    let settings = "mini_batch_size = 2\nrun_max_try = 2\nisolate_failures = false";
    let mut flow = Flow::start(&fake, settings, 8, Options::default()).await;
    let (status, _) = flow.end().await;
    assert_eq!(status.state, JobState::Completed, "{status:?}");
    assert_eq!(counts(&status), (4, 1, 6, 2));
    assert_eq!(
        flow.output(),
        "f00.txt\nf01.txt\nf02.txt\nf03.txt\nf04.txt\nf05.txt\n"
    );
    // The worker's metrics count the same attempts.
    let result = |r| format!("fleetrun_mini_batches_total{{result=\"{r}\"}}");
    assert_eq!(flow.metric(&result("succeeded")), 3.0);
    assert_eq!(flow.metric(&result("raised")), 3.0);
    assert_eq!(flow.metric(&result("died")), 1.0);
    assert_eq!(flow.metric(&result("failed_whole")), 1.0);
    assert_eq!(flow.metric("fleetrun_runner_deaths_total"), 1.0);
    assert_eq!(
        flow.metric("fleetrun_items_total{result=\"succeeded\"}"),
        6.0
    );

    let result = flow.log(logs::JOB_RESULT);
    for line in [
        &format!("Job: {JOB}\n"),
        "Result: Completed\n",
        "Mini-batches: 4 processed of 4\n",
        "Items: 6 succeeded, 2 failed (error_threshold -1 (failures ignored))\n",
        "Mini-batches failed: 1\n",
    ] {
        assert_contains(&result, line);
    }
    let overview = flow.log(logs::PROGRESS_OVERVIEW);
    for line in [
        "Mini-batches created: 4 (all)\n",
        "Mini-batches processed: 4\n",
        "Items failed: 2\n",
        "Result: Completed\n",
    ] {
        assert_contains(&overview, line);
    }

    // Script errors: mini-batch 1 once, mini-batch 3 at both attempts.
    let errors = flow.log(logs::USER_ERROR);
    assert_eq!(errors.lines().count(), 3, "{errors}");
    assert_contains(&errors, " mini-batch 1 attempt 1: boom-1\n");
    assert_contains(&errors, " mini-batch 3 attempt 1: boom-3\n");
    assert_contains(&errors, " mini-batch 3 attempt 2: boom-3\n");
    let summary = flow.log(logs::JOB_ERROR);
    assert!(summary.starts_with("Script errors: 3\n"), "{summary}");
    assert_contains(&summary, "boom-1");

    let master = flow.log(logs::MASTER_ROLE);
    assert_contains(
        &master,
        &format!("Job {JOB} followed by node {NODE}: input "),
    );
    // Noted even though the worker stopped before its watcher looked again.
    assert_contains(&master, &format!("Job {JOB} ended Completed.\n"));

    // One report row per attempt: mini-batch, attempt, result, items, succeeded, failed,
    // node, process, …
    let report = flow.log(logs::REPORT_CSV);
    let mut rows: Vec<String> = report
        .lines()
        .skip(1)
        .map(|row| row.split(',').take(7).collect::<Vec<_>>().join(","))
        .collect();
    rows.sort();
    assert_eq!(report.lines().next(), Some(logs::REPORT_HEADER));
    assert_eq!(
        rows,
        [
            "0,1,succeeded,2,2,0,0",
            "1,1,raised,2,0,0,0",
            "1,2,succeeded,2,2,0,0",
            "2,1,died,2,0,0,0",
            "2,2,succeeded,2,2,0,0",
            "3,1,raised,2,0,0,0",
            "3,2,raised,2,0,0,0",
        ]
    );
    let died = report.lines().find(|r| r.starts_with("2,1,died,")).unwrap();
    let died_on = died.split(',').nth(7).unwrap();

    let main = flow.log(&logs::JobLogs::node_main(NODE));
    assert_contains(&main, "process000 started: pid 1001, Python 3.12.0 (fake)");
    assert_contains(&main, &format!("{died_on} exits with returncode -9."));
    // The process's own log: where it runs, each mini-batch picked and completed.
    let ip = fleetrun_worker::ip::node_ip();
    let process = flow.log(&logs::JobLogs::node_process(NODE, "process000"));
    assert_contains(
        &process,
        &format!("process000 started on node 0: ip {ip}, pid 1001.\n"),
    );
    assert_contains(
        &process,
        &format!("mini-batch 0 picked: attempt 1, items 2, ip {ip}, pid 1001.\n"),
    );
    assert_contains(
        &process,
        &format!(
            "mini-batch 0 completed: ip {ip}, pid 1001, items 2, succeeded 2, failed 0, started "
        ),
    );
    assert_contains(&process, ", run() 2.000s");
    // The node's system errors: the process that died, by name; script errors are not there.
    let died_errors = flow.log(&logs::JobLogs::sys_error(NODE, died_on));
    assert_eq!(died_errors.lines().count(), 1, "{died_errors}");
    assert_contains(
        &died_errors,
        &format!("{died_on} exits with returncode -9.\n"),
    );
    let errors: Vec<String> = std::fs::read_dir(flow.log_path("sys/error/0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        errors,
        [format!("{died_on}.txt")],
        "only the death is a system error"
    );

    assert_eq!(
        flow.log(logs::FAILED_ITEMS_CSV),
        format!(
            "{}\nf06.txt,3,2,boom-3\nf07.txt,3,2,boom-3\n",
            logs::FAILED_ITEMS_HEADER
        )
    );
    let raised_on = fake.tries(3)[0].call.process.clone();
    let tracebacks = flow.log(&logs::JobLogs::user_error(NODE, &raised_on));
    assert_contains(&tracebacks, " mini-batch 3 attempt 1:\nTraceback");
    assert_contains(&tracebacks, "Exception: boom-3");
}

/// An attempt that ended with no word from its node (the worker was killed while it held the
/// mini-batch) gets its row in the report all the same, written by the node that holds the
/// mini-batch next and naming the lost node. A failed attempt that its node reported is not
/// reported again as lost.
#[tokio::test(start_paused = true)]
async fn an_attempt_lost_with_its_node_gets_a_report_row_from_the_next_holder() {
    let fake = FakeLauncher::new().run(|call| match (call.mini_batch, call.try_number) {
        (0, 1) => Run::Raise("first try".into()),
        _ => Run::Rows,
    });
    let settings = "mini_batch_size = 2\nrun_max_try = 3";
    let mut flow = Flow::start(&fake, settings, 4, Options::default()).await;
    // What a node killed in mini-batch 1's first attempt left in the ledger.
    let gone = r#"{"node":"gone","process":"process007","attempt":1,"start":"2026-11-26 08:00:00.000","id":7}"#;
    let before = flow
        .fleet
        .ledger
        .attempt_started(JOB, 1, gone)
        .await
        .unwrap();
    assert_eq!(before.lost, None);
    let (status, _) = flow.end().await;

    assert_eq!(status.state, JobState::Completed, "{status:?}");
    let report = flow.log(logs::REPORT_CSV);
    let rows: Vec<&str> = report.lines().skip(1).collect();
    let of = |index: &str| -> Vec<&str> {
        rows.iter()
            .filter(|r| r.split(',').next() == Some(index))
            .copied()
            .collect()
    };
    let lost: Vec<&str> = of("1")
        .into_iter()
        .filter(|r| r.contains(",lost,"))
        .collect();
    assert_eq!(lost.len(), 1, "{report}");
    assert!(
        lost[0].starts_with("1,1,lost,2,0,0,gone,process007,2026-11-26 08:00:00.000,,,"),
        "{}",
        lost[0]
    );
    assert_contains(lost[0], "lost with node gone");
    assert_contains(lost[0], &format!("noted by node {NODE}"));
    assert_eq!(
        of("1").len(),
        2,
        "the lost attempt and this node's: {report}"
    );
    // Mini-batch 0 raised once, then succeeded: two rows of this node, none lost.
    let first = of("0");
    assert_eq!(first.len(), 2, "{report}");
    assert!(first.iter().all(|r| !r.contains(",lost,")), "{report}");
}

/// A job whose deadline passes with work unfinished ends Expired, moved by the watcher of
/// the node serving it: its own event (`job.expired`, with its manifest's digest), the rows
/// of the mini-batches it finished in the output, in input order, the others listed in
/// `unfinished_mini_batches.csv` and marked in the manifest, and its hung run killed.
#[tokio::test(start_paused = true)]
async fn a_job_past_its_deadline_expires_with_the_rows_it_finished() {
    let fake = FakeLauncher::new().run(|call| match call.mini_batch {
        0 | 1 => Run::Rows,
        _ => Run::Hang,
    });
    let settings = "mini_batch_size = 1\nrun_invocation_timeout = 1000\nprogress_update_timeout = 300\ndeadline = \"60s\"";
    let mut flow = Flow::start(&fake, settings, 4, Options::default()).await;
    let (status, ended) = flow.end().await;

    assert_eq!(status.state, JobState::Expired, "{status:?}");
    let reason = status.reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("deadline passed: 60s after submission (deadline), 2 of 4"),
        "{reason}"
    );
    assert_ended_within(ended, 60, 63);
    assert_eq!(flow.output(), "f00.txt\nf01.txt\n");
    assert_eq!(
        flow.log(logs::UNFINISHED_CSV),
        format!("{}\n2\n3\n", logs::UNFINISHED_HEADER)
    );
    let manifest: serde_json::Value = serde_json::from_str(&flow.log("manifest.json")).unwrap();
    assert_eq!(manifest["state"], "Expired");
    let marked: Vec<bool> = manifest["mini_batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["unfinished"] == true)
        .collect();
    assert_eq!(marked, [false, false, true, true]);
    assert_contains(&flow.log(logs::JOB_RESULT), "Result: Expired");
    assert_contains(&flow.log(logs::JOB_RESULT), logs::UNFINISHED_CSV);
    let heard = flow.heard().await;
    let states: Vec<JobState> = heard.iter().map(|e| e.state).collect();
    assert_eq!(states, [JobState::Running, JobState::Expired]);
    assert_eq!(heard[1].routing_key(), "job.expired");
    assert!(heard[1].manifest.is_some(), "{:?}", heard[1]);
    assert_eq!(
        fake.kills(),
        1,
        "the hung run is killed once the job expires"
    );
}
