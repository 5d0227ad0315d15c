//! Choosing and starting the embedded CPython.
//!
//! CPython derives `sys.prefix`, the stdlib and site-packages from the path of the `python`
//! executable it believes it runs as. The runner sets that path explicitly through `PyConfig`
//! instead of letting CPython look `python3` up on `PATH`:
//!
//! - a virtualenv's `bin/python`: CPython finds the venv's `pyvenv.cfg`, so `sys.prefix` is the
//!   venv and its site-packages are importable, exactly as under the venv's own `python`;
//! - otherwise the interpreter this crate was built against (`FLEETRUN_BUILD_PYTHON`, recorded
//!   by `build.rs`), so the stdlib matches the libpython the binary loads, whatever `python3`
//!   comes first on `PATH`.

use std::ffi::{CStr, CString, OsString};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fs, io};

use pyo3::ffi;

/// The interpreter the crate was built against (`sys.executable` of pyo3's build config).
const BUILD_PYTHON: Option<&str> = option_env!("FLEETRUN_BUILD_PYTHON");

/// Asks an interpreter file where it lives and which version it is.
const PROBE: &str = "import sys; print(sys.executable); print(sys.prefix); print(sys.base_prefix); \
                     print('%d.%d' % sys.version_info[:2])";

/// The interpreter settings CPython is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// The `python` CPython computes its paths from; `None` leaves the choice to CPython.
    pub executable: Option<PathBuf>,
    /// The virtualenv in use: its `bin` is put first on `PATH` for subprocesses.
    pub venv: Option<PathBuf>,
}

/// Why CPython cannot be started as asked. Reported to the agent as an init failure.
#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error("environment {0} does not exist")]
    NotFound(PathBuf),
    #[error(
        "environment {path} is neither a virtualenv folder (with pyvenv.cfg) nor a Python \
         interpreter: {source}"
    )]
    NotAnInterpreter { path: PathBuf, source: io::Error },
    #[error("VIRTUAL_ENV={0} is not a virtualenv folder (no pyvenv.cfg)")]
    NotAVirtualEnv(PathBuf),
    #[error("virtualenv {0} has no bin/python")]
    NoPythonInVirtualEnv(PathBuf),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error(
        "{what} is Python {found}, but fleetrun-runner embeds Python {embedded}; use an \
         environment made with Python {embedded}"
    )]
    VersionMismatch {
        what: String,
        found: String,
        embedded: String,
    },
    #[error("Python failed to start: {0}")]
    Start(String),
}

impl Interpreter {
    /// Picks the interpreter: the job's `environment` (a virtualenv folder, an environment
    /// folder with `bin/python`, or an interpreter file), else `$VIRTUAL_ENV`, else the
    /// interpreter the crate was built against.
    pub fn choose(environment: Option<&str>) -> Result<Self, InterpreterError> {
        if let Some(environment) = environment.filter(|e| !e.is_empty()) {
            let path =
                std::path::absolute(environment).map_err(|source| InterpreterError::Read {
                    path: environment.into(),
                    source,
                })?;
            if path.join("pyvenv.cfg").is_file() {
                return Self::from_venv(&path);
            }
            if !path.exists() {
                return Err(InterpreterError::NotFound(path));
            }
            if path.is_dir() {
                // A conda environment or a plain installation folder.
                return Self::from_interpreter_file(&path.join("bin").join("python"));
            }
            return Self::from_interpreter_file(&path);
        }
        if let Some(venv) = env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
            let venv = PathBuf::from(venv);
            if !venv.join("pyvenv.cfg").is_file() {
                return Err(InterpreterError::NotAVirtualEnv(venv));
            }
            return Self::from_venv(&venv);
        }
        let built = BUILD_PYTHON.map(PathBuf::from).filter(|p| p.exists());
        Ok(Self {
            executable: built,
            venv: None,
        })
    }

    fn from_venv(venv: &Path) -> Result<Self, InterpreterError> {
        let cfg_path = venv.join("pyvenv.cfg");
        let cfg = fs::read_to_string(&cfg_path).map_err(|source| InterpreterError::Read {
            path: cfg_path,
            source,
        })?;
        if let Some(version) = pyvenv_version(&cfg) {
            check_version(|| format!("virtualenv {}", venv.display()), version)?;
        }
        let bin = venv.join("bin");
        let executable = ["python", "python3"]
            .into_iter()
            .map(|name| bin.join(name))
            .find(|p| p.exists())
            .ok_or_else(|| InterpreterError::NoPythonInVirtualEnv(venv.to_path_buf()))?;
        Ok(Self {
            executable: Some(executable),
            venv: Some(venv.to_path_buf()),
        })
    }

    /// Runs the interpreter once to learn its real executable (through shims), its version
    /// and whether it belongs to a virtualenv.
    fn from_interpreter_file(path: &Path) -> Result<Self, InterpreterError> {
        let not_an_interpreter = |source| InterpreterError::NotAnInterpreter {
            path: path.to_path_buf(),
            source,
        };
        let output = Command::new(path)
            .args(["-c", PROBE])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(not_an_interpreter)?;
        if !output.status.success() {
            return Err(not_an_interpreter(io::Error::other(format!(
                "`{} -c ...` failed ({})",
                path.display(),
                output.status
            ))));
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let lines: Vec<&str> = text.lines().collect();
        let [executable, prefix, base_prefix, version] = lines[..] else {
            return Err(not_an_interpreter(io::Error::other("unexpected output")));
        };
        check_version(|| format!("interpreter {}", path.display()), version)?;
        let executable = if executable.is_empty() {
            path.into()
        } else {
            executable.into()
        };
        let venv = (prefix != base_prefix).then(|| PathBuf::from(prefix));
        Ok(Self {
            executable: Some(executable),
            venv,
        })
    }

    /// Starts CPython with these settings.
    ///
    /// Must run once, before any other Python API call, while the process has a single thread
    /// (it edits the environment). Leaves the GIL released, as `pyo3`'s own initialisation does.
    pub fn start(&self) -> Result<(), InterpreterError> {
        if let Some(venv) = &self.venv {
            activate(venv);
        }
        let executable = match &self.executable {
            Some(p) => Some(CString::new(p.as_os_str().as_bytes()).map_err(|_| {
                InterpreterError::Start(format!("interpreter path {} contains NUL", p.display()))
            })?),
            None => None,
        };
        // SAFETY: called once at start-up, before anything else touches Python.
        unsafe { initialize(executable.as_deref()) }
    }
}

/// Puts the venv's `bin` first on `PATH` and sets `VIRTUAL_ENV`, as `activate` does, so
/// subprocesses that run `python` or a console script get the venv's.
fn activate(venv: &Path) {
    let bin = venv.join("bin");
    let path: OsString = match env::var_os("PATH") {
        Some(old) => env::join_paths(std::iter::once(bin.clone()).chain(env::split_paths(&old)))
            .unwrap_or_else(|_| bin.into_os_string()),
        None => bin.into_os_string(),
    };
    // SAFETY: the runner is still single-threaded here (see `Interpreter::start`).
    unsafe {
        env::set_var("PATH", path);
        env::set_var("VIRTUAL_ENV", venv);
    }
}

/// `Py_InitializeFromConfig` with the Python (not isolated) defaults, minus argv parsing:
/// CPython installs its signal handlers as `python3` does (SIGINT raises `KeyboardInterrupt`
/// in the main thread, which is the only thread the runner runs Python on; SIGPIPE and
/// SIGXFSZ are ignored, and reset to their defaults in the script's subprocesses).
///
/// # Safety
/// Must be called once, before any other Python API call.
unsafe fn initialize(executable: Option<&CStr>) -> Result<(), InterpreterError> {
    let mut config = MaybeUninit::<ffi::PyConfig>::uninit();
    let cfg = config.as_mut_ptr();
    // SAFETY: `cfg` is initialised by `PyConfig_InitPythonConfig` before any field is used and
    // cleared once; the string setters copy their argument.
    unsafe {
        ffi::PyConfig_InitPythonConfig(cfg);
        (*cfg).install_signal_handlers = 1;
        (*cfg).parse_argv = 0;
        let mut status = ffi::PyStatus_Ok();
        if let Some(exe) = executable {
            // `program_name` drives the path calculation up to 3.10, `executable` from 3.11.
            status = ffi::PyConfig_SetBytesString(cfg, &raw mut (*cfg).program_name, exe.as_ptr());
            if ffi::PyStatus_Exception(status) == 0 {
                status =
                    ffi::PyConfig_SetBytesString(cfg, &raw mut (*cfg).executable, exe.as_ptr());
            }
        }
        if ffi::PyStatus_Exception(status) == 0 {
            status = ffi::Py_InitializeFromConfig(cfg);
        }
        ffi::PyConfig_Clear(cfg);
        if ffi::PyStatus_Exception(status) != 0 {
            return Err(InterpreterError::Start(status_message(&status)));
        }
        ffi::PyEval_SaveThread();
    }
    Ok(())
}

fn status_message(status: &ffi::PyStatus) -> String {
    let text = |p: *const std::ffi::c_char| {
        // SAFETY: CPython fills these with NULL or static NUL-terminated strings.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    match (text(status.func), text(status.err_msg)) {
        (Some(func), Some(msg)) => format!("{func}: {msg}"),
        (None, Some(msg)) => msg,
        _ => format!("exit status {}", status.exitcode),
    }
}

/// `major.minor.micro` of the libpython the process loaded.
pub fn embedded_version() -> String {
    // SAFETY: `Py_GetVersion` returns a static string and may be called before initialisation.
    let full = unsafe { CStr::from_ptr(ffi::Py_GetVersion()) }
        .to_string_lossy()
        .into_owned();
    full.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn check_version(what: impl FnOnce() -> String, found: &str) -> Result<(), InterpreterError> {
    let embedded = embedded_version();
    if major_minor(found) == major_minor(&embedded) {
        return Ok(());
    }
    Err(InterpreterError::VersionMismatch {
        what: what(),
        found: found.to_owned(),
        embedded: major_minor(&embedded).to_owned(),
    })
}

/// `3.11` of `3.11.7` (or of `3.11.7.final.0`).
fn major_minor(version: &str) -> &str {
    let end = version
        .match_indices('.')
        .nth(1)
        .map_or(version.len(), |(i, _)| i);
    &version[..end]
}

/// The Python version a `pyvenv.cfg` records (`version` from `venv`, `version_info` from
/// `virtualenv` and `uv`).
fn pyvenv_version(cfg: &str) -> Option<&str> {
    let value = |wanted: &str| {
        cfg.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            (key.trim() == wanted).then(|| value.trim())
        })
    };
    value("version").or_else(|| value("version_info"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pyvenv_versions_are_read_from_venv_and_virtualenv_files() {
        let venv = "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n";
        assert_eq!(pyvenv_version(venv), Some("3.11.7"));
        let virtualenv =
            "home = /usr/bin\nimplementation = CPython\nversion_info = 3.10.12.final.0\n";
        assert_eq!(pyvenv_version(virtualenv), Some("3.10.12.final.0"));
        assert_eq!(pyvenv_version("home = /usr/bin\n"), None);
    }

    #[test]
    fn versions_compare_on_major_and_minor() {
        assert_eq!(major_minor("3.11.7"), "3.11");
        assert_eq!(major_minor("3.10.12.final.0"), "3.10");
        assert_eq!(major_minor("3.12"), "3.12");
        assert_eq!(major_minor("3"), "3");
    }
}
