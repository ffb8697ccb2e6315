//! What a pod asks of the GPU scheduler, per container, exactly as HAMi
//! reads it (spec §3): `nvidia.com/gpu` count, `gpumem` MiB or
//! `gpumem-percentage`, `gpucores`, the `defaultMemory`/`defaultCores`
//! defaults, type/UUID allow and deny lists, numa-bind, the sharing mode,
//! per-pod policies and GPU score weights.
//!
//! The input is a [`PodSpecLite`]: resource quantities already parsed to
//! integers and the annotation map, so this module does not depend on
//! `k8s-openapi` (the extender converts a `Pod` into it).

use std::collections::BTreeMap;

use proto::hami::keys::DEVICE_SCORING_WEIGHTS;
use proto::hami::resources::ResourceNames;
use proto::hami::scoring_weights::{DeviceScoringWeights, WeightsError};

use crate::core::kinds::{GpuPolicy, Policy, PolicyError};

/// `nvidia.com/use-gputype`: comma list, case-insensitive substring match.
pub const USE_GPU_TYPE: &str = "nvidia.com/use-gputype";
/// `nvidia.com/nouse-gputype`: comma list, case-insensitive substring match.
pub const NOUSE_GPU_TYPE: &str = "nvidia.com/nouse-gputype";
/// `nvidia.com/use-gpuuuid`: comma list, exact match.
pub const USE_GPU_UUID: &str = "nvidia.com/use-gpuuuid";
/// `nvidia.com/nouse-gpuuuid`: comma list, exact match.
pub const NOUSE_GPU_UUID: &str = "nvidia.com/nouse-gpuuuid";
/// `nvidia.com/numa-bind`: all GPUs of a container on one NUMA node.
pub const NUMA_BIND: &str = "nvidia.com/numa-bind";
/// `nvidia.com/vgpu-mode`: the device mode must be a substring of it.
pub const VGPU_MODE: &str = "nvidia.com/vgpu-mode";
/// `hami.io/node-scheduler-policy`.
pub const NODE_POLICY: &str = "hami.io/node-scheduler-policy";
/// `hami.io/gpu-scheduler-policy`.
pub const GPU_POLICY: &str = "hami.io/gpu-scheduler-policy";

/// Errors reading a pod's requests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A resource quantity is negative.
    #[error("container {container}: {resource} is negative ({value})")]
    Negative {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The value.
        value: i64,
    },
    /// `gpumem-percentage` outside 0–100.
    #[error("container {container}: gpumem-percentage {value} is outside 0-100")]
    Percentage {
        /// Container name.
        container: String,
        /// The value.
        value: i64,
    },
    /// A quantity does not fit the protocol's int32.
    #[error("container {container}: {resource} {value} does not fit int32")]
    TooLarge {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The value (after `memoryFactor`).
        value: i64,
    },
    /// A policy annotation names no supported policy.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// `hami.io/device-scoring-weights` is not a value HAMi accepts; the
    /// message names the annotation, the value and what is wrong.
    #[error(transparent)]
    Weights(#[from] WeightsError),
}

/// One container as the scheduler needs it: resource quantities as
/// integers (`nvidia.com/gpumem` in MiB, counts as counts).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerLite {
    /// Container name (for error messages).
    pub name: String,
    /// `resources.limits`.
    pub limits: BTreeMap<String, i64>,
    /// `resources.requests`.
    pub requests: BTreeMap<String, i64>,
}

impl ContainerLite {
    /// Limit, falling back to request.
    fn quantity(&self, resource: &str) -> Option<i64> {
        self.limits
            .get(resource)
            .or_else(|| self.requests.get(resource))
            .copied()
    }
}

/// The parts of a pod the scheduler reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodSpecLite {
    /// Pod UID (reservation key).
    pub uid: String,
    /// Pod annotations.
    pub annotations: BTreeMap<String, String>,
    /// Init containers, in order.
    pub init_containers: Vec<ContainerLite>,
    /// App containers, in order.
    pub containers: Vec<ContainerLite>,
    /// Pod CPU request, milli-cores (checked only on nodes with a capacity).
    pub cpu_milli: u64,
    /// Pod memory request, MiB (checked only on nodes with a capacity).
    pub memory_mib: u64,
}

/// Defaults and names the scheduler applies when reading requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestConfig {
    /// Resource names.
    pub names: ResourceNames,
    /// `defaultMemory` MiB (0: whole card unless a percentage is given).
    pub default_memory: u64,
    /// `defaultCores` percent.
    pub default_cores: u32,
    /// `memoryFactor` applied to `gpumem`.
    pub memory_factor: u32,
}

impl Default for RequestConfig {
    fn default() -> Self {
        Self {
            names: ResourceNames::default(),
            default_memory: 0,
            default_cores: 0,
            memory_factor: 1,
        }
    }
}

/// Device memory a container asks per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryRequest {
    /// An absolute amount, MiB.
    Mib(u64),
    /// A percentage of each card's memory (1–100).
    Percent(u32),
}

/// One container's GPU request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRequest {
    /// Number of distinct physical GPUs.
    pub nums: u32,
    /// Memory per GPU.
    pub memory: MemoryRequest,
    /// Cores per GPU, percent (clamped to 100).
    pub cores: u32,
}

impl DeviceRequest {
    /// Memory this request takes on a card with `devmem` MiB.
    #[must_use]
    pub fn memory_on(&self, devmem: u64) -> u64 {
        match self.memory {
            MemoryRequest::Mib(m) => m,
            MemoryRequest::Percent(p) => devmem * u64::from(p) / 100,
        }
    }
}

/// Pod-level constraints on which GPUs may be used.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Constraints {
    /// Allowed type substrings, lower-case (empty: any).
    pub use_types: Vec<String>,
    /// Denied type substrings, lower-case.
    pub nouse_types: Vec<String>,
    /// Allowed UUIDs (empty: any).
    pub use_uuids: Vec<String>,
    /// Denied UUIDs.
    pub nouse_uuids: Vec<String>,
    /// All GPUs of a container on one NUMA node.
    pub numa_bind: bool,
    /// The device mode must be a substring of this, when set.
    pub vgpu_mode: Option<String>,
    /// Only GPUs no container uses may be picked (`mutex` in the GPU
    /// policy; set by [`crate::core::policy::schedule`] from the pod's or
    /// the cluster's policy).
    pub mutex: bool,
    /// Every fitting GPU is gathered and the pick made by pair scores
    /// (`topology-aware` in the GPU policy; set like [`Self::mutex`]).
    pub topology: bool,
    /// Room left in the pod's namespace quota (`None`: no quota, the
    /// common case, which costs the fit nothing).
    pub quota: Option<QuotaRoom>,
}

impl Constraints {
    /// Whether the type and mode are acceptable. Checked for every GPU of
    /// every candidate node, so it allocates nothing.
    #[must_use]
    pub fn type_allows(&self, device_type: &str, mode: &str) -> bool {
        let has = |t: &String| contains_ignore_ascii_case(device_type, t);
        if !self.use_types.is_empty() && !self.use_types.iter().any(has) {
            return false;
        }
        if self.nouse_types.iter().any(has) {
            return false;
        }
        self.vgpu_mode.as_ref().is_none_or(|m| m.contains(mode))
    }

    /// Whether the UUID is acceptable.
    #[must_use]
    pub fn uuid_allows(&self, uuid: &str) -> bool {
        (self.use_uuids.is_empty() || self.use_uuids.iter().any(|u| u == uuid))
            && !self.nouse_uuids.iter().any(|u| u == uuid)
    }
}

/// What is left for one pod in its namespace quota; `None` is unlimited.
/// Built by [`crate::core::quota::QuotaBook::room`]; it lives here, with
/// the other constraints on a pick, so a request does not depend on the
/// quota book.
/// Memory is device MiB (after `memoryFactor`), cores are percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaRoom {
    /// Memory left, MiB.
    pub memory_mib: Option<u64>,
    /// Cores left, percent.
    pub cores: Option<u64>,
}

impl QuotaRoom {
    /// Whether a pick of `mem` MiB and `cores` percent fits.
    #[must_use]
    pub fn admits(&self, mem: u64, cores: u32) -> bool {
        self.memory_mib.is_none_or(|m| mem <= m) && self.cores.is_none_or(|c| u64::from(cores) <= c)
    }

    /// Takes a pick out of the room when it fits; `false` (and no change)
    /// when it does not.
    pub fn take(&mut self, mem: u64, cores: u32) -> bool {
        if !self.admits(mem, cores) {
            return false;
        }
        if let Some(m) = self.memory_mib.as_mut() {
            *m -= mem;
        }
        if let Some(c) = self.cores.as_mut() {
            *c -= u64::from(cores);
        }
        true
    }
}

/// Whether `needle` occurs in `haystack`, ignoring ASCII case (HAMi
/// lower-cases both sides).
fn contains_ignore_ascii_case(haystack: &str, needle: &str) -> bool {
    needle.is_empty()
        || haystack
            .as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// Everything the scheduler needs to place one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodRequest {
    /// Per init container, its GPU request (`None`: no GPU).
    pub init: Vec<Option<DeviceRequest>>,
    /// Per app container, its GPU request (`None`: no GPU).
    pub app: Vec<Option<DeviceRequest>>,
    /// Which GPUs may be used.
    pub constraints: Constraints,
    /// `hami.io/node-scheduler-policy`, when set.
    pub node_policy: Option<Policy>,
    /// `hami.io/gpu-scheduler-policy`, when set.
    pub gpu_policy: Option<GpuPolicy>,
    /// `hami.io/device-scoring-weights`, when set.
    pub weights: Option<DeviceScoringWeights>,
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
}

impl PodRequest {
    /// Reads a pod's requests. The policy and weight annotations are read
    /// only when a container asks for a GPU: HAMi's filter returns every
    /// node for any other pod before it looks at them.
    ///
    /// # Errors
    /// A negative or out-of-range quantity, an unknown policy name, or a
    /// `hami.io/device-scoring-weights` value HAMi refuses.
    pub fn from_pod(pod: &PodSpecLite, cfg: &RequestConfig) -> Result<Self, RequestError> {
        let read = |cs: &[ContainerLite]| -> Result<Vec<Option<DeviceRequest>>, RequestError> {
            cs.iter().map(|c| container_request(c, cfg)).collect()
        };
        let list = |key: &str, lower: bool| -> Vec<String> {
            pod.annotations
                .get(key)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| {
                            if lower {
                                s.to_ascii_lowercase()
                            } else {
                                s.to_owned()
                            }
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let constraints = Constraints {
            use_types: list(USE_GPU_TYPE, true),
            nouse_types: list(NOUSE_GPU_TYPE, true),
            use_uuids: list(USE_GPU_UUID, false),
            nouse_uuids: list(NOUSE_GPU_UUID, false),
            numa_bind: pod
                .annotations
                .get(NUMA_BIND)
                .is_some_and(|v| go_parse_bool(v.trim())),
            vgpu_mode: pod.annotations.get(VGPU_MODE).cloned(),
            mutex: false,
            topology: false,
            quota: None,
        };
        let mut request = Self {
            init: read(&pod.init_containers)?,
            app: read(&pod.containers)?,
            constraints,
            cpu_milli: pod.cpu_milli,
            memory_mib: pod.memory_mib,
            ..Self::default()
        };
        if request.wants_gpu() {
            let annotation = |key: &str| pod.annotations.get(key);
            request.node_policy = annotation(NODE_POLICY)
                .map(|v| v.parse::<Policy>())
                .transpose()?;
            request.gpu_policy = annotation(GPU_POLICY)
                .map(|v| v.parse::<GpuPolicy>())
                .transpose()?;
            request.weights = annotation(DEVICE_SCORING_WEIGHTS)
                .map(|v| v.parse::<DeviceScoringWeights>())
                .transpose()?;
        }
        Ok(request)
    }

    /// Whether any container asks for a GPU.
    #[must_use]
    pub fn wants_gpu(&self) -> bool {
        self.init.iter().chain(&self.app).any(Option::is_some)
    }

    /// The largest GPU count one container asks for.
    #[must_use]
    pub fn max_nums(&self) -> u32 {
        self.init
            .iter()
            .chain(&self.app)
            .flatten()
            .map(|r| r.nums)
            .max()
            .unwrap_or(0)
    }
}

/// Go's `strconv.ParseBool`; anything else reads as false (HAMi ignores it).
fn go_parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

fn container_request(
    c: &ContainerLite,
    cfg: &RequestConfig,
) -> Result<Option<DeviceRequest>, RequestError> {
    let names = &cfg.names;
    let non_negative = |resource: &str| -> Result<Option<u64>, RequestError> {
        match c.quantity(resource) {
            None => Ok(None),
            Some(v) if v < 0 => Err(RequestError::Negative {
                container: c.name.clone(),
                resource: resource.to_owned(),
                value: v,
            }),
            Some(v) => Ok(Some(v.unsigned_abs())),
        }
    };
    let Some(nums) = non_negative(&names.resource_name)? else {
        return Ok(None);
    };
    if nums == 0 {
        return Ok(None);
    }
    let too_large = |resource: &str, value: u64| RequestError::TooLarge {
        container: c.name.clone(),
        resource: resource.to_owned(),
        value: i64::try_from(value).unwrap_or(i64::MAX),
    };
    let nums = u32::try_from(nums).map_err(|_| too_large(&names.resource_name, nums))?;
    let mem = non_negative(&names.resource_mem)?.filter(|m| *m > 0);
    let pct = match c.quantity(&names.resource_mem_percentage) {
        None | Some(0) => None,
        Some(p @ 1..=100) => Some(u32::try_from(p).unwrap_or(100)),
        Some(p) => {
            return Err(RequestError::Percentage {
                container: c.name.clone(),
                value: p,
            });
        }
    };
    let memory = if let Some(m) = mem {
        let scaled = m.saturating_mul(u64::from(cfg.memory_factor));
        if scaled > i32::MAX as u64 {
            return Err(too_large(&names.resource_mem, scaled));
        }
        MemoryRequest::Mib(scaled)
    } else if let Some(p) = pct {
        MemoryRequest::Percent(p)
    } else if cfg.default_memory != 0 {
        MemoryRequest::Mib(cfg.default_memory)
    } else {
        MemoryRequest::Percent(100)
    };
    let cores = match non_negative(&names.resource_cores)? {
        Some(v) => u32::try_from(v.min(100)).unwrap_or(100),
        None => cfg.default_cores.min(100),
    };
    Ok(Some(DeviceRequest {
        nums,
        memory,
        cores,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr(pairs: &[(&str, i64)]) -> ContainerLite {
        ContainerLite {
            name: "c".into(),
            limits: pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            requests: BTreeMap::new(),
        }
    }

    const GPU: &str = "nvidia.com/gpu";
    const MEM: &str = "nvidia.com/gpumem";
    const PCT: &str = "nvidia.com/gpumem-percentage";
    const CORES: &str = "nvidia.com/gpucores";

    #[test]
    fn container_requests_follow_hami_rules() {
        let cfg = RequestConfig::default();
        let with_defaults = RequestConfig {
            default_memory: 2000,
            default_cores: 20,
            ..RequestConfig::default()
        };
        let cases: Vec<(&str, ContainerLite, &RequestConfig, Option<DeviceRequest>)> = vec![
            ("no gpu", ctr(&[(MEM, 100)]), &cfg, None),
            ("zero gpu", ctr(&[(GPU, 0)]), &cfg, None),
            (
                "gpumem wins over percentage",
                ctr(&[(GPU, 1), (MEM, 3000), (PCT, 50), (CORES, 30)]),
                &cfg,
                Some(DeviceRequest {
                    nums: 1,
                    memory: MemoryRequest::Mib(3000),
                    cores: 30,
                }),
            ),
            (
                "percentage",
                ctr(&[(GPU, 2), (PCT, 50)]),
                &cfg,
                Some(DeviceRequest {
                    nums: 2,
                    memory: MemoryRequest::Percent(50),
                    cores: 0,
                }),
            ),
            (
                "percentage zero is ignored, whole card",
                ctr(&[(GPU, 1), (PCT, 0)]),
                &cfg,
                Some(DeviceRequest {
                    nums: 1,
                    memory: MemoryRequest::Percent(100),
                    cores: 0,
                }),
            ),
            (
                "defaults",
                ctr(&[(GPU, 1)]),
                &with_defaults,
                Some(DeviceRequest {
                    nums: 1,
                    memory: MemoryRequest::Mib(2000),
                    cores: 20,
                }),
            ),
            (
                "cores clamp to 100",
                ctr(&[(GPU, 1), (CORES, 150)]),
                &cfg,
                Some(DeviceRequest {
                    nums: 1,
                    memory: MemoryRequest::Percent(100),
                    cores: 100,
                }),
            ),
        ];
        for (name, c, cfg, want) in cases {
            assert_eq!(container_request(&c, cfg).unwrap(), want, "{name}");
        }
    }

    #[test]
    fn limits_win_over_requests() {
        let mut c = ctr(&[(GPU, 1)]);
        c.requests.insert(MEM.into(), 100);
        c.limits.insert(MEM.into(), 200);
        let r = container_request(&c, &RequestConfig::default())
            .unwrap()
            .unwrap();
        assert_eq!(r.memory, MemoryRequest::Mib(200));
        let mut c = ContainerLite::default();
        c.requests.insert(GPU.into(), 1);
        assert!(
            container_request(&c, &RequestConfig::default())
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn memory_factor_scales_and_must_fit_int32() {
        let cfg = RequestConfig {
            memory_factor: 4,
            ..RequestConfig::default()
        };
        let r = container_request(&ctr(&[(GPU, 1), (MEM, 10)]), &cfg)
            .unwrap()
            .unwrap();
        assert_eq!(r.memory, MemoryRequest::Mib(40));
        let err = container_request(&ctr(&[(GPU, 1), (MEM, 1 << 30)]), &cfg).unwrap_err();
        assert!(matches!(err, RequestError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn bad_quantities_are_errors() {
        let cfg = RequestConfig::default();
        for (c, what) in [
            (ctr(&[(GPU, -1)]), "negative gpu"),
            (ctr(&[(GPU, 1), (PCT, 101)]), "percentage"),
            (ctr(&[(GPU, 1), (PCT, -3)]), "negative percentage"),
            (ctr(&[(GPU, 1), (CORES, -3)]), "negative cores"),
        ] {
            assert!(container_request(&c, &cfg).is_err(), "{what}");
        }
    }

    #[test]
    fn annotations_become_constraints_and_policies() {
        let mut pod = PodSpecLite {
            containers: vec![ctr(&[(GPU, 1)])],
            ..PodSpecLite::default()
        };
        for (k, v) in [
            (USE_GPU_TYPE, "A100, t4"),
            (NOUSE_GPU_TYPE, "mig"),
            (USE_GPU_UUID, "GPU-a, GPU-b"),
            (NOUSE_GPU_UUID, ""),
            (NUMA_BIND, "true"),
            (NODE_POLICY, "spread"),
            (GPU_POLICY, "binpack"),
        ] {
            pod.annotations.insert(k.into(), v.into());
        }
        let r = PodRequest::from_pod(&pod, &RequestConfig::default()).unwrap();
        assert_eq!(r.constraints.use_types, vec!["a100", "t4"]);
        assert_eq!(r.constraints.use_uuids, vec!["GPU-a", "GPU-b"]);
        assert!(r.constraints.nouse_uuids.is_empty());
        assert!(r.constraints.numa_bind);
        assert_eq!(r.node_policy, Some(Policy::Spread));
        assert_eq!(r.gpu_policy, Some(GpuPolicy::BINPACK));
        assert!(r.constraints.type_allows("NVIDIA-Tesla T4", "hami-core"));
        assert!(!r.constraints.type_allows("NVIDIA-Tesla V100", "hami-core"));
        assert!(!r.constraints.type_allows("NVIDIA A100 MIG", "hami-core"));
        assert!(r.constraints.uuid_allows("GPU-b"));
        assert!(!r.constraints.uuid_allows("GPU-c"));
        assert!(r.wants_gpu());
        assert_eq!(r.max_nums(), 1);

        pod.annotations.insert(NUMA_BIND.into(), "yes".into());
        pod.annotations
            .insert(GPU_POLICY.into(), "mutex, binpack,numa".into());
        let r = PodRequest::from_pod(&pod, &RequestConfig::default()).unwrap();
        assert!(!r.constraints.numa_bind, "Go ParseBool rejects 'yes'");
        assert_eq!(
            r.gpu_policy.map(|p| p.to_string()).as_deref(),
            Some("mutex,binpack,numa")
        );
        pod.annotations
            .insert(GPU_POLICY.into(), "binpack,nmua".into());
        let err = PodRequest::from_pod(&pod, &RequestConfig::default()).unwrap_err();
        assert!(err.to_string().contains("\"nmua\""), "{err}");
    }

    #[test]
    fn scoring_weights_are_read_and_a_bad_value_names_the_annotation_and_the_part() {
        let mut pod = PodSpecLite {
            containers: vec![ctr(&[(GPU, 1)])],
            ..PodSpecLite::default()
        };
        let cfg = RequestConfig::default();
        assert_eq!(PodRequest::from_pod(&pod, &cfg).unwrap().weights, None);
        pod.annotations.insert(
            DEVICE_SCORING_WEIGHTS.into(),
            "slot=1,core=1,memory=3".into(),
        );
        let r = PodRequest::from_pod(&pod, &cfg).unwrap();
        assert_eq!(
            r.weights,
            Some(DeviceScoringWeights {
                slot: 1,
                core: 1,
                memory: 3
            })
        );
        pod.annotations.insert(
            DEVICE_SCORING_WEIGHTS.into(),
            "slot=1,core=-1,memory=3".into(),
        );
        let err = PodRequest::from_pod(&pod, &cfg).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid hami.io/device-scoring-weights annotation \"slot=1,core=-1,memory=3\": \"core\" weight must not be negative"
        );
        // A pod asking for no GPU is not read further (HAMi passes it through).
        pod.containers = vec![ctr(&[])];
        pod.annotations.insert(GPU_POLICY.into(), "nonsense".into());
        assert!(!PodRequest::from_pod(&pod, &cfg).unwrap().wants_gpu());
    }

    #[test]
    fn vgpu_mode_must_contain_device_mode() {
        let c = Constraints {
            vgpu_mode: Some("hami-core,mps".into()),
            ..Constraints::default()
        };
        assert!(c.type_allows("NVIDIA T4", "mps"));
        assert!(!c.type_allows("NVIDIA T4", "mig"));
    }
}
