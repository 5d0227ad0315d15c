//! Records the interpreter the crate was built against (`FLEETRUN_BUILD_PYTHON`), which the
//! runner's tests use to make virtualenvs. The runner itself links no libpython: the launcher
//! loads the job's at start (see `src/main.rs`).

fn main() {
    let config = pyo3_build_config::get();
    if let Some(executable) = config.executable() {
        println!("cargo:rustc-env=FLEETRUN_BUILD_PYTHON={executable}");
    }
}
