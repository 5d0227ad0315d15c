//! Starting the embedded CPython that the launcher loaded.
//!
//! CPython derives `sys.prefix`, the stdlib and site-packages from the path of the `python`
//! executable it believes it runs as. The runner names that path explicitly (the program name)
//! instead of letting CPython look `python3` up on `PATH`: a virtualenv's `bin/python`, so
//! CPython finds the venv's `pyvenv.cfg` and its site-packages exactly as under the venv's own
//! `python`, or the interpreter's own file, so the stdlib matches the libpython loaded.
//!
//! Only calls of CPython's stable ABI are used (`PyConfig` is not part of it), so the same
//! runner starts every CPython the launcher may load.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use pyo3::ffi;

/// Why CPython cannot be started as asked. Reported to the agent as an init failure.
#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error("interpreter path {0} cannot be given to Python")]
    BadPath(String),
}

/// Starts CPython as `executable` would run, with the signal handlers `python3` installs
/// (SIGINT raises `KeyboardInterrupt` in the main thread, which is the only thread the runner
/// runs Python on; SIGPIPE and SIGXFSZ are ignored, and reset to their defaults in the
/// script's subprocesses).
///
/// Must run once, before any other Python API call, while the process has a single thread
/// (it edits the environment). Leaves the GIL released, as `pyo3`'s own initialisation does.
pub fn start(executable: &Path) -> Result<(), InterpreterError> {
    let bad = || InterpreterError::BadPath(executable.display().to_string());
    let program = CString::new(executable.as_os_str().as_bytes()).map_err(|_| bad())?;
    utf8_mode_as_python3();
    // SAFETY: called once at start-up, before anything else touches Python; CPython keeps
    // the program name's pointer, so the decoded string is never freed.
    unsafe {
        let wide = ffi::Py_DecodeLocale(program.as_ptr(), std::ptr::null_mut());
        if wide.is_null() {
            return Err(bad());
        }
        ffi::Py_SetProgramName(wide);
        ffi::Py_InitializeEx(1);
        ffi::PyEval_SaveThread();
    }
    Ok(())
}

/// `python3` turns on UTF-8 mode under the C or POSIX locale (PEP 540); the initialisation
/// of an embedded CPython does not, so the runner asks for it the way a user would.
fn utf8_mode_as_python3() {
    if std::env::var_os("PYTHONUTF8").is_some() {
        return;
    }
    // SAFETY: `setlocale` with "" reads the environment's locale; the returned string is
    // copied before any other locale call. The process is single-threaded here.
    let c_locale = unsafe {
        let name = libc::setlocale(libc::LC_CTYPE, c"".as_ptr());
        let c_locale =
            !name.is_null() && matches!(CStr::from_ptr(name).to_bytes(), b"C" | b"POSIX");
        libc::setlocale(libc::LC_CTYPE, c"C".as_ptr());
        c_locale
    };
    if c_locale {
        // SAFETY: single-threaded (see `start`).
        unsafe { std::env::set_var("PYTHONUTF8", "1") };
    }
}
