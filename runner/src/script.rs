//! The user's entry script inside the embedded interpreter: loading it, calling
//! `init()`, `run(mini_batch)` and `shutdown()`, and turning Python exceptions into
//! [`ScriptError`]s without ever letting CPython print or act on them (a `SystemExit` is
//! reported like any other exception).

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule, PyString, PyTraceback, PyType};

use crate::protocol::{
    ErrorCause, InitParams, ReadyInfo, RunContext, ScriptError, StagedTable, TabularInit, Timing,
};
use crate::rows::{self, Returned};

/// The `EntryScript` helper, executed as the module `fleetrun`.
const HELPER_SOURCE: &str = include_str!("python/entry_script.py");
const HELPER_MODULE: &CStr = c"fleetrun";
const HELPER_FILE: &CStr = c"<fleetrun-runner>/entry_script.py";

/// The reader of a tabular input's chunks, executed as the module `fleetrun_tabular`.
const TABULAR_SOURCE: &str = include_str!("python/tabular.py");
const TABULAR_MODULE: &CStr = c"fleetrun_tabular";
const TABULAR_FILE: &CStr = c"<fleetrun-runner>/tabular.py";

/// The module name used when the script's file name is not a free module name.
const FALLBACK_MODULE: &str = "entry_script";

/// A loaded entry script whose `init()` has returned.
pub struct EntryScript {
    run: Py<PyAny>,
    shutdown: Option<Py<PyAny>>,
    /// A tabular input's reader (`fleetrun_tabular`), and how it reads.
    tabular: Option<(Py<PyModule>, TabularInit)>,
    /// The separator of a returned DataFrame's values.
    separator: u8,
    /// `fleetrun._context`, when `run` takes a second parameter (the mini-batch context).
    context: Option<Py<PyAny>>,
    /// cProfile around `init()` and `run()`, when the job asks for it.
    profiler: Option<Profiler>,
}

impl EntryScript {
    /// Registers the helper modules, sets `sys.argv` and `sys.path`, imports the script
    /// (its `if __name__ == "__main__":` block does not run) and calls its `init()`.
    pub fn load(py: Python<'_>, params: &InitParams) -> Result<Self, ScriptError> {
        Self::try_load(py, params).map_err(|e| e.into_script_error(py))
    }

    fn try_load(py: Python<'_>, params: &InitParams) -> Result<Self, LoadError> {
        let helper = install_helpers(py, params)?;
        let sys = py.import("sys")?;
        let mut argv = vec![params.entry_script.as_str()];
        argv.extend(params.arguments.iter().map(String::as_str));
        sys.setattr("argv", PyList::new(py, argv)?)?;

        let script = Path::new(&params.entry_script);
        let script_dir = script.parent().map(|d| d.to_string_lossy().into_owned());
        let mut dirs: Vec<String> = script_dir.into_iter().filter(|d| !d.is_empty()).collect();
        if let Some(source) = params.source_directory.as_ref().filter(|s| !s.is_empty())
            && !dirs.contains(source)
        {
            dirs.push(source.clone());
        }
        let sys_path = sys
            .getattr("path")?
            .cast_into::<PyList>()
            .map_err(PyErr::from)?;
        for (i, dir) in dirs.iter().enumerate() {
            sys_path.insert(i, dir)?;
        }

        // Before the script (its folder already importable, so a vendored pandas counts): a job that cannot read its input fails saying why, once.
        let tabular = match &params.tabular {
            Some(init) => {
                let source = std::ffi::CString::new(TABULAR_SOURCE).expect("no NUL");
                let reader = PyModule::from_code(py, &source, TABULAR_FILE, TABULAR_MODULE)?;
                reader.call_method1("check", (init.parquet,))?;
                Some((reader.unbind(), init.clone()))
            }
            None => None,
        };
        let module = import_script(py, &params.entry_script)?;
        let run = match module.getattr_opt("run")? {
            Some(run) if run.is_callable() => run,
            Some(run) => {
                let kind = type_name(&run);
                return Err(LoadError::Plain(format!(
                    "the entry script's run is a {kind}, not a run(mini_batch) function"
                )));
            }
            None => {
                return Err(LoadError::Plain(
                    "entry script defines no run(mini_batch) function".to_owned(),
                ));
            }
        };
        let profiler = match &params.profile {
            Some(path) => Some(Profiler::new(py, path)?),
            None => None,
        };
        if let Some(init) = module.getattr_opt("init")? {
            profiled(py, profiler.as_ref(), || init.call0())?;
        }
        let shutdown = module.getattr_opt("shutdown")?.filter(|f| f.is_callable());
        let context = helper
            .call_method1("_takes_context", (&run,))?
            .is_truthy()?
            .then(|| helper.getattr("_context"))
            .transpose()?;
        Ok(Self {
            run: run.unbind(),
            shutdown: shutdown.map(Bound::unbind),
            tabular,
            separator: params.append_row_separator,
            context: context.map(Bound::unbind),
            profiler,
        })
    }

    /// Reads a tabular mini-batch's staged chunks into one DataFrame and calls `run()` on
    /// it; also returns how many rows it was given.
    pub fn run_tables(
        &self,
        py: Python<'_>,
        tables: &[StagedTable],
        index: u64,
        context: &RunContext,
    ) -> (Result<Returned, ScriptError>, Timing, Option<u64>) {
        let frame = (|| {
            let Some((reader, init)) = &self.tabular else {
                return Err(PyTypeError::new_err(
                    "a tabular mini-batch reached a runner started for a file input",
                ));
            };
            let tables = tables
                .iter()
                .map(|t| {
                    (
                        t.path.as_str(),
                        format!("{:?}", t.format),
                        t.row_groups.clone(),
                        t.columns.clone(),
                    )
                })
                .collect::<Vec<_>>();
            let separator = char::from(init.separator).to_string();
            let options = (
                separator,
                init.encoding.clone(),
                init.empty_as_string,
                init.drop_columns.clone(),
            );
            reader.bind(py).call_method1("read", (tables, options))
        })();
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return (Err(script_error(py, &e)), Timing::default(), None),
        };
        let given = frame.len().ok().map(|n| n as u64);
        if given == Some(0) {
            // A chunk whose edges fell inside one long record holds no row: `run()` is
            // never handed an empty DataFrame.
            let none = Returned {
                rows: Vec::new(),
                header: None,
            };
            return (Ok(none), Timing::default(), given);
        }
        let (rows, timing) = self.call_run(py, frame, index, context);
        (rows, timing, given)
    }

    /// Calls `run(items)` (or `run(items, context)` when `run` takes two parameters) and
    /// converts what it returns into one string per element.
    pub fn run(
        &self,
        py: Python<'_>,
        items: &[PathBuf],
        index: u64,
        context: &RunContext,
    ) -> (Result<Returned, ScriptError>, Timing) {
        let mini_batch = match path_list(py, items) {
            Ok(list) => list,
            Err(e) => return (Err(script_error(py, &e)), Timing::default()),
        };
        self.call_run(py, mini_batch.into_any(), index, context)
    }

    fn call_run(
        &self,
        py: Python<'_>,
        mini_batch: Bound<'_, PyAny>,
        index: u64,
        context: &RunContext,
    ) -> (Result<Returned, ScriptError>, Timing) {
        let context = match &self.context {
            None => None,
            Some(make) => match make.bind(py).call1((
                // Pairs in the order of `partition_keys`; the mini-batch types the values.
                context.partition_key_value.clone().map(|values| values.0),
                &context.dataset,
                index,
                &mini_batch,
            )) {
                Ok(context) => Some(context),
                Err(e) => return (Err(script_error(py, &e)), Timing::default()),
            },
        };
        let wall = Instant::now();
        let cpu = process_cpu_seconds();
        let result = profiled(py, self.profiler.as_ref(), || match context {
            Some(context) => self.run.bind(py).call1((mini_batch, context)),
            None => self.run.bind(py).call1((mini_batch,)),
        });
        let timing = Timing {
            run_seconds: wall.elapsed().as_secs_f64(),
            cpu_seconds: (process_cpu_seconds() - cpu).max(0.0),
            waited_seconds: 0.0,
        };
        let rows = result
            .and_then(|r| rows::rows(&r, self.separator))
            .map_err(|e| script_error(py, &e));
        (rows, timing)
    }

    /// Writes the profile, if the job asked for one; a failure goes to the runner's stderr.
    pub fn write_profile(&self, py: Python<'_>) {
        if let Some(profiler) = &self.profiler
            && let Err(e) = profiler.dump(py)
        {
            let error = script_error(py, &e);
            eprintln!(
                "fleetrun-runner: cannot write the profile {}: {}",
                profiler.path, error.message
            );
        }
    }

    /// Calls `shutdown()` if the script defines one.
    pub fn shutdown(&self, py: Python<'_>) -> Result<(), ScriptError> {
        match &self.shutdown {
            Some(f) => f
                .bind(py)
                .call0()
                .map(drop)
                .map_err(|e| script_error(py, &e)),
            None => Ok(()),
        }
    }
}

/// cProfile's `Profile`, switched on around each call of the script's `init()` and `run()`
/// and written once, in `dump_stats` format (what `pstats.Stats` loads), when the runner
/// stops cleanly. A runner that is killed (a timeout, a crash, an abort) writes none.
struct Profiler {
    profile: Py<PyAny>,
    path: String,
}

impl Profiler {
    fn new(py: Python<'_>, path: &str) -> PyResult<Profiler> {
        let profile = py.import("cProfile")?.getattr("Profile")?.call0()?;
        Ok(Profiler {
            profile: profile.unbind(),
            path: path.to_owned(),
        })
    }

    /// Writes the stats gathered so far, making the folder if needed.
    fn dump(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(dir) = Path::new(&self.path).parent() {
            std::fs::create_dir_all(dir)?;
        }
        self.profile
            .bind(py)
            .call_method1("dump_stats", (&self.path,))?;
        Ok(())
    }
}

/// Calls `f` with the profiler on, if there is one. A profiler that cannot be switched on
/// (the script runs one of its own: only one may be active) leaves the call unprofiled.
fn profiled<T>(py: Python<'_>, profiler: Option<&Profiler>, f: impl FnOnce() -> T) -> T {
    let Some(profiler) = profiler else {
        return f();
    };
    let profile = profiler.profile.bind(py);
    let on = profile.call_method0("enable").is_ok();
    let result = f();
    if on {
        let _ = profile.call_method0("disable");
    }
    result
}

/// The mini-batch as the script sees it: a `list[str]` of paths, each what `os.fsdecode`
/// makes of the path's bytes, so a name that is not UTF-8 (undecodable bytes become
/// surrogates) still opens the right file with `open(p)`. pyo3 converts an `OsStr` the same
/// way (`PyUnicode_DecodeFSDefault`), without a call into Python for each path.
fn path_list<'py>(py: Python<'py>, items: &[PathBuf]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, items.iter().map(|p| p.as_os_str()))
}

/// What the agent learns about the interpreter once the script is ready.
pub fn ready_info(py: Python<'_>) -> PyResult<ReadyInfo> {
    let sys = py.import("sys")?;
    Ok(ReadyInfo {
        python_version: sys.getattr("version")?.extract()?,
        python_prefix: sys.getattr("prefix")?.extract()?,
        python_executable: sys.getattr("executable")?.extract()?,
        pid: std::process::id(),
    })
}

/// Flushes Python's `sys.stdout`/`sys.stderr` and C stdio, so the script's prints reach the
/// log files before the agent hears back. Errors (a closed or replaced stream) are ignored.
pub fn flush_stdio(py: Python<'_>) {
    // Imported once: `sys` is never replaced, only its streams are.
    static SYS: pyo3::sync::PyOnceLock<Py<PyModule>> = pyo3::sync::PyOnceLock::new();
    let sys = SYS
        .get_or_try_init(py, || py.import("sys").map(Bound::unbind))
        .map(|sys| sys.bind(py));
    if let Ok(sys) = sys {
        for name in ["stdout", "stderr"] {
            if let Ok(Some(stream)) = sys.getattr_opt(name)
                && !stream.is_none()
            {
                let _ = stream.call_method0("flush");
            }
        }
    }
    // SAFETY: `fflush(NULL)` flushes every C output stream; it takes the streams' locks.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

enum LoadError {
    Python(PyErr),
    Plain(String),
}

impl From<PyErr> for LoadError {
    fn from(e: PyErr) -> Self {
        Self::Python(e)
    }
}

impl LoadError {
    fn into_script_error(self, py: Python<'_>) -> ScriptError {
        match self {
            Self::Python(e) => script_error(py, &e),
            Self::Plain(message) => plain_error(message),
        }
    }
}

/// A failure that is not a Python exception, shaped like an exception without traceback.
pub fn plain_error(message: String) -> ScriptError {
    ScriptError::plain(message)
}

fn install_helpers<'py>(py: Python<'py>, params: &InitParams) -> PyResult<Bound<'py, PyModule>> {
    let source = std::ffi::CString::new(HELPER_SOURCE).expect("helper source has no NUL");
    let helper = PyModule::from_code(py, &source, HELPER_FILE, HELPER_MODULE)?;
    let settings = PyDict::new(py);
    settings.set_item("node_id", &params.node_id)?;
    settings.set_item("process_name", &params.process_name)?;
    settings.set_item("log_dir", &params.log_dir)?;
    settings.set_item("output_dir", &params.output_dir)?;
    settings.set_item("logging_level", &params.logging_level)?;
    settings.set_item(
        "working_dir",
        params.working_dir.as_deref().unwrap_or_default(),
    )?;
    settings.set_item("models", params.models.clone())?;
    helper.call_method1("_install", (settings,))?;
    Ok(helper)
}

/// Imports the script from its path under its file name (`score.py` → `score`), or under
/// `entry_script` when that name is taken or not an identifier, and registers it in
/// `sys.modules` so pickling and sibling imports find it.
fn import_script<'py>(py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyModule>> {
    let modules = py.import("sys")?.getattr("modules")?;
    let stem = Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned());
    let name = match stem {
        Some(stem)
            if PyString::new(py, &stem)
                .call_method0("isidentifier")?
                .is_truthy()?
                && !modules.contains(&stem)? =>
        {
            stem
        }
        _ => FALLBACK_MODULE.to_owned(),
    };
    let machinery = py.import("importlib.machinery")?;
    let util = py.import("importlib.util")?;
    // An explicit loader also accepts a script whose name does not end in `.py`.
    let loader = machinery
        .getattr("SourceFileLoader")?
        .call1((&name, path))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("loader", &loader)?;
    let spec = util.call_method("spec_from_file_location", (&name, path), Some(&kwargs))?;
    let module = util.call_method1("module_from_spec", (&spec,))?;
    modules.set_item(&name, &module)?;
    if let Err(e) = loader.call_method1("exec_module", (&module,)) {
        let _ = modules.del_item(&name);
        return Err(e);
    }
    Ok(module.cast_into::<PyModule>()?)
}

/// `ValueError: cannot score 'bad.png'` plus the full traceback text, with the importlib
/// frames of loading the script left out.
pub fn script_error(py: Python<'_>, err: &PyErr) -> ScriptError {
    let value = err.value(py);
    let kind = err
        .get_type(py)
        .fully_qualified_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "Exception".to_owned());
    let text = value
        .str()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "<exception str() failed>".to_owned());
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let message = if text.is_empty() {
        kind
    } else {
        format!("{kind}: {text}")
    };
    let traceback = format_exception(py, err).unwrap_or_else(|_| format!("{message}\n"));
    let classes = mro_names(py, err);
    let cause = ErrorCause::of(classes.iter().map(String::as_str), &text);
    ScriptError {
        message,
        traceback,
        cause,
    }
}

/// The qualified names of the exception's class and its bases (`torch.OutOfMemoryError`,
/// `builtins.RuntimeError`, …), for [`ErrorCause::of`]; empty where they cannot be read.
fn mro_names(py: Python<'_>, err: &PyErr) -> Vec<String> {
    let Ok(mro) = err.get_type(py).getattr("__mro__") else {
        return Vec::new();
    };
    let Ok(classes) = mro.try_iter() else {
        return Vec::new();
    };
    classes
        .flatten()
        .filter_map(|class| {
            let class = class.cast_into::<PyType>().ok()?;
            let name = class.fully_qualified_name().ok()?;
            let name = name.to_string_lossy().into_owned();
            // The builtins' names are written bare; the rules name them qualified.
            Some(if name.contains('.') {
                name
            } else {
                format!("builtins.{name}")
            })
        })
        .collect()
}

fn format_exception(py: Python<'_>, err: &PyErr) -> PyResult<String> {
    let mut tb = err.traceback(py);
    while let Some(frame) = &tb {
        let file: String = frame
            .getattr("tb_frame")?
            .getattr("f_code")?
            .getattr("co_filename")?
            .extract()?;
        if !file.starts_with("<frozen importlib") {
            break;
        }
        tb = frame.getattr("tb_next")?.cast_into::<PyTraceback>().ok();
    }
    let lines = py
        .import("traceback")?
        .call_method1("format_exception", (err.get_type(py), err.value(py), tb))?;
    let lines = lines.cast_into::<PyList>()?;
    let mut text = String::new();
    for line in lines.iter() {
        text.push_str(&line.cast_into::<PyString>()?.to_string_lossy());
    }
    Ok(text)
}

/// The `TypeError` for a `run()` result that is not a list, an array or a DataFrame.
pub fn wrong_result_type(result: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "run() must return a list, an array or a pandas DataFrame, got {}",
        type_name(result)
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "object".to_owned())
}

/// CPU seconds the whole process (every thread) has used.
fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
