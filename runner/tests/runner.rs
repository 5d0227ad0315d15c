//! Drives the real `fleetrun-runner` binary over its fd-3 channel, as the node agent does.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use fleetrun_common::protocol::{
    ErrorCause, InitParams, ReadyInfo, Reply, Request, ScriptError, Timing, read_frame, write_frame,
};
use fleetrun_tests::pyenv_python;
use tempfile::TempDir;

/// A job folder: scripts, logs, outputs and the runner's stdout/stderr files.
struct Job {
    dir: TempDir,
}

impl Job {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `text` (dedented Python) to `rel` and returns its absolute path.
    fn write(&self, rel: &str, text: &str) -> String {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, dedent(text)).unwrap();
        path.to_str().unwrap().to_owned()
    }

    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    fn params(&self, entry_script: &str) -> InitParams {
        InitParams {
            entry_script: entry_script.to_owned(),
            source_directory: None,
            arguments: vec![],
            node_id: "node0".into(),
            process_name: "process007".into(),
            log_dir: self.path("logs").to_str().unwrap().into(),
            output_dir: self.path("out").to_str().unwrap().into(),
            logging_level: "INFO".into(),
            environment: None,
            tabular: None,
            append_row_separator: b' ',
            working_dir: None,
            models: Default::default(),
            profile: None,
            python: None,
            hold_replies: false,
        }
    }

    fn spawn(&self) -> Runner {
        self.spawn_with(|_| {})
    }

    /// Starts the runner with `stdout.txt`/`stderr.txt` in the job folder, no inherited
    /// `VIRTUAL_ENV`, and the child end of a socket pair on fd 3.
    fn spawn_with(&self, configure: impl FnOnce(&mut Command)) -> Runner {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetrun-runner"));
        cmd.stdin(Stdio::null())
            .stdout(fs::File::create(self.path("stdout.txt")).unwrap())
            .stderr(fs::File::create(self.path("stderr.txt")).unwrap())
            .env_remove("VIRTUAL_ENV");
        configure(&mut cmd);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    // dup2(3, 3) would keep close-on-exec set.
                    if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, 3) != 3 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        drop(theirs);
        Runner {
            child,
            channel: Some(ours),
        }
    }

    /// Spawns a runner and sends `Init`.
    fn start(&self, params: &InitParams) -> (Runner, Reply) {
        let mut runner = self.spawn();
        let reply = runner.request(&Request::Init(Box::new(params.clone())));
        (runner, reply)
    }

    /// Spawns a runner that must reply `Ready`.
    fn ready(&self, params: &InitParams) -> (Runner, ReadyInfo) {
        match self.start(params) {
            (runner, Reply::Ready(info)) => (runner, info),
            (_, other) => panic!(
                "expected Ready, got {other:?}\nstderr: {}",
                self.read("stderr.txt")
            ),
        }
    }
}

struct Runner {
    child: Child,
    channel: Option<UnixStream>,
}

impl Runner {
    fn request(&mut self, request: &Request) -> Reply {
        let channel = self.channel.as_mut().expect("channel open");
        write_frame(channel, request).unwrap();
        read_frame(channel)
            .unwrap()
            .expect("the runner closed the channel instead of replying")
    }

    fn run(&mut self, items: &[&str]) -> Reply {
        let items = items.iter().map(PathBuf::from).collect();
        self.request(&Request::Run {
            mini_batch: 1,
            items,
            context: Default::default(),
            tables: Vec::new(),
        })
    }

    fn rows(&mut self, items: &[&str]) -> Vec<String> {
        match self.run(items) {
            Reply::Done { rows, .. } => rows,
            other => panic!("expected Done, got {other:?}"),
        }
    }

    fn failure(&mut self, items: &[&str]) -> ScriptError {
        match self.run(items) {
            Reply::Failed { error, .. } => error,
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    fn shutdown(mut self) -> ExitStatus {
        let mut channel = self.channel.take().unwrap();
        write_frame(&mut channel, &Request::Shutdown).unwrap();
        self.child.wait().unwrap()
    }

    /// Closes the channel, as an agent that goes away does, and waits for the exit.
    fn close(mut self) -> ExitStatus {
        self.channel.take();
        self.child.wait().unwrap()
    }

    /// Waits for an exit the runner chose itself (after `InitFailed`).
    fn wait(mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn dedent(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| l.get(indent..).unwrap_or("").to_owned() + "\n")
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn init_failure(reply: Reply) -> ScriptError {
    match reply {
        Reply::InitFailed(error) => error,
        other => panic!("expected InitFailed, got {other:?}"),
    }
}

/// `sys.prefix` of the interpreter the runner was built against.
fn build_python_prefix() -> String {
    let out = Command::new(env!("FLEETRUN_BUILD_PYTHON"))
        .args(["-c", "import sys; print(sys.prefix)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

const ECHO: &str = r#"
    def run(mini_batch):
        return [p.upper() for p in mini_batch]
"#;

#[test]
fn run_returns_rows_in_order_with_elements_stringified() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import decimal

        def run(mini_batch):
            rows = [f"{p}:ok" for p in mini_batch]
            return rows + [7, 2.5, None, b"caf\xc3\xa9", b"\xff", decimal.Decimal("1.10"), ("a", 1)]
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    let items: Vec<String> = (0..500).map(|i| format!("/data/{i:04}.png")).collect();
    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
    let rows = runner.rows(&refs);
    let mut expected: Vec<String> = items.iter().map(|p| format!("{p}:ok")).collect();
    expected.extend(strings(&[
        "7", "2.5", "None", "café", "\u{fffd}", "1.10", "('a', 1)",
    ]));
    assert_eq!(rows, expected);
    assert_eq!(
        runner.rows(&[]),
        strings(&["7", "2.5", "None", "café", "\u{fffd}", "1.10", "('a', 1)"])
    );
    assert!(runner.shutdown().success());
}

/// A path is bytes: the script gets `os.fsdecode` of them, so `open(p)` opens the file whose
/// name is not UTF-8, and `os.fsencode(p)` gives the bytes back.
#[test]
fn paths_reach_the_script_as_fsdecoded_str_that_open_the_file() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import os

        def run(mini_batch):
            return [f"{type(p).__name__} {os.fsencode(p)!r} {open(p).read()}" for p in mini_batch]
        "#,
    );
    let names: [&[u8]; 3] = [b"caf\xe9.txt", b"a\\b.txt", b"line\nbreak"];
    let paths: Vec<PathBuf> = names
        .iter()
        .map(|name| {
            let path = job.dir.path().join(OsString::from_vec(name.to_vec()));
            fs::write(&path, "x").unwrap();
            path
        })
        .collect();
    let (mut runner, _) = job.ready(&job.params(&script));
    let reply = runner.request(&Request::Run {
        mini_batch: 1,
        items: paths,
        context: Default::default(),
        tables: Vec::new(),
    });
    let Reply::Done { rows, .. } = reply else {
        panic!("expected Done, got {reply:?}");
    };
    let dir = job.dir.path().to_str().unwrap().to_owned();
    assert_eq!(
        rows,
        [
            format!("str b'{dir}/caf\\xe9.txt' x"),
            format!("str b'{dir}/a\\\\b.txt' x"),
            format!("str b'{dir}/line\\nbreak' x"),
        ]
    );
    assert!(runner.shutdown().success());
}

#[test]
fn results_other_than_lists_are_converted_or_refused() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        class Array:
            """Stands in for a numpy array or a pandas Series."""
            def __init__(self, values):
                self.values = values
            def tolist(self):
                return list(self.values)

        class Scalar:
            def tolist(self):
                return 3

        class Frame:
            """Stands in for a pandas DataFrame."""
            columns = ["path", "score"]
            def itertuples(self, index=True, name="Pandas"):
                assert (index, name) == (False, None), (index, name)
                return iter([("a.png", 0.5), ("b 2.png", 0.25), ("c.png", float("nan"))])

        def run(mini_batch):
            kind = mini_batch[0]
            return {
                "tuple": ("x", 1),
                "set": {"only"},
                "array": Array([1, 2.5, "s"]),
                "frame": Frame(),
                "none": None,
                "str": "not a list",
                "dict": {"a": 1},
                "generator": (x for x in mini_batch),
                "scalar": Scalar(),
            }[kind]
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    assert_eq!(runner.rows(&["tuple"]), strings(&["x", "1"]));
    assert_eq!(runner.rows(&["set"]), strings(&["only"]));
    assert_eq!(runner.rows(&["array"]), strings(&["1", "2.5", "s"]));
    assert_eq!(
        runner.rows(&["frame"]),
        strings(&["a.png 0.5", "\"b 2.png\" 0.25", "c.png "])
    );
    for (kind, type_name) in [
        ("none", "NoneType"),
        ("str", "str"),
        ("dict", "dict"),
        ("generator", "generator"),
        ("scalar", "Scalar"),
    ] {
        let error = runner.failure(&[kind]);
        assert_eq!(
            error.message,
            format!(
                "TypeError: run() must return a list, an array or a pandas DataFrame, got {type_name}"
            )
        );
        assert_eq!(error.traceback, format!("{}\n", error.message));
    }
    assert_eq!(
        runner.rows(&["tuple"]),
        strings(&["x", "1"]),
        "still serving"
    );
}

#[test]
fn argv_and_imports_from_the_script_folder_and_source_directory() {
    let job = Job::new();
    let script = job.write(
        "code/score.py",
        r#"
        import sys
        import helper
        import srclib

        MAIN_RAN = False
        if __name__ == "__main__":
            MAIN_RAN = True

        def run(mini_batch):
            return [repr(sys.argv[1:]), helper.VALUE, srclib.VALUE, __name__, str(MAIN_RAN),
                    str(sys.argv[0].endswith("score.py"))]
        "#,
    );
    job.write("code/helper.py", "VALUE = 'from the script folder'\n");
    job.write("src/srclib.py", "VALUE = 'from the source directory'\n");
    let mut params = job.params(&script);
    params.arguments = strings(&["--model", "m.pt", "--flag"]);
    params.source_directory = Some(job.path("src").to_str().unwrap().into());
    let (mut runner, _) = job.ready(&params);
    assert_eq!(
        runner.rows(&["x"]),
        strings(&[
            "['--model', 'm.pt', '--flag']",
            "from the script folder",
            "from the source directory",
            "score",
            "False",
            "True",
        ])
    );
}

#[test]
fn entry_script_helper_gives_paths_and_a_logger_file() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        from azureml_user.parallel_run import EntryScript
        import fleetrun

        def init():
            EntryScript().logger.info("model loaded in init")
            EntryScript().logger.debug("debug is below INFO")

        def run(mini_batch):
            es = EntryScript()
            es.get_logger().warning("scoring %d files", len(mini_batch))
            return [es.log_dir, es.output_dir, es.working_dir, es.agent_name, es.node_id,
                    str(es is EntryScript()), str(fleetrun.EntryScript is EntryScript),
                    str(es.get_logger() is es.logger), es.logger.name]
        "#,
    );
    let mut params = job.params(&script);
    let work = job.path("work");
    fs::create_dir(&work).unwrap();
    params.working_dir = Some(work.to_str().unwrap().to_owned());
    let (mut runner, _) = job.ready(&params);
    let logs = job.path("logs/user/entry_script_log/node0");
    let out = job.path("out").to_str().unwrap().to_owned();
    assert_eq!(
        runner.rows(&["a", "b"]),
        [
            logs.to_str().unwrap(),
            &out,
            work.to_str().unwrap(),
            "process007",
            "node0",
            "True",
            "True",
            "True",
            "fleetrun.entry_script"
        ]
    );
    let log = job.read("logs/user/entry_script_log/node0/process007.log.txt");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].contains("|INFO|") && lines[0].ends_with("|model loaded in init"),
        "{log}"
    );
    assert!(
        lines[1].contains("|WARNING|") && lines[1].ends_with("|scoring 2 files"),
        "{log}"
    );
    assert!(lines[0].contains("|fleetrun.entry_script|"), "{log}");
}

#[test]
fn prints_go_to_the_stdout_and_stderr_files_not_the_channel() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import os, sys

        print("hello from init")

        def run(mini_batch):
            print("scoring", len(mini_batch), "files")
            print("a warning", file=sys.stderr)
            os.system("echo from a subprocess")
            return mini_batch
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    assert_eq!(job.read("stdout.txt"), "hello from init\n");
    assert_eq!(runner.rows(&["a", "b"]), strings(&["a", "b"]));
    assert_eq!(
        job.read("stdout.txt"),
        "hello from init\nscoring 2 files\nfrom a subprocess\n"
    );
    assert_eq!(job.read("stderr.txt"), "a warning\n");
}

#[test]
fn an_exception_in_run_fails_the_batch_and_the_runner_keeps_serving() {
    let job = Job::new();
    job.write(
        "scoring_lib.py",
        r#"
        def score(path):
            if path == "bad.png":
                raise ValueError(f"cannot score {path!r}")
            return path + " ok"
        "#,
    );
    let script = job.write(
        "score.py",
        r#"
        import scoring_lib

        def run(mini_batch):
            return [scoring_lib.score(p) for p in mini_batch]
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    let error = runner.failure(&["good.png", "bad.png"]);
    assert_eq!(error.message, "ValueError: cannot score 'bad.png'");
    assert!(
        error
            .traceback
            .starts_with("Traceback (most recent call last):\n"),
        "{}",
        error.traceback
    );
    assert!(
        error
            .traceback
            .contains("return [scoring_lib.score(p) for p in mini_batch]")
    );
    assert!(
        error
            .traceback
            .contains("raise ValueError(f\"cannot score {path!r}\")")
    );
    assert!(
        error
            .traceback
            .ends_with("ValueError: cannot score 'bad.png'\n")
    );
    assert_eq!(runner.rows(&["good.png"]), strings(&["good.png ok"]));
    assert!(runner.shutdown().success());
}

/// The runner tells a GPU out-of-memory error by the exception's classes (its MRO, so a
/// subclass counts) or its message, and any other error is the script's.
#[test]
fn an_out_of_memory_error_is_told_apart_by_its_class_or_message() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        class OutOfMemoryError(RuntimeError):
            pass

        # As torch 2.5 and later name it, without torch.
        OutOfMemoryError.__module__ = "torch"

        class Ours(OutOfMemoryError):
            pass

        def run(mini_batch):
            kind = mini_batch[0]
            if kind == "class":
                raise Ours("Tried to allocate 2.00 GiB")
            if kind == "message":
                raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")
            if kind == "xla":
                raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes.")
            raise MemoryError("host memory")
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    for kind in ["class", "message", "xla"] {
        let error = runner.failure(&[kind]);
        assert_eq!(
            error.cause,
            ErrorCause::OutOfMemory,
            "{kind}: {}",
            error.message
        );
    }
    let error = runner.failure(&["host"]);
    assert_eq!(error.cause, ErrorCause::Script, "{}", error.message);
    assert!(runner.shutdown().success());
}

#[test]
fn sys_exit_in_run_is_a_failed_batch_not_an_exit() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import sys

        def run(mini_batch):
            if mini_batch == ["exit"]:
                sys.exit(3)
            if mini_batch == ["interrupt"]:
                raise KeyboardInterrupt
            return mini_batch
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    let error = runner.failure(&["exit"]);
    assert_eq!(error.message, "SystemExit: 3");
    assert!(
        error.traceback.contains("sys.exit(3)"),
        "{}",
        error.traceback
    );
    assert_eq!(runner.failure(&["interrupt"]).message, "KeyboardInterrupt");
    assert_eq!(runner.rows(&["next"]), strings(&["next"]));
    assert!(runner.shutdown().success());
}

#[test]
fn an_exception_in_init_is_init_failed_and_exit_code_3() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        def load_model():
            raise RuntimeError("model file missing")

        def init():
            print("loading")
            load_model()

        def run(mini_batch):
            return mini_batch
        "#,
    );
    let (runner, reply) = job.start(&job.params(&script));
    let error = init_failure(reply);
    assert_eq!(error.message, "RuntimeError: model file missing");
    assert!(
        error.traceback.contains("load_model()"),
        "{}",
        error.traceback
    );
    assert!(
        error
            .traceback
            .contains("raise RuntimeError(\"model file missing\")")
    );
    assert_eq!(runner.wait().code(), Some(3));
    assert_eq!(job.read("stdout.txt"), "loading\n");
}

#[test]
fn errors_while_loading_the_script_are_init_failed() {
    let job = Job::new();
    let cases = [
        (
            "no_run.py",
            "def init():\n    pass\n",
            "entry script defines no run(mini_batch) function",
        ),
        ("exits.py", "import sys\nsys.exit(3)\n", "SystemExit: 3"),
        (
            "bad_import.py",
            "import no_such_module_xyz\n",
            "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
    ];
    for (name, source, message) in cases {
        let script = job.write(name, source);
        let (runner, reply) = job.start(&job.params(&script));
        let error = init_failure(reply);
        assert_eq!(error.message, message, "{name}");
        assert!(
            !error.traceback.contains("<frozen importlib"),
            "{}",
            error.traceback
        );
        assert_eq!(runner.wait().code(), Some(3), "{name}");
    }

    let script = job.write("syntax.py", "def run(mini_batch):\n    return [\n");
    let (runner, reply) = job.start(&job.params(&script));
    let error = init_failure(reply);
    assert!(
        error.message.starts_with("SyntaxError: "),
        "{}",
        error.message
    );
    assert!(error.traceback.contains("syntax.py"), "{}", error.traceback);
    assert_eq!(runner.wait().code(), Some(3));

    let missing = job.path("missing.py");
    let (runner, reply) = job.start(&job.params(missing.to_str().unwrap()));
    assert!(
        init_failure(reply)
            .message
            .starts_with("FileNotFoundError: ")
    );
    assert_eq!(runner.wait().code(), Some(3));
}

#[test]
fn shutdown_is_called_on_shutdown_but_not_when_the_agent_goes_away() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import os
        from azureml_user.parallel_run import EntryScript

        def shutdown():
            os.makedirs(EntryScript().output_dir, exist_ok=True)
            with open(os.path.join(EntryScript().output_dir, "shutdown.txt"), "a") as f:
                f.write("called\n")
            print("bye")

        def run(mini_batch):
            return mini_batch
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    assert_eq!(runner.rows(&["a"]), strings(&["a"]));
    assert_eq!(runner.shutdown().code(), Some(0));
    assert_eq!(job.read("out/shutdown.txt"), "called\n");
    assert_eq!(job.read("stdout.txt"), "bye\n");

    let (runner, _) = job.ready(&job.params(&script));
    assert_eq!(runner.close().code(), Some(0));
    assert_eq!(
        job.read("out/shutdown.txt"),
        "called\n",
        "shutdown() not called again"
    );
}

#[test]
fn an_exception_in_shutdown_goes_to_stderr_and_the_exit_is_still_clean() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        def shutdown():
            raise OSError("cannot flush cache")

        def run(mini_batch):
            return mini_batch
        "#,
    );
    let (runner, _) = job.ready(&job.params(&script));
    assert_eq!(runner.shutdown().code(), Some(0));
    let stderr = job.read("stderr.txt");
    assert!(stderr.contains("OSError: cannot flush cache"), "{stderr}");
    assert!(
        stderr.contains("raise OSError(\"cannot flush cache\")"),
        "{stderr}"
    );
}

#[test]
fn timing_measures_wall_and_cpu_time_in_run() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import time

        def run(mini_batch):
            start = time.process_time()
            while time.process_time() - start < 0.2:
                pass
            return mini_batch
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    let Reply::Done {
        timing: Timing {
            run_seconds,
            cpu_seconds,
            ..
        },
        ..
    } = runner.run(&["a"])
    else {
        panic!("expected Done");
    };
    assert!((0.19..5.0).contains(&cpu_seconds), "cpu {cpu_seconds}");
    assert!(
        run_seconds >= cpu_seconds * 0.9,
        "wall {run_seconds} cpu {cpu_seconds}"
    );
}

/// What a script learns of its signal dispositions, as one line.
const DISPOSITIONS: &str = r#"
import signal

def dispositions():
    names = ["SIGINT", "SIGPIPE", "SIGXFSZ", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTERM"]
    return " ".join(f"{n}={signal.getsignal(getattr(signal, n))!r}" for n in names)
"#;

#[test]
fn signal_dispositions_are_those_of_python3() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        &format!(
            "{DISPOSITIONS}
def run(mini_batch):
    return [dispositions()]
"
        ),
    );
    let python = format!("{}/bin/python3", build_python_prefix());
    let plain = Command::new(&python)
        .arg("-c")
        .arg(format!(
            "{DISPOSITIONS}
print(dispositions())"
        ))
        .output()
        .unwrap();
    assert!(plain.status.success(), "{plain:?}");
    let expected = String::from_utf8(plain.stdout).unwrap().trim().to_owned();
    assert!(expected.contains("default_int_handler"), "{expected}");
    let (mut runner, _) = job.ready(&job.params(&script));
    assert_eq!(runner.rows(&["a"]), [expected]);
}

#[test]
fn a_script_that_sends_itself_sigsegv_dies_of_it_the_first_time() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import os, signal

        def run(mini_batch):
            os.kill(os.getpid(), signal.SIGSEGV)
            return mini_batch
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    let channel = runner.channel.as_mut().unwrap();
    write_frame(
        channel,
        &Request::Run {
            mini_batch: 1,
            items: vec![PathBuf::from("a")],
            context: Default::default(),
            tables: Vec::new(),
        },
    )
    .unwrap();
    // No reply: the process is gone, killed by the signal.
    assert!(read_frame::<_, Reply>(channel).unwrap().is_none());
    let status = runner.wait();
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}");
}

#[test]
fn sigint_raises_keyboard_interrupt_in_run_as_under_python3() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import os, signal

        def run(mini_batch):
            os.kill(os.getpid(), signal.SIGINT)
            return mini_batch
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    assert_eq!(runner.failure(&["a"]).message, "KeyboardInterrupt");
    assert!(runner.shutdown().success());
}

/// No `environment` and no `VIRTUAL_ENV`: `python3` on `PATH`, here pyenv's 3.12 put first.
#[test]
fn without_an_environment_python3_on_path_is_used() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import os, sys, sysconfig

        def run(mini_batch):
            return [sys.prefix, sys.base_prefix, os.path.dirname(os.__file__), sysconfig.get_paths()["purelib"]]
        "#,
    );
    let python = pyenv_python("3.12");
    let bin = python.parent().unwrap().to_owned();
    let prefix = bin.parent().unwrap().to_str().unwrap().to_owned();
    let path = std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let mut runner = job.spawn_with(|cmd| {
        cmd.env("PATH", &path);
    });
    let Reply::Ready(ready) = runner.request(&Request::Init(Box::new(job.params(&script)))) else {
        panic!("expected Ready: {}", job.read("stderr.txt"));
    };
    assert_eq!(ready.python_prefix, prefix);
    assert_eq!(ready.pid, runner.child.id());
    let rows = runner.rows(&["a"]);
    assert_eq!(rows[0], prefix);
    assert_eq!(rows[1], prefix);
    assert!(
        rows[2].starts_with(&prefix),
        "stdlib {} outside {prefix}",
        rows[2]
    );
    assert!(
        rows[3].starts_with(&prefix),
        "site-packages {} outside {prefix}",
        rows[3]
    );
}

#[test]
fn a_virtualenv_is_honoured_from_environment_virtual_env_or_its_python() {
    let job = Job::new();
    let venv = job.path("venv");
    let status = Command::new(env!("FLEETRUN_BUILD_PYTHON"))
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(status.success());
    let site_packages = fs::read_dir(venv.join("lib"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let site_packages = site_packages.join("site-packages");
    fs::write(
        site_packages.join("venv_marker.py"),
        "VALUE = 'from the venv'\n",
    )
    .unwrap();
    let script = job.write(
        "score.py",
        r#"
        import os, shutil, sys
        import venv_marker

        def run(mini_batch):
            return [sys.prefix, sys.base_prefix, venv_marker.VALUE,
                    os.environ["PATH"].split(os.pathsep)[0], shutil.which("python") or "",
                    os.environ.get("VIRTUAL_ENV", "")]
        "#,
    );
    let venv_str = venv.to_str().unwrap().to_owned();
    let venv_bin = venv.join("bin");
    let venv_python = venv_bin.join("python").to_str().unwrap().to_owned();
    let base = build_python_prefix();
    let expected = [
        venv_str.as_str(),
        base.as_str(),
        "from the venv",
        venv_bin.to_str().unwrap(),
        venv_python.as_str(),
        venv_str.as_str(),
    ];

    // As `environment`: a venv folder, then its interpreter.
    for environment in [&venv_str, &venv_python] {
        let mut params = job.params(&script);
        params.environment = Some(environment.clone());
        let (mut runner, ready) = job.ready(&params);
        assert_eq!(ready.python_prefix, venv_str);
        assert_eq!(ready.python_executable, venv_python);
        assert_eq!(runner.rows(&["a"]), expected, "environment {environment}");
    }

    // From an activated shell's VIRTUAL_ENV.
    let mut runner = job.spawn_with(|cmd| {
        cmd.env("VIRTUAL_ENV", &venv);
    });
    let Reply::Ready(ready) = runner.request(&Request::Init(Box::new(job.params(&script)))) else {
        panic!("expected Ready: {}", job.read("stderr.txt"));
    };
    assert_eq!(ready.python_prefix, venv_str);
    assert_eq!(runner.rows(&["a"]), expected);
}

#[test]
fn environments_that_cannot_work_are_init_failed() {
    let job = Job::new();
    let script = job.write("score.py", ECHO);

    let old = job.path("py27-venv");
    fs::create_dir_all(old.join("bin")).unwrap();
    fs::write(
        old.join("pyvenv.cfg"),
        "home = /usr/bin\nversion = 2.7.18\n",
    )
    .unwrap();
    fs::write(old.join("bin/python"), "").unwrap();
    let missing = job.path("no-such-env");
    let not_python = job.write("not_python.sh", "#!/bin/sh\nexit 1\n");

    for (environment, expected) in [
        (
            old.to_str().unwrap(),
            "is Python 2.7.18, which fleetrun cannot run; it runs CPython 3.9, 3.10,",
        ),
        (missing.to_str().unwrap(), "does not exist"),
        (not_python.as_str(), "is neither a virtualenv folder"),
    ] {
        let mut params = job.params(&script);
        params.environment = Some(environment.to_owned());
        let (runner, reply) = job.start(&params);
        let error = init_failure(reply);
        assert!(
            error.message.contains(expected),
            "{environment}: {}",
            error.message
        );
        assert_eq!(runner.wait().code(), Some(3));
    }
}

/// One runner binary serves every CPython from 3.9 on: it loads the environment's own
/// libpython, as an interpreter file, an installation folder or a virtualenv made from it.
#[test]
fn every_served_cpython_runs_the_script_with_its_own_libpython() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import sys

        def run(mini_batch):
            return ["%d.%d" % sys.version_info[:2], sys.prefix, sys.executable]
        "#,
    );
    for minor in ["3.9", "3.10", "3.11", "3.12", "3.13"] {
        let python = pyenv_python(minor);
        let prefix = python.parent().unwrap().parent().unwrap().to_owned();
        let venv = job.path(&format!("venv{minor}"));
        let status = Command::new(&python)
            .args(["-m", "venv", "--without-pip"])
            .arg(&venv)
            .status()
            .unwrap();
        assert!(status.success());
        for (environment, expected_prefix) in [
            (python.clone(), prefix.clone()),
            (prefix.clone(), prefix.clone()),
            (venv.clone(), venv.clone()),
        ] {
            let mut params = job.params(&script);
            params.environment = Some(environment.to_str().unwrap().to_owned());
            let (mut runner, ready) = job.ready(&params);
            assert!(
                ready.python_version.starts_with(&format!("{minor}.")),
                "{}: {}",
                environment.display(),
                ready.python_version
            );
            let rows = runner.rows(&["a"]);
            assert_eq!(rows[0], minor, "{}", environment.display());
            assert_eq!(rows[1], expected_prefix.to_str().unwrap());
            assert!(runner.shutdown().success());
        }
    }
}

/// The Python the agent resolved travels in `Init` and is the one the runner starts, whatever
/// `PATH` or `VIRTUAL_ENV` would give.
#[test]
fn the_python_the_agent_resolved_is_the_one_started() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        "import sys\ndef run(mini_batch):\n    return ['%d.%d' % sys.version_info[:2]]\n",
    );
    let python = pyenv_python("3.10");
    let mut params = job.params(&script);
    let resolved = fleetrun_common::python::Python::resolve(Some(&python)).unwrap();
    params.python = Some(Box::new(resolved));
    let (mut runner, ready) = job.ready(&params);
    assert!(ready.python_version.starts_with("3.10."), "{ready:?}");
    assert_eq!(runner.rows(&["a"]), ["3.10"]);
    assert!(runner.shutdown().success());
}

/// CPython 3.8 (older than the stable ABI's floor) is refused by name, with the versions
/// that are served. (pyenv's 3.8 is on every machine the suite runs on; older ones need not.)
#[test]
fn an_unserved_cpython_is_init_failed_naming_the_served_versions() {
    let job = Job::new();
    let script = job.write("score.py", ECHO);
    let minor = "3.8";
    let python = pyenv_python(minor);
    let mut params = job.params(&script);
    params.environment = Some(python.to_str().unwrap().to_owned());
    let (runner, reply) = job.start(&params);
    let error = init_failure(reply);
    assert!(
        error.message.contains(&format!("is Python {minor}."))
            && error
                .message
                .contains("it runs CPython 3.9, 3.10, 3.11, 3.12, 3.13"),
        "{minor}: {}",
        error.message
    );
    assert_eq!(runner.wait().code(), Some(3));
}

#[test]
fn started_by_hand_it_explains_and_exits_2() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetrun-runner"));
    cmd.stdin(Stdio::null());
    // SAFETY: `close` is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::close(3);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{:?}", out.status.signal());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("started by fleetrun's node agent, not by hand"),
        "{stderr}"
    );
}

#[test]
fn an_agent_that_closes_before_init_gets_a_clean_exit() {
    let job = Job::new();
    let runner = job.spawn();
    assert_eq!(runner.close().code(), Some(0));
}

/// A tabular mini-batch: staged CSV (header first), JSON Lines and a Parquet copy become one
/// DataFrame; `run()` learns nothing of the staging, the reply says how many rows it was
/// given, and a returned DataFrame's rows are CSV records with the job's separator.
#[test]
fn tabular_chunks_become_one_dataframe_and_returned_frames_keep_their_header() {
    use fleetrun_common::protocol::{StagedTable, TabularInit};
    use fleetrun_common::wire::ChunkFormat;
    let job = Job::new();
    fs::write(job.path("a.csv"), "id,text\n1,\"two\nlines\"\n2,plain\n").unwrap();
    fs::write(job.path("b.jsonl"), "{\"id\": 3, \"text\": \"x;y\"}\n").unwrap();
    let made = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import pandas as pd; pd.DataFrame({{'id': [4, 5], 'text': ['p', None]}}).to_parquet({:?}, row_group_size=1)",
            job.path("c.parquet").to_str().unwrap()
        ))
        .status()
        .unwrap();
    assert!(
        made.success(),
        "pandas and pyarrow are needed (scripts/install-deps.sh)"
    );
    let script = job.write(
        "score.py",
        r#"
        def run(frame):
            return frame[["id", "text"]]
        "#,
    );
    let mut params = job.params(&script);
    params.tabular = Some(TabularInit {
        separator: b',',
        parquet: true,
        encoding: None,
        empty_as_string: false,
        drop_columns: Vec::new(),
    });
    params.append_row_separator = b';';
    let (mut runner, _) = job.ready(&params);
    let table = |rel: &str, format, row_groups: Vec<u32>| StagedTable {
        path: job.path(rel).to_str().unwrap().to_owned(),
        format,
        row_groups,
        columns: vec![],
    };
    let reply = runner.request(&Request::Run {
        mini_batch: 1,
        items: vec![],
        context: Default::default(),
        tables: vec![
            table("a.csv", ChunkFormat::Csv, vec![]),
            table("b.jsonl", ChunkFormat::JsonLines, vec![]),
            table("c.parquet", ChunkFormat::Parquet, vec![1]),
        ],
    });
    let Reply::Done {
        rows,
        given,
        header,
        ..
    } = reply
    else {
        panic!("expected Done, got {reply:?}");
    };
    assert_eq!(given, Some(4));
    assert_eq!(header.as_deref(), Some("id;text"));
    assert_eq!(
        rows,
        strings(&["1;\"two\nlines\"", "2;plain", "3;\"x;y\"", "5;"])
    );
}

/// A tabular job whose Python lacks pandas fails to start, naming the package.
#[test]
fn a_tabular_job_without_pandas_names_the_package() {
    let job = Job::new();
    let script = job.write("score.py", "def run(frame):\n    return []\n");
    let mut params = job.params(&script);
    params.tabular = Some(fleetrun_common::protocol::TabularInit {
        separator: b',',
        parquet: false,
        encoding: None,
        empty_as_string: false,
        drop_columns: Vec::new(),
    });
    // A module of that name that cannot be imported stands in for a missing package.
    job.write(
        "pandas/__init__.py",
        "raise ImportError('No module named pandas')\n",
    );
    params.source_directory = Some(
        job.path("")
            .to_str()
            .unwrap()
            .trim_end_matches('/')
            .to_owned(),
    );
    params.entry_script = job.path("score.py").to_str().unwrap().to_owned();
    match job.start(&params) {
        (_, Reply::InitFailed(error)) => {
            assert!(
                error
                    .message
                    .starts_with("fleetrun_tabular.MissingPackage: a tabular input needs pandas"),
                "{}",
                error.message
            );
            assert!(
                error.message.contains("-m pip install pandas"),
                "{}",
                error.message
            );
        }
        (_, other) => panic!("expected InitFailed, got {other:?}"),
    }
}

#[test]
fn the_runner_starts_in_its_working_folder() {
    let job = Job::new();
    job.write("work/labels.txt", "cat\ndog\n");
    let script = job.write(
        "code/score.py",
        r#"
        import os, sys

        labels = open(sys.argv[1]).read().split()

        def run(mini_batch):
            return [os.getcwd()] + labels
        "#,
    );
    let mut params = job.params(&script);
    params.arguments = vec!["labels.txt".into()];
    params.working_dir = Some(job.path("work").to_str().unwrap().to_owned());
    let (mut runner, _) = job.ready(&params);
    assert_eq!(
        runner.rows(&["a"]),
        [job.path("work").to_str().unwrap(), "cat", "dog"]
    );
}

#[test]
fn model_get_model_path_returns_the_local_copy_of_a_models_entry() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        from azureml.core import Model
        from azureml.core.model import Model as Model2

        def run(mini_batch):
            try:
                Model.get_model_path("other")
                missing = "no error"
            except KeyError as e:
                missing = str(e)
            return [Model.get_model_path("digits"), Model2.get_model_path(model_name="digits"),
                    str(Model is Model2), missing]
        "#,
    );
    let mut params = job.params(&script);
    params.models = [("digits".to_owned(), "/cache/side/abc/digits".to_owned())].into();
    let (mut runner, _) = job.ready(&params);
    let rows = runner.rows(&["a"]);
    assert_eq!(
        rows[..3],
        ["/cache/side/abc/digits", "/cache/side/abc/digits", "True"]
    );
    assert!(
        rows[3].contains("no model named 'other'") && rows[3].contains("known: digits"),
        "{}",
        rows[3]
    );
}

#[test]
fn a_run_with_two_parameters_gets_the_mini_batch_context() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        def run(mini_batch, mini_batch_context):
            c = mini_batch_context
            return [repr(list(c.partition_key_value.items())), c.dataset, c.minibatch_index]
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    let reply = runner.request(&Request::Run {
        mini_batch: 4,
        items: vec![PathBuf::from("a")],
        context: fleetrun_common::protocol::RunContext {
            // In the order of `partition_keys`, which is not the names' order.
            partition_key_value: Some(
                [("user", "ann"), ("genres", "jazz")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into_iter()
                    .collect(),
            ),
            dataset: "s3://bkt/in".into(),
        },
        tables: Vec::new(),
    });
    let Reply::Done { rows, .. } = reply else {
        panic!("expected Done, got {reply:?}");
    };
    assert_eq!(
        rows,
        ["[('user', 'ann'), ('genres', 'jazz')]", "s3://bkt/in", "4"]
    );
    // Without partition keys the dict is empty.
    assert_eq!(runner.rows(&["a"])[0], "[]");
}

/// A file partition's values are path parts typed as `pandas.read_csv` reads them; a
/// tabular one's are the mini-batch's own column values, numpy scalars made Python's.
#[test]
fn partition_values_are_typed_as_pandas_reads_them() {
    use fleetrun_common::protocol::{RunContext, StagedTable, TabularInit};
    use fleetrun_common::wire::ChunkFormat;
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        def run(mini_batch, mini_batch_context):
            values = mini_batch_context.partition_key_value
            return ["/".join(str(v) for v in values.values()),
                    " ".join(type(v).__name__ for v in values.values())]
        "#,
    );
    let context = |pairs: &[(&str, &str)]| RunContext {
        partition_key_value: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        dataset: "in".into(),
    };
    let mut params = job.params(&script);
    params.tabular = Some(TabularInit {
        separator: b',',
        parquet: false,
        encoding: None,
        empty_as_string: false,
        drop_columns: Vec::new(),
    });
    let (mut runner, _) = job.ready(&params);
    let run = |runner: &mut Runner, context: RunContext, tables: Vec<StagedTable>| match runner
        .request(&Request::Run {
            mini_batch: 0,
            items: vec![PathBuf::from("a")],
            context,
            tables,
        }) {
        Reply::Done { rows, .. } => rows,
        reply => panic!("expected Done, got {reply:?}"),
    };
    let files = context(&[
        ("Store", "1000"),
        ("Brand", "dominicks"),
        ("Price", "2.5"),
        ("Open", "True"),
        ("Zip", "007"),
        ("Country", "NA"),
    ]);
    assert_eq!(
        run(&mut runner, files, Vec::new()),
        ["1000/dominicks/2.5/True/7/NA", "int str float bool int str"]
    );
    fs::write(
        job.path("oj.csv"),
        "Brand,Store,Price\ndominicks,1000,2.5\ndominicks,1000,3.0\n",
    )
    .unwrap();
    let table = StagedTable {
        path: job.path("oj.csv").to_str().unwrap().to_owned(),
        format: ChunkFormat::Csv,
        row_groups: vec![],
        columns: vec![],
    };
    let tabular = context(&[("Store", "1000"), ("Brand", "dominicks")]);
    assert_eq!(
        run(&mut runner, tabular, vec![table]),
        ["1000/dominicks", "int str"]
    );
}

#[test]
fn the_root_logger_and_warnings_go_to_the_stdout_file_at_the_jobs_level() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        import logging, warnings

        logging.basicConfig(level=logging.DEBUG)  # as scripts do; changes nothing

        def run(mini_batch):
            logging.info("root info")
            logging.debug("root debug")
            logging.getLogger("mine").warning("named warning")
            warnings.warn("careful")
            return mini_batch
        "#,
    );
    let (mut runner, _) = job.ready(&job.params(&script));
    runner.rows(&["a"]);
    let stdout = job.read("stdout.txt");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].contains("|INFO|") && lines[0].ends_with("|root|root info"),
        "{stdout}"
    );
    assert!(lines[1].ends_with("|mine|named warning"), "{stdout}");
    assert!(
        lines[2].contains("|WARNING|") && lines[2].contains("UserWarning: careful"),
        "{stdout}"
    );
    assert!(!stdout.contains("root debug"), "{stdout}");
    assert_eq!(job.read("stderr.txt"), "");
}

/// With the real azureml-core installed, names in `[models]` get fleetrun's copy and the
/// others still go to azureml-core.
#[test]
fn a_real_azureml_core_is_wrapped_not_replaced() {
    let job = Job::new();
    job.write("site/azureml/__init__.py", "");
    job.write(
        "site/azureml/core/__init__.py",
        "from .model import Model\n",
    );
    job.write(
        "site/azureml/core/model.py",
        r#"
        class Model:
            @staticmethod
            def get_model_path(model_name, version=None, _workspace=None):
                return "real:" + model_name
        "#,
    );
    let script = job.write(
        "score.py",
        r#"
        from azureml.core import Model

        def run(mini_batch):
            return [Model.get_model_path("digits"), Model.get_model_path("other"),
                    Model.__module__]
        "#,
    );
    let mut params = job.params(&script);
    params.models = [("digits".to_owned(), "/cache/m".to_owned())].into();
    let site = job.path("site");
    let mut runner = job.spawn_with(|cmd| {
        cmd.env("PYTHONPATH", &site);
    });
    let reply = runner.request(&Request::Init(Box::new(params)));
    assert!(matches!(reply, Reply::Ready(_)), "{reply:?}");
    assert_eq!(
        runner.rows(&["a"]),
        ["/cache/m", "real:other", "azureml.core.model"]
    );
}

/// The functions a cProfile stats file names, as `pstats.Stats` loads them.
fn profiled_functions(path: &Path) -> Vec<String> {
    let code =
        "import pstats, sys\nfor (_, _, name) in pstats.Stats(sys.argv[1]).stats: print(name)";
    let out = Command::new(env!("FLEETRUN_BUILD_PYTHON"))
        .args(["-c", code])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn profile_stats_of_init_and_run_are_written_on_a_clean_stop_only() {
    let job = Job::new();
    let script = job.write(
        "score.py",
        r#"
        def load_model():
            return 1

        def init():
            load_model()

        def score(path):
            return path.upper()

        def run(mini_batch):
            return [score(p) for p in mini_batch]
        "#,
    );
    let mut params = job.params(&script);
    let stats = job.path("logs/sys/profile/node0/process007.profile");
    params.profile = Some(stats.to_str().unwrap().into());

    let (mut runner, _) = job.ready(&params);
    assert_eq!(runner.rows(&["a", "b"]), strings(&["A", "B"]));
    assert!(!stats.exists(), "written when the runner stops");
    assert_eq!(runner.shutdown().code(), Some(0));
    let functions = profiled_functions(&stats);
    for name in ["init", "load_model", "run", "score"] {
        assert!(
            functions.iter().any(|f| f == name),
            "{name} in {functions:?}"
        );
    }

    // The agent closing the channel is a clean stop too.
    fs::remove_file(&stats).unwrap();
    let (mut runner, _) = job.ready(&params);
    runner.rows(&["c"]);
    assert_eq!(runner.close().code(), Some(0));
    assert!(profiled_functions(&stats).iter().any(|f| f == "run"));

    // Without the setting, nothing is profiled or written.
    fs::remove_file(&stats).unwrap();
    let (runner, _) = job.ready(&job.params(&script));
    assert_eq!(runner.shutdown().code(), Some(0));
    assert!(!stats.exists());
}
