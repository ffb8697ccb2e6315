//! Every annotation and label key of the HAMi protocol (NVIDIA path).
//!
//! Owns the key strings only; the values' encodings live in the sibling
//! modules named in each constant's doc. Keys are HAMi's, byte for byte, so a
//! HAMi scheduler, device plugin, monitor or WebUI reads what gpuslice writes.

// === Node annotations ===

/// Node annotation: the GPUs of the node, written by the device plugin.
/// Value: [`super::register`] (JSON array, v2.8+; legacy `…:` list read-only).
pub const NODE_NVIDIA_REGISTER: &str = "hami.io/node-nvidia-register";

/// Node annotation: the scheduler's handshake with the node's device plugin.
/// Value: [`super::handshake::Handshake`], e.g. `Requesting_2025-07-12 01:12:20`.
pub const NODE_HANDSHAKE: &str = "hami.io/node-handshake";

/// Node annotation: GPU pair scores for the `topology-aware` policy, written
/// by the plugin only with `ENABLE_TOPOLOGY_SCORE=true`.
/// Value: [`super::pair_score`], `[{"uuid":"GPU-a","score":{"GPU-b":<int>}}]`.
pub const NODE_NVIDIA_SCORE: &str = "hami.io/node-nvidia-score";

/// Node annotation, set by an admin: comma list of GPU UUIDs excluded from
/// new allocations (existing ones are kept).
pub const DEVICE_CORDON: &str = "hami.io/device-cordon";

/// Node annotation: the node lock, shared by all vendors, held from bind to
/// Allocate. Value: [`super::node_lock::NodeLock`],
/// e.g. `2025-10-20T03:07:02Z,default,train-0`.
pub const NODE_LOCK: &str = "hami.io/mutex.lock";

// === Pod annotations written by the scheduler ===

/// Pod annotation and pod label: the node the scheduler chose.
pub const VGPU_NODE: &str = "hami.io/vgpu-node";

/// Pod annotation: when the scheduler's filter chose the node, unix seconds
/// (same encoding as [`super::bind::BindTime`]).
pub const VGPU_TIME: &str = "hami.io/vgpu-time";

/// Pod annotation: the devices still to be handed out, one `;`-terminated
/// entry per container; the device plugin empties each container's entry
/// after Allocate. Value: [`super::pod_devices::PodDevices`].
pub const VGPU_DEVICES_TO_ALLOCATE: &str = "hami.io/vgpu-devices-to-allocate";

/// Pod annotation: the devices the pod holds, never changed after filter;
/// usage is rebuilt from it. Value: [`super::pod_devices::PodDevices`].
pub const VGPU_DEVICES_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";

/// Pod annotation, MIG mode only: the MIG placements (JSON). gpuslice does
/// not implement MIG; the key is listed so it can be recognised.
pub const VGPU_MIG_ALLOCATIONS: &str = "hami.io/vgpu-mig-allocations";

/// Pod annotation: where the pod is between bind and Allocate.
/// Value: [`super::bind::BindPhase`] (`allocating`, `success`, `failed`).
pub const BIND_PHASE: &str = "hami.io/bind-phase";

/// Pod annotation: when bind started, unix seconds; used to find allocations
/// that never complete. Value: [`super::bind::BindTime`].
pub const BIND_TIME: &str = "hami.io/bind-time";

/// Pod annotation, **gpuslice's own** (not HAMi's, not in [`ALL`]): a binder
/// took this pod's node lock over while the pod might still be admitted
/// there. Value: the node's name. Written with `bind-phase=failed` by a
/// resourceVersion-guarded patch; while a pod bound to that node carries it
/// and is still `Pending`, that node's daemon refuses every Allocate the pod
/// could have sent (see `docs/protocol.md`, the node lock).
pub const BIND_ABANDONED: &str = "gpuslice.io/bind-abandoned";

// === Pod annotations a user may set ===

/// Pod annotation: comma list; only GPUs whose type contains one of the
/// entries (case-insensitive) are used.
pub const USE_GPUTYPE: &str = "nvidia.com/use-gputype";

/// Pod annotation: comma list; GPUs whose type contains one of the entries
/// (case-insensitive) are not used.
pub const NOUSE_GPUTYPE: &str = "nvidia.com/nouse-gputype";

/// Pod annotation: comma list of GPU UUIDs (exact, trimmed) the pod may use;
/// an empty value means no constraint.
pub const USE_GPUUUID: &str = "nvidia.com/use-gpuuuid";

/// Pod annotation: comma list of GPU UUIDs (exact, trimmed) the pod must not
/// use; an empty value means no constraint.
pub const NOUSE_GPUUUID: &str = "nvidia.com/nouse-gpuuuid";

/// Pod annotation, bool: all GPUs of a container must share a NUMA node.
pub const NUMA_BIND: &str = "nvidia.com/numa-bind";

/// Pod annotation: a device's mode (`hami-core`, `mig`, `mps`) must be a
/// substring of this value.
pub const VGPU_MODE: &str = "nvidia.com/vgpu-mode";

/// Pod annotation: node policy for this pod, `binpack` or `spread`.
pub const NODE_SCHEDULER_POLICY: &str = "hami.io/node-scheduler-policy";

/// Pod annotation: GPU policy for this pod, `binpack`, `spread`, `mutex`,
/// `topology-aware`, `numa`, or a comma chain such as `binpack,numa`.
pub const GPU_SCHEDULER_POLICY: &str = "hami.io/gpu-scheduler-policy";

/// Pod annotation: GPU score weights, exactly `slot=a,core=b,memory=c`.
/// Value: [`super::scoring_weights::DeviceScoringWeights`].
pub const DEVICE_SCORING_WEIGHTS: &str = "hami.io/device-scoring-weights";

// === Labels ===

/// Label on objects and namespaces the mutating webhook must skip; the value
/// is [`WEBHOOK_IGNORE_VALUE`].
pub const WEBHOOK_IGNORE_LABEL: &str = "hami.io/webhook";

/// Value of [`WEBHOOK_IGNORE_LABEL`] that excludes an object.
pub const WEBHOOK_IGNORE_VALUE: &str = "ignore";

/// Label the scheduler puts on its own pod: [`SCHEDULER_ROLE_LEADER`] or
/// [`SCHEDULER_ROLE_FOLLOWER`]; the Service selects the leader.
pub const SCHEDULER_ROLE_LABEL: &str = "hami.io/scheduler-role";

/// Value of [`SCHEDULER_ROLE_LABEL`] on the leader.
pub const SCHEDULER_ROLE_LEADER: &str = "leader";

/// Value of [`SCHEDULER_ROLE_LABEL`] on a follower.
pub const SCHEDULER_ROLE_FOLLOWER: &str = "follower";

/// Label marking PodGroup members, which retry node-lock contention instead
/// of failing at once.
pub const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// Every key above, for checks and documentation.
pub const ALL: &[&str] = &[
    NODE_NVIDIA_REGISTER,
    NODE_HANDSHAKE,
    NODE_NVIDIA_SCORE,
    DEVICE_CORDON,
    NODE_LOCK,
    VGPU_NODE,
    VGPU_TIME,
    VGPU_DEVICES_TO_ALLOCATE,
    VGPU_DEVICES_ALLOCATED,
    VGPU_MIG_ALLOCATIONS,
    BIND_PHASE,
    BIND_TIME,
    USE_GPUTYPE,
    NOUSE_GPUTYPE,
    USE_GPUUUID,
    NOUSE_GPUUUID,
    NUMA_BIND,
    VGPU_MODE,
    NODE_SCHEDULER_POLICY,
    GPU_SCHEDULER_POLICY,
    DEVICE_SCORING_WEIGHTS,
    WEBHOOK_IGNORE_LABEL,
    SCHEDULER_ROLE_LABEL,
    POD_GROUP_LABEL,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A Kubernetes qualified name with a DNS-subdomain prefix.
    fn is_qualified_key(key: &str) -> bool {
        let Some((prefix, name)) = key.split_once('/') else {
            return false;
        };
        let dns = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|l| {
                    !l.is_empty()
                        && l.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                })
        };
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && name.as_bytes()[0].is_ascii_alphanumeric()
            && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
        dns(prefix) && name_ok
    }

    #[test]
    fn every_key_is_a_valid_distinct_kubernetes_key() {
        for key in ALL {
            assert!(is_qualified_key(key), "{key}");
        }
        let mut sorted = ALL.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ALL.len());
    }
}
