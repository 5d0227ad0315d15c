//! Which CPython a job's runners use, and whether fleetrun can run it.
//!
//! The runner process loads the chosen interpreter's shared libpython at start and uses only
//! CPython's stable ABI (`abi3`), so one runner serves every CPython from [`OLDEST`] to
//! [`NEWEST`]. The node agent resolves a job's `environment` with [`Python::resolve`] once,
//! before it starts any runner, refuses a Python it cannot serve, and hands the resolved one
//! to each runner it starts (a runner started without one resolves it the same way).
//!
//! An environment is a virtualenv folder (with `pyvenv.cfg`), an environment folder with
//! `bin/python` (conda, a plain installation), or an interpreter file. Without one, the
//! active virtualenv (`VIRTUAL_ENV`) is used, else `python3` on `PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fmt, fs, io};

/// The oldest CPython the runner serves (its stable-ABI floor).
pub const OLDEST: (u32, u32) = (3, 9);
/// The newest CPython the runner serves.
pub const NEWEST: (u32, u32) = (3, 15);

/// Asks an interpreter where it lives, which version it is and where its shared library is.
/// Run without `site` (`-S`): site's imports and `.pth` files can take longer than the rest
/// of the start, and the virtualenv is found by site's own rule instead ([`venv_of`]).
/// Written for Python 2 as well, so an old interpreter is refused by its version.
const PROBE: &str = "import sys, sysconfig\n\
v = sysconfig.get_config_var\n\
impl = getattr(getattr(sys, 'implementation', None), 'name', 'cpython')\n\
sys.stdout.write('\\n'.join([sys.executable, getattr(sys, 'base_prefix', sys.prefix),\n\
    '%d.%d.%d' % tuple(sys.version_info[:3]), impl, str(v('LIBDIR') or ''),\n\
    str(v('INSTSONAME') or ''), str(v('MULTIARCH') or ''), str(v('Py_GIL_DISABLED') or 0)]) + '\\n')\n";

/// A CPython a runner can start: the file CPython computes its paths from, its virtualenv
/// and its shared library.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Python {
    /// The `python` CPython computes `sys.prefix` and its paths from (a venv's `bin/python`
    /// for a venv, so that its site-packages are importable).
    pub executable: PathBuf,
    /// The virtualenv in use, if any: its `bin` goes first on `PATH` for subprocesses.
    pub venv: Option<PathBuf>,
    /// `major.minor.micro`.
    pub version: String,
    /// The shared libpython the runner loads.
    pub libpython: PathBuf,
}

/// Why a job's Python cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("environment {0} does not exist")]
    NotFound(PathBuf),
    #[error(
        "environment {path} is neither a virtualenv folder (with pyvenv.cfg) nor a Python \
         interpreter: {source}"
    )]
    NotAnInterpreter {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("VIRTUAL_ENV={0} is not a virtualenv folder (no pyvenv.cfg)")]
    NotAVirtualEnv(PathBuf),
    #[error("virtualenv {0} has no bin/python")]
    NoPythonInVirtualEnv(PathBuf),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} is {found}, which fleetrun cannot run; it runs {}", served())]
    Unserved { what: String, found: String },
    #[error(
        "{what} is CPython {version} without a shared libpython (looked for {looked}); fleetrun \
         runs {} built with --enable-shared",
        served()
    )]
    NoSharedLibrary {
        what: String,
        version: String,
        looked: String,
    },
}

/// The versions the runner serves, as an error message names them: `CPython 3.9, 3.10, …`.
pub fn served() -> String {
    let minors: Vec<String> = (OLDEST.1..=NEWEST.1)
        .map(|minor| format!("{}.{minor}", OLDEST.0))
        .collect();
    format!("CPython {} (not free-threaded)", minors.join(", "))
}

impl Python {
    /// Resolves the job's `environment` (relative to the current folder), else `VIRTUAL_ENV`,
    /// else `python3` on `PATH`, and checks fleetrun can run it. Runs the interpreter once.
    pub fn resolve(environment: Option<&Path>) -> Result<Python, PythonError> {
        if let Some(environment) = environment.filter(|e| !e.as_os_str().is_empty()) {
            let path = std::path::absolute(environment).map_err(|source| PythonError::Read {
                path: environment.into(),
                source,
            })?;
            if path.join("pyvenv.cfg").is_file() {
                return Self::from_venv(&path);
            }
            if !path.exists() {
                return Err(PythonError::NotFound(path));
            }
            if path.is_dir() {
                // A conda environment or a plain installation folder.
                return Self::probe(&path.join("bin").join("python"), &path);
            }
            return Self::probe(&path, &path);
        }
        if let Some(venv) = env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
            let venv = PathBuf::from(venv);
            if !venv.join("pyvenv.cfg").is_file() {
                return Err(PythonError::NotAVirtualEnv(venv));
            }
            return Self::from_venv(&venv);
        }
        Self::probe(Path::new("python3"), Path::new("python3 (on PATH)"))
    }

    fn from_venv(venv: &Path) -> Result<Python, PythonError> {
        let cfg_path = venv.join("pyvenv.cfg");
        let cfg = fs::read_to_string(&cfg_path).map_err(|source| PythonError::Read {
            path: cfg_path,
            source,
        })?;
        // An old venv is refused by its recorded version, before anything runs.
        if let Some(version) = pyvenv_version(&cfg)
            && !is_served(version)
        {
            return Err(PythonError::Unserved {
                what: format!("virtualenv {}", venv.display()),
                found: format!("Python {}", short_version(version)),
            });
        }
        let bin = venv.join("bin");
        let executable = ["python", "python3"]
            .into_iter()
            .map(|name| bin.join(name))
            .find(|p| p.exists())
            .ok_or_else(|| PythonError::NoPythonInVirtualEnv(venv.to_path_buf()))?;
        Self::probe(&executable, venv)
    }

    /// Runs the interpreter once to learn its real executable (through shims), its version,
    /// its virtualenv and its shared library; `named` is what the job called it.
    fn probe(path: &Path, named: &Path) -> Result<Python, PythonError> {
        let not_an_interpreter = |source| PythonError::NotAnInterpreter {
            path: named.to_path_buf(),
            source,
        };
        let output = Command::new(path)
            .args(["-S", "-c", PROBE])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(not_an_interpreter)?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(not_an_interpreter(io::Error::other(format!(
                "`{} -c ...` failed ({}){}",
                path.display(),
                output.status,
                stderr
                    .lines()
                    .last()
                    .map_or_else(String::new, |l| format!(": {l}"))
            ))));
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let lines: Vec<&str> = text.lines().collect();
        let [
            executable,
            base_prefix,
            version,
            implementation,
            libdir,
            soname,
            multiarch,
            gil_disabled,
        ] = lines[..]
        else {
            return Err(not_an_interpreter(io::Error::other(format!(
                "unexpected output of `{} -c ...`",
                path.display()
            ))));
        };
        let what = || format!("environment {}", named.display());
        if implementation != "cpython" {
            return Err(PythonError::Unserved {
                what: what(),
                found: format!("{implementation} {version}"),
            });
        }
        if !is_served(version) || gil_disabled == "1" {
            let threading = if gil_disabled == "1" {
                " (free-threaded)"
            } else {
                ""
            };
            return Err(PythonError::Unserved {
                what: what(),
                found: format!("Python {version}{threading}"),
            });
        }
        let candidates: Vec<PathBuf> = [
            Path::new(libdir).join(soname),
            Path::new(libdir).join(multiarch).join(soname),
            Path::new(base_prefix).join("lib").join(soname),
        ]
        .into_iter()
        .filter(|_| soname.contains(".so"))
        .collect();
        let Some(libpython) = candidates.iter().find(|p| p.is_file()) else {
            let looked = if candidates.is_empty() {
                format!("its build has INSTSONAME={soname}")
            } else {
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(PythonError::NoSharedLibrary {
                what: what(),
                version: version.to_owned(),
                looked,
            });
        };
        let executable = if executable.is_empty() {
            path.to_path_buf()
        } else {
            PathBuf::from(executable)
        };
        let venv = venv_of(&executable);
        Ok(Python {
            executable,
            venv,
            version: version.to_owned(),
            libpython: libpython.clone(),
        })
    }
}

/// `Python 3.12.1 (/venv/bin/python, virtualenv /venv), libpython /…/libpython3.12.so.1.0`.
impl fmt::Display for Python {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Python {} ({}", self.version, self.executable.display())?;
        if let Some(venv) = &self.venv {
            write!(f, ", virtualenv {}", venv.display())?;
        }
        write!(f, "), libpython {}", self.libpython.display())
    }
}

/// The virtualenv `executable` runs in, by `site`'s rule: a `pyvenv.cfg` beside it or one
/// folder up makes the folder above the executable's the environment.
fn venv_of(executable: &Path) -> Option<PathBuf> {
    let bin = executable.parent()?;
    let env = bin.parent()?;
    [bin.join("pyvenv.cfg"), env.join("pyvenv.cfg")]
        .iter()
        .any(|cfg| cfg.is_file())
        .then(|| env.to_path_buf())
}

/// Whether a `major.minor[...]` version is one the runner serves.
fn is_served(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (OLDEST..=NEWEST).contains(&(major, minor)),
        _ => false,
    }
}

/// `3.10.12` of `3.10.12.final.0`.
fn short_version(version: &str) -> &str {
    let end = version
        .match_indices('.')
        .nth(2)
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
        assert_eq!(short_version("3.10.12.final.0"), "3.10.12");
    }

    #[test]
    fn a_virtualenv_is_the_folder_above_its_python_when_a_pyvenv_cfg_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("env/bin/python");
        fs::create_dir_all(python.parent().unwrap()).unwrap();
        assert_eq!(venv_of(&python), None);
        fs::write(dir.path().join("env/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert_eq!(venv_of(&python), Some(dir.path().join("env")));
        fs::remove_file(dir.path().join("env/pyvenv.cfg")).unwrap();
        fs::write(dir.path().join("env/bin/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert_eq!(venv_of(&python), Some(dir.path().join("env")));
    }

    #[test]
    fn the_served_versions_run_from_the_stable_abi_floor() {
        for served in ["3.9.18", "3.10.13", "3.12", "3.13.0", "3.15.0.final.0"] {
            assert!(is_served(served), "{served}");
        }
        for refused in ["2.7.18", "3.7.16", "3.8.18", "3.16.0", "3", "x.y"] {
            assert!(!is_served(refused), "{refused}");
        }
        assert_eq!(
            served(),
            "CPython 3.9, 3.10, 3.11, 3.12, 3.13, 3.14, 3.15 (not free-threaded)"
        );
    }
}
