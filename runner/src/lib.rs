//! The Python half of the runner process: one process per concurrent mini-batch on a node.
//!
//! The node agent spawns `fleetrun-runner` (the launcher, `main.rs`) with its channel on fd 3
//! (see [`protocol`]), the user's stdout/stderr redirected to the job's log files and the
//! job's environment set. The launcher reads the `Init` frame, takes the job's Python the
//! agent resolved ([`fleetrun_common::python`]), loads that interpreter's shared libpython and
//! then this library (`libfleetrun_runner.so`, built against CPython's stable ABI, so one
//! build serves every CPython the launcher may load), and calls [`fleetrun_runner_serve_v1`].
//! From there the runner starts CPython, loads the entry script, calls `init()` once, `run()`
//! per mini-batch and `shutdown()` on a clean stop. A script that crashes, hangs or leaks
//! takes down only its own runner; the agent restarts it.
//!
//! # Layout
//!
//! - [`protocol`]: the frames exchanged with the agent.
//! - `interpreter`: starts CPython as the chosen `python` executable would run.
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
//! The launcher uses the same codes.
//!
//! [`ScriptError`]: protocol::ScriptError

use std::ffi::{CStr, OsStr, c_char, c_int};
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use pyo3::Python;

use crate::outbox::Outbox;
use crate::progress::Progress;
use crate::protocol::{
    InitParams, MAX_FRAME, Reply, Request, Timing, frame, read_frame, write_frame,
};
use crate::script::EntryScript;

mod interpreter;
mod outbox;
mod progress;
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

/// Serves the channel on `fd` from its `Init` frame (`init`, `init_len` bytes of
/// MessagePack, already read by the launcher), with CPython computing its paths from
/// `executable` (a NUL-terminated path). Returns the process's exit code.
///
/// # Safety
/// The launcher calls it once, single-threaded, after loading libpython with `RTLD_GLOBAL`;
/// `init` points to `init_len` readable bytes, `executable` to a NUL-terminated string, and
/// `fd` is the agent's socket, owned by nothing else.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fleetrun_runner_serve_v1(
    fd: c_int,
    init: *const u8,
    init_len: usize,
    executable: *const c_char,
) -> c_int {
    // SAFETY: as the caller promises.
    let (channel, init, executable) = unsafe {
        (
            UnixStream::from_raw_fd(fd),
            std::slice::from_raw_parts(init, init_len),
            Path::new(OsStr::from_bytes(CStr::from_ptr(executable).to_bytes())),
        )
    };
    let result = match rmp_serde::from_slice::<InitParams>(init) {
        Ok(params) => serve(&channel, &params, executable),
        Err(e) => Err(RunnerError::Channel(io::Error::new(
            io::ErrorKind::InvalidData,
            e,
        ))),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fleetrun-runner: {e}");
            EXIT_CHANNEL_ERROR
        }
    }
}

fn serve(channel: &UnixStream, params: &InitParams, executable: &Path) -> Result<i32, RunnerError> {
    if let Err(e) = interpreter::start(executable) {
        write_frame(
            &mut &*channel,
            &Reply::InitFailed(script::plain_error(e.to_string())),
        )?;
        return Ok(EXIT_INIT_FAILED);
    }
    Python::attach(|py| serve_script(py, channel, params))
}

fn serve_script(
    py: Python<'_>,
    channel: &UnixStream,
    params: &InitParams,
) -> Result<i32, RunnerError> {
    // Requests are read through a buffer (a frame's length and body in one read, and those
    // sent ahead with them); replies are written whole, one or several in a write.
    let mut requests = io::BufReader::new(channel);
    let mut replies = channel;
    // Opened before the script loads: its descriptor is closed before anything is spawned.
    let mut progress = match params.hold_replies.then(Progress::open).transpose() {
        Ok(progress) => progress,
        Err(e) => {
            eprintln!("fleetrun-runner: replies are not held back: {e}");
            None
        }
    };
    let Some(script) = init(py, params, &mut replies)? else {
        return Ok(EXIT_INIT_FAILED);
    };
    let outbox = Outbox::new(channel, progress.is_some())?;
    // Since when the runner has had nothing to run: its wait for each request is reported.
    let mut free = Instant::now();
    loop {
        if outbox.held() && !request_in_hand(&requests) {
            // Nothing to run next: what is held goes now, not HOLD_LIMIT later.
            py.detach(|| outbox.flush())?;
        }
        // The GIL is released while waiting, so the script's own threads keep running.
        match py.detach(|| read_frame::<_, Request>(&mut requests))? {
            None => {
                py.detach(|| outbox.flush())?;
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
                let waited_seconds = free.elapsed().as_secs_f64();
                if let Some(progress) = progress.as_mut() {
                    progress.begin();
                }
                let (rows, timing, given) = if tables.is_empty() {
                    let (rows, timing) = script.run(py, &items, mini_batch, &context);
                    (rows, timing, None)
                } else {
                    script.run_tables(py, &tables, mini_batch, &context)
                };
                let timing = Timing {
                    waited_seconds,
                    ..timing
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
                let whole = run_reply_frame(&reply, timing)?;
                if outbox.holds() && request_in_hand(&requests) {
                    // No I/O unless HELD_REPLIES are in hand.
                    outbox.hold(&whole)?;
                } else {
                    py.detach(|| outbox.send(&whole))?;
                }
                free = Instant::now();
            }
            Some(Request::Shutdown) => {
                py.detach(|| outbox.flush())?;
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

/// Loads the entry script and runs its `init()`, answering `Ready` (with what the runner
/// found) or `InitFailed` on `replies`; `None` when it failed.
fn init(
    py: Python<'_>,
    params: &InitParams,
    replies: &mut &UnixStream,
) -> Result<Option<EntryScript>, RunnerError> {
    let loaded = EntryScript::load(py, params).and_then(|script| {
        let ready = script::ready_info(py).map_err(|e| script::script_error(py, &e))?;
        Ok((script, ready))
    });
    script::flush_stdio(py);
    match loaded {
        Ok((script, ready)) => {
            write_frame(replies, &Reply::Ready(ready))?;
            Ok(Some(script))
        }
        Err(error) => {
            write_frame(replies, &Reply::InitFailed(error))?;
            Ok(None)
        }
    }
}

/// Whether the next request is already in `requests`' buffer (it came with the one before:
/// the runner is behind, the moment holding replies saves the agent a wake). One still in
/// the channel does not count: holding then would leave the runner without its next ones
/// while the agent waits for replies.
fn request_in_hand(requests: &io::BufReader<&UnixStream>) -> bool {
    !requests.buffer().is_empty()
}

/// A `Run` reply's frame, or a `Failed` one's when the rows exceed the frame limit (the
/// agent would refuse the frame and lose the runner).
fn run_reply_frame(reply: &Reply, timing: Timing) -> io::Result<Vec<u8>> {
    let whole = frame(reply)?;
    let body = whole.len() - 4;
    if body <= MAX_FRAME {
        return Ok(whole);
    }
    let message = format!(
        "ValueError: run() returned {} MiB of rows; a mini-batch's rows must stay under {} MiB",
        body >> 20,
        MAX_FRAME >> 20
    );
    frame(&Reply::Failed {
        error: script::plain_error(message),
        timing,
    })
}
