//! The GPUs' side of a sample, through NVML (`nvml-wrapper`, which loads the driver's
//! library at run time). A node without the driver or its library has no GPU rows and no
//! GPU file: that is no error.

use nvml_wrapper::Nvml;

use super::sample::GpuSample;

/// NVML, opened once per monitor.
pub struct GpuProbe {
    nvml: Option<Nvml>,
}

impl GpuProbe {
    /// Opens NVML if the node has it.
    pub fn open() -> GpuProbe {
        let nvml = match Nvml::init() {
            Ok(nvml) => Some(nvml),
            Err(e) => {
                tracing::debug!(error = %e, "No NVML on this node: no GPU rows in perf/.");
                None
            }
        };
        GpuProbe { nvml }
    }

    /// Whether the node has NVML (else [`GpuProbe::sample`] is always empty).
    pub fn has_nvml(&self) -> bool {
        self.nvml.is_some()
    }

    /// Utilisation and memory of each GPU; a reading the driver refuses is left empty.
    pub fn sample(&self) -> Vec<GpuSample> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|index| {
                let device = nvml.device_by_index(index).ok()?;
                let utilization = device.utilization_rates().ok();
                let memory = device.memory_info().ok();
                Some(GpuSample {
                    index,
                    name: device.name().unwrap_or_default(),
                    utilization_percent: utilization.as_ref().map(|u| u.gpu),
                    memory_utilization_percent: utilization.as_ref().map(|u| u.memory),
                    memory_used_bytes: memory.as_ref().map(|m| m.used),
                    memory_total_bytes: memory.as_ref().map(|m| m.total),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_without_nvml_has_no_gpu_rows_and_no_error() {
        // On a machine with the driver this lists its GPUs instead; either way it returns.
        let probe = GpuProbe::open();
        let gpus = probe.sample();
        if probe.nvml.is_none() {
            assert!(gpus.is_empty());
        }
    }
}
