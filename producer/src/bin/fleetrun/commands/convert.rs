//! `fleetrun convert`: an Azure ML v2 YAML's parallel job as a fleetrun job file.

use std::path::PathBuf;
use std::process::ExitCode;

use fleetrun_producer::exit;

#[derive(clap::Args)]
pub struct Args {
    /// The YAML: a parallel job, a parallel component, or a pipeline.
    pub yaml: PathBuf,
    /// The parallel job of a pipeline that has several.
    #[arg(long = "job", value_name = "NAME")]
    pub aml_job: Option<String>,
    /// Give an input or output the YAML cannot reach here: `inputs.NAME=PATH`,
    /// `outputs.NAME=PATH`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

pub fn main(args: Args) -> ExitCode {
    convert(&args.yaml, args.aml_job.as_deref(), &args.overrides)
}

/// `fleetrun convert`: the YAML's job as TOML on stdout.
fn convert(yaml: &std::path::Path, aml_job: Option<&str>, overrides: &[String]) -> ExitCode {
    let text = match std::fs::read_to_string(yaml) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("error: {}: {e}", yaml.display());
            return ExitCode::from(exit::REFUSED);
        }
    };
    let base_dir = yaml
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let source = yaml.display().to_string();
    let converted = fleetrun_config::aml::convert(&text, &source, base_dir, aml_job, overrides)
        .and_then(|(mut converted, rest)| converted.set(&rest).map(|()| converted));
    match converted {
        Ok(converted) => {
            say!("{}", converted.to_toml(&source).trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::REFUSED)
        }
    }
}
