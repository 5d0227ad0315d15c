//! A job's recent pace: the ledger's counts noted as they move, measured over the last
//! stretch of time. The terminal's progress and `fleetrun serve`'s metrics both read a
//! job's rate here, so a job that slows down or stalls says so at once in both, where a
//! rate over the job's whole life keeps an old pace.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at: Instant,
    /// Mini-batches done.
    pub done: u64,
    /// Items processed (succeeded or failed).
    pub processed: u64,
}

/// The samples of the last `span` (and the one before them), oldest first; a sample is kept
/// only when the done count moved.
#[derive(Debug, Clone)]
pub struct Window {
    span: Duration,
    recent: VecDeque<Sample>,
}

/// What a window measured: rates per second from its first sample to now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub batches_per_second: f64,
    pub items_per_second: f64,
}

impl Window {
    pub fn new(span: Duration) -> Window {
        Window {
            span,
            recent: VecDeque::new(),
        }
    }

    /// Notes the counts of `sample.at`, and forgets what is older than the window needs.
    pub fn note(&mut self, sample: Sample) {
        if self
            .recent
            .back()
            .is_none_or(|last| last.done != sample.done)
        {
            self.recent.push_back(sample);
        }
        // Keep one sample at or before the window's start, to measure the whole window.
        while self.recent.len() > 2 && sample.at.duration_since(self.recent[1].at) >= self.span {
            self.recent.pop_front();
        }
    }

    /// The first and the last sample kept, if any.
    pub fn ends(&self) -> Option<(Sample, Sample)> {
        Some((*self.recent.front()?, *self.recent.back()?))
    }

    /// The rates from the first sample kept to `now`; `None` until the counts moved between
    /// two samples.
    pub fn rates(&self, now: Instant) -> Option<Rates> {
        let (first, last) = self.ends()?;
        let span = now.duration_since(first.at).as_secs_f64();
        if last.done == first.done || span <= 0.0 {
            return None;
        }
        Some(Rates {
            batches_per_second: (last.done - first.done) as f64 / span,
            items_per_second: (last.processed - first.processed) as f64 / span,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, secs: u64, done: u64) -> Sample {
        Sample {
            at: t0 + Duration::from_secs(secs),
            done,
            processed: done * 10,
        }
    }

    #[test]
    fn rates_are_the_windows_and_fall_while_nothing_moves() {
        let mut w = Window::new(Duration::from_secs(30));
        let t0 = Instant::now();
        w.note(at(t0, 0, 0));
        assert_eq!(w.rates(t0), None);
        // Fast at first, then 1 a second for longer than the window.
        w.note(at(t0, 1, 500));
        for s in 2..=60 {
            w.note(at(t0, s, 500 + s - 1));
        }
        let r = w.rates(t0 + Duration::from_secs(60)).unwrap();
        assert_eq!(r.batches_per_second, 1.0);
        assert_eq!(r.items_per_second, 10.0);
        // Nothing moves for another 30 s: the rate halves.
        let r = w.rates(t0 + Duration::from_secs(90)).unwrap();
        assert_eq!(r.batches_per_second, 0.5);
    }
}
