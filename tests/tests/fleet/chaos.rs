//! Chaos: randomised trials of a fleet job under faults at random instants, several per
//! trial: a runner, a worker or the submitter killed with SIGKILL, Redis stopped (SIGSTOP)
//! or killed and started again, RabbitMQ stopped and started again. After each trial every
//! input's line is in the output exactly once, the job's counts say so, and the job ended
//! on its own within a bound.
//!
//! The broker and Redis are the run's own (they are stopped mid-job); S3 is the shared
//! server. Each trial has a seed, printed, from which everything random in it follows (the
//! job's size, its workers, the faults and their instants), so a failing trial replays:
//!
//! ```sh
//! scripts/chaos.sh --trials 100        # CHAOS_TRIALS=100
//! scripts/chaos.sh --seed 0x5eed1234   # CHAOS_SEED: that one trial again
//! ```
//!
//! The test suite runs two trials (`chaos_trials`); docs/chaos.md records longer runs.

use std::time::Instant;

use super::*;

/// Trials when `CHAOS_TRIALS` is not set: the suite's short run.
const SUITE_TRIALS: u64 = 2;

/// How long a trial's job may take to end once its last fault is over.
const JOB_LIMIT: Duration = Duration::from_secs(240);

/// SplitMix64: small, and the same sequence for a seed on every build.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillRunner,
    KillWorker,
    KillSubmitter,
    /// SIGSTOP Redis for this long, then SIGCONT.
    StopRedis(Duration),
    /// SIGKILL Redis, start it again after this long (its append-only file kept).
    KillRedis(Duration),
    /// Stop RabbitMQ, start it again after this long.
    RestartBroker(Duration),
}

impl Fault {
    fn draw(rng: &mut Rng) -> Fault {
        match rng.range(0, 5) {
            0 => Fault::KillRunner,
            1 => Fault::KillWorker,
            2 => Fault::KillSubmitter,
            3 => Fault::StopRedis(rng.millis(200, 4000)),
            4 => Fault::KillRedis(rng.millis(0, 2000)),
            _ => Fault::RestartBroker(rng.millis(0, 2000)),
        }
    }
}

/// What a trial's seed decides.
#[derive(Debug)]
struct Plan {
    items: usize,
    mini_batch_size: u64,
    /// Runner processes of each worker.
    workers: Vec<usize>,
    /// Seconds each `run()` sleeps.
    sleep: f64,
    /// Each fault with its instant after the submit.
    faults: Vec<(Duration, Fault)>,
}

impl Plan {
    fn of(seed: u64) -> Plan {
        let mut rng = Rng(seed);
        let items = rng.range(100, 400) as usize;
        let mini_batch_size = rng.range(1, 8);
        let workers: Vec<usize> = (0..rng.range(2, 3))
            .map(|_| rng.range(1, 2) as usize)
            .collect();
        // A job of 5 to 12 s on its runners, so the faults land while it runs.
        let seconds = rng.range(5, 12) as f64;
        let batches = items.div_ceil(mini_batch_size as usize) as f64;
        let runners = workers.iter().sum::<usize>() as f64;
        let sleep = (seconds * runners / batches).clamp(0.005, 0.5);
        // Faults land from the submit to the job's end as planned (its runners' time and a
        // second and a half of start-up): some before any mini-batch ran, some at its end.
        let ends = ((batches * sleep / runners + 1.5) * 1000.0) as u64;
        let mut faults: Vec<(Duration, Fault)> = (0..rng.range(2, 4))
            .map(|_| (rng.millis(300, ends), Fault::draw(&mut rng)))
            .collect();
        faults.sort_by_key(|(at, _)| *at);
        Plan {
            items,
            mini_batch_size,
            workers,
            sleep,
            faults,
        }
    }
}

/// The run's own servers, which trials stop and kill.
struct Servers {
    broker: PrivateRabbitMq,
    redis: PrivateRedis,
}

/// The trials of one run, `CHAOS_TRIALS` of them (two by default), or the one trial of
/// `CHAOS_SEED`. Fails with the seeds of the trials that failed.
#[test]
fn chaos_trials() {
    let (seeds, base) = match std::env::var("CHAOS_SEED") {
        Ok(seed) => (vec![parse_seed(&seed)], None),
        Err(_) => {
            let trials = std::env::var("CHAOS_TRIALS").map_or(SUITE_TRIALS, |n| {
                n.parse().expect("CHAOS_TRIALS is a number")
            });
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            let mut rng = Rng(base);
            ((0..trials).map(|_| rng.next() >> 32).collect(), Some(base))
        }
    };
    if let Some(base) = base {
        eprintln!("[chaos] {} trials from base seed {base:#x}", seeds.len());
    }
    let mut servers = Servers {
        broker: PrivateRabbitMq::start(),
        redis: PrivateRedis::persistent(),
    };
    let mut failed = Vec::new();
    let started = Instant::now();
    for (n, seed) in seeds.iter().enumerate() {
        let at = Instant::now();
        eprintln!("[chaos] trial {}/{} seed {seed:#x}", n + 1, seeds.len());
        servers.heal();
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trial(&mut servers, *seed)));
        let took = at.elapsed().as_secs_f64();
        match outcome {
            Ok(said) => eprintln!("[chaos] seed {seed:#x}: passed in {took:.1} s: {said}"),
            Err(why) => {
                let why = why
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| why.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                eprintln!("[chaos] seed {seed:#x}: FAILED in {took:.1} s: {why}");
                failed.push(*seed);
                // A failed trial may leave the servers stopped: the next trial needs them.
                servers.recover();
            }
        }
    }
    eprintln!(
        "[chaos] {} of {} trials passed in {:.0} s",
        seeds.len() - failed.len(),
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<String> = failed.iter().map(|s| format!("{s:#x}")).collect();
    assert!(
        failed.is_empty(),
        "chaos trials failed; replay each with scripts/chaos.sh --seed SEED: {failed:?}"
    );
}

fn parse_seed(text: &str) -> u64 {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|_| panic!("CHAOS_SEED {text:?} is not a number"))
}

impl Servers {
    /// Restarts a broker that the trials before left broken (see
    /// [`PrivateRabbitMq::lost_dead_letter_workers`]): a fault of RabbitMQ's own, which the
    /// trials' teardown (deleting a pool's queues just after a restart) can set off, and
    /// which would fail every trial after it.
    fn heal(&mut self) {
        if self.broker.lost_dead_letter_workers() {
            eprintln!("[chaos] RabbitMQ lost its dead-letter workers' supervisor; restarting it");
            self.broker.stop();
            self.broker.start_again();
        }
    }

    /// Both servers answering again, whatever a failed trial left.
    fn recover(&mut self) {
        // SAFETY: kill(2) with SIGCONT on the server this run started.
        unsafe { libc::kill(self.redis.pid() as i32, libc::SIGCONT) };
        // Restarted even when it answers: a RabbitMQ 3.10 node can lose the supervisor of
        // its quorum queues' dead-letter workers (rabbitmq-server#16652) and then refuse
        // every publish to a new queue until it restarts, which would fail every trial after.
        if self.broker.answers() {
            self.broker.stop();
        }
        self.broker.start_again();
    }
}

/// One trial: the job the seed plans, its faults applied as planned, then the checks.
/// Returns a line saying what happened; panics, naming what was wrong, on a failed check.
fn trial(servers: &mut Servers, seed: u64) -> String {
    let plan = Plan::of(seed);
    eprintln!("[chaos] {plan:?}");
    let script = format!(
        "import time\ndef run(mini_batch):\n    time.sleep({})\n    return [open(p).read() for p in mini_batch]\n",
        plan.sleep
    );
    let mut fleet = Fleet::on_broker(&script, servers.broker.url());
    fleet.redis_url = servers.redis.url();
    fleet.know_pool(&fleet.pool);
    fleet.inputs(plan.items);
    for (n, processes) in plan.workers.iter().enumerate() {
        fleet.worker(&format!("w{n}"), *processes);
    }
    // Attempts enough that no planned fault can use up a mini-batch's: every line is due.
    let job = fleet.s3_job(&format!(
        "mini_batch_size = {}\nrun_max_try = 10\nnode_count = {}",
        plan.mini_batch_size,
        plan.workers.len()
    ));
    let id = format!("chaos-{}", random_suffix());
    let submit = |fleet: &Fleet| {
        let mut cmd = command("fleetrun");
        fleet.env(&mut cmd);
        cmd.args(["submit", "--quiet", "--wait", "--job-id", &id])
            .arg(&job)
            .stdout(std::process::Stdio::null());
        KillOnDrop(cmd.spawn().expect("fleetrun submit starts"))
    };
    let mut submitter = submit(&fleet);
    let submitted = Instant::now();
    let mut rng = Rng(seed ^ 0xC4A0_5EED);
    let mut said = Vec::new();
    for (at, fault) in &plan.faults {
        if let Some(left) = at.checked_sub(submitted.elapsed()) {
            std::thread::sleep(left);
        }
        let t = submitted.elapsed().as_secs_f64();
        let what = apply(
            *fault,
            servers,
            &mut fleet,
            &mut submitter,
            &submit,
            &mut rng,
        );
        eprintln!("[chaos] seed {seed:#x} t={t:.2}s: {what}");
        said.push(format!("{t:.1}s {what}"));
    }
    let mut status = None;
    wait_for(
        &format!("the job to end within {JOB_LIMIT:?} of its last fault; faults {said:?}"),
        JOB_LIMIT,
        || {
            status = submitter.0.try_wait().expect("wait for the submitter");
            status.is_some()
        },
    );
    let status = status.unwrap();
    assert_eq!(status.code(), Some(0), "the job did not complete: {said:?}");
    let output = lines(&fleet.output("out/parallel_run_step.txt"));
    let unique: BTreeSet<&String> = output.iter().collect();
    let expected = expected_lines(plan.items, |_| false);
    let missing: Vec<&String> = expected.iter().filter(|l| !unique.contains(l)).collect();
    assert!(
        missing.is_empty() && unique.len() == output.len() && output.len() == expected.len(),
        "{} lines for {} items: {} missing ({:?}…), {} duplicated; faults {said:?}",
        output.len(),
        plan.items,
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        output.len() - unique.len()
    );
    let counts = job_counts(&fleet, &id);
    let batches = plan.items.div_ceil(plan.mini_batch_size as usize) as u64;
    assert_eq!(
        (
            counts["succeeded_items"].as_u64(),
            counts["failed_items"].as_u64(),
            counts["total_mini_batches"].as_u64(),
            counts["completed_mini_batches"].as_u64(),
            counts["failed_mini_batches"].as_u64(),
        ),
        (
            Some(plan.items as u64),
            Some(0),
            Some(batches),
            Some(batches),
            Some(0)
        ),
        "the job's counts: {counts}; faults {said:?}"
    );
    format!(
        "{} items in {batches} mini-batches, every line once; {}",
        plan.items,
        said.join(", ")
    )
}

/// The job's counts as `fleetrun status ID --json` shows them.
fn job_counts(fleet: &Fleet, id: &str) -> serde_json::Value {
    let mut cmd = command("fleetrun");
    fleet.env(&mut cmd);
    let out = output_within(cmd.args(["status", id, "--json"]), Duration::from_secs(60));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "Completed", "{shown}");
    shown["counts"].clone()
}

/// Applies `fault`; returns what was done.
fn apply(
    fault: Fault,
    servers: &mut Servers,
    fleet: &mut Fleet,
    submitter: &mut KillOnDrop,
    submit: &dyn Fn(&Fleet) -> KillOnDrop,
    rng: &mut Rng,
) -> String {
    match fault {
        Fault::KillRunner => {
            let workers: Vec<u32> = fleet.workers.iter().map(|(_, w)| w.id()).collect();
            let runners = children_named(&workers, "fleetrun-runner");
            if runners.is_empty() {
                return "kill -9 a runner: none running".into();
            }
            let pid = runners[rng.range(0, runners.len() as u64 - 1) as usize];
            // SAFETY: kill(2) with SIGKILL on a runner of this trial's workers.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            format!("kill -9 runner {pid}")
        }
        Fault::KillWorker => {
            let at = rng.range(0, fleet.workers.len() as u64 - 1) as usize;
            let (node, mut child) = fleet.workers.remove(at);
            let processes = (child.id(), node.clone());
            kill(&mut child);
            // A fleet keeps its size: another worker comes in the dead one's place.
            let new = format!("{node}r");
            fleet.worker(&new, 1);
            format!("kill -9 worker {node} (pid {}), {new} started", processes.0)
        }
        Fault::KillSubmitter => {
            if submitter.0.try_wait().ok().flatten().is_some() {
                return "kill -9 the submitter: it had ended".into();
            }
            kill(&mut submitter.0);
            *submitter = submit(fleet);
            "kill -9 the submitter, submitted again with its --job-id".into()
        }
        Fault::StopRedis(pause) => {
            let pid = servers.redis.pid() as i32;
            // SAFETY: kill(2) with SIGSTOP, then SIGCONT, on the run's own Redis.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::sleep(pause);
            unsafe { libc::kill(pid, libc::SIGCONT) };
            format!("SIGSTOP Redis for {} ms", pause.as_millis())
        }
        Fault::KillRedis(down) => {
            servers.redis.kill();
            std::thread::sleep(down);
            servers.redis.start_again();
            format!("kill -9 Redis, started again after {} ms", down.as_millis())
        }
        Fault::RestartBroker(down) => {
            servers.broker.stop();
            std::thread::sleep(down);
            servers.broker.start_again();
            format!(
                "RabbitMQ stopped, started again after {} ms",
                down.as_millis()
            )
        }
    }
}

/// The pids of running processes named `name` whose parent is one of `parents`.
fn children_named(parents: &[u32], name: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let comm = head.split_once(" (").map_or("", |(_, c)| c);
            let mut fields = rest.split_whitespace();
            // A killed runner stays a zombie until its worker reaps it: not running.
            let running = fields.next().is_some_and(|state| state != "Z");
            let ppid = fields.next().and_then(|p| p.parse().ok());
            running && comm == name && ppid.is_some_and(|p| parents.contains(&p))
        })
        .collect()
}
