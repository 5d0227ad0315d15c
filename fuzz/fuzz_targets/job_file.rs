//! A job file as `fleetrun run` and `fleetrun submit` read it, with `--set` overrides, and a
//! job as the HTTP API receives it (JSON): any text is a job or one error, never a panic.
//!
//! The input is the file's text; after a NUL byte come `--set` overrides, one per line.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (file, overrides) = text.split_once('\0').unwrap_or((text, ""));
    let overrides: Vec<String> = overrides.lines().map(str::to_owned).collect();
    let base = Path::new("/nonexistent/fuzz");
    if let Err(e) = fleetrun_config::load_str(file, "job.toml", base, &overrides) {
        let _ = e.to_string();
    }
    if let Err(e) = fleetrun_config::load_json(file, "client", base) {
        let _ = e.to_string();
    }
});
