//! Prometheus metrics of the scheduler, with HAMi's names and labels (so
//! HAMi-WebUI and its dashboards work unchanged) plus our own latency and
//! decision counters.
//!
//! GPU, slice and quota gauges are rebuilt from a model snapshot at every
//! scrape; counters and histograms are updated by the handlers.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use proto::hami::resources::ResourceNames;

use crate::cache::model::{GpuSnapshot, SliceSnapshot};
use crate::core::quota::QuotaStatus;

const MIB: f64 = 1024.0 * 1024.0;

/// Labels of per-GPU metrics (HAMi ≥ v2.9).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    node: String,
    device_uuid: String,
    device_index: String,
    device_type: String,
}

/// Labels of `hami_node_gpu_overview` (HAMi's: capacity as label values,
/// cores and MiB as integers).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OverviewLabels {
    node: String,
    device_uuid: String,
    device_index: String,
    device_cores: String,
    device_memory_limit: String,
    device_type: String,
}

/// Labels of `hami_node_gpu_mig_instance_info` (HAMi v2.10): one series per
/// MIG instance the device plugin created.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigInstanceLabels {
    node: String,
    device_uuid: String,
    device_index: String,
    mig_uuid: String,
    profile: String,
    gpu_instance_id: String,
    compute_instance_id: String,
    placement_start: String,
    placement_size: String,
}

/// Labels of `hami_build_info`, in HAMi's names; `go_version` is empty.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfoLabels {
    version: String,
    revision: String,
    build_date: String,
    go_version: String,
    compiler: String,
    platform: String,
}

impl BuildInfoLabels {
    /// This build: the crate version, the revision and date the build
    /// environment passed in (`GPUSLICE_REVISION`, `GPUSLICE_BUILD_DATE`,
    /// else empty), `rustc`, and Go's `os/arch` spelling of the target.
    fn current() -> Self {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            revision: option_env!("GPUSLICE_REVISION").unwrap_or("").to_owned(),
            build_date: option_env!("GPUSLICE_BUILD_DATE").unwrap_or("").to_owned(),
            go_version: String::new(),
            compiler: "rustc".to_owned(),
            platform: format!("{}/{arch}", std::env::consts::OS),
        }
    }
}

/// Labels of per-container slice metrics (HAMi ≥ v2.9).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SliceLabels {
    namespace: String,
    node: String,
    pod: String,
    container_index: String,
    device_uuid: String,
}

/// Labels of `hami_resource_quota_used` (HAMi's: the limit is a label too,
/// `"0"` when none is set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaUsedLabels {
    namespace: String,
    quota_name: String,
    limit: String,
}

/// Labels of `hami_resource_quota_limit`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLimitLabels {
    namespace: String,
    quota_name: String,
}

/// Labels of decision counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    result: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric the scheduler exports.
pub struct Metrics {
    registry: Registry,
    gpu_memory_limit: Family<GpuLabels, FloatGauge>,
    gpu_core_limit: Family<GpuLabels, FloatGauge>,
    gpu_memory_allocated: Family<GpuLabels, FloatGauge>,
    gpu_core_allocated: Family<GpuLabels, FloatGauge>,
    gpu_shared_count: Family<GpuLabels, FloatGauge>,
    node_memory_ratio: Family<GpuLabels, FloatGauge>,
    overview: Family<OverviewLabels, FloatGauge>,
    mig_instances: Family<MigInstanceLabels, FloatGauge>,
    vgpu_memory: Family<SliceLabels, FloatGauge>,
    vgpu_core: Family<SliceLabels, FloatGauge>,
    quota_used: Family<QuotaUsedLabels, FloatGauge>,
    quota_limit: Family<QuotaLimitLabels, FloatGauge>,
    pending_pods: Gauge,
    /// Filter decisions by result (`placed`, `no_fit`, `invalid`, `no_gpu`,
    /// and for a dry run with Node objects `dry_run_fit`, `dry_run_no_fit`).
    pub filter_results: Family<ResultLabels, Counter>,
    /// Bind outcomes by result (`bound`, `failed`).
    pub bind_results: Family<ResultLabels, Counter>,
    /// Seconds per filter request.
    pub filter_seconds: Histogram,
    /// Seconds per bind request (includes waiting for the node lock).
    pub bind_seconds: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            gpu_memory_limit: Family::default(),
            gpu_core_limit: Family::default(),
            gpu_memory_allocated: Family::default(),
            gpu_core_allocated: Family::default(),
            gpu_shared_count: Family::default(),
            node_memory_ratio: Family::default(),
            overview: Family::default(),
            mig_instances: Family::default(),
            vgpu_memory: Family::default(),
            vgpu_core: Family::default(),
            quota_used: Family::default(),
            quota_limit: Family::default(),
            pending_pods: Gauge::default(),
            filter_results: Family::default(),
            bind_results: Family::default(),
            filter_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            bind_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            registry: Registry::default(),
        };
        registry.register(
            "hami_gpu_memory_limit_bytes",
            "Device memory of the GPU",
            m.gpu_memory_limit.clone(),
        );
        registry.register(
            "hami_gpu_core_limit_ratio",
            "Device cores of the GPU (1 = one card)",
            m.gpu_core_limit.clone(),
        );
        registry.register(
            "hami_gpu_memory_allocated_bytes",
            "Device memory allocated on the GPU",
            m.gpu_memory_allocated.clone(),
        );
        registry.register(
            "hami_gpu_core_allocated_ratio",
            "Device cores allocated on the GPU (1 = one card)",
            m.gpu_core_allocated.clone(),
        );
        registry.register(
            "hami_gpu_shared_count",
            "Containers sharing the GPU",
            m.gpu_shared_count.clone(),
        );
        registry.register(
            "hami_node_gpu_memory_allocated_ratio",
            "Allocated share of the GPU's memory",
            m.node_memory_ratio.clone(),
        );
        registry.register(
            "hami_node_gpu_overview",
            "GPU overview on a certain node: memory allocated, capacity in labels",
            m.overview.clone(),
        );
        registry.register(
            "hami_node_gpu_mig_instance_info",
            "Realized MIG instance identity and scheduler placement",
            m.mig_instances.clone(),
        );
        let build_info = Family::<BuildInfoLabels, FloatGauge>::default();
        build_info
            .get_or_create(&BuildInfoLabels::current())
            .set(1.0);
        registry.register(
            "hami_build_info",
            "Build metadata exposed as labels with a constant value of 1",
            build_info,
        );
        registry.register(
            "hami_vgpu_memory_allocated_bytes",
            "Device memory allocated to a container",
            m.vgpu_memory.clone(),
        );
        registry.register(
            "hami_vgpu_core_allocated_ratio",
            "Device cores allocated to a container (1 = one card)",
            m.vgpu_core.clone(),
        );
        registry.register(
            "hami_resource_quota_used",
            "ResourceQuota use of GPU memory (MiB) or cores (percent) in a namespace",
            m.quota_used.clone(),
        );
        registry.register(
            "hami_resource_quota_limit",
            "ResourceQuota limit of GPU memory (MiB, as written) or cores (percent) in a namespace",
            m.quota_limit.clone(),
        );
        registry.register(
            "gpuslice_pending_gpu_pods",
            "GPU pods holding nothing whose last filter found no node",
            m.pending_pods.clone(),
        );
        registry.register(
            "gpuslice_filter_decisions",
            "Filter decisions by result",
            m.filter_results.clone(),
        );
        registry.register(
            "gpuslice_bind_results",
            "Bind outcomes by result",
            m.bind_results.clone(),
        );
        registry.register(
            "gpuslice_filter_duration_seconds",
            "Time to answer a filter request",
            m.filter_seconds.clone(),
        );
        registry.register(
            "gpuslice_bind_duration_seconds",
            "Time to answer a bind request, lock wait included",
            m.bind_seconds.clone(),
        );
        Self { registry, ..m }
    }

    /// Counts one outcome in a result family.
    pub fn count(family: &Family<ResultLabels, Counter>, result: &str) {
        family
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Sets the number of GPU pods whose last filter found no node.
    pub fn set_pending(&self, pods: usize) {
        self.pending_pods
            .set(i64::try_from(pods).unwrap_or(i64::MAX));
    }

    /// Replaces the GPU and slice gauges with a fresh snapshot.
    pub fn refresh(&self, gpus: &[GpuSnapshot], slices: &[SliceSnapshot]) {
        for family in [
            &self.gpu_memory_limit,
            &self.gpu_core_limit,
            &self.gpu_memory_allocated,
            &self.gpu_core_allocated,
            &self.gpu_shared_count,
            &self.node_memory_ratio,
        ] {
            family.clear();
        }
        self.overview.clear();
        self.mig_instances.clear();
        self.vgpu_memory.clear();
        self.vgpu_core.clear();
        #[allow(clippy::cast_precision_loss)] // MiB and percent counts are far below 2^52
        for g in gpus {
            let labels = GpuLabels {
                node: g.node.clone(),
                device_uuid: g.uuid.clone(),
                device_index: g.index.to_string(),
                device_type: g.device_type.clone(),
            };
            self.gpu_memory_limit
                .get_or_create(&labels)
                .set(g.memory_mib as f64 * MIB);
            self.gpu_core_limit
                .get_or_create(&labels)
                .set(f64::from(g.cores) / 100.0);
            self.gpu_memory_allocated
                .get_or_create(&labels)
                .set(g.used_memory_mib as f64 * MIB);
            self.gpu_core_allocated
                .get_or_create(&labels)
                .set(f64::from(g.used_cores) / 100.0);
            self.gpu_shared_count
                .get_or_create(&labels)
                .set(f64::from(g.used_slots));
            let ratio = if g.memory_mib == 0 {
                0.0
            } else {
                g.used_memory_mib as f64 / g.memory_mib as f64
            };
            self.node_memory_ratio.get_or_create(&labels).set(ratio);
            self.overview
                .get_or_create(&OverviewLabels {
                    node: g.node.clone(),
                    device_uuid: g.uuid.clone(),
                    device_index: g.index.to_string(),
                    device_cores: g.cores.to_string(),
                    device_memory_limit: g.memory_mib.to_string(),
                    device_type: g.device_type.clone(),
                })
                .set(g.used_memory_mib as f64 * MIB);
        }
        #[allow(clippy::cast_precision_loss)]
        for s in slices {
            let labels = SliceLabels {
                namespace: s.namespace.clone(),
                node: s.node.clone(),
                pod: s.pod.clone(),
                container_index: s.container_index.to_string(),
                device_uuid: s.uuid.clone(),
            };
            self.vgpu_memory
                .get_or_create(&labels)
                .set(s.memory_mib as f64 * MIB);
            self.vgpu_core
                .get_or_create(&labels)
                .set(f64::from(s.cores) / 100.0);
            if let Some((mig, runtime)) =
                s.mig.as_ref().and_then(|m| Some((m, m.runtime.as_ref()?)))
            {
                let device_index = gpus
                    .iter()
                    .find(|g| g.node == s.node && g.uuid == s.uuid)
                    .map(|g| g.index.to_string())
                    .unwrap_or_default();
                self.mig_instances
                    .get_or_create(&MigInstanceLabels {
                        node: s.node.clone(),
                        device_uuid: s.uuid.clone(),
                        device_index,
                        mig_uuid: runtime.mig_uuid.clone(),
                        profile: mig.profile.clone(),
                        gpu_instance_id: runtime.gpu_instance_id.to_string(),
                        compute_instance_id: runtime.compute_instance_id.to_string(),
                        placement_start: mig.placement.start.to_string(),
                        placement_size: mig.placement.size.to_string(),
                    })
                    .set(1.0);
            }
        }
    }

    /// Replaces the quota gauges: per namespace and key, the use (labelled
    /// with its limit, as HAMi does) and the limit when one is set.
    /// `quota_name` is the resource name without `limits.`.
    pub fn refresh_quotas(&self, quotas: &[QuotaStatus], names: &ResourceNames) {
        self.quota_used.clear();
        self.quota_limit.clear();
        #[allow(clippy::cast_precision_loss)] // MiB and percent counts are far below 2^52
        for q in quotas {
            for (resource, used, limit) in [
                (&names.resource_mem, q.used.memory_mib, q.limits.memory_mib),
                (&names.resource_cores, q.used.cores, q.limits.cores),
            ] {
                self.quota_used
                    .get_or_create(&QuotaUsedLabels {
                        namespace: q.namespace.clone(),
                        quota_name: resource.clone(),
                        limit: limit.unwrap_or(0).to_string(),
                    })
                    .set(used as f64);
                if let Some(limit) = limit {
                    self.quota_limit
                        .get_or_create(&QuotaLimitLabels {
                            namespace: q.namespace.clone(),
                            quota_name: resource.clone(),
                        })
                        .set(limit as f64);
                }
            }
        }
    }

    /// The OpenMetrics text exposition.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hami_names_and_labels_are_exported() {
        let m = Metrics::new();
        let gpu = GpuSnapshot {
            node: "n1".into(),
            uuid: "GPU-a".into(),
            index: 0,
            device_type: "NVIDIA-Tesla T4".into(),
            memory_mib: 1000,
            cores: 100,
            slots: 10,
            used_slots: 2,
            used_memory_mib: 250,
            used_cores: 30,
        };
        let slice = SliceSnapshot {
            namespace: "ns".into(),
            pod: "p".into(),
            node: "n1".into(),
            container_index: 1,
            uuid: "GPU-a".into(),
            memory_mib: 250,
            cores: 30,
            mig: None,
        };
        let mig = SliceSnapshot {
            container_index: 0,
            memory_mib: 10240,
            cores: 28,
            mig: Some(proto::hami::mig::MigAllocation {
                container_index: 0,
                device_index: 0,
                gpu_uuid: "GPU-a".into(),
                profile: "2g.10gb".into(),
                placement: proto::hami::mig::MigPlacement { start: 2, size: 2 },
                runtime: Some(proto::hami::mig::MigRuntime {
                    mig_uuid: "MIG-x".into(),
                    gpu_instance_id: 4,
                    compute_instance_id: 0,
                }),
            }),
            ..slice.clone()
        };
        m.refresh(&[gpu], &[slice, mig]);
        Metrics::count(&m.filter_results, "placed");
        let text = m.encode();
        assert!(text.contains(r#"hami_gpu_memory_allocated_bytes{node="n1",device_uuid="GPU-a",device_index="0",device_type="NVIDIA-Tesla T4"} 262144000.0"#), "{text}");
        assert!(text.contains(r#"hami_node_gpu_memory_allocated_ratio{node="n1",device_uuid="GPU-a",device_index="0",device_type="NVIDIA-Tesla T4"} 0.25"#), "{text}");
        assert!(text.contains(r#"hami_vgpu_core_allocated_ratio{namespace="ns",node="n1",pod="p",container_index="1",device_uuid="GPU-a"} 0.3"#), "{text}");
        assert!(text.contains(r#"hami_node_gpu_overview{node="n1",device_uuid="GPU-a",device_index="0",device_cores="100",device_memory_limit="1000",device_type="NVIDIA-Tesla T4"} 262144000.0"#), "{text}");
        // One series per created MIG instance, none for a plain slice.
        assert!(text.contains(r#"hami_node_gpu_mig_instance_info{node="n1",device_uuid="GPU-a",device_index="0",mig_uuid="MIG-x",profile="2g.10gb",gpu_instance_id="4",compute_instance_id="0",placement_start="2",placement_size="2"} 1.0"#), "{text}");
        assert_eq!(
            text.matches("hami_node_gpu_mig_instance_info{").count(),
            1,
            "{text}"
        );
        let build = format!(
            r#"hami_build_info{{version="{}",revision="#,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build), "{text}");
        assert!(
            text.contains(r#"compiler="rustc",platform="linux/"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gpuslice_filter_decisions_total{result="placed"} 1"#),
            "{text}"
        );

        // A GPU that disappears from the snapshot disappears from the output.
        m.refresh(&[], &[]);
        assert!(!m.encode().contains("GPU-a"));
        assert!(m.encode().contains("hami_build_info{"), "build info stays");
    }

    #[test]
    fn quota_use_and_limit_carry_hamis_labels() {
        use crate::core::quota::{QuotaLimits, QuotaUse};

        let m = Metrics::new();
        let limited = QuotaStatus {
            namespace: "team-a".into(),
            limits: QuotaLimits {
                memory_mib: Some(8192),
                cores: None,
            },
            used: QuotaUse {
                memory_mib: 4096,
                cores: 50,
            },
            memory_factor: 1,
        };
        m.refresh_quotas(&[limited], &ResourceNames::default());
        let text = m.encode();
        for line in [
            r#"hami_resource_quota_used{namespace="team-a",quota_name="nvidia.com/gpumem",limit="8192"} 4096.0"#,
            r#"hami_resource_quota_used{namespace="team-a",quota_name="nvidia.com/gpucores",limit="0"} 50.0"#,
            r#"hami_resource_quota_limit{namespace="team-a",quota_name="nvidia.com/gpumem"} 8192.0"#,
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert!(
            !text.contains(
                r#"hami_resource_quota_limit{namespace="team-a",quota_name="nvidia.com/gpucores"}"#
            ),
            "no limit series without a limit: {text}"
        );
        m.refresh_quotas(&[], &ResourceNames::default());
        assert!(!m.encode().contains("team-a"));
    }
}
