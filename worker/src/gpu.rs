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
//!
//! A GPU in MIG mode is used through its instances only (CUDA sees one instance per
//! process): NVML lists them, and each is one of the node's GPUs, handed out by its UUID.

use std::sync::{Arc, Mutex, OnceLock};

use nvml_wrapper::error::NvmlError;

/// The variable a configured GPU count is read from, and the one that tells the script how
/// many GPUs its node has.
pub const GPU_COUNT_VAR: &str = "FLEETRUN_GPU_COUNT";

/// ParallelRunStep's name for the node's GPU count, set beside [`GPU_COUNT_VAR`] so that its
/// scripts read it unchanged.
pub const AZ_GPU_COUNT_VAR: &str = "AZ_BATCHAI_GPU_COUNT_FOUND";

/// The variable that tells a runner how many of its job's runners on the node share its GPU
/// (the job's process count over the node's GPUs, rounded up): a script loading a model on
/// a GPU it shares takes that share of its memory.
pub const RUNNERS_PER_GPU_VAR: &str = "FLEETRUN_RUNNERS_PER_GPU";

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
    /// What each puts in a runner's `CUDA_VISIBLE_DEVICES`, when NVML told them (see
    /// [`Device::entry`]); empty otherwise, and the indexes are handed out.
    pub devices: Vec<String>,
    /// Where the count came from, for the node's log.
    pub source: String,
}

/// A physical GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub name: String,
    /// Its MIG instances when MIG mode is on (`None` when it is off or not supported).
    pub mig: Option<Vec<MigInstance>>,
}

/// One MIG instance of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInstance {
    pub name: String,
    /// Its UUID as NVML gives it (`MIG-…`), which `CUDA_VISIBLE_DEVICES` takes.
    pub uuid: String,
}

/// One device a runner can be handed: a GPU, or a MIG instance of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    /// What a runner's `CUDA_VISIBLE_DEVICES` holds to see this device alone: a GPU's
    /// index, or a MIG instance's UUID.
    pub entry: String,
}

/// The devices runners are handed on a machine whose GPUs are `gpus`, in NVML's order: each
/// GPU by its index, or, in MIG mode, each of its instances by UUID (a GPU in MIG mode
/// serves CUDA only through its instances; one with none serves nothing).
pub fn devices(gpus: &[Gpu]) -> Vec<Device> {
    gpus.iter()
        .enumerate()
        .flat_map(|(index, gpu)| match &gpu.mig {
            None => vec![Device {
                name: gpu.name.clone(),
                entry: index.to_string(),
            }],
            Some(instances) => instances
                .iter()
                .map(|mig| Device {
                    name: format!("{} {}", gpu.name, mig.name),
                    entry: mig.uuid.clone(),
                })
                .collect(),
        })
        .collect()
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
                    .map(|(i, name)| match self.devices.get(i) {
                        Some(entry) if *entry != i.to_string() => {
                            format!("{i}: {name} ({entry})")
                        }
                        _ => format!("{i}: {name}"),
                    })
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
    nvml: impl FnOnce() -> Result<Vec<Gpu>, NvmlError>,
) -> Detected {
    let unnamed = |count, source| Detected {
        count,
        names: Vec::new(),
        devices: Vec::new(),
        source,
    };
    if let Some(count) = configured.and_then(|v| v.trim().parse().ok()) {
        return unnamed(count, format!("{GPU_COUNT_VAR}={count}"));
    }
    if let Some(mask) = mask {
        // NVML counts every GPU of the machine, the mask only this worker's.
        let source = format!("{VISIBLE_DEVICES_VAR}={}", mask.join(","));
        return unnamed(mask.len(), source);
    }
    match nvml() {
        Ok(gpus) => {
            let (names, devices) = devices(&gpus)
                .into_iter()
                .map(|device| (device.name, device.entry))
                .unzip();
            Detected {
                count: gpus_count(&gpus),
                names,
                devices,
                source: "NVML".to_owned(),
            }
        }
        Err(why) => unnamed(0, format!("NVML: {why}")),
    }
}

/// How many devices runners are handed among `gpus` (see [`devices`]).
fn gpus_count(gpus: &[Gpu]) -> usize {
    gpus.iter()
        .map(|gpu| gpu.mig.as_ref().map_or(1, Vec::len))
        .sum()
}

/// What each of a node's `count` GPU indexes hands a runner: the inherited mask's entries
/// (see [`visible_devices`]), else the devices NVML listed (MIG instances by UUID) when
/// they are the count, else the indexes.
pub fn node_devices(count: usize) -> Vec<String> {
    let mask = inherited_mask();
    let detected = detect();
    if mask.is_none() && detected.count == count && detected.devices.len() == count {
        return detected.devices.clone();
    }
    visible_devices(count, mask)
}

/// NVML's `current` MIG mode value when MIG is on (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLED: u32 = 1;
/// The most MIG instances a GPU holds (seven on an A100 or H100); NVML numbers them
/// from 0, not necessarily without gaps.
const MIG_INSTANCES: u32 = 7;

/// The machine's GPUs, from NVML.
fn nvml_gpus() -> Result<Vec<Gpu>, NvmlError> {
    use nvml_wrapper::Nvml;
    let nvml = Nvml::init()?;
    let count = nvml.device_count()?;
    Ok((0..count)
        .map(|i| match nvml.device_by_index(i) {
            Ok(device) => {
                let mig_on = device
                    .mig_mode()
                    .is_ok_and(|mode| mode.current == MIG_ENABLED);
                let mig = mig_on.then(|| {
                    (0..MIG_INSTANCES)
                        .filter_map(|m| {
                            let mig = device.mig_device_by_index(m).ok()?;
                            let uuid = mig.uuid().ok()?;
                            let name = mig.name().unwrap_or_else(|_| format!("MIG {m}"));
                            Some(MigInstance { name, uuid })
                        })
                        .collect()
                });
                Gpu {
                    name: device.name().unwrap_or_else(|e| format!("unnamed ({e})")),
                    mig,
                }
            }
            Err(e) => Gpu {
                name: format!("unnamed ({e})"),
                mig: None,
            },
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

    fn gpu(name: &str) -> Gpu {
        Gpu {
            name: name.to_owned(),
            mig: None,
        }
    }

    /// A GPU in MIG mode is its instances: two instances are two of the node's GPUs, each
    /// handed to a runner by its UUID, beside a GPU without MIG handed out by its index.
    #[test]
    fn mig_instances_are_handed_out_by_uuid() {
        let instance = |name: &str, uuid: &str| MigInstance {
            name: name.to_owned(),
            uuid: uuid.to_owned(),
        };
        let machine = vec![
            Gpu {
                name: "NVIDIA A100-SXM4-40GB".to_owned(),
                mig: Some(vec![
                    instance("MIG 3g.20gb", "MIG-5b2c1a0e-0000-4000-8000-000000000001"),
                    instance("MIG 3g.20gb", "MIG-5b2c1a0e-0000-4000-8000-000000000002"),
                ]),
            },
            gpu("NVIDIA A10"),
            // MIG on, no instance made yet: it serves nothing.
            Gpu {
                name: "NVIDIA A100-SXM4-40GB".to_owned(),
                mig: Some(Vec::new()),
            },
        ];
        let found = detect_with(None, None, || Ok(machine));
        assert_eq!(found.count, 3);
        assert_eq!(
            found.devices,
            [
                "MIG-5b2c1a0e-0000-4000-8000-000000000001",
                "MIG-5b2c1a0e-0000-4000-8000-000000000002",
                "1",
            ]
        );
        assert_eq!(
            found.describe(),
            "3 GPU(s) (NVML): 0: NVIDIA A100-SXM4-40GB MIG 3g.20gb \
             (MIG-5b2c1a0e-0000-4000-8000-000000000001), 1: NVIDIA A100-SXM4-40GB MIG 3g.20gb \
             (MIG-5b2c1a0e-0000-4000-8000-000000000002), 2: NVIDIA A10 (1)."
        );
        let pool = GpuPool::with_devices(found.devices.clone());
        let (p0, p1, p2) = (
            pool.acquire().unwrap(),
            pool.acquire().unwrap(),
            pool.acquire().unwrap(),
        );
        assert_eq!(
            [p0.device(), p1.device(), p2.device()],
            [found.devices[0].as_str(), &found.devices[1], "1"]
        );
        assert!(![&p0, &p1, &p2].iter().any(|p| p.is_shared()));
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
        let unasked = || -> Result<Vec<Gpu>, NvmlError> { panic!("NVML asked") };
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
        let unasked = || -> Result<Vec<Gpu>, NvmlError> { panic!("NVML asked") };
        let configured = detect_with(Some(" 2 "), None, unasked);
        assert_eq!(configured.count, 2);
        assert_eq!(configured.describe(), "2 GPU(s) (FLEETRUN_GPU_COUNT=2).");

        let missing = detect_with(None, None, || Err(NvmlError::DriverNotLoaded));
        assert_eq!(missing.count, 0);
        assert_eq!(
            missing.describe(),
            "No GPU on this node (NVML: NVIDIA driver is not loaded)."
        );

        let found = detect_with(Some("many"), None, || Ok(vec![gpu("A100"), gpu("A100")]));
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
