//! One runner process as the agent sees it: spawned with its channel on fd 3 and its stdout
//! and stderr in the job's user log files, driven request by reply, killed when it overruns.
//!
//! The agent drives runners through two small traits, [`Launcher`] and [`Runner`]:
//! [`ProcessLauncher`] starts real `fleetrun-runner` processes; the flow tests start
//! in-process fakes (`crate::testing`) whose timeouts run on paused time.
//!
//! Each runner leads a process group of its own, which the processes the script starts
//! (`subprocess.Popen` in `init()` or `run()`) join. Whenever the runner ends (killed,
//! shut down, crashed, or its value dropped) the whole group is killed, so nothing the script
//! started outlives its runner. When the agent itself dies (a `kill -9`), the kernel sends
//! each runner [`protocol::agent_gone_signal`] and the runner kills its group.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fleetrun_common::protocol::{
    self, InitParams, ReadyInfo, Reply, Request, RunContext, ScriptError,
};
use fleetrun_common::python::{Python, PythonError};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

use self::progress::Progress;

mod progress;

/// The runner executable's file name, looked for beside the running binary.
pub const RUNNER_EXE: &str = "fleetrun-runner";

/// How long a runner may take to exit after `Shutdown` before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How often an ending runner is checked for its exit.
const EXIT_POLL: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start the runner {exe}: {source}")]
    Spawn {
        exe: PathBuf,
        source: std::io::Error,
    },
    #[error("runner channel: {0}")]
    Channel(#[from] std::io::Error),
}

/// Why the runner executable was not found.
#[derive(Debug, thiserror::Error)]
pub enum FindRunnerError {
    #[error("cannot locate this executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    #[error(
        "{RUNNER_EXE} was not found beside {}; build the whole workspace (cargo build) or set FLEETRUN_RUNNER",
        beside.display()
    )]
    Missing { beside: PathBuf },
}

/// Finds the runner executable: `$FLEETRUN_RUNNER`, else beside the current executable (or
/// one folder up, for test binaries under `target/*/deps`).
pub fn find_runner_exe() -> Result<PathBuf, FindRunnerError> {
    if let Some(exe) = std::env::var_os("FLEETRUN_RUNNER") {
        return Ok(PathBuf::from(exe));
    }
    let current = std::env::current_exe().map_err(FindRunnerError::CurrentExe)?;
    let mut dir = current.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join(RUNNER_EXE);
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent();
    }
    Err(FindRunnerError::Missing { beside: current })
}

/// What starting a runner needs beyond [`InitParams`].
#[derive(Debug, Clone)]
pub struct Launch {
    pub exe: PathBuf,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// Set in the runner's environment, over the agent's own.
    pub env: Vec<(String, String)>,
    /// Variables removed from the runner's environment (fleetrun's credentials, a GPU mask
    /// it must not get), before `env` is set.
    pub env_remove: Vec<String>,
}

impl Launch {
    /// Makes `cmd`'s environment the runner's: the agent's own, less `env_remove`, plus `env`.
    pub fn apply_env(&self, cmd: &mut std::process::Command) {
        for name in &self.env_remove {
            cmd.env_remove(name);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
    }
}

/// How a `run()` attempt ended, from the agent's side.
#[derive(Debug)]
pub enum RunOutcome {
    Done {
        rows: Vec<String>,
        timing: protocol::Timing,
        /// The rows `run()` was given (a tabular input), which are its items.
        given: Option<u64>,
        /// The returned DataFrame's header row.
        header: Option<String>,
    },
    Raised {
        error: ScriptError,
        timing: protocol::Timing,
    },
    /// Overran `run_invocation_timeout`; the runner was killed.
    TimedOut,
    /// The runner died (crash, OOM kill, `kill -9`).
    Died(ExitStatus),
    /// The runner had run this mini-batch and held its reply back, then died in one sent
    /// after it: the `ahead`-th of those sent ahead of this one (from 0), as its progress
    /// page tells. This one's reply was lost with the runner; the script is not to blame
    /// for it.
    ReplyLost { died: ExitStatus, ahead: usize },
}

/// How starting a runner ended.
#[derive(Debug)]
pub enum InitOutcome {
    Ready(ReadyInfo),
    Failed(ScriptError),
    TimedOut,
    Died(ExitStatus),
}

/// Starts a slot's runner: sends it `Init` and returns once it is ready or has failed.
#[async_trait]
pub trait Launcher: Send + Sync + std::fmt::Debug {
    /// The Python a job's runners will run, given its `environment`; refused when fleetrun
    /// cannot run it. Asked once per job on a node, before any of its runners starts; the
    /// runners get the answer (`InitParams::python`).
    async fn python(&self, environment: Option<PathBuf>) -> Result<Python, PythonError>;

    async fn start(
        &self,
        launch: &Launch,
        params: InitParams,
        timeout: Duration,
    ) -> Result<(Option<Box<dyn Runner>>, InitOutcome), ProcessError>;
}

/// One mini-batch as a runner gets it: its local paths, or a tabular input's staged chunks,
/// and its context.
#[derive(Debug, Default)]
pub struct Batch {
    pub index: u64,
    pub items: Vec<PathBuf>,
    pub tables: Vec<protocol::StagedTable>,
    pub context: RunContext,
}

/// A started runner, driven request by reply (see [`RunnerProcess`] for the rules).
#[async_trait]
pub trait Runner: Send + Sync {
    fn pid(&self) -> u32;
    /// Sends a mini-batch; it runs once those sent before it have returned.
    async fn submit(&mut self, batch: Batch) -> std::io::Result<()>;

    /// How the oldest mini-batch sent and not yet answered ended, waiting at most `timeout`.
    async fn outcome(&mut self, timeout: Duration) -> RunOutcome;
    /// Asks the runner to call `shutdown()` and exit.
    async fn shutdown(self: Box<Self>) -> ExitStatus;
    /// Kills the runner and whatever it started.
    async fn kill(&mut self);
}

/// Starts real `fleetrun-runner` processes: the launcher of every worker.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessLauncher;

impl ProcessLauncher {
    /// The launcher workers use, as configurations hold it.
    pub fn shared() -> Arc<dyn Launcher> {
        Arc::new(ProcessLauncher)
    }
}

#[async_trait]
impl Launcher for ProcessLauncher {
    async fn python(&self, environment: Option<PathBuf>) -> Result<Python, PythonError> {
        // It runs the interpreter once: off the runtime's threads.
        tokio::task::spawn_blocking(move || Python::resolve(environment.as_deref()))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    async fn start(
        &self,
        launch: &Launch,
        params: InitParams,
        timeout: Duration,
    ) -> Result<(Option<Box<dyn Runner>>, InitOutcome), ProcessError> {
        let (process, outcome) = RunnerProcess::start(launch, params, timeout).await?;
        Ok((process.map(|p| Box::new(p) as Box<dyn Runner>), outcome))
    }
}

#[async_trait]
impl Runner for RunnerProcess {
    fn pid(&self) -> u32 {
        RunnerProcess::pid(self)
    }

    async fn submit(&mut self, batch: Batch) -> std::io::Result<()> {
        RunnerProcess::submit(self, batch).await
    }

    async fn outcome(&mut self, timeout: Duration) -> RunOutcome {
        RunnerProcess::outcome(self, timeout).await
    }

    async fn shutdown(self: Box<Self>) -> ExitStatus {
        RunnerProcess::shutdown(*self).await
    }

    async fn kill(&mut self) {
        RunnerProcess::kill(self).await;
    }
}

pub struct RunnerProcess {
    child: Child,
    /// Read through a buffer: a reply's length and body come in one read.
    channel: BufReader<UnixStream>,
    pid: u32,
    /// The page the runner counts its begun mini-batches in, when it may hold replies.
    progress: Option<Progress>,
    /// `Run` replies taken: the next one answers the runner's mini-batch of that number.
    answered: u64,
    /// Set once the runner is reaped: from then on its pid, and so its group's id, may name
    /// another process, and the group is never signalled again.
    reaped: Option<ExitStatus>,
}

/// Has the runner `cmd` starts die with this agent, and find its channel (`fd`) and its
/// progress page (`page_fd`) at the descriptors the protocol names.
fn hand_over(cmd: &mut Command, fd: RawFd, page_fd: Option<RawFd>) {
    let agent = std::process::id() as libc::pid_t;
    let agent_gone = protocol::agent_gone_signal();
    // SAFETY: only async-signal-safe calls (prctl, getppid, dup2, fcntl) between fork and
    // exec.
    unsafe {
        cmd.pre_exec(move || {
            die_with_agent(agent, agent_gone)?;
            // Each first copied above both targets, so that neither `dup2` overwrites
            // the other's source; the copies close on exec, the targets stay open.
            let high = |fd| match libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) {
                n if n < 0 => Err(std::io::Error::last_os_error()),
                n => Ok(n),
            };
            let (channel, page) = (high(fd)?, page_fd.map(high).transpose()?);
            for (from, to) in [
                (Some(channel), protocol::CHANNEL_FD),
                (page, protocol::PROGRESS_FD),
            ] {
                if let Some(from) = from
                    && libc::dup2(from, to) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

impl RunnerProcess {
    /// Spawns the runner and sends it `Init`; returns once it is ready or has failed.
    pub async fn start(
        launch: &Launch,
        mut params: InitParams,
        timeout: Duration,
    ) -> Result<(Option<RunnerProcess>, InitOutcome), ProcessError> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        // A runner may hold replies back only when, dying, it can say which mini-batch it
        // died in: without its page, it sends each reply at once.
        let (progress, page) = match params.hold_replies.then(Progress::new) {
            Some(Ok((progress, page))) => (Some(progress), Some(page)),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "Cannot make a runner's progress page; its replies are not held back.");
                (None, None)
            }
            None => (None, None),
        };
        params.hold_replies = progress.is_some();
        ours.set_nonblocking(true)?;
        let theirs: OwnedFd = theirs.into();
        for path in [&launch.stdout, &launch.stderr] {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
        }
        let append = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
        };
        let mut cmd = Command::new(&launch.exe);
        cmd.stdin(Stdio::null())
            .stdout(append(&launch.stdout)?)
            .stderr(append(&launch.stderr)?)
            .process_group(0)
            .kill_on_drop(true);
        launch.apply_env(cmd.as_std_mut());
        hand_over(
            &mut cmd,
            theirs.as_raw_fd(),
            page.as_ref().map(|p| p.as_raw_fd()),
        );
        let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            exe: launch.exe.clone(),
            source,
        })?;
        drop((theirs, page));
        let pid = child.id().unwrap_or_default();
        let mut runner = RunnerProcess {
            child,
            channel: BufReader::new(UnixStream::from_std(ours)?),
            pid,
            progress,
            answered: 0,
            reaped: None,
        };
        runner.send(&Request::Init(Box::new(params))).await?;
        let outcome = match tokio::time::timeout(timeout, runner.receive()).await {
            Err(_) => {
                runner.kill().await;
                return Ok((None, InitOutcome::TimedOut));
            }
            Ok(Ok(Some(Reply::Ready(info)))) => InitOutcome::Ready(info),
            Ok(Ok(Some(Reply::InitFailed(error)))) => {
                runner.kill().await;
                return Ok((None, InitOutcome::Failed(error)));
            }
            Ok(Ok(Some(other))) => {
                runner.kill().await;
                return Ok((None, InitOutcome::Failed(unexpected(&other))));
            }
            Ok(Ok(None) | Err(_)) => {
                let status = runner.reap().await;
                return Ok((None, InitOutcome::Died(status)));
            }
        };
        Ok((Some(runner), outcome))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends a mini-batch. The runner reads requests in order: one sent while it runs
    /// another waits in the channel and starts the moment the one before returns. Every
    /// mini-batch sent must have its [`RunnerProcess::outcome`] taken, in order, or the
    /// process be killed.
    pub async fn submit(&mut self, batch: Batch) -> std::io::Result<()> {
        self.send(&Request::Run {
            mini_batch: batch.index,
            items: batch.items,
            tables: batch.tables,
            context: batch.context,
        })
        .await
    }

    /// How the oldest mini-batch sent and not yet answered ended, waiting at most `timeout`.
    /// After `TimedOut`, `Died` or `ReplyLost` the process is gone: drop this value.
    pub async fn outcome(&mut self, timeout: Duration) -> RunOutcome {
        let reply = match tokio::time::timeout(timeout, self.receive()).await {
            Err(_) => {
                self.kill().await;
                return RunOutcome::TimedOut;
            }
            Ok(Ok(None) | Err(_)) => return self.died().await,
            Ok(Ok(Some(reply))) => reply,
        };
        self.answered += 1;
        match reply {
            Reply::Done {
                rows,
                timing,
                given,
                header,
            } => RunOutcome::Done {
                rows,
                timing,
                given,
                header,
            },
            Reply::Failed { error, timing } => RunOutcome::Raised { error, timing },
            other => RunOutcome::Raised {
                error: unexpected(&other),
                timing: Default::default(),
            },
        }
    }

    /// How the oldest mini-batch not yet answered ended when the runner died: in it, or
    /// (its progress page says so) in one sent after it, this one's reply held back and lost.
    async fn died(&mut self) -> RunOutcome {
        let died = self.reap().await;
        let begun = self.progress.as_ref().map_or(0, Progress::begun);
        // The runner's mini-batches are numbered from 0 in the order sent; the oldest not
        // answered is number `answered`, and it died in number `begun - 1`.
        match begun.checked_sub(self.answered + 2) {
            Some(ahead) => RunOutcome::ReplyLost {
                died,
                ahead: ahead as usize,
            },
            None => RunOutcome::Died(died),
        }
    }

    /// Asks the runner to call `shutdown()` and exit; kills it if it does not in time. What
    /// the script left running is killed either way.
    pub async fn shutdown(mut self) -> ExitStatus {
        let grace = if self.send(&Request::Shutdown).await.is_ok() {
            SHUTDOWN_GRACE
        } else {
            Duration::ZERO
        };
        self.end(grace).await
    }

    /// SIGKILLs the runner and everything in its process group.
    pub async fn kill(&mut self) {
        self.end(Duration::ZERO).await;
    }

    /// Waits for a runner whose channel closed, returning how it exited.
    async fn reap(&mut self) -> ExitStatus {
        // The channel closes as the process dies; its exit follows within moments. A runner
        // that closed its channel but lingers is killed.
        self.end(Duration::from_secs(5)).await
    }

    /// Gives the runner up to `grace` to exit, then SIGKILLs its process group (the runner
    /// if it is still there, and whatever the script started) and reaps it.
    async fn end(&mut self, grace: Duration) -> ExitStatus {
        if let Some(status) = self.reaped {
            return status;
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.exited() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(EXIT_POLL).await;
        }
        // Before reaping: until then the runner's pid, the group's id, is nobody else's.
        self.kill_group();
        let status = self
            .child
            .wait()
            .await
            .unwrap_or_else(|_| ExitStatus::from_raw(libc::SIGKILL));
        self.reaped = Some(status);
        status
    }

    /// Whether the runner has exited, leaving it to be reaped.
    fn exited(&self) -> bool {
        // SAFETY: `waitid` writes into `info`; WNOWAIT leaves the child waitable.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let found = libc::waitid(
                libc::P_PID,
                self.pid,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            // With WNOHANG, a child that has not exited leaves `si_pid` 0.
            found != 0 || info.si_pid() != 0
        }
    }

    fn kill_group(&self) {
        if self.reaped.is_none() && self.pid != 0 {
            // SAFETY: sends a signal; the runner is not reaped, so its group id is its own.
            unsafe {
                libc::killpg(self.pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }

    async fn send(&mut self, request: &Request) -> std::io::Result<()> {
        self.channel.write_all(&protocol::frame(request)?).await
    }

    async fn receive(&mut self) -> std::io::Result<Option<Reply>> {
        let mut len = [0u8; 4];
        match self.channel.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let len = protocol::check_len(u32::from_be_bytes(len))?;
        let mut body = vec![0u8; len];
        self.channel.read_exact(&mut body).await?;
        protocol::decode(&body).map(Some)
    }
}

impl Drop for RunnerProcess {
    /// A runner dropped without being ended (a cancelled task) takes its group with it;
    /// tokio reaps the runner itself.
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// In a forked runner before exec: asks the kernel for `signal` when the agent dies, the
/// runner's cue to kill its process group. An agent already gone (it died since the fork) is
/// an error, and the runner never starts.
///
/// # Safety
/// Async-signal-safe: for `pre_exec`.
unsafe fn die_with_agent(agent: libc::pid_t, signal: i32) -> std::io::Result<()> {
    // SAFETY: plain system calls.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() != agent {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

fn unexpected(reply: &Reply) -> ScriptError {
    let message = format!("runner protocol error: unexpected reply {reply:?}");
    ScriptError::plain(message)
}

/// `-9` for a signal, the code otherwise: how `_main.txt` reports an exit.
pub fn returncode(status: &ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| -status.signal().unwrap_or(0))
}
