//! Where a job's runner time went: seconds in `init()`, in `run()`, waiting for input and
//! idle, per runner, added up by the nodes that run the job ([`super::Ledger::add_runner_times`])
//! and read by whoever writes its results.

use serde::{Deserialize, Serialize};

/// One runner of a job: the node it ran on, its process name there (one per slot, so a
/// runner started again on the same slot adds to the same row) and its GPU, if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunnerId {
    pub node: String,
    pub runner: String,
    /// The GPU it was given (`CUDA_VISIBLE_DEVICES`' value), empty for none.
    pub gpu: String,
}

/// Seconds of a runner's life on a job, by phase; added up over flushes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RunnerTimes {
    /// Starting the runner: the process, the interpreter and the script's `init()`.
    pub init_s: f64,
    /// Inside the script's `run()`.
    pub run_s: f64,
    /// Ready with nothing to run: waiting for the queue, or for inputs to be staged.
    pub input_wait_s: f64,
    /// The rest of its life on the job (results recorded, the job's tail).
    pub idle_s: f64,
}

impl RunnerTimes {
    /// The phases, named as the ledger and the metrics name them.
    pub const PHASES: [&'static str; 4] = ["init", "run", "input_wait", "idle"];

    /// The seconds of each phase, in the order of [`RunnerTimes::PHASES`].
    pub fn seconds(&self) -> [f64; 4] {
        [self.init_s, self.run_s, self.input_wait_s, self.idle_s]
    }

    /// The times with `seconds` of phase `phase` added (an unknown phase adds nothing).
    pub fn add(&mut self, phase: &str, seconds: f64) {
        match phase {
            "init" => self.init_s += seconds,
            "run" => self.run_s += seconds,
            "input_wait" => self.input_wait_s += seconds,
            "idle" => self.idle_s += seconds,
            _ => {}
        }
    }

    /// Every phase of `other` added.
    pub fn add_all(&mut self, other: &RunnerTimes) {
        for (phase, seconds) in Self::PHASES.iter().zip(other.seconds()) {
            self.add(phase, seconds);
        }
    }

    /// `self - earlier`, phase by phase: what was added since `earlier`.
    pub fn since(&self, earlier: &RunnerTimes) -> RunnerTimes {
        RunnerTimes {
            init_s: self.init_s - earlier.init_s,
            run_s: self.run_s - earlier.run_s,
            input_wait_s: self.input_wait_s - earlier.input_wait_s,
            idle_s: self.idle_s - earlier.idle_s,
        }
    }

    /// The seconds of every phase together.
    pub fn total(&self) -> f64 {
        self.seconds().iter().sum()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.seconds().iter().all(|s| *s == 0.0)
    }
}

/// A job's runners and their times, as [`super::Ledger::runner_times`] answers.
pub type JobTimes = Vec<(RunnerId, RunnerTimes)>;

/// The times of every runner of `times` together.
pub fn sum(times: &JobTimes) -> RunnerTimes {
    let mut all = RunnerTimes::default();
    for (_, t) in times {
        all.add_all(t);
    }
    all
}

/// A runner's phase as one field of the Redis hash of a job's times: its id's parts and the
/// phase, separated by tabs (which node ids and process names never hold).
pub(super) fn field(runner: &RunnerId, phase: &str) -> String {
    format!(
        "{}\t{}\t{}\t{phase}",
        runner.node, runner.runner, runner.gpu
    )
}

/// The runner and phase a field of [`field`] names.
pub(super) fn parse_field(field: &str) -> Option<(RunnerId, &str)> {
    let mut parts = field.splitn(4, '\t');
    let (node, runner, gpu, phase) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let id = RunnerId {
        node: node.to_owned(),
        runner: runner.to_owned(),
        gpu: gpu.to_owned(),
    };
    Some((id, phase))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_names_its_runner_and_phase() {
        let id = RunnerId {
            node: "node-1".into(),
            runner: "process001".into(),
            gpu: "0".into(),
        };
        let f = field(&id, "input_wait");
        assert_eq!(parse_field(&f), Some((id, "input_wait")));
    }
}
