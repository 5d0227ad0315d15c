//! A fake runner for the flow tests: the agent drives it through the same [`Launcher`] and
//! [`Runner`] traits as real `fleetrun-runner` processes, but it lives in-process and plays
//! a scripted behaviour for each `init()` and each `run(mini_batch)`. Its waits are tokio
//! timers, so under paused time (`#[tokio::test(start_paused = true)]`) a hung `run()` meets
//! `run_invocation_timeout` at exactly that virtual time, and tests of hours run in moments.
//!
//! Built for the crate's own tests and, with the `testing` feature, for `worker/tests/`.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use fleetrun_common::protocol::{InitParams, ReadyInfo, ScriptError, Timing};
use fleetrun_common::python::{Python, PythonError};
use tokio::time::Instant;

use crate::process::{Batch, InitOutcome, Launch, Launcher, ProcessError, RunOutcome, Runner};

/// How a runner's start ends.
#[derive(Debug, Clone)]
pub enum Init {
    Ready,
    /// `init()` raised this message.
    Fail(String),
    /// `init()` never returns: the start times out.
    Hang,
    /// The process exits with this code during init.
    Die(i32),
}

/// What one `run(mini_batch)` call does.
#[derive(Debug, Clone)]
pub enum Run {
    /// Returns one row per item: the item's file name.
    Rows,
    /// Returns these rows.
    Return(Vec<String>),
    /// Raises this message.
    Raise(String),
    /// The process dies (SIGKILL: returncode -9).
    Die,
    /// Never returns.
    Hang,
    /// Takes this long, then does the rest.
    After(Duration, Box<Run>),
}

/// One `run()` call, as the script sees it.
#[derive(Debug, Clone)]
pub struct Call {
    pub mini_batch: u64,
    /// The calls of this mini-batch so far, this one included (1 on its first).
    pub try_number: u32,
    pub items: Vec<PathBuf>,
    /// The runner process's name (`processNNN`).
    pub process: String,
}

/// What became of one `run()` call.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub call: Call,
    /// Virtual times the call started and ended.
    pub started: Instant,
    pub ended: Instant,
    /// `rows`, `raised`, `died` or `timed out`.
    pub result: &'static str,
}

type InitScript = Arc<dyn Fn(u32) -> Init + Send + Sync>;
type RunScript = Arc<dyn Fn(&Call) -> Run + Send + Sync>;

#[derive(Default)]
struct Log {
    starts: u32,
    /// `run()` calls begun, by mini-batch.
    begun: std::collections::HashMap<u64, u32>,
    calls: Vec<CallRecord>,
    kills: u32,
    shutdowns: u32,
}

/// Starts fake runners. Clones share the script and the log.
#[derive(Clone)]
pub struct FakeLauncher {
    init: InitScript,
    run: RunScript,
    log: Arc<Mutex<Log>>,
}

impl std::fmt::Debug for FakeLauncher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeLauncher").finish_non_exhaustive()
    }
}

impl Default for FakeLauncher {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeLauncher {
    /// Runners that start and return one row per item.
    pub fn new() -> FakeLauncher {
        FakeLauncher {
            init: Arc::new(|_| Init::Ready),
            run: Arc::new(|_| Run::Rows),
            log: Arc::default(),
        }
    }

    /// How each start ends, by its number (1 for the first runner started).
    pub fn init(mut self, script: impl Fn(u32) -> Init + Send + Sync + 'static) -> Self {
        self.init = Arc::new(script);
        self
    }

    /// What each `run()` call does.
    pub fn run(mut self, script: impl Fn(&Call) -> Run + Send + Sync + 'static) -> Self {
        self.run = Arc::new(script);
        self
    }

    /// The launcher as a worker's configuration holds it.
    pub fn shared(&self) -> Arc<dyn Launcher> {
        Arc::new(self.clone())
    }

    /// Runners started, ready or not.
    pub fn starts(&self) -> u32 {
        self.lock().starts
    }

    /// Every `run()` call that ended (not cut short by a kill), in the order they ended.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.lock().calls.clone()
    }

    /// The `run()` calls of one mini-batch that ended.
    pub fn tries(&self, mini_batch: u64) -> Vec<CallRecord> {
        let log = self.lock();
        let calls = log.calls.iter().filter(|c| c.call.mini_batch == mini_batch);
        calls.cloned().collect()
    }

    /// Runners killed: by the agent, or at a `run()` timeout.
    pub fn kills(&self) -> u32 {
        self.lock().kills
    }

    /// Runners asked to shut down.
    pub fn shutdowns(&self) -> u32 {
        self.lock().shutdowns
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Launcher for FakeLauncher {
    async fn python(&self, _environment: Option<PathBuf>) -> Result<Python, PythonError> {
        Ok(Python {
            executable: "/fake/bin/python".into(),
            venv: None,
            version: "3.12.0".into(),
            libpython: "/fake/lib/libpython3.12.so.1.0".into(),
        })
    }

    async fn start(
        &self,
        _launch: &Launch,
        params: InitParams,
        timeout: Duration,
    ) -> Result<(Option<Box<dyn Runner>>, InitOutcome), ProcessError> {
        let number = {
            let mut log = self.lock();
            log.starts += 1;
            log.starts
        };
        let pid = 1000 + number;
        let outcome = match (self.init)(number) {
            Init::Ready => InitOutcome::Ready(ReadyInfo {
                python_version: "3.12.0 (fake)".into(),
                python_prefix: "/fake".into(),
                python_executable: "/fake/bin/python".into(),
                pid,
            }),
            Init::Fail(message) => InitOutcome::Failed(script_error(&message, "init")),
            Init::Hang => {
                let _ = tokio::time::timeout(timeout, std::future::pending::<()>()).await;
                InitOutcome::TimedOut
            }
            Init::Die(code) => InitOutcome::Died(ExitStatus::from_raw(code << 8)),
        };
        let runner = matches!(outcome, InitOutcome::Ready(_)).then(|| {
            Box::new(FakeRunner {
                launcher: self.clone(),
                name: params.process_name,
                pid,
                sent: Default::default(),
                gone: false,
            }) as Box<dyn Runner>
        });
        Ok((runner, outcome))
    }
}

/// A fake runner: mini-batches sent wait in order, as in a real runner's channel.
struct FakeRunner {
    launcher: FakeLauncher,
    name: String,
    pid: u32,
    sent: std::collections::VecDeque<(u64, Vec<PathBuf>)>,
    /// Killed or dead: it answers nothing more.
    gone: bool,
}

#[async_trait]
impl Runner for FakeRunner {
    fn pid(&self) -> u32 {
        self.pid
    }

    async fn submit(&mut self, batch: Batch) -> std::io::Result<()> {
        if self.gone {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        self.sent.push_back((batch.index, batch.items));
        Ok(())
    }

    async fn outcome(&mut self, timeout: Duration) -> RunOutcome {
        if self.gone {
            return RunOutcome::Died(ExitStatus::from_raw(libc::SIGKILL));
        }
        let Some((mini_batch, items)) = self.sent.pop_front() else {
            // Nothing sent: nothing comes back, as from a real runner.
            tokio::time::sleep(timeout).await;
            self.gone = true;
            return RunOutcome::TimedOut;
        };
        let try_number = {
            let mut log = self.launcher.lock();
            let begun = log.begun.entry(mini_batch).or_default();
            *begun += 1;
            *begun
        };
        let call = Call {
            mini_batch,
            try_number,
            items,
            process: self.name.clone(),
        };
        let started = Instant::now();
        let behaviour = (self.launcher.run)(&call);
        let outcome = tokio::time::timeout(timeout, play(behaviour, &call.items))
            .await
            .unwrap_or(RunOutcome::TimedOut);
        let result = match &outcome {
            RunOutcome::Done { .. } => "rows",
            RunOutcome::Raised { .. } => "raised",
            RunOutcome::Died(_) | RunOutcome::ReplyLost { .. } => "died",
            RunOutcome::TimedOut => "timed out",
        };
        let mut log = self.launcher.lock();
        if matches!(outcome, RunOutcome::Died(_) | RunOutcome::TimedOut) {
            // A real runner is killed at its timeout, and a dead one answers nothing more.
            self.gone = true;
            log.kills += u32::from(matches!(outcome, RunOutcome::TimedOut));
        }
        log.calls.push(CallRecord {
            call,
            started,
            ended: Instant::now(),
            result,
        });
        outcome
    }

    async fn shutdown(self: Box<Self>) -> ExitStatus {
        self.launcher.lock().shutdowns += 1;
        ExitStatus::from_raw(0)
    }

    async fn kill(&mut self) {
        if !self.gone {
            self.gone = true;
            self.launcher.lock().kills += 1;
        }
    }
}

/// Plays one `run()` behaviour out.
async fn play(mut behaviour: Run, items: &[PathBuf]) -> RunOutcome {
    let started = Instant::now();
    while let Run::After(wait, then) = behaviour {
        tokio::time::sleep(wait).await;
        behaviour = *then;
    }
    let timing = Timing {
        run_seconds: started.elapsed().as_secs_f64(),
        cpu_seconds: 0.0,
        waited_seconds: 0.0,
    };
    match behaviour {
        Run::Rows => RunOutcome::Done {
            rows: items.iter().map(|p| file_name(p)).collect(),
            timing,
            given: None,
            header: None,
        },
        Run::Return(rows) => RunOutcome::Done {
            rows,
            timing,
            given: None,
            header: None,
        },
        Run::Raise(message) => RunOutcome::Raised {
            error: script_error(&message, "run"),
            timing,
        },
        Run::Die => RunOutcome::Died(ExitStatus::from_raw(libc::SIGKILL)),
        Run::Hang => std::future::pending().await,
        Run::After(..) => unreachable!("played above"),
    }
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

fn script_error(message: &str, function: &str) -> ScriptError {
    ScriptError {
        message: message.to_owned(),
        traceback: format!(
            "Traceback (most recent call last):\n  File \"score.py\", line 1, in {function}\nException: {message}"
        ),
        // A scripted message tells the cause as the runner would from a `RuntimeError`.
        cause: fleetrun_common::protocol::ErrorCause::of([], message),
    }
}
