//! Reading the job a command is given: a TOML job file or an Azure ML YAML, with the
//! command line's overrides.

use fleetrun_producer::fleet::EmptyInput;

/// Whether `path` is an Azure ML YAML rather than a TOML job file.
fn is_yaml(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yml") || e.eq_ignore_ascii_case("yaml"))
}

/// The job of a TOML job file or an Azure ML YAML (saying once, on stderr, which YAML keys
/// it does not use), or `None` once the mistake is printed.
pub fn load_job(
    path: &std::path::Path,
    aml_job: Option<&str>,
    overrides: &[String],
) -> Option<fleetrun_config::JobSpec> {
    let loaded = if is_yaml(path) {
        fleetrun_config::load_aml(path, aml_job, overrides).map(|(spec, converted)| {
            if let Some(warning) = converted.warning() {
                eprintln!("warning: {}: {warning}.", path.display());
            }
            spec
        })
    } else if let Some(name) = aml_job {
        eprintln!(
            "error: --job {name}: {} is a job file; --job names a job of an Azure ML pipeline YAML",
            path.display()
        );
        return None;
    } else {
        fleetrun_config::load(path, overrides)
    };
    loaded.map_err(|e| eprintln!("error: {e}")).ok()
}

/// Says once, on stderr, which ParallelRunStep settings the job takes from its `arguments`,
/// and warns of those its own keys overrule.
pub fn note_settings_from_arguments(job: &std::path::Path, spec: &fleetrun_config::JobSpec) {
    for setting in &spec.settings_from_arguments {
        let kind = if setting.taken { "note" } else { "warning" };
        eprintln!("{kind}: {}: {setting}.", job.display());
    }
}

pub fn empty_input(allow: bool) -> EmptyInput {
    if allow {
        EmptyInput::Accept
    } else {
        EmptyInput::Refuse
    }
}

/// The `--set` overrides with `--deadline`'s after them, as the job's `deadline`: the
/// flag wins over the job file, and is refused by the same rule.
pub fn with_deadline(mut overrides: Vec<String>, deadline: Option<String>) -> Vec<String> {
    overrides.extend(deadline.map(|d| format!("deadline={d}")));
    overrides
}
