//! `fleetrun verify`: a completed job's output checked against its manifest.

use std::process::ExitCode;

use fleetrun_common::report::one_line;
use fleetrun_producer::{exit, verify};

#[derive(clap::Args)]
pub struct Args {
    /// The job's output folder, or its s3://bucket/prefix.
    pub output: String,
    /// List this input again (a folder or s3:// prefix) instead of trusting the
    /// manifest's listing.
    #[arg(long, value_name = "INPUT")]
    pub input: Option<String>,
    /// The key the manifest is signed with (default: $FLEETRUN_MANIFEST_KEY, else
    /// $FLEETRUN_WEBHOOK_SECRET); without one the signature is not checked.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
}

pub fn main(args: Args) -> ExitCode {
    verify(&args.output, args.input.as_deref(), args.key)
}

/// `fleetrun verify`: 0 when the output holds, 1 naming each problem (or why it could not
/// be checked).
fn verify(output: &str, input: Option<&str>, key: Option<String>) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let key = key.or_else(fleetrun_worker::job::manifest::signing_key);
    let result = runtime.block_on(async {
        let output = fleetrun_config::Location::parse(output)?;
        let input = input.map(fleetrun_config::Location::parse).transpose()?;
        let key = key.as_deref().map(str::as_bytes);
        anyhow::Ok(verify::verify_at(&output, input.as_ref(), key).await?)
    });
    match result {
        Ok(verified) if verified.problems.is_empty() => {
            say!("{}", verified.summary());
            ExitCode::from(exit::COMPLETED)
        }
        Ok(verified) => {
            for problem in &verified.problems {
                say!("problem: {problem}");
            }
            say!("{} problem(s) found", verified.problems.len());
            ExitCode::from(exit::ERROR)
        }
        Err(e) => {
            eprintln!("error: {}", one_line(e.as_ref()));
            ExitCode::from(exit::ERROR)
        }
    }
}
