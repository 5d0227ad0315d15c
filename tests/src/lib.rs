//! Helpers for fleetrun's end-to-end tests: a job folder with a script and inputs, the built
//! binaries to run it with, bounded waits on what they do, and servers of a test's own for
//! faults that would disturb the shared ones.

pub mod tabular;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long one `fleetrun run` of a test may take: well under the suite's per-test limit
/// (`.config/nextest.toml`), so a hung run fails its test with this crate's message and is
/// killed, rather than being found by the harness.
pub const RUN_LIMIT: Duration = Duration::from_secs(180);

/// A built workspace binary (`cargo build` puts them beside the test's `deps` folder).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --workspace` first",
        path.display()
    );
    path
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
        let mut cmd = Command::new(bin("fleetrun"));
        cmd.arg("run")
            .arg(self.path("job.toml"))
            .arg("--quiet")
            .args(args);
        cmd.env_remove("VIRTUAL_ENV");
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

/// Waits for a condition that a running process brings about, bounded by `limit`.
pub fn wait_for(what: &str, limit: Duration, done: impl FnMut() -> bool) {
    assert!(poll(limit, done), "timed out waiting for {what}");
}

/// Whether `done` came to hold within `limit`, asked every 20 ms.
fn poll(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
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
        let _ = child.kill();
        let _ = child.wait();
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
        let chown = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(broker.dir.path())
            .status();
        assert!(
            chown.is_ok_and(|s| s.success()),
            "chown the broker's folder"
        );
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
        let status = Command::new("rabbitmq-server")
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
            .status()
            .expect("rabbitmq-server runs");
        assert!(status.success(), "rabbitmq-server -detached: {status}");
        // `-detached` returns before the node registers; `await_startup` needs it registered.
        wait_for(
            "the private RabbitMQ to start",
            Duration::from_secs(120),
            || self.ctl(&["await_startup", "--timeout", "120"]),
        );
    }

    /// Stops the node; its clients' connections are closed.
    pub fn stop(&self) {
        assert!(self.ctl(&["stop"]), "rabbitmqctl stop {}", self.node);
    }

    fn ctl(&self, args: &[&str]) -> bool {
        Command::new("rabbitmqctl")
            .args(["-n", &self.node, "--quiet"])
            .args(args)
            .output()
            .is_ok_and(|out| out.status.success())
    }
}

impl Drop for PrivateRabbitMq {
    fn drop(&mut self) {
        self.ctl(&["stop"]);
    }
}

/// A Redis server of one test's own, for faults that would disturb every other test on the
/// shared one (`CLIENT KILL`, `CLIENT PAUSE`). Lives in a temporary folder, listens on a free
/// loopback port, keeps nothing on disk; killed on drop.
pub struct PrivateRedis {
    dir: tempfile::TempDir,
    server: Child,
    port: u16,
}

impl PrivateRedis {
    pub fn start() -> PrivateRedis {
        let dir = tempfile::tempdir().expect("temp dir");
        let [port] = free_ports();
        let server = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/install-deps.sh installs it)");
        let mut redis = PrivateRedis { dir, server, port };
        let answers = poll(Duration::from_secs(30), || {
            // Another process can take the port between `free_ports` and the server's bind.
            if let Some(exit) = redis.server.try_wait().unwrap() {
                panic!("redis-server exited ({exit}):\n{}", redis.log());
            }
            redis.answers()
        });
        assert!(
            answers,
            "the private Redis never answered:\n{}",
            redis.log()
        );
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
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
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Ports nothing listens on now (held together, so they differ).
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}
