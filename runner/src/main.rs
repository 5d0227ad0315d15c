//! `fleetrun-runner`: the launcher of a runner process, started by the node agent with its
//! channel on fd 3.
//!
//! It reads the agent's `Init` frame, takes the job's Python the agent resolved (or resolves
//! it the same way, [`fleetrun_common::python`]), loads that interpreter's shared libpython with
//! `RTLD_GLOBAL` and then the Python half of the runner, `libfleetrun_runner.so` (beside this
//! executable; see the library's docs), whose Python symbols resolve against the libpython
//! just loaded. Nothing here touches Python.

use std::ffi::{CStr, CString, OsString, c_char, c_int};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use fleetrun_common::protocol::{
    CHANNEL_FD, InitParams, PROGRESS_FD, Reply, Request, ScriptError, agent_gone_signal, encode,
    read_frame, write_frame,
};
use fleetrun_common::python::Python;

/// Exit codes, as `libfleetrun_runner.so` documents them.
const EXIT_OK: i32 = 0;
const EXIT_NOT_STARTED_BY_AGENT: i32 = 2;
const EXIT_INIT_FAILED: i32 = 3;
const EXIT_CHANNEL_ERROR: i32 = 4;

/// The Python half, beside the launcher.
const LIBRARY: &str = "libfleetrun_runner.so";
/// Its entry point (`fleetrun_runner::fleetrun_runner_serve_v1`).
const ENTRY: &CStr = c"fleetrun_runner_serve_v1";
type Entry = unsafe extern "C" fn(c_int, *const u8, usize, *const c_char) -> c_int;

fn main() {
    exit(run())
}

fn run() -> i32 {
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
    let params = match read_frame::<_, Request>(&mut channel) {
        Ok(None | Some(Request::Shutdown)) => return EXIT_OK,
        Ok(Some(Request::Init(params))) => *params,
        Ok(Some(Request::Run { .. })) => {
            eprintln!("fleetrun-runner: unexpected Run before Init request from the agent");
            return EXIT_CHANNEL_ERROR;
        }
        Err(e) => {
            eprintln!("fleetrun-runner: channel to the agent failed: {e}");
            return EXIT_CHANNEL_ERROR;
        }
    };
    match launch(channel, &params) {
        Ok(code) => code,
        Err(Refused { mut channel, why }) => {
            let error = ScriptError::plain(why);
            match write_frame(&mut channel, &Reply::InitFailed(error)) {
                Ok(()) => EXIT_INIT_FAILED,
                Err(e) => {
                    eprintln!("fleetrun-runner: channel to the agent failed: {e}");
                    EXIT_CHANNEL_ERROR
                }
            }
        }
    }
}

/// The runner cannot start as asked: the agent is told why.
struct Refused {
    channel: UnixStream,
    why: String,
}

/// Enters the working folder, resolves the Python, loads libpython and the Python half, and
/// hands it the channel.
fn launch(channel: UnixStream, params: &InitParams) -> Result<i32, Refused> {
    let refuse = |channel, why| Err(Refused { channel, why });
    // The runner's own working folder, before Python starts: relative paths in the
    // arguments and the script resolve there on every node.
    if let Some(dir) = params.working_dir.as_deref().filter(|d| !d.is_empty())
        && let Err(e) = std::env::set_current_dir(dir)
    {
        return refuse(
            channel,
            format!("cannot enter the working folder {dir}: {e}"),
        );
    }
    // The agent's choice, else the same resolution made here.
    let resolved = match &params.python {
        Some(python) => Ok(python.as_ref().clone()),
        None => Python::resolve(params.environment.as_deref().map(Path::new)),
    };
    let python = match resolved {
        Ok(python) => python,
        Err(e) => return refuse(channel, e.to_string()),
    };
    if let Some(venv) = &python.venv {
        activate(venv);
    }
    let init = match encode(params) {
        Ok(init) => init,
        Err(e) => return refuse(channel, format!("cannot encode the Init request: {e}")),
    };
    let Ok(executable) = CString::new(python.executable.as_os_str().as_bytes()) else {
        let why = format!(
            "interpreter path {} contains NUL",
            python.executable.display()
        );
        return refuse(channel, why);
    };
    let entry = match load(&python.libpython).and_then(|()| python_half()) {
        Ok(entry) => entry,
        Err(why) => return refuse(channel, why),
    };
    let fd = channel.into_raw_fd();
    // SAFETY: the entry point's contract: libpython is loaded globally, `init` and
    // `executable` outlive the call, and `fd` (the channel) is handed over.
    Ok(unsafe { entry(fd, init.as_ptr(), init.len(), executable.as_ptr()) })
}

/// Loads the interpreter's shared libpython so that the Python half's symbols resolve to it.
fn load(libpython: &Path) -> Result<(), String> {
    dlopen(libpython, libc::RTLD_NOW | libc::RTLD_GLOBAL)
        .map(|_| ())
        .map_err(|e| format!("cannot load {}: {e}", libpython.display()))
}

/// Loads `libfleetrun_runner.so` from beside this executable and finds its entry point.
fn python_half() -> Result<Entry, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find fleetrun-runner's own path: {e}"))?;
    let library: PathBuf = exe.with_file_name(LIBRARY);
    let handle = dlopen(&library, libc::RTLD_NOW | libc::RTLD_LOCAL)
        .map_err(|e| format!("cannot load {}: {e}", library.display()))?;
    // SAFETY: `handle` is a loaded library; `ENTRY` is NUL-terminated.
    let symbol = unsafe { libc::dlsym(handle, ENTRY.as_ptr()) };
    if symbol.is_null() {
        return Err(format!(
            "{} has no {}",
            library.display(),
            ENTRY.to_string_lossy()
        ));
    }
    // SAFETY: the library exports the entry point with this signature.
    Ok(unsafe { std::mem::transmute::<*mut libc::c_void, Entry>(symbol) })
}

fn dlopen(path: &Path, flags: c_int) -> Result<*mut libc::c_void, String> {
    let name = CString::new(path.as_os_str().as_bytes()).map_err(|_| "a NUL in the path")?;
    // SAFETY: `name` is NUL-terminated; `dlerror` returns NULL or a NUL-terminated string.
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), flags);
        if handle.is_null() {
            let error = libc::dlerror();
            return Err(if error.is_null() {
                "dlopen failed".to_owned()
            } else {
                CStr::from_ptr(error).to_string_lossy().into_owned()
            });
        }
        Ok(handle)
    }
}

/// Puts the venv's `bin` first on `PATH` and sets `VIRTUAL_ENV`, as `activate` does, so
/// subprocesses that run `python` or a console script get the venv's.
fn activate(venv: &Path) {
    let bin = venv.join("bin");
    let path: OsString = match std::env::var_os("PATH") {
        Some(old) => {
            std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(&old)))
                .unwrap_or_else(|_| bin.into_os_string())
        }
        None => bin.into_os_string(),
    };
    // SAFETY: the launcher is single-threaded.
    unsafe {
        std::env::set_var("PATH", path);
        std::env::set_var("VIRTUAL_ENV", venv);
    }
}

/// Ends the process without running C `atexit` handlers or static destructors.
///
/// Python threads of the script may still be running: tearing down C/C++ libraries under them
/// (CUDA, torch) can crash and turn a clean exit into a signal. Python's and C's stdio are
/// flushed by then.
fn exit(code: i32) -> ! {
    let _ = io::stdout().flush();
    // SAFETY: plain libc calls; `_exit` does not return.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(code)
    }
}

/// Before anything Python: give the script the signal dispositions `python3` starts with, and
/// take what the script starts along when the agent dies.
///
/// Rust's runtime catches SIGSEGV and SIGBUS (to report a stack overflow) and returns from a
/// signal that was sent rather than caused by a fault, so a script's `os.kill(os.getpid(),
/// SIGSEGV)` would be swallowed once: the fault signals go back to their defaults, and a
/// crash crashes. SIGINT is left at its default so that CPython installs its own handler
/// (`KeyboardInterrupt`) at start-up, as it does for `python3`, along with ignoring SIGPIPE
/// and SIGXFSZ. A Ctrl-C on the user's terminal does not reach a runner: each leads a process
/// group of its own, and the agent stops runners itself.
fn prepare_process() {
    // SAFETY: setting signal dispositions; no Rust state involved.
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
    }
    kill_group_when_agent_dies();
}

/// The agent asked the kernel for [`agent_gone_signal`] when it dies (a `kill -9` gives it no
/// time to end its runners): on it, the runner kills its process group, itself and every
/// process its script started that stayed in the group. Only a runner leading its group
/// does; any other keeps the signal's default, which ends the runner alone.
///
/// A script that handles the signal itself (`signal.signal`) gives this up, and a process
/// that left the group (`setsid`, `start_new_session=True`) is not reached.
fn kill_group_when_agent_dies() {
    extern "C" fn agent_gone(_: c_int) {
        // SAFETY: `kill` is async-signal-safe; pid 0 is the caller's process group.
        unsafe {
            libc::kill(0, libc::SIGKILL);
        }
    }
    // SAFETY: plain system calls; the handler only calls `kill`.
    unsafe {
        if libc::getpgrp() == libc::getpid() {
            let handler: extern "C" fn(c_int) = agent_gone;
            libc::signal(agent_gone_signal(), handler as libc::sighandler_t);
        }
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
        // The progress page's descriptor, when given, is closed on exec too (the library
        // maps it and closes it before the script loads).
        libc::fcntl(PROGRESS_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        // SAFETY: fd 3 is an open socket that nothing else in the process owns.
        let channel = UnixStream::from_raw_fd(CHANNEL_FD);
        debug_assert_eq!(channel.as_raw_fd(), CHANNEL_FD);
        Ok(channel)
    }
}
