//! The node device register annotation (`hami.io/node-nvidia-register`).

/// One GPU as the device plugin publishes it in the node register annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevice {
    /// GPU UUID, e.g. `GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448`.
    pub id: String,
    /// Index of the GPU on its node.
    pub index: u32,
    /// Split count: how many pods may share this GPU.
    pub count: u32,
    /// Device memory in MiB (after `deviceMemoryScaling`).
    pub devmem: u32,
    /// Device cores in percent (after `deviceCoreScaling`, 100 = one card).
    pub devcore: u32,
    /// Type, e.g. `NVIDIA-Tesla V100-PCIE-32GB`.
    pub device_type: String,
    /// NUMA node.
    pub numa: u32,
    /// Sharing mode: `hami-core`, `mig` or `mps`.
    pub mode: String,
    /// Whether the GPU is healthy.
    pub health: bool,
}
