//! Where a job's runner time went: seconds in `init()`, in `run()`, waiting for input and
//! idle, per runner, added up by the nodes that run the job ([`super::Ledger::add_runner_times`])
//! and read by whoever writes its results; and, where the node's monitor read NVML, how
//! busy the runner's GPU was and the most memory it held over the runner's life.

use serde::{Deserialize, Serialize};

/// One runner of a job: the node it ran on, its process name there (each start its own, so
/// a runner started again, or one that failed to start, is a row of its own) and its GPU,
/// if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunnerId {
    pub node: String,
    pub runner: String,
    /// The GPU it was given (`CUDA_VISIBLE_DEVICES`' value), empty for none.
    pub gpu: String,
}

/// Seconds of a runner's life on a job, by phase, and its GPU's use meanwhile; every field
/// is added up over flushes.
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
    /// How many of the node monitor's samples read its GPU's utilisation while it lived.
    #[serde(default)]
    pub gpu_samples: f64,
    /// Those samples' utilisation percentages, summed.
    #[serde(default)]
    pub gpu_util_sum: f64,
    /// The most memory its GPU held in those samples, in MiB. Its node keeps the maximum
    /// and flushes its rises, so the sum the ledger keeps is the maximum too.
    #[serde(default)]
    pub gpu_mem_peak_mib: f64,
}

impl RunnerTimes {
    /// The phases, named as the ledger and the metrics name them.
    pub const PHASES: [&'static str; 4] = ["init", "run", "input_wait", "idle"];

    /// The GPU's measures, named as the ledger names them.
    pub const GPU_MEASURES: [&'static str; 3] = ["gpu_samples", "gpu_util_sum", "gpu_mem_peak_mib"];

    /// The seconds of each phase, in the order of [`RunnerTimes::PHASES`].
    pub fn seconds(&self) -> [f64; 4] {
        [self.init_s, self.run_s, self.input_wait_s, self.idle_s]
    }

    /// The GPU's measures, in the order of [`RunnerTimes::GPU_MEASURES`].
    pub fn gpu(&self) -> [f64; 3] {
        [self.gpu_samples, self.gpu_util_sum, self.gpu_mem_peak_mib]
    }

    /// Every field by its name: the phases, then the GPU's measures.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, f64)> {
        let phases = Self::PHASES.into_iter().zip(self.seconds());
        phases.chain(Self::GPU_MEASURES.into_iter().zip(self.gpu()))
    }

    /// The mean utilisation of its GPU over the samples, in percent; `None` unsampled.
    pub fn gpu_utilization_pct(&self) -> Option<f64> {
        (self.gpu_samples > 0.0).then(|| self.gpu_util_sum / self.gpu_samples)
    }

    /// The most memory its GPU held, in MiB; `None` when no sample read it.
    pub fn gpu_memory_peak_mib(&self) -> Option<f64> {
        (self.gpu_mem_peak_mib > 0.0).then_some(self.gpu_mem_peak_mib)
    }

    /// The times with `seconds` of phase `phase` (or that much of a GPU measure) added; an
    /// unknown name adds nothing.
    pub fn add(&mut self, phase: &str, seconds: f64) {
        match phase {
            "init" => self.init_s += seconds,
            "run" => self.run_s += seconds,
            "input_wait" => self.input_wait_s += seconds,
            "idle" => self.idle_s += seconds,
            "gpu_samples" => self.gpu_samples += seconds,
            "gpu_util_sum" => self.gpu_util_sum += seconds,
            "gpu_mem_peak_mib" => self.gpu_mem_peak_mib += seconds,
            _ => {}
        }
    }

    /// Every field of `other` added.
    pub fn add_all(&mut self, other: &RunnerTimes) {
        for (name, value) in other.fields() {
            self.add(name, value);
        }
    }

    /// `self - earlier`, phase by phase: what was added since `earlier`.
    pub fn since(&self, earlier: &RunnerTimes) -> RunnerTimes {
        RunnerTimes {
            init_s: self.init_s - earlier.init_s,
            run_s: self.run_s - earlier.run_s,
            input_wait_s: self.input_wait_s - earlier.input_wait_s,
            idle_s: self.idle_s - earlier.idle_s,
            gpu_samples: self.gpu_samples - earlier.gpu_samples,
            gpu_util_sum: self.gpu_util_sum - earlier.gpu_util_sum,
            gpu_mem_peak_mib: self.gpu_mem_peak_mib - earlier.gpu_mem_peak_mib,
        }
    }

    /// The seconds of every phase together.
    pub fn total(&self) -> f64 {
        self.seconds().iter().sum()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.fields().all(|(_, value)| value == 0.0)
    }
}

/// A job's runners and their times, as [`super::Ledger::runner_times`] answers.
pub type JobTimes = Vec<(RunnerId, RunnerTimes)>;

/// The times of every runner of `times` together; the GPU memory peak is the highest
/// runner's.
pub fn sum(times: &JobTimes) -> RunnerTimes {
    let mut all = RunnerTimes::default();
    for (_, t) in times {
        all.add_all(t);
    }
    all.gpu_mem_peak_mib = times
        .iter()
        .map(|(_, t)| t.gpu_mem_peak_mib)
        .fold(0.0, f64::max);
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

    #[test]
    fn gpu_measures_add_up_and_the_jobs_peak_is_the_highest_runners() {
        let id = |runner: &str| RunnerId {
            node: "n".into(),
            runner: runner.into(),
            gpu: "0".into(),
        };
        let mut a = RunnerTimes {
            run_s: 1.0,
            gpu_samples: 2.0,
            gpu_util_sum: 150.0,
            gpu_mem_peak_mib: 1000.0,
            ..RunnerTimes::default()
        };
        a.add_all(&RunnerTimes {
            gpu_samples: 2.0,
            gpu_util_sum: 50.0,
            gpu_mem_peak_mib: 500.0,
            ..RunnerTimes::default()
        });
        assert_eq!(a.gpu_utilization_pct(), Some(50.0));
        assert_eq!(a.gpu_memory_peak_mib(), Some(1500.0), "rises add up");
        assert_eq!(a.total(), 1.0, "GPU measures are no seconds");
        let b = RunnerTimes {
            gpu_samples: 1.0,
            gpu_util_sum: 100.0,
            gpu_mem_peak_mib: 700.0,
            ..RunnerTimes::default()
        };
        let all = sum(&vec![(id("p1"), a), (id("p2"), b)]);
        assert_eq!(all.gpu_utilization_pct(), Some(60.0));
        assert_eq!(all.gpu_memory_peak_mib(), Some(1500.0));
        assert_eq!(RunnerTimes::default().gpu_utilization_pct(), None);
        assert_eq!(RunnerTimes::default().gpu_memory_peak_mib(), None);
    }
}
