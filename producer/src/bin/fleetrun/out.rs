//! What the commands print: lines that end quietly on a closed stdout, JSON for programs.

use std::io::{self, Write};

/// `println!` that ends quietly when stdout is closed (`fleetrun run job.toml | head -1`):
/// the reader has what it wanted, and the exit code stays the job's. Says whether stdout is
/// still open.
macro_rules! say {
    ($($arg:tt)*) => { $crate::out::print_line(format_args!($($arg)*)) };
}

pub fn print_line(line: std::fmt::Arguments) -> bool {
    match writeln!(io::stdout().lock(), "{line}") {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => false,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            false
        }
    }
}

/// How a command shows what it does: JSON for programs, a progress display for people.
#[derive(Debug, Clone, Copy)]
pub struct Shown {
    pub json: bool,
    pub progress: bool,
}

impl Shown {
    /// JSON when asked; else a progress display unless `quiet`.
    pub fn new(json: bool, quiet: bool) -> Shown {
        Shown {
            json,
            progress: !quiet && !json,
        }
    }
}

/// One JSON document on stdout, on one line.
pub fn print_json(value: &impl serde::Serialize) {
    say!(
        "{}",
        serde_json::to_string(value).expect("a summary always encodes")
    );
}
