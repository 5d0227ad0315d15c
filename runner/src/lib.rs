//! The runner process: one per concurrent mini-batch on a node.
//!
//! The node agent spawns `fleetrun-runner` with its channel on fd 3 (see [`protocol`]), the
//! user's stdout/stderr redirected to the job's log files and the job's environment set.
//! The runner embeds CPython, loads the entry script, calls `init()` once, `run()` per
//! mini-batch and `shutdown()` on a clean stop. A script that crashes, hangs or leaks takes
//! down only its own runner; the agent restarts it.
//!
//! # Layout
//!
//! - [`protocol`]: the frames exchanged with the agent.
//! - `interpreter`: picks the Python (a virtualenv, an interpreter, or the one the crate was
//!   built against) and starts CPython through `PyConfig`.
//! - `script`: loads the entry script with its `EntryScript` helper (`python/entry_script.py`)
//!   and calls `init()`, `run()` and `shutdown()`, turning exceptions into [`ScriptError`]s.
//! - `rows`: turns `run()`'s result into one string per element.
//!
//! # Exit codes
//!
//! [`EXIT_OK`] after `Shutdown` or when the agent closes the channel;
//! [`EXIT_NOT_STARTED_BY_AGENT`] when fd 3 is not a socket; [`EXIT_INIT_FAILED`] after an
//! `InitFailed` reply; [`EXIT_CHANNEL_ERROR`] when the channel breaks or carries an
//! unexpected frame. Anything else (a signal, `os._exit()` in the script) is the script's.
//!
//! [`ScriptError`]: protocol::ScriptError

use std::io::{self, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

use pyo3::Python;

use crate::interpreter::Interpreter;
use crate::protocol::{
    CHANNEL_FD, InitParams, MAX_FRAME, Reply, Request, Timing, encode, read_frame, write_encoded,
    write_frame,
};
use crate::script::EntryScript;

mod interpreter;
pub use fleetrun_common::protocol;
mod rows;
mod script;

/// `Shutdown` handled, or the agent closed the channel.
pub const EXIT_OK: i32 = 0;
/// File descriptor 3 is not a socket: someone started the runner by hand.
pub const EXIT_NOT_STARTED_BY_AGENT: i32 = 2;
/// The runner replied `InitFailed`: Python could not start, or loading the script or its
/// `init()` raised.
pub const EXIT_INIT_FAILED: i32 = 3;
/// The channel failed (read/write error, undecodable frame) or carried a request out of turn.
pub const EXIT_CHANNEL_ERROR: i32 = 4;

#[derive(Debug, thiserror::Error)]
enum RunnerError {
    #[error("channel to the agent failed: {0}")]
    Channel(#[from] io::Error),
    #[error("unexpected {0} request from the agent")]
    Unexpected(&'static str),
}

/// Runs the runner process to completion and returns its exit code (pass it to [`exit`]).
pub fn main() -> i32 {
    prepare_process();
    let mut channel = match open_channel() {
        Ok(channel) => channel,
        Err(reason) => {
            eprintln!(
                "fleetrun-runner: {reason}. fleetrun-runner is started by fleetrun's node \
                 agent, not by hand."
            );
            return EXIT_NOT_STARTED_BY_AGENT;
        }
    };
    match serve(&mut channel) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fleetrun-runner: {e}");
            EXIT_CHANNEL_ERROR
        }
    }
}

/// Ends the process without running C `atexit` handlers or static destructors.
///
/// Python threads of the script may still be running: tearing down C/C++ libraries under them
/// (CUDA, torch) can crash and turn a clean exit into a signal. Python's and C's stdio are
/// flushed by then.
pub fn exit(code: i32) -> ! {
    let _ = io::stdout().flush();
    // SAFETY: plain libc calls; `_exit` does not return.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(code)
    }
}

/// Before anything Python: give the script the signal dispositions `python3` starts with, and
/// die with the agent.
///
/// Rust's runtime catches SIGSEGV and SIGBUS (to report a stack overflow) and returns from a
/// signal that was sent rather than caused by a fault, so a script's `os.kill(os.getpid(),
/// SIGSEGV)` would be swallowed once: the fault signals go back to their defaults, and a
/// crash crashes. SIGINT is left at its default so that CPython installs its own handler
/// (`KeyboardInterrupt`) at start-up, as it does for `python3`, along with ignoring SIGPIPE
/// and SIGXFSZ (see `interpreter`). A Ctrl-C on the user's terminal does not reach a runner:
/// each leads a process group of its own, and the agent stops runners itself.
fn prepare_process() {
    // SAFETY: setting signal dispositions and a process attribute; no Rust state involved.
    unsafe {
        for signal in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGINT,
        ] {
            libc::signal(signal, libc::SIG_DFL);
        }
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
}

/// Takes the agent's socket from fd 3, closed on exec so the script's subprocesses do not
/// hold the channel open.
fn open_channel() -> Result<UnixStream, &'static str> {
    // SAFETY: `fstat` writes into `stat`; `fcntl` only changes a flag of the descriptor.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(CHANNEL_FD, &mut stat) != 0 {
            return Err("file descriptor 3 is not open");
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err("file descriptor 3 is not a socket");
        }
        libc::fcntl(CHANNEL_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        // SAFETY: fd 3 is an open socket that nothing else in the process owns.
        Ok(UnixStream::from_raw_fd(CHANNEL_FD))
    }
}

fn serve(channel: &mut UnixStream) -> Result<i32, RunnerError> {
    let params = match read_frame::<_, Request>(channel)? {
        None => return Ok(EXIT_OK),
        Some(Request::Init(params)) => params,
        Some(Request::Run { .. }) => return Err(RunnerError::Unexpected("Run before Init")),
        Some(Request::Shutdown) => return Ok(EXIT_OK),
    };
    // The runner's own working folder, before Python starts: relative paths in the
    // arguments and the script resolve there on every node.
    if let Some(dir) = params.working_dir.as_deref().filter(|d| !d.is_empty())
        && let Err(e) = std::env::set_current_dir(dir)
    {
        let message = format!("cannot enter the working folder {dir}: {e}");
        write_frame(channel, &Reply::InitFailed(script::plain_error(message)))?;
        return Ok(EXIT_INIT_FAILED);
    }
    let started = Interpreter::choose(params.environment.as_deref()).and_then(|i| i.start());
    if let Err(e) = started {
        write_frame(
            channel,
            &Reply::InitFailed(script::plain_error(e.to_string())),
        )?;
        return Ok(EXIT_INIT_FAILED);
    }
    Python::attach(|py| serve_script(py, channel, &params))
}

fn serve_script(
    py: Python<'_>,
    channel: &mut UnixStream,
    params: &InitParams,
) -> Result<i32, RunnerError> {
    let loaded = EntryScript::load(py, params).and_then(|script| {
        let ready = script::ready_info(py).map_err(|e| script::script_error(py, &e))?;
        Ok((script, ready))
    });
    script::flush_stdio(py);
    let script = match loaded {
        Ok((script, ready)) => {
            write_frame(channel, &Reply::Ready(ready))?;
            script
        }
        Err(error) => {
            write_frame(channel, &Reply::InitFailed(error))?;
            return Ok(EXIT_INIT_FAILED);
        }
    };
    loop {
        // The GIL is released while waiting, so the script's own threads keep running.
        match py.detach(|| read_frame::<_, Request>(channel))? {
            None => {
                script.write_profile(py);
                script::flush_stdio(py);
                return Ok(EXIT_OK);
            }
            Some(Request::Run {
                mini_batch,
                items,
                tables,
                context,
            }) => {
                let (rows, timing, given) = if tables.is_empty() {
                    let (rows, timing) = script.run(py, &items, mini_batch, &context);
                    (rows, timing, None)
                } else {
                    script.run_tables(py, &tables, mini_batch, &context)
                };
                script::flush_stdio(py);
                let reply = match rows {
                    Ok(returned) => Reply::Done {
                        rows: returned.rows,
                        timing,
                        given,
                        header: returned.header,
                    },
                    Err(error) => Reply::Failed { error, timing },
                };
                py.detach(|| send_run_reply(channel, &reply, timing))?;
            }
            Some(Request::Shutdown) => {
                let result = script.shutdown(py);
                script.write_profile(py);
                script::flush_stdio(py);
                if let Err(error) = result {
                    eprint!("fleetrun-runner: shutdown() raised:\n{}", error.traceback);
                }
                return Ok(EXIT_OK);
            }
            Some(Request::Init(_)) => return Err(RunnerError::Unexpected("second Init")),
        }
    }
}

/// Sends a `Run` reply, or a `Failed` one when the rows exceed the frame limit (the agent
/// would refuse the frame and lose the runner).
fn send_run_reply(channel: &mut UnixStream, reply: &Reply, timing: Timing) -> io::Result<()> {
    let body = encode(reply)?;
    if body.len() <= MAX_FRAME {
        return write_encoded(channel, &body);
    }
    let message = format!(
        "ValueError: run() returned {} MiB of rows; a mini-batch's rows must stay under {} MiB",
        body.len() >> 20,
        MAX_FRAME >> 20
    );
    write_frame(
        channel,
        &Reply::Failed {
            error: script::plain_error(message),
            timing,
        },
    )
}
