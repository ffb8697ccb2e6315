//! Extended resource names a pod requests GPU slices with.

use serde::{Deserialize, Serialize};

/// The extended resource names, configurable; HAMi's by default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceNames {
    /// Number of distinct physical GPUs (`nvidia.com/gpu`).
    pub resource_name: String,
    /// MiB of device memory per GPU (`nvidia.com/gpumem`).
    pub resource_mem: String,
    /// Percentage of device memory per GPU (`nvidia.com/gpumem-percentage`).
    pub resource_mem_percentage: String,
    /// Percentage of compute per GPU (`nvidia.com/gpucores`).
    pub resource_cores: String,
    /// Task priority (`nvidia.com/priority`).
    pub resource_priority: String,
}

impl Default for ResourceNames {
    fn default() -> Self {
        Self {
            resource_name: "nvidia.com/gpu".to_owned(),
            resource_mem: "nvidia.com/gpumem".to_owned(),
            resource_mem_percentage: "nvidia.com/gpumem-percentage".to_owned(),
            resource_cores: "nvidia.com/gpucores".to_owned(),
            resource_priority: "nvidia.com/priority".to_owned(),
        }
    }
}

impl ResourceNames {
    /// Every name, in a fixed order (for extender `managedResources`).
    #[must_use]
    pub fn all(&self) -> [&str; 5] {
        [
            &self.resource_name,
            &self.resource_mem,
            &self.resource_mem_percentage,
            &self.resource_cores,
            &self.resource_priority,
        ]
    }
}
