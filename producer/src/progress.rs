//! Progress on the terminal: a bar with counts and an ETA on a TTY, a plain line now and
//! then otherwise (CI logs, pipes). Both read the ledger's figures, never a log file.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use fleetrun_common::ledger::Status;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the plain form prints.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
    /// When the plain form last printed (it prints its first line at once).
    last_line: Option<Instant>,
    name: String,
}

/// The figures one update shows.
pub struct Figures<'a> {
    pub status: &'a Status,
    pub created: u64,
    pub items_listed: u64,
}

impl Progress {
    pub fn new(name: &str) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(4));
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} {prefix} [{bar:30}] {pos}/{len} items · {msg} · {per_sec} · ETA {eta}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(name.to_owned());
            bar
        });
        Progress {
            bar,
            started: Instant::now(),
            last_line: None,
            name: name.to_owned(),
        }
    }

    pub fn update(&mut self, f: Figures<'_>) {
        let s = f.status;
        let processed = s.items_succeeded + s.items_failed;
        let batches = match s.total {
            Some(total) => format!("{}/{total} mini-batches", s.done),
            None => format!("{}/{}+ mini-batches", s.done, f.created),
        };
        let msg = format!("{batches} · {} failed", s.items_failed);
        if let Some(bar) = &self.bar {
            bar.set_length(f.items_listed.max(processed));
            bar.set_position(processed);
            bar.set_message(msg);
        } else if self.last_line.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
            self.last_line = Some(Instant::now());
            let secs = self.started.elapsed().as_secs_f64().max(1e-3);
            let rate = processed as f64 / secs;
            let eta = match (s.total, rate > 0.0) {
                (Some(_), true) => format!(
                    ", ETA {:.0}s",
                    f.items_listed.saturating_sub(processed) as f64 / rate
                ),
                _ => String::new(),
            };
            eprintln!(
                "[{}] {processed}/{} items, {msg}, {rate:.0} items/s{eta}",
                self.name, f.items_listed
            );
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
