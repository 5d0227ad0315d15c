//! Helpers for fleetrun's end-to-end tests: a job folder with a script and inputs, the built
//! binaries to run it with, bounded waits on what they do, and servers of a test's own for
//! faults that would disturb the shared ones.

pub mod cluster;
pub mod relay;
pub mod s3_relay;
pub mod tabular;

pub use cluster::PrivateRabbitCluster;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long one `fleetrun run` of a test may take: well under the suite's per-test limit
/// (`.config/nextest.toml`), so a hung run fails its test with this crate's message and is
/// killed, rather than being found by the harness.
pub const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The built workspace binary `name` (`cargo build` puts them beside the test's `deps`
/// folder), checked to be fresh: this crate is not the binaries' package, so cargo does not
/// rebuild them for `cargo test` of it, and a test must not run what an earlier edit left.
/// A binary older than one of the sources cargo's dep-info says it was built from, or built
/// from another checkout sharing the target folder, fails the test, saying what to run.
/// `fleetrun` and `fleetrun-worker` start `fleetrun-runner`, so it is checked with them, and
/// `fleetrun-runner` loads `libfleetrun_runner.so`, checked with it.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let path = dir.join(name);
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace folder");
    if let Err(why) = fresh(&path, workspace) {
        panic!("{why}: run `cargo build --workspace` first (scripts/test.sh does)");
    }
    if name == "fleetrun-runner" {
        // The runner's Python half, loaded by it from beside it.
        let library = dir.join("libfleetrun_runner.so");
        if let Err(why) = fresh(&library, workspace) {
            panic!("{why}: run `cargo build --workspace` first (scripts/test.sh does)");
        }
    } else {
        bin("fleetrun-runner");
    }
    path
}

/// Whether the binary at `path` was built, from the checkout at `workspace`, after every
/// source file its dep-info (`<path>.d`, written by cargo beside it) lists.
fn fresh(path: &Path, workspace: &Path) -> Result<(), String> {
    let shown = path.display();
    let built = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(|_| format!("{shown} is not built"))?;
    for source in built_from(path)? {
        if !source.starts_with(workspace) {
            return Err(format!(
                "{shown} was built from {}, not from this checkout ({})",
                source.display(),
                workspace.display()
            ));
        }
        let changed = std::fs::metadata(&source).and_then(|m| m.modified());
        match changed {
            Ok(changed) if changed <= built => {}
            Ok(_) => {
                return Err(format!("{shown} is older than {}", source.display()));
            }
            Err(_) => {
                return Err(format!(
                    "{shown} was built from {}, now gone",
                    source.display()
                ));
            }
        }
    }
    Ok(())
}

/// The source files the binary at `path` was built from, as its dep-info (`<path>.d`,
/// written by cargo beside it) lists them.
fn built_from(path: &Path) -> Result<Vec<PathBuf>, String> {
    let dep_info = path.with_extension("d");
    let text = std::fs::read_to_string(&dep_info).map_err(|e| {
        format!(
            "{} has no dep-info {} ({e})",
            path.display(),
            dep_info.display()
        )
    })?;
    // `<target>: <source> <source> ...`, a space inside a path escaped as `\ `.
    let (_, sources) = text
        .split_once(": ")
        .ok_or_else(|| format!("{} is not dep-info", dep_info.display()))?;
    Ok(sources
        .replace("\\ ", "\0")
        .split_whitespace()
        .map(|source| PathBuf::from(source.replace('\0', " ")))
        .collect())
}

/// A command running the built binary `name` (see [`bin`]) in the test's environment less
/// what a developer's shell may hold for fleetrun: no `FLEETRUN_*` variable (a
/// `FLEETRUN_GPU_COUNT` or `FLEETRUN_POOL` set by hand would change what a test sees), no
/// `AWS_*` one (a profile or endpoint of the developer's), no `VIRTUAL_ENV`. A test sets
/// what it means to.
pub fn command(name: &str) -> Command {
    let mut cmd = Command::new(bin(name));
    clear_developer_env(&mut cmd);
    cmd
}

/// Removes from `cmd`'s environment every `FLEETRUN_*` and `AWS_*` variable and
/// `VIRTUAL_ENV`; see [`command`].
pub fn clear_developer_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("FLEETRUN_") || text.starts_with("AWS_") || text == "VIRTUAL_ENV" {
            cmd.env_remove(&name);
        }
    }
}

/// A child process killed (SIGKILL) and reaped when this is dropped: a test that fails,
/// or returns early, leaves it neither running nor a zombie.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// How the child exited, waiting at most `limit` (see [`exit_within`]).
    pub fn exit_within(&mut self, limit: Duration) -> ExitStatus {
        exit_within(&mut self.0, limit)
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill(&mut self.0);
    }
}

/// SIGKILLs `child` and reaps it. The wait is for the kernel to tear down a killed process,
/// which does not depend on what the process does.
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The first line `child` prints on its piped stdout (an address it listens on), trimmed,
/// waiting at most `limit`: past it the child is killed and the test fails.
pub fn first_line_within(child: &mut Child, limit: Duration) -> String {
    lines_within(child, 1, limit).remove(0)
}

/// The first `n` lines `child` prints on its piped stdout, trimmed, waiting at most `limit`
/// in all: past it the child is killed and the test fails.
pub fn lines_within(child: &mut Child, n: usize, limit: Duration) -> Vec<String> {
    let stdout = child.stdout.take().expect("a piped stdout");
    let (sent, received) = mpsc::channel();
    std::thread::spawn(move || {
        let mut printed = std::io::BufReader::new(stdout);
        for _ in 0..n {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut printed, &mut line);
            let _ = sent.send(line);
        }
        // The rest is read and dropped until the child closes its stdout: it may print again
        // (a submitter, when its job ends) and must not find the pipe closed.
        let _ = std::io::copy(&mut printed, &mut std::io::sink());
    });
    let deadline = Instant::now() + limit;
    let mut lines = Vec::with_capacity(n);
    while lines.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => lines.push(line.trim().to_owned()),
            Err(_) => {
                kill(child);
                panic!(
                    "process {} printed {} of {n} lines in {limit:?}: killed",
                    child.id(),
                    lines.len()
                );
            }
        }
    }
    lines
}

/// The interpreters of the machine's pyenv (`$PYENV_ROOT`, else `~/.pyenv`): the newest
/// `versions/<minor>.*` of each minor asked for. A missing one fails the test, never skips it:
/// the project's machines have them.
pub fn pyenv_python(minor: &str) -> PathBuf {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".pyenv"));
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            name.strip_prefix(minor)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|micro| micro.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    found.sort();
    let python = found
        .pop()
        .unwrap_or_else(|| panic!("no CPython {minor} under {}/versions", root.display()))
        .join("bin")
        .join(format!("python{minor}"));
    assert!(python.exists(), "{} is missing", python.display());
    python
}

/// A job in a temporary folder: `job.toml`, `score.py`, inputs under `data/`, output `out/`.
pub struct JobDir {
    pub dir: tempfile::TempDir,
}

impl JobDir {
    /// `settings` are extra top-level TOML lines (they come before the tables).
    pub fn new(script: &str, settings: &str) -> JobDir {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("score.py"), script).unwrap();
        let toml = format!(
            "name = \"e2e\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\n{settings}\n[input]\nfiles = \"data\"\n[output]\npath = \"out\"\n"
        );
        std::fs::write(dir.path().join("job.toml"), toml).unwrap();
        JobDir { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `n` input files `data/<group>/fNNNN.txt`, 100 per group, each holding its name.
    pub fn inputs(&self, n: usize) -> &Self {
        for i in 0..n {
            let rel = format!("data/g{:02}/f{i:04}.txt", i / 100);
            let path = self.path(&rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("f{i:04}")).unwrap();
        }
        self
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = command("fleetrun");
        cmd.arg("run")
            .arg(self.path("job.toml"))
            .arg("--quiet")
            .args(args);
        cmd
    }

    /// Runs the job to its end, bounded by [`RUN_LIMIT`].
    pub fn run(&self, args: &[&str]) -> Output {
        let out = output_within(&mut self.command(args), RUN_LIMIT);
        eprintln!(
            "--- fleetrun stdout\n{}--- stderr\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Replaces the job file's `[input] files = "data"` with `[input]` and `lines`.
    pub fn input(self, lines: &str) -> JobDir {
        let toml = std::fs::read_to_string(self.path("job.toml")).unwrap();
        let toml = toml.replace("[input]\nfiles = \"data\"\n", &format!("[input]\n{lines}"));
        std::fs::write(self.path("job.toml"), toml).unwrap();
        self
    }

    /// The `append_row` file's lines.
    pub fn output_lines(&self) -> Vec<String> {
        let text =
            std::fs::read_to_string(self.path("out/parallel_run_step.txt")).expect("output file");
        text.lines().map(str::to_owned).collect()
    }

    pub fn log(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(&format!("out/logs/{rel}")))
            .unwrap_or_else(|e| panic!("log {rel}: {e}"))
    }
}

/// The pids of the processes a script started (and its own, where it wrote it), as it wrote
/// them to a file, one a line; killed on drop, so a failing test leaves nothing running.
pub struct ScriptProcesses(pub Vec<i32>);

impl ScriptProcesses {
    /// The processes whose pids are in `file` (see [`pids`]), theirs to kill from now on.
    pub fn read(file: &Path) -> ScriptProcesses {
        ScriptProcesses(pids(file))
    }

    /// Asserts that every one of them ends within 10 s, and that there is one.
    pub fn assert_all_gone(&self) {
        assert!(!self.0.is_empty(), "the script started no process");
        for &pid in &self.0 {
            wait_for(
                &format!("process {pid} of the script to end"),
                Duration::from_secs(10),
                || !runs(pid),
            );
        }
    }
}

impl Drop for ScriptProcesses {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if runs(pid) {
                // SAFETY: sends a signal to a process this test's script started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// The pids a script wrote to `file`, one a line: none while it is missing, and not a line
/// it is still writing.
pub fn pids(file: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Whether `pid` is a running process (a zombie waiting to be reaped has ended).
pub fn runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, s)| !s.starts_with('Z'))
    })
}

/// Waits for a condition that a running process brings about, bounded by `limit`.
pub fn wait_for(what: &str, limit: Duration, done: impl FnMut() -> bool) {
    assert!(poll(limit, done), "timed out waiting for {what}");
}

/// Whether `done` came to hold within `limit`, asked every 20 ms.
pub fn poll(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How `child` exited, waiting at most `limit`: past it the child is killed (a failed test
/// leaves it neither running nor waited on forever) and the test fails.
pub fn exit_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let mut exit = None;
    if !poll(limit, || {
        exit = child.try_wait().expect("wait for a child process");
        exit.is_some()
    }) {
        kill(child);
        panic!("process {} still ran after {limit:?}: killed", child.id());
    }
    exit.unwrap()
}

/// `Command::output` bounded by `limit`: stdout and stderr captured, stdin empty; past the
/// limit the process is killed and the test fails.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?} starts: {e}"));
    wait_with_output_within(child, limit)
}

/// `Child::wait_with_output` bounded by `limit` (the pipes the caller asked for are read,
/// the others read as empty); past the limit the child is killed and the test fails. A pipe
/// still open 10 s after the child exited (something it started holds it) fails the test too.
pub fn wait_with_output_within(mut child: Child, limit: Duration) -> Output {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
        let (sent, received) = mpsc::channel();
        if let Some(mut pipe) = pipe {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                let _ = sent.send(bytes);
            });
        } else {
            let _ = sent.send(Vec::new());
        }
        received
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = exit_within(&mut child, limit);
    let read = |pipe: mpsc::Receiver<Vec<u8>>, name: &str| {
        pipe.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                panic!(
                    "the {name} of process {} stayed open after it exited",
                    child.id()
                )
            })
    };
    Output {
        status,
        stdout: read(stdout, "stdout"),
        stderr: read(stderr, "stderr"),
    }
}

/// The inputs a poison script raises for (`f0017`, `f0333`, `f0998`), each with the
/// message `poison fNNNN`.
pub const POISONED: [usize; 3] = [17, 333, 998];

/// `failed_items.csv` lists exactly the files of `POISONED`, in order, each with its own
/// error.
pub fn assert_failed_alone(failed_items: &str, poisoned: &[usize]) {
    let listed: Vec<&str> = failed_items.lines().skip(1).collect();
    assert_eq!(listed.len(), poisoned.len(), "{failed_items}");
    for (line, i) in listed.iter().zip(poisoned) {
        let name = format!("f{i:04}");
        assert!(
            line.contains(&format!("/{name}.txt,")) && line.ends_with(&format!("poison {name}")),
            "{line}"
        );
    }
}

/// Lines `f0000`…: what a script echoing each file's content returns for `n` inputs.
pub fn expected_lines(n: usize, skip: impl Fn(usize) -> bool) -> Vec<String> {
    (0..n)
        .filter(|i| !skip(*i))
        .map(|i| format!("f{i:04}"))
        .collect()
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// Where the real servers of the `services` test tier listen (set by `scripts/services.sh`;
/// these defaults are the ports it uses).
pub mod services {
    fn var(name: &str, default: &str) -> String {
        std::env::var(name).unwrap_or_else(|_| default.to_owned())
    }

    pub fn amqp_url() -> String {
        var(
            "FLEETRUN_TEST_AMQP_URL",
            "amqp://guest:guest@127.0.0.1:5673/%2f",
        )
    }

    pub fn redis_url() -> String {
        var("FLEETRUN_TEST_REDIS_URL", "redis://127.0.0.1:6390/")
    }

    pub fn s3_endpoint() -> String {
        var("FLEETRUN_TEST_S3_ENDPOINT", "http://127.0.0.1:5055")
    }

    /// The TLS-only RabbitMQ, which wants a client certificate from [`tls_dir`].
    pub fn amqps_url() -> String {
        var(
            "FLEETRUN_TEST_AMQPS_URL",
            "amqps://fleetrun:tls-secret-7f3a@127.0.0.1:5674/%2f",
        )
    }

    /// The TLS-only Redis, which wants a client certificate from [`tls_dir`].
    pub fn rediss_url() -> String {
        var(
            "FLEETRUN_TEST_REDISS_URL",
            "rediss://:tls-secret-7f3a@127.0.0.1:6391/",
        )
    }

    /// The test CA and certificates (`scripts/test-certs.sh`).
    pub fn tls_dir() -> std::path::PathBuf {
        var("FLEETRUN_TEST_TLS_DIR", "/tmp/fleetrun-services/tls").into()
    }
}

/// A RabbitMQ node of one test's own, for faults that would disturb every other test on the
/// shared one (stopping the broker). Lives in a temporary folder, listens on free loopback
/// ports, runs no plugins; stopped on drop.
pub struct PrivateRabbitMq {
    dir: tempfile::TempDir,
    node: String,
    port: u16,
    dist_port: u16,
}

impl PrivateRabbitMq {
    pub fn start() -> PrivateRabbitMq {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("mnesia")).unwrap();
        std::fs::create_dir_all(dir.path().join("log")).unwrap();
        let [port, dist_port] = free_ports();
        let broker = PrivateRabbitMq {
            // Unique while its port is taken.
            node: format!("fleetrun-test-{port}@localhost"),
            port,
            dist_port,
            dir,
        };
        std::fs::write(
            broker.path("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = 127.0.0.1:{}\nconsumer_timeout = 3600000\n",
                broker.port
            ),
        )
        .unwrap();
        std::fs::write(broker.path("enabled_plugins"), "[].\n").unwrap();
        // Debian's scripts run the server as the `rabbitmq` user.
        let chown = output_within(
            Command::new("chown")
                .args(["-R", "rabbitmq:rabbitmq"])
                .arg(broker.dir.path()),
            Duration::from_secs(30),
        );
        assert!(chown.status.success(), "chown the broker's folder");
        broker.run();
        broker
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Starts the stopped node again on the same data: durable queues and their messages
    /// survive.
    pub fn start_again(&self) {
        self.run();
    }

    fn run(&self) {
        let mut server = Command::new("rabbitmq-server");
        server
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", self.path("rabbitmq.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.path("enabled_plugins"),
            )
            .env("RABBITMQ_MNESIA_BASE", self.path("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.path("log"))
            // The detached node would hold a pipe open: it logs under the folder.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut started = server.spawn().expect("rabbitmq-server runs");
        let status = exit_within(&mut started, Duration::from_secs(120));
        assert!(status.success(), "rabbitmq-server -detached: {status}");
        // `-detached` returns before the node registers; `await_startup` needs it registered.
        wait_for(
            "the private RabbitMQ to start",
            Duration::from_secs(120),
            || self.ctl(&["await_startup", "--timeout", "120"]),
        );
    }

    /// Whether the node is up.
    pub fn answers(&self) -> bool {
        self.ctl(&["status"])
    }

    /// Whether the node lost the supervisor of its quorum queues' dead-letter workers since
    /// it last started, as its log says: RabbitMQ 3.10 then refuses every publish to a new
    /// queue that dead-letters at least once, until the node restarts (rabbitmq-server#16652).
    /// A burst of those workers' crashes does it, as when queues are deleted while the node
    /// recovers them after a restart.
    pub fn lost_dead_letter_workers(&self) -> bool {
        let log = std::fs::read_to_string(self.path(&format!("log/{}.log", self.node)))
            .unwrap_or_default();
        let since_start = log
            .rsplit_once("Starting RabbitMQ")
            .map_or(&*log, |(_, s)| s);
        let mut lines = since_start.lines().peekable();
        while let Some(line) = lines.next() {
            if line.ends_with("supervisor: {local,rabbit_fifo_dlx_sup}")
                && lines
                    .peek()
                    .is_some_and(|next| next.ends_with("errorContext: shutdown"))
            {
                return true;
            }
        }
        false
    }

    /// Raises a disk alarm on the node (a free-disk limit above any disk), or lowers it again
    /// to RabbitMQ's default: while it lasts the node blocks every publishing connection.
    pub fn disk_alarm(&self, on: bool) {
        let limit = if on { "1000000GB" } else { "50MB" };
        assert!(
            self.ctl(&["set_disk_free_limit", limit]),
            "rabbitmqctl set_disk_free_limit {limit}"
        );
    }

    /// Stops the node; its clients' connections are closed.
    pub fn stop(&self) {
        assert!(self.ctl(&["stop"]), "rabbitmqctl stop {}", self.node);
    }

    /// Whether `rabbitmqctl ARGS` succeeded within three minutes (it is killed past them).
    fn ctl(&self, args: &[&str]) -> bool {
        let child = Command::new("rabbitmqctl")
            .args(["-n", &self.node, "--quiet"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut child) = child else { return false };
        let mut exit = None;
        if !poll(Duration::from_secs(180), || {
            exit = child.try_wait().ok().flatten();
            exit.is_some()
        }) {
            kill(&mut child);
        }
        exit.is_some_and(|status| status.success())
    }
}

impl Drop for PrivateRabbitMq {
    fn drop(&mut self) {
        self.ctl(&["stop"]);
    }
}

/// A Redis server of one test's own, for faults that would disturb every other test on the
/// shared one (`CLIENT KILL`, `CLIENT PAUSE`, SIGSTOP, SIGKILL). Lives in a temporary
/// folder, listens on a free loopback port, keeps nothing on disk unless started
/// [`persistent`](PrivateRedis::persistent); killed on drop.
pub struct PrivateRedis {
    dir: tempfile::TempDir,
    server: Child,
    port: u16,
    /// Runs with the fleet's persistence settings (`deploy/redis/redis.conf`): its
    /// append-only file, and when that reaches the disk.
    persistent: bool,
    /// Each `fdatasync` of the server takes this long (see [`PrivateRedis::on_slow_disk`]).
    slow_sync: Option<Duration>,
    /// What slows its syncs: `strace` attached to the server.
    tracer: Option<Child>,
    /// The port of the primary it replicates from, if any.
    primary: Option<u16>,
    /// Its TLS port, if it has one besides its plain port.
    tls: Option<TlsPort>,
}

/// The TLS port a private Redis or Sentinel listens on besides its plain port (which stays for
/// the test's own probes): it shows the test CA's server certificate and wants a client
/// certificate signed by that CA, and speaks TLS to the primaries, replicas and sentinels it
/// connects to.
#[derive(Clone)]
struct TlsPort {
    port: u16,
    /// The folder of `scripts/services.sh`'s certificates ([`services::tls_dir`]).
    certs: PathBuf,
}

impl TlsPort {
    fn new(certs: &Path) -> TlsPort {
        let [port] = free_ports();
        TlsPort {
            port,
            certs: certs.to_path_buf(),
        }
    }

    /// Its settings, as `name value` pairs of a configuration file or command line.
    fn settings(&self) -> Vec<(&'static str, String)> {
        let cert = |name: &str| self.certs.join(name).display().to_string();
        vec![
            ("tls-port", self.port.to_string()),
            ("tls-cert-file", cert("server.pem")),
            ("tls-key-file", cert("server.key")),
            // What it shows as the client of a primary or sentinel: the server certificate is
            // for servers only.
            ("tls-client-cert-file", cert("client.pem")),
            ("tls-client-key-file", cert("client.key")),
            ("tls-ca-cert-file", cert("ca.pem")),
            ("tls-auth-clients", "yes".to_owned()),
            ("tls-replication", "yes".to_owned()),
        ]
    }
}

impl PrivateRedis {
    pub fn start() -> PrivateRedis {
        PrivateRedis::start_with(false, None)
    }

    /// A server that keeps its data in an append-only file, as the fleet's does: killed with
    /// SIGKILL and [started again](PrivateRedis::start_again), it has every write it
    /// acknowledged.
    pub fn persistent() -> PrivateRedis {
        PrivateRedis::start_with(true, None)
    }

    /// A [persistent](PrivateRedis::persistent) server on a disk whose every sync takes
    /// `sync` (`strace` delays the server's `fdatasync` calls), as a busy disk makes them:
    /// what the server acknowledged and had not synced shows whether a kill loses it.
    pub fn on_slow_disk(sync: Duration) -> PrivateRedis {
        PrivateRedis::start_with(true, Some(sync))
    }

    /// A replica of the primary on `primary` (the primary's own port, or a relay's to it),
    /// once it holds everything the primary had: asynchronous, as Redis's replicas are.
    pub fn replica_of(primary: u16) -> PrivateRedis {
        let mut replica = PrivateRedis::start_with_primary(false, None, Some(primary), None);
        let synced = poll(Duration::from_secs(30), || {
            replica
                .query(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        assert!(synced, "the replica never synced:\n{}", replica.log());
        replica.primary = Some(primary);
        replica
    }

    /// A server that also speaks TLS, on [`PrivateRedis::tls_port`], with the certificates
    /// in `certs` (see [`TlsPort`]).
    pub fn with_tls(certs: &Path) -> PrivateRedis {
        PrivateRedis::start_with_primary(false, None, None, Some(TlsPort::new(certs)))
    }

    /// A replica of `primary` (a server [with TLS](PrivateRedis::with_tls)) that replicates
    /// over TLS and speaks it too, once it holds everything the primary had.
    pub fn tls_replica_of(primary: &PrivateRedis) -> PrivateRedis {
        let tls = primary.tls.clone().expect("a primary with TLS");
        let from = Some(tls.port);
        let replica =
            PrivateRedis::start_with_primary(false, None, from, Some(TlsPort::new(&tls.certs)));
        let synced = poll(Duration::from_secs(30), || {
            replica
                .query(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        assert!(synced, "the replica never synced:\n{}", replica.log());
        replica
    }

    /// The port it speaks TLS on (see [`PrivateRedis::with_tls`]).
    pub fn tls_port(&self) -> u16 {
        self.tls.as_ref().expect("a server with TLS").port
    }

    fn start_with(persistent: bool, slow_sync: Option<Duration>) -> PrivateRedis {
        PrivateRedis::start_with_primary(persistent, slow_sync, None, None)
    }

    fn start_with_primary(
        persistent: bool,
        slow_sync: Option<Duration>,
        primary: Option<u16>,
        tls: Option<TlsPort>,
    ) -> PrivateRedis {
        let dir = tempfile::tempdir().expect("temp dir");
        let [port] = free_ports();
        let server = PrivateRedis::spawn(dir.path(), port, persistent, primary, tls.as_ref());
        let mut redis = PrivateRedis {
            dir,
            server,
            port,
            persistent,
            slow_sync,
            tracer: None,
            primary,
            tls,
        };
        redis.await_answer();
        redis
    }

    fn spawn(
        dir: &Path,
        port: u16,
        persistent: bool,
        primary: Option<u16>,
        tls: Option<&TlsPort>,
    ) -> Child {
        let mut command = Command::new("redis-server");
        for (name, value) in tls.map(TlsPort::settings).unwrap_or_default() {
            command.arg(format!("--{name}")).arg(value);
        }
        if let Some(primary) = primary {
            command.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
        }
        if persistent {
            for name in ["appendonly", "appendfsync"] {
                command
                    .arg(format!("--{name}"))
                    .arg(fleet_redis_setting(name));
            }
        } else {
            command.args(["--appendonly", "no"]);
        }
        command
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", ""])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/install-deps.sh installs it)")
    }

    fn await_answer(&mut self) {
        let answers = poll(Duration::from_secs(30), || {
            // Another process can take the port between `free_ports` and the server's bind.
            if let Some(exit) = self.server.try_wait().unwrap() {
                panic!("redis-server exited ({exit}):\n{}", self.log());
            }
            self.answers()
        });
        assert!(answers, "the private Redis never answered:\n{}", self.log());
        if let Some(sync) = self.slow_sync {
            self.slow_down(sync);
        }
    }

    /// Attaches `strace` to every thread of the server, delaying each `fdatasync` (Redis's
    /// sync of its append-only file) by `sync`; returns once all are traced.
    fn slow_down(&mut self, sync: Duration) {
        let pid = self.server.id();
        let tracer = Command::new("strace")
            .args(["-f", "-qq", "-e", "trace=fdatasync", "-e"])
            .arg(format!("inject=fdatasync:delay_enter={}", sync.as_micros()))
            .arg("-o")
            .arg(self.dir.path().join("strace.log"))
            .args(["-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("strace runs (scripts/install-deps.sh installs it)");
        self.tracer = Some(tracer);
        let traced = poll(Duration::from_secs(30), || {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return false;
            };
            tasks.flatten().all(|task| {
                std::fs::read_to_string(task.path().join("status")).is_ok_and(|status| {
                    status
                        .lines()
                        .any(|l| l.starts_with("TracerPid:") && l.trim_end() != "TracerPid:\t0")
                })
            })
        });
        assert!(traced, "strace did not attach to redis-server {pid}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Makes a replica a primary (`REPLICAOF NO ONE`), as a failover does: it keeps what it
    /// had received, and nothing more.
    pub fn promote(&mut self) {
        let answer = self.query(&["REPLICAOF", "NO", "ONE"]);
        assert_eq!(answer, "OK", "REPLICAOF NO ONE");
        self.primary = None;
    }

    /// The server's answer to one command, as text (a simple string, an error or a bulk
    /// string; empty when it does not answer).
    pub fn query(&self, args: &[&str]) -> String {
        let ask = || -> std::io::Result<String> {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
            let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            stream.write_all(resp_request(args).as_bytes())?;
            let mut reply = Vec::new();
            let mut buf = [0u8; 8192];
            // A simple reply is one line; a bulk string says its length first.
            loop {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                reply.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&reply);
                if let Some(rest) = text.strip_prefix('$')
                    && let Some((len, body)) = rest.split_once("\r\n")
                {
                    let len: i64 = len.parse().unwrap_or(-1);
                    if len < 0 || body.len() >= len as usize + 2 {
                        break;
                    }
                } else if text.ends_with("\r\n") {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&reply).into_owned();
            Ok(match text.split_once("\r\n") {
                Some((head, body)) if head.starts_with('$') => body.trim_end().to_owned(),
                Some((head, _)) => head.trim_start_matches(['+', '-', ':']).to_owned(),
                None => text,
            })
        };
        ask().unwrap_or_default()
    }

    /// Freezes the server (SIGSTOP): it keeps its connections and answers nothing until
    /// [`PrivateRedis::thaw`].
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(signal)
            .arg(self.server.id().to_string())
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {signal} redis-server");
    }

    /// The server's pid, for signals a test sends it (SIGSTOP, SIGCONT).
    pub fn pid(&self) -> u32 {
        self.server.id()
    }

    /// SIGKILLs the server: its clients' connections break, nothing is flushed.
    pub fn kill(&mut self) {
        kill(&mut self.server);
        // The tracer ends with the server it traced.
        if let Some(mut tracer) = self.tracer.take() {
            kill(&mut tracer);
        }
    }

    /// Starts the killed server again on the same port and folder (and, when persistent,
    /// the same data).
    pub fn start_again(&mut self) {
        self.server = PrivateRedis::spawn(
            self.dir.path(),
            self.port,
            self.persistent,
            self.primary,
            self.tls.as_ref(),
        );
        self.await_answer();
    }

    /// Whether the server answers a `PING`.
    fn answers(&self) -> bool {
        let ping = || -> std::io::Result<bool> {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
            let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            stream.set_read_timeout(Some(Duration::from_secs(1)))?;
            stream.write_all(b"PING\r\n")?;
            let mut reply = [0; 7];
            stream.read_exact(&mut reply)?;
            Ok(&reply == b"+PONG\r\n")
        };
        ping().unwrap_or(false)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        // A stopped server is killed all the same (SIGKILL needs no SIGCONT).
        self.kill();
    }
}

/// A Redis Sentinel of a test's own, watching the primary on `primary` as `master`, quick to
/// act as tests need: a primary silent for a second is down, and a failover may start a
/// second after another.
pub struct PrivateSentinel {
    dir: tempfile::TempDir,
    server: Child,
    port: u16,
    /// Its TLS port, if it has one besides its plain port.
    tls: Option<TlsPort>,
}

impl PrivateSentinel {
    /// One of `quorum` or more sentinels of `master` on `primary`, answering once started.
    pub fn watch(master: &str, primary: u16, quorum: u32) -> PrivateSentinel {
        PrivateSentinel::start(master, primary, quorum, None)
    }

    /// One of `quorum` or more sentinels of `master` on the TLS port of `primary` (a server
    /// [with TLS](PrivateRedis::with_tls)), speaking TLS to it, to its replicas and to the
    /// other sentinels, and to clients on the port [`PrivateSentinel::address`] names.
    pub fn watch_tls(master: &str, primary: &PrivateRedis, quorum: u32) -> PrivateSentinel {
        let certs = &primary.tls.as_ref().expect("a primary with TLS").certs;
        let tls = TlsPort::new(certs);
        PrivateSentinel::start(master, primary.tls_port(), quorum, Some(tls))
    }

    fn start(master: &str, primary: u16, quorum: u32, tls: Option<TlsPort>) -> PrivateSentinel {
        let dir = tempfile::tempdir().expect("temp dir");
        let [port] = free_ports();
        // A sentinel rewrites its configuration file, which must therefore be its own.
        let conf = dir.path().join("sentinel.conf");
        let mut settings = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n",
            dir = dir.path().display()
        );
        for (name, value) in tls.as_ref().map(TlsPort::settings).unwrap_or_default() {
            settings.push_str(&format!("{name} {value}\n"));
        }
        settings.push_str(&format!(
            "sentinel monitor {master} 127.0.0.1 {primary} {quorum}\n\
             sentinel down-after-milliseconds {master} 1000\n\
             sentinel failover-timeout {master} 3000\n\
             sentinel parallel-syncs {master} 1\n"
        ));
        std::fs::write(&conf, settings).unwrap();
        let server = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/install-deps.sh installs it)");
        let mut sentinel = PrivateSentinel {
            dir,
            server,
            port,
            tls,
        };
        let answers = poll(Duration::from_secs(30), || {
            if let Some(exit) = sentinel.server.try_wait().unwrap() {
                panic!("the sentinel exited ({exit}):\n{}", sentinel.log());
            }
            let asked = sentinel.query(&["SENTINEL", "get-master-addr-by-name", master]);
            !asked.is_empty()
        });
        assert!(answers, "the sentinel never answered:\n{}", sentinel.log());
        sentinel
    }

    /// `host:port` of this sentinel, as a Sentinel URL lists it: its TLS port, when it has
    /// one.
    pub fn address(&self) -> String {
        let port = self.tls.as_ref().map_or(self.port, |tls| tls.port);
        format!("127.0.0.1:{port}")
    }

    /// The port of the primary this sentinel names for `master` now, if it names one.
    pub fn primary(&self, master: &str) -> Option<u16> {
        let asked = self.query(&["SENTINEL", "get-master-addr-by-name", master]);
        asked
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .next_back()
    }

    fn query(&self, args: &[&str]) -> String {
        let asked = || -> std::io::Result<String> {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
            let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            stream.set_read_timeout(Some(Duration::from_secs(1)))?;
            stream.write_all(resp_request(args).as_bytes())?;
            let mut reply = Vec::new();
            let mut buf = [0u8; 4096];
            // An array of two bulk strings ends with the port's line.
            while reply.iter().filter(|b| **b == b'\n').count() < 5 {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                reply.extend_from_slice(&buf[..n]);
                if reply.starts_with(b"*-1") || reply.starts_with(b"-") {
                    return Ok(String::new());
                }
            }
            Ok(String::from_utf8_lossy(&reply).into_owned())
        };
        asked().unwrap_or_default()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }
}

impl Drop for PrivateSentinel {
    fn drop(&mut self) {
        kill(&mut self.server);
    }
}

/// `args` as one RESP request.
fn resp_request(args: &[&str]) -> String {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    request
}

/// A setting of the fleet's Redis, as `deploy/redis/redis.conf` gives it.
fn fleet_redis_setting(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/redis/redis.conf");
    let conf = std::fs::read_to_string(&path).expect("deploy/redis/redis.conf");
    conf.lines()
        .find_map(|line| match line.trim().split_once(' ') {
            Some((key, value)) if key == name => Some(value.trim().to_owned()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{} sets no {name}", path.display()))
}

/// Ports nothing listens on now (held together, so they differ).
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}

/// The files of a folder, recursively, relative to it.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push(path.strip_prefix(dir).unwrap().to_owned());
            }
        }
    }
    found.sort();
    found
}

/// The folder `scripts/build-wheel.sh --debug --out` writes the test suite's wheel to
/// (`scripts/test.sh` does, after `cargo build --workspace`), under the build folder.
pub const WHEEL_DIR: &str = "target/debug/python-wheel";

/// The `fleetrun` wheel of this checkout's debug build, in [`WHEEL_DIR`], checked to be
/// newer than every source file the binaries it packs are built from (their dep-info; the
/// binaries themselves are checked fresh by [`bin`]) and every file of the Python package: a
/// wheel missing or older fails the test, saying what to run. Not newer than the binaries
/// themselves: building the tests relinks them with the tests' features (cargo unifies the
/// dev-dependencies'), from the same sources. Tests never build the wheel themselves:
/// maturin runs cargo, which must not relink binaries that other tests are running.
pub fn python_wheel() -> PathBuf {
    let target = bin("fleetrun").parent().expect("target/debug").to_owned();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace folder");
    let build =
        format!("run `scripts/build-wheel.sh --debug --out {WHEEL_DIR}` (scripts/test.sh does)");
    let wheel = wheel_in(&target.join("python-wheel"))
        .unwrap_or_else(|| panic!("no wheel in {WHEEL_DIR}: {build}"));
    let mut sources = vec![repo.join("pyproject.toml")];
    for binary in [
        "fleetrun",
        "fleetrun-worker",
        "fleetrun-runner",
        "libfleetrun_runner.so",
    ] {
        sources.extend(built_from(&target.join(binary)).unwrap_or_else(|why| panic!("{why}")));
    }
    let package = repo.join("python/fleetrun");
    sources.extend(
        files_under(&package)
            .into_iter()
            .filter(|p| !p.components().any(|c| c.as_os_str() == "__pycache__"))
            .map(|p| package.join(p)),
    );
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).unwrap();
    let made = modified(&wheel);
    if let Some(newer) = sources.iter().find(|source| modified(source) > made) {
        panic!(
            "{} is older than {}: {build}",
            wheel.display(),
            newer.display()
        );
    }
    wheel
}

/// The one `fleetrun-*.whl` in `dir`, if any.
fn wheel_in(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("fleetrun-") && name.ends_with(".whl")
        })
}

/// A fresh virtualenv of pyenv's CPython `minor` ([`pyenv_python`]) with the `fleetrun`
/// wheel ([`python_wheel`]) installed from the file alone (`pip install --no-index`), in a
/// temporary folder of its own or at `at`. Commands made by [`Venv::command`] run with
/// nothing of the test's environment but a `PATH` of the venv's `bin/`, `/usr/bin` and
/// `/bin`: no Rust toolchain and no build folder, as on a user's machine.
pub struct Venv {
    pub dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl Venv {
    pub fn with_wheel(minor: &str) -> Venv {
        let temp = tempfile::tempdir().unwrap();
        let mut venv = Venv::with_wheel_at(minor, &temp.path().join("venv"));
        venv._temp = Some(temp);
        venv
    }

    pub fn with_wheel_at(minor: &str, dir: &Path) -> Venv {
        let wheel = python_wheel();
        let venv = Venv {
            dir: dir.to_owned(),
            _temp: None,
        };
        let made = output_within(
            Command::new(pyenv_python(minor))
                .arg("-m")
                .arg("venv")
                .arg(dir),
            Duration::from_secs(120),
        );
        assert!(made.status.success(), "python{minor} -m venv: {made:?}");
        venv.pip(&["install".as_ref(), "--no-index".as_ref(), wheel.as_os_str()]);
        venv
    }

    /// `python -m pip ARGS` in the venv, bounded; a failure fails the test.
    pub fn pip(&self, args: &[&std::ffi::OsStr]) {
        let mut cmd = self.command("python");
        cmd.args(["-m", "pip", "--disable-pip-version-check", "-q"])
            .args(args);
        let done = output_within(&mut cmd, Duration::from_secs(240));
        assert!(
            done.status.success(),
            "pip {args:?}: {}",
            String::from_utf8_lossy(&done.stderr)
        );
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }

    /// The `PATH` of the venv's commands: its `bin/`, then the system's, none of which holds
    /// `cargo`, `rustc` or this checkout's build folder (asserted).
    pub fn path(&self) -> String {
        let path = format!("{}:/usr/bin:/bin", self.dir.join("bin").display());
        for tool in ["cargo", "rustc"] {
            for entry in path.split(':') {
                assert!(
                    !Path::new(entry).join(tool).exists(),
                    "{tool} is in {entry}, on the venv's PATH"
                );
            }
        }
        path
    }

    /// `name`, found on [`Venv::path`], run in an environment of that `PATH`, `HOME` and
    /// `LANG` alone.
    pub fn command(&self, name: &str) -> Command {
        let path = self.path();
        let found = path
            .split(':')
            .map(|dir| Path::new(dir).join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{name} is not on {path}"));
        let mut cmd = Command::new(found);
        cmd.env_clear().env("PATH", &path).env("LANG", "C.UTF-8");
        if let Some(home) = std::env::var_os("HOME") {
            cmd.env("HOME", home);
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary `bin` in `dir/target` built from `dir/src/main.rs`, its dep-info written.
    fn built(dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::create_dir_all(dir.join("target")).unwrap();
        let source = dir.join("src/main.rs");
        std::fs::write(&source, "fn main() {}").unwrap();
        let bin = dir.join("target/bin");
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&bin, "").unwrap();
        let info = format!("{}: {}\n", bin.display(), source.display());
        std::fs::write(dir.join("target/bin.d"), info).unwrap();
        bin
    }

    #[test]
    fn a_binary_built_after_its_sources_is_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let bin = built(dir.path());
        assert_eq!(fresh(&bin, dir.path()), Ok(()));
    }

    #[test]
    fn a_source_edited_after_the_build_makes_it_stale() {
        let dir = tempfile::tempdir().unwrap();
        let bin = built(dir.path());
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(dir.path().join("src/main.rs"), "fn main() { edited() }").unwrap();
        let why = fresh(&bin, dir.path()).unwrap_err();
        assert!(
            why.contains("is older than") && why.contains("main.rs"),
            "{why}"
        );
    }

    #[test]
    fn a_binary_of_another_checkout_or_without_dep_info_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bin = built(dir.path());
        let elsewhere = tempfile::tempdir().unwrap();
        let why = fresh(&bin, elsewhere.path()).unwrap_err();
        assert!(why.contains("not from this checkout"), "{why}");
        std::fs::remove_file(dir.path().join("target/bin.d")).unwrap();
        let why = fresh(&bin, dir.path()).unwrap_err();
        assert!(why.contains("no dep-info"), "{why}");
        let why = fresh(&dir.path().join("target/none"), dir.path()).unwrap_err();
        assert!(why.contains("is not built"), "{why}");
    }
}
