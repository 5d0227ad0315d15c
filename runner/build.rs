//! Links libpython with an rpath and records which interpreter the crate was built against,
//! so the runner can start CPython with that interpreter's prefix when no virtualenv is chosen.

fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
    let config = pyo3_build_config::get();
    if let Some(executable) = config.executable() {
        println!("cargo:rustc-env=FLEETRUN_BUILD_PYTHON={executable}");
    }
}
