//! Pod device annotations (`hami.io/vgpu-devices-to-allocate`,
//! `hami.io/vgpu-devices-allocated`).

/// One GPU slice held by one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDevice {
    /// Physical GPU UUID.
    pub uuid: String,
    /// Vendor word, `NVIDIA` for this device type.
    pub vendor: String,
    /// Device memory in MiB (after `memoryFactor`).
    pub usedmem: i32,
    /// Cores in percent.
    pub usedcores: i32,
}

/// The devices of one container, possibly none.
pub type ContainerDevices = Vec<ContainerDevice>;

/// The devices of every container of a pod: init containers first, then
/// app containers, one entry each (empty for a GPU-less container).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDevices(pub Vec<ContainerDevices>);
