//! GPUs (CONTRACT.md §3): counting and naming a node's GPUs through NVML, and handing each
//! runner process a GPU index in `CUDA_VISIBLE_DEVICES`.
//!
//! Each process gets one unique index while indexes last (the lowest free one); a process
//! that stops releases its index, and the next process started takes the lowest free one.
//! Processes beyond the GPU count share the GPUs round-robin: each gets the index the
//! fewest processes share (the lowest on a tie). ParallelRunStep leaves such processes
//! without `CUDA_VISIBLE_DEVICES`, so they see every GPU and crowd the first one; fleetrun
//! never lets a process see every GPU by accident (docs/contract.md §3).
//!
//! A worker started with `CUDA_VISIBLE_DEVICES` set hands out only what it lists: its
//! entries are the node's GPUs, in order (indexes such as `2,3`, or the UUIDs of GPUs and
//! MIG instances), and runner processes get entries, never devices outside them.

use std::sync::{Arc, Mutex, OnceLock};

/// The variable a configured GPU count is read from, and the one that tells the script how
/// many GPUs its node has.
pub const GPU_COUNT_VAR: &str = "FLEETRUN_GPU_COUNT";

/// ParallelRunStep's name for the node's GPU count, set beside [`GPU_COUNT_VAR`] so that its
/// scripts read it unchanged.
pub const AZ_GPU_COUNT_VAR: &str = "AZ_BATCHAI_GPU_COUNT_FOUND";

/// The variable that masks the GPUs a CUDA process sees, inherited by a worker and set for
/// each runner.
pub const VISIBLE_DEVICES_VAR: &str = "CUDA_VISIBLE_DEVICES";

/// The entries of the `CUDA_VISIBLE_DEVICES` this worker inherited, when it was set: the
/// only GPUs its runners may be handed. Read once per process.
pub fn inherited_mask() -> Option<&'static [String]> {
    static MASK: OnceLock<Option<Vec<String>>> = OnceLock::new();
    MASK.get_or_init(|| {
        std::env::var(VISIBLE_DEVICES_VAR)
            .ok()
            .map(|v| mask_entries(&v))
    })
    .as_deref()
}

/// The entries of a `CUDA_VISIBLE_DEVICES` value: `2, 3` is `2` and `3`; empty is none.
fn mask_entries(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What each of `count` GPU indexes puts in a runner's `CUDA_VISIBLE_DEVICES`: the entry of
/// the inherited `mask` at that index (taken round-robin when the configured count exceeds
/// the mask's entries, so nothing outside the mask is ever handed out), else the index.
pub fn visible_devices(count: usize, mask: Option<&[String]>) -> Vec<String> {
    match mask {
        Some(mask) if !mask.is_empty() => {
            (0..count).map(|i| mask[i % mask.len()].clone()).collect()
        }
        _ => (0..count).map(|i| i.to_string()).collect(),
    }
}

/// What a node found out about its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// How many GPUs runners are handed.
    pub count: usize,
    /// Their names, by index, when NVML told them.
    pub names: Vec<String>,
    /// Where the count came from, for the node's log.
    pub source: String,
}

impl Detected {
    /// One line for the node's `_main.txt`.
    pub fn describe(&self) -> String {
        match (self.count, self.names.is_empty()) {
            (0, _) => format!("No GPU on this node ({}).", self.source),
            (n, true) => format!("{n} GPU(s) ({}).", self.source),
            (n, false) => {
                let names: Vec<String> = self
                    .names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| format!("{i}: {name}"))
                    .collect();
                format!("{n} GPU(s) ({}): {}.", self.source, names.join(", "))
            }
        }
    }
}

/// This node's GPUs: `$FLEETRUN_GPU_COUNT` when set, else what NVML counts. No driver or no
/// NVML library (`libnvidia-ml.so.1`, loaded at run time) means 0 GPUs, never an error.
/// Asked once per process; later calls give the first answer.
pub fn detect() -> &'static Detected {
    static DETECTED: OnceLock<Detected> = OnceLock::new();
    DETECTED.get_or_init(|| {
        let configured = std::env::var(GPU_COUNT_VAR).ok();
        detect_with(configured.as_deref(), inherited_mask(), nvml_gpus)
    })
}

/// The node's GPU count (see [`detect`]).
pub fn detect_gpus() -> usize {
    detect().count
}

/// [`detect`] with the configured count, the inherited mask and the NVML query given.
fn detect_with(
    configured: Option<&str>,
    mask: Option<&[String]>,
    nvml: impl FnOnce() -> Result<Vec<String>, String>,
) -> Detected {
    if let Some(count) = configured.and_then(|v| v.trim().parse().ok()) {
        return Detected {
            count,
            names: Vec::new(),
            source: format!("{GPU_COUNT_VAR}={count}"),
        };
    }
    if let Some(mask) = mask {
        // NVML counts every GPU of the machine, the mask only this worker's.
        return Detected {
            count: mask.len(),
            names: Vec::new(),
            source: format!("{VISIBLE_DEVICES_VAR}={}", mask.join(",")),
        };
    }
    match nvml() {
        Ok(names) => Detected {
            count: names.len(),
            names,
            source: "NVML".to_owned(),
        },
        Err(why) => Detected {
            count: 0,
            names: Vec::new(),
            source: format!("NVML: {why}"),
        },
    }
}

/// The GPUs' names by index, from NVML.
fn nvml_gpus() -> Result<Vec<String>, String> {
    use nvml_wrapper::Nvml;
    let nvml = Nvml::init().map_err(|e| e.to_string())?;
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    Ok((0..count)
        .map(|i| {
            nvml.device_by_index(i)
                .and_then(|d| d.name())
                .unwrap_or_else(|e| format!("unnamed ({e})"))
        })
        .collect())
}

/// The owners and sharers of a node's GPU indexes.
#[derive(Debug)]
pub struct GpuPool {
    state: Mutex<Indexes>,
    /// What each index puts in `CUDA_VISIBLE_DEVICES` (see [`visible_devices`]).
    devices: Vec<String>,
}

#[derive(Debug)]
struct Indexes {
    /// Whether each index has its own process.
    owned: Vec<bool>,
    /// Processes sharing each index (beyond the GPU count).
    sharers: Vec<usize>,
}

/// One process's GPU; the index goes back to the pool when this is dropped.
#[derive(Debug)]
pub struct GpuLease {
    pool: Arc<GpuPool>,
    index: usize,
    shared: bool,
}

impl GpuPool {
    /// A pool of `count` GPUs, each index its own device.
    pub fn new(count: usize) -> Arc<GpuPool> {
        GpuPool::with_devices(visible_devices(count, None))
    }

    /// A pool of the GPUs `devices` (each an entry of `CUDA_VISIBLE_DEVICES`), by index.
    pub fn with_devices(devices: Vec<String>) -> Arc<GpuPool> {
        let count = devices.len();
        Arc::new(GpuPool {
            state: Mutex::new(Indexes {
                owned: vec![false; count],
                sharers: vec![0; count],
            }),
            devices,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Indexes> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn count(&self) -> usize {
        self.state().owned.len()
    }

    /// The lowest index without a process of its own; once every index has one, the index
    /// the fewest processes share. `None` only on a node without GPUs.
    pub fn acquire(self: &Arc<Self>) -> Option<GpuLease> {
        let mut state = self.state();
        if let Some(index) = state.owned.iter().position(|owned| !owned) {
            state.owned[index] = true;
            return Some(GpuLease {
                pool: self.clone(),
                index,
                shared: false,
            });
        }
        let (index, _) = state
            .sharers
            .iter()
            .enumerate()
            .min_by_key(|(index, sharers)| (**sharers, *index))?;
        state.sharers[index] += 1;
        Some(GpuLease {
            pool: self.clone(),
            index,
            shared: true,
        })
    }
}

impl GpuLease {
    pub fn index(&self) -> usize {
        self.index
    }

    /// What the process gets in `CUDA_VISIBLE_DEVICES`: its index, or the inherited mask's
    /// entry there.
    pub fn device(&self) -> &str {
        &self.pool.devices[self.index]
    }

    /// Whether other processes may have this index too (more processes than GPUs).
    pub fn is_shared(&self) -> bool {
        self.shared
    }
}

impl Drop for GpuLease {
    fn drop(&mut self) {
        let mut state = self.pool.state();
        if self.shared {
            state.sharers[self.index] -= 1;
        } else {
            state.owned[self.index] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(lease: &GpuLease) -> (usize, bool) {
        (lease.index(), lease.is_shared())
    }

    #[test]
    fn processes_beyond_the_count_share_the_gpus_round_robin() {
        let pool = GpuPool::new(2);
        let p0 = pool.acquire().unwrap();
        let p1 = pool.acquire().unwrap();
        let p2 = pool.acquire().unwrap();
        let p3 = pool.acquire().unwrap();
        let p4 = pool.acquire().unwrap();
        assert_eq!(
            [&p0, &p1, &p2, &p3, &p4].map(held),
            [(0, false), (1, false), (0, true), (1, true), (0, true)]
        );
        // The least shared index goes next.
        drop(p2);
        assert_eq!(held(&pool.acquire().unwrap()), (0, true));
    }

    #[test]
    fn a_stopped_process_frees_its_index_for_the_next() {
        let pool = GpuPool::new(2);
        let p0 = pool.acquire().unwrap();
        let _p1 = pool.acquire().unwrap();
        let _p2 = pool.acquire().unwrap();
        let _p3 = pool.acquire().unwrap();
        drop(p0); // process 0 dies
        let p4 = pool.acquire().unwrap();
        assert_eq!(held(&p4), (0, false), "process 4 has index 0 of its own");
        assert_eq!(held(&pool.acquire().unwrap()), (0, true));
    }

    #[test]
    fn an_inherited_mask_is_what_the_runners_get() {
        let mask = mask_entries("2, 3");
        let pool = GpuPool::with_devices(visible_devices(2, Some(&mask)));
        let p0 = pool.acquire().unwrap();
        let p1 = pool.acquire().unwrap();
        let p2 = pool.acquire().unwrap();
        assert_eq!([p0.device(), p1.device(), p2.device()], ["2", "3", "2"]);
        assert!(p2.is_shared());
        // MIG instances by UUID; a configured count above the mask stays within it.
        let mig = mask_entries("MIG-8f1c,MIG-77aa");
        assert_eq!(
            visible_devices(3, Some(&mig)),
            ["MIG-8f1c", "MIG-77aa", "MIG-8f1c"]
        );
        assert_eq!(visible_devices(2, None), ["0", "1"]);
        assert_eq!(visible_devices(2, Some(&[])), ["0", "1"]);
        // The mask is the node's GPUs, unless a count is configured.
        let unasked = || -> Result<Vec<String>, String> { panic!("NVML asked") };
        let masked = detect_with(None, Some(&mig), unasked);
        assert_eq!(masked.count, 2);
        assert_eq!(
            masked.describe(),
            "2 GPU(s) (CUDA_VISIBLE_DEVICES=MIG-8f1c,MIG-77aa)."
        );
        assert_eq!(detect_with(None, Some(&[]), unasked).count, 0);
        assert_eq!(detect_with(Some("4"), Some(&mig), unasked).count, 4);
    }

    #[test]
    fn no_gpus_means_no_leases() {
        assert!(GpuPool::new(0).acquire().is_none());
    }

    #[test]
    fn the_configured_count_wins_and_nvml_missing_is_no_gpu() {
        let unasked = || -> Result<Vec<String>, String> { panic!("NVML asked") };
        let configured = detect_with(Some(" 2 "), None, unasked);
        assert_eq!(configured.count, 2);
        assert_eq!(configured.describe(), "2 GPU(s) (FLEETRUN_GPU_COUNT=2).");

        let missing = detect_with(None, None, || Err("libnvidia-ml.so.1: cannot open".into()));
        assert_eq!(missing.count, 0);
        assert_eq!(
            missing.describe(),
            "No GPU on this node (NVML: libnvidia-ml.so.1: cannot open)."
        );

        let found = detect_with(Some("many"), None, || {
            Ok(vec!["A100".into(), "A100".into()])
        });
        assert_eq!(found.count, 2);
        assert_eq!(found.describe(), "2 GPU(s) (NVML): 0: A100, 1: A100.");
    }

    /// NVML answering with no GPU is 0 GPUs, said as NVML's answer.
    #[test]
    fn nvml_finding_no_gpu_is_zero_gpus() {
        let found = detect_with(None, None, || Ok(Vec::new()));
        assert_eq!(found.count, 0);
        assert!(found.describe().contains("NVML"), "{}", found.describe());
    }
}
