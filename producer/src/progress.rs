//! Progress on the terminal: a bar with counts and an ETA on a TTY, a plain line now and
//! then otherwise (CI logs, pipes). Both read the ledger's figures, never a log file.
//!
//! The bar counts mini-batches: their number is known for every input once it is listed
//! (a tabular input's rows are not known until they are read). The rate and the ETA are
//! those of the last [`WINDOW`], so a job that slows down or stalls says so at once, and
//! the ETA is never 0 while a mini-batch is left.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use fleetrun_common::ledger::Status;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::pace::{Sample, Window};

/// How often the plain form prints.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// The stretch of time the rate and the ETA are measured over.
const WINDOW: Duration = Duration::from_secs(30);

pub struct Progress {
    bar: Option<ProgressBar>,
    /// When the plain form last printed (it prints its first line at once).
    last_line: Option<Instant>,
    name: String,
    /// What an item is: `items` (files) or `rows` (a tabular input).
    unit: &'static str,
    /// The figures of the updates within the last [`WINDOW`].
    recent: Window,
}

/// The figures one update shows.
pub struct Figures<'a> {
    pub status: &'a Status,
    /// Mini-batches published so far.
    pub created: u64,
}

/// What the window says of the job's pace.
#[derive(Debug, Clone, PartialEq)]
enum Pace {
    /// Nothing to measure yet.
    Starting,
    /// Items per second and, once the input is listed, the time left.
    Moving {
        items_per_second: f64,
        left: Option<Duration>,
    },
    /// No mini-batch recorded for this long, with work left.
    Stalled(Duration),
}

impl Progress {
    /// Progress of job `name`, whose items are `rows` for a tabular input.
    pub fn new(name: &str, tabular: bool) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(4));
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} {prefix} [{bar:30}] {pos}/{len} mini-batches · {msg}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(name.to_owned());
            bar
        });
        Progress {
            bar,
            last_line: None,
            name: name.to_owned(),
            unit: if tabular { "rows" } else { "items" },
            recent: Window::new(WINDOW),
        }
    }

    pub fn update(&mut self, f: Figures<'_>) {
        let now = Instant::now();
        let text = self.line(now, &f);
        let s = f.status;
        if let Some(bar) = &self.bar {
            bar.set_length(s.total.unwrap_or(f.created).max(s.done));
            bar.set_position(s.done);
            bar.set_message(text);
        } else if self.last_line.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
            self.last_line = Some(now);
            let batches = match s.total {
                Some(total) => format!("{}/{total}", s.done),
                None => format!("{}/{}+", s.done, f.created),
            };
            eprintln!("[{}] {batches} mini-batches, {text}", self.name);
        }
    }

    /// Everything but the mini-batches: `1200 items, 3 failed, 850 items/s, ETA 2m05s`.
    fn line(&mut self, now: Instant, f: &Figures<'_>) -> String {
        let s = f.status;
        let pace = self.pace(now, s);
        let unit = self.unit;
        let processed = s.items_succeeded + s.items_failed;
        let mut text = format!("{processed} {unit}, {} failed", s.items_failed);
        match pace {
            Pace::Starting => {}
            Pace::Moving {
                items_per_second,
                left,
            } => {
                text.push_str(&format!(", {items_per_second:.0} {unit}/s"));
                match left {
                    Some(left) => text.push_str(&format!(", ETA {}", short(left))),
                    None => text.push_str(", listing the input"),
                }
            }
            Pace::Stalled(quiet) => {
                text.push_str(&format!(", no mini-batch done for {}", short(quiet)));
            }
        }
        text
    }

    /// Notes the figures of `now` and measures the pace over the last [`WINDOW`].
    fn pace(&mut self, now: Instant, s: &Status) -> Pace {
        self.recent.note(Sample {
            at: now,
            done: s.done,
            processed: s.items_succeeded + s.items_failed,
        });
        let Some((_, last)) = self.recent.ends() else {
            return Pace::Starting;
        };
        let left = s.total.map(|total| total.saturating_sub(s.done));
        let quiet = now.duration_since(last.at);
        if last.done == 0 || left == Some(0) {
            return Pace::Starting;
        }
        if quiet >= WINDOW {
            return Pace::Stalled(quiet);
        }
        let Some(rates) = self.recent.rates(now) else {
            return Pace::Starting;
        };
        Pace::Moving {
            items_per_second: rates.items_per_second,
            left: left.map(|left| Duration::from_secs_f64(left as f64 / rates.batches_per_second)),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `45s`, `2m05s`, `1h02m`; never `0s` (under a second is `1s`).
fn short(d: Duration) -> String {
    let secs = d.as_secs().max(1);
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(total: Option<u64>, done: u64, items: u64) -> Status {
        Status {
            total,
            done,
            items_succeeded: items,
            ..Status::new()
        }
    }

    fn line(p: &mut Progress, at: Instant, s: &Status, created: u64) -> String {
        p.line(at, &Figures { status: s, created })
    }

    #[test]
    fn a_tabular_job_counts_rows_and_its_eta_comes_from_mini_batches() {
        let mut p = Progress::new("t", true);
        let t0 = Instant::now();
        assert_eq!(
            line(&mut p, t0, &status(Some(100), 0, 0), 100),
            "0 rows, 0 failed"
        );
        let s = status(Some(100), 10, 5000);
        line(&mut p, t0 + Duration::from_secs(1), &s, 100);
        // 20 mini-batches in 11 s: the 80 left take 44 s.
        let s = status(Some(100), 20, 10_000);
        assert_eq!(
            line(&mut p, t0 + Duration::from_secs(11), &s, 100),
            "10000 rows, 0 failed, 909 rows/s, ETA 44s"
        );
    }

    #[test]
    fn the_eta_is_never_zero_while_a_mini_batch_is_left() {
        let mut p = Progress::new("t", false);
        let t0 = Instant::now();
        line(&mut p, t0, &status(Some(1000), 1, 10), 1000);
        let text = line(
            &mut p,
            t0 + Duration::from_millis(100),
            &status(Some(1000), 999, 9990),
            1000,
        );
        assert!(text.ends_with("ETA 1s"), "{text}");
    }

    #[test]
    fn the_rate_is_the_last_windows_and_a_stall_is_named() {
        let mut p = Progress::new("t", false);
        let t0 = Instant::now();
        line(&mut p, t0, &status(Some(1000), 1, 10), 1000);
        // Fast at first, then 1 mini-batch per second for a whole window.
        line(
            &mut p,
            t0 + Duration::from_secs(1),
            &status(Some(1000), 500, 5000),
            1000,
        );
        for second in 2..=40 {
            let done = 500 + (second - 1);
            line(
                &mut p,
                t0 + Duration::from_secs(second),
                &status(Some(1000), done, done * 10),
                1000,
            );
        }
        let text = line(
            &mut p,
            t0 + Duration::from_secs(40),
            &status(Some(1000), 539, 5390),
            1000,
        );
        assert!(text.contains(", 10 items/s, ETA 7m41s"), "{text}");
        let text = line(
            &mut p,
            t0 + Duration::from_secs(100),
            &status(Some(1000), 539, 5390),
            1000,
        );
        assert!(text.ends_with(", no mini-batch done for 1m00s"), "{text}");
    }

    #[test]
    fn while_the_input_is_listed_there_is_a_rate_and_no_eta() {
        let mut p = Progress::new("t", false);
        let t0 = Instant::now();
        line(&mut p, t0, &status(None, 1, 10), 50);
        let text = line(
            &mut p,
            t0 + Duration::from_secs(2),
            &status(None, 21, 210),
            80,
        );
        assert_eq!(text, "210 items, 0 failed, 100 items/s, listing the input");
    }

    #[test]
    fn durations_read_short() {
        assert_eq!(short(Duration::from_millis(10)), "1s");
        assert_eq!(short(Duration::from_secs(59)), "59s");
        assert_eq!(short(Duration::from_secs(125)), "2m05s");
        assert_eq!(short(Duration::from_secs(3720)), "1h02m");
    }
}
