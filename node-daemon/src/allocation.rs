//! The decisions of Allocate and GetPreferredAllocation as pure functions
//! over the pods bound to this node (no actix, no I/O):
//!
//! - [`identify_pod`]: which pod an Allocate is for. kubelet sends no pod
//!   identity, so: the node-lock owner when it is waiting for this many
//!   devices; otherwise the one pod on this node whose next pending
//!   container asks for this many devices — exactly one, never a guess
//!   between two (HAMi takes the first of an unsorted list; #781). And
//!   never while a pod whose node lock a binder took over
//!   (`gpuslice.io/bind-abandoned`) may still be admitted here and could be
//!   the sender: its Allocate and the new holder's look the same.
//! - [`plan_container`]: the container entry the request consumes, checked
//!   against the request and the node's GPUs.
//! - [`rebuild_holdings`]: the slices already handed out, from annotations,
//!   to refill the GPU ledgers after a restart.
//! - [`prefer_devices`]: device IDs on the GPUs the scheduler chose.

use proto::hami::bind::BindPhase;
use proto::hami::keys;
use proto::hami::node_lock::NodeLock;
use proto::hami::pod_devices::{ContainerDevices, PodDevices, PodDevicesError};

use crate::cluster::{ClusterError, PodView};
use crate::ledger::{LedgerError, Slice, SliceKey};

/// Why an Allocate could not be served.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// The request has no container.
    #[error("Allocate request has no container request")]
    EmptyRequest,
    /// No pod on the node waits for this many devices.
    #[error("no pod on node {node} is waiting for an allocation of {devices} device(s)")]
    NoPod {
        /// The node.
        node: String,
        /// Devices in the request.
        devices: usize,
    },
    /// Several pods wait for this many devices and no lock names one.
    #[error(
        "pods {pods:?} on node {node} all wait for {devices} device(s) and the node lock names none of them; refusing to guess"
    )]
    Ambiguous {
        /// The node.
        node: String,
        /// Devices in the request.
        devices: usize,
        /// The candidates, `namespace/name`.
        pods: Vec<String>,
    },
    /// A pod whose lock was taken over may still be admitted on this node
    /// and could have sent this Allocate; the new holder's looks the same.
    #[error(
        "pods {abandoned:?} on node {node} were abandoned by their binder but may still be admitted here, and an Allocate of {devices} device(s) could be theirs; refusing to guess"
    )]
    Abandoned {
        /// The node.
        node: String,
        /// Devices in the request.
        devices: usize,
        /// The abandoned pods, `namespace/name`.
        abandoned: Vec<String>,
    },
    /// Reading the pods failed before any pod was identified.
    #[error("cannot read the pods of this node: {0}")]
    Cluster(#[source] ClusterError),
    /// The identified pod cannot be served.
    #[error("pod {pod}: {reason}")]
    Pod {
        /// `namespace/name`.
        pod: String,
        /// Why.
        #[source]
        reason: PodFailure,
    },
}

/// Why one identified pod cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum PodFailure {
    /// `vgpu-devices-to-allocate` is missing.
    #[error(
        "annotation {} is missing (device request not found)",
        keys::VGPU_DEVICES_TO_ALLOCATE
    )]
    NoRequest,
    /// An annotation does not decode.
    #[error("annotation {key}: {error}")]
    Annotation {
        /// The key.
        key: &'static str,
        /// The decoding error.
        #[source]
        error: PodDevicesError,
    },
    /// No container entry is left to allocate.
    #[error("no pending device allocation found")]
    NothingPending,
    /// kubelet asks for a different number of devices than the entry holds.
    #[error(
        "container {container}: kubelet asks for {requested} device(s), the scheduler chose {chosen} (device number not matched)"
    )]
    DeviceCount {
        /// Container index.
        container: usize,
        /// Devices in the request.
        requested: usize,
        /// Devices in the entry.
        chosen: usize,
    },
    /// The entry names a GPU this node does not have.
    #[error("container {container}: GPU {uuid} is not on this node")]
    UnknownGpu {
        /// Container index.
        container: usize,
        /// The UUID.
        uuid: String,
    },
    /// The entry index has no container in the pod spec.
    #[error("container index {0} is not in the pod spec")]
    NoSuchContainer(usize),
    /// A GPU refused the slice.
    #[error("GPU {uuid}: {error}")]
    Ledger {
        /// The GPU.
        uuid: String,
        /// Why.
        #[source]
        error: LedgerError,
    },
    /// A GPU actor is gone (the daemon is stopping).
    #[error("GPU {0} is not serving")]
    GpuUnavailable(String),
    /// The HAMi-core contract could not be built.
    #[error("{0}")]
    Contract(#[source] proto::hami::container_contract::ContractError),
    /// Writing the pod's annotations failed.
    #[error("{0}")]
    Cluster(#[source] ClusterError),
    /// A device on a MIG GPU has no instance to give.
    #[error("{0}")]
    Mig(#[source] crate::mig::NoPlacement),
}

impl PodFailure {
    /// Wraps the failure with the pod it concerns.
    #[must_use]
    pub fn of(self, pod: &PodView) -> AllocateError {
        AllocateError::Pod {
            pod: pod.full_name(),
            reason: self,
        }
    }
}

/// The physical GPU of a device ID: `<UUID>-<i>` without `-<i>`; an ID
/// without a numeric suffix is returned whole.
#[must_use]
pub fn physical_uuid(device_id: &str) -> &str {
    match device_id.rsplit_once('-') {
        Some((uuid, i)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => uuid,
        _ => device_id,
    }
}

/// The device IDs advertised for a GPU: `<UUID>-0` … `<UUID>-<split-1>`.
pub fn device_ids(uuid: &str, split_count: u32) -> impl Iterator<Item = String> + '_ {
    (0..split_count).map(move |i| format!("{uuid}-{i}"))
}

/// The decoded `vgpu-devices-to-allocate` of a pod that waits for Allocate
/// on `node`: not finished or deleting, `Pending`, bound here by the
/// scheduler (`vgpu-node`), `bind-phase` allocating (or success, as HAMi
/// accepts), with a container still pending.
#[must_use]
pub fn awaiting_allocation(pod: &PodView, node: &str) -> Option<PodDevices> {
    if pod.terminating || !matches!(pod.phase.as_str(), "Pending" | "") {
        return None;
    }
    if pod.annotation(keys::VGPU_NODE) != Some(node) {
        return None;
    }
    let phase = pod
        .annotation(keys::BIND_PHASE)?
        .parse::<BindPhase>()
        .ok()?;
    if phase == BindPhase::Failed {
        return None;
    }
    let devices: PodDevices = pod
        .annotation(keys::VGPU_DEVICES_TO_ALLOCATE)?
        .parse()
        .ok()?;
    devices.has_pending_devices().then_some(devices)
}

/// Whether `pod` was abandoned on `node` by a binder that took its node
/// lock over, and kubelet may still admit it there with an Allocate of
/// `devices` device(s): it is bound here (listed for this node), not
/// finished or deleting, still `Pending`, marked `gpuslice.io/bind-abandoned`
/// with this node, and its next pending container asks for `devices` (or
/// its request cannot be read, so it could ask for any count).
#[must_use]
pub fn may_send_abandoned(pod: &PodView, node: &str, devices: usize) -> bool {
    if pod.terminating || !matches!(pod.phase.as_str(), "Pending" | "") {
        return false;
    }
    if pod.annotation(keys::BIND_ABANDONED) != Some(node) {
        return false;
    }
    match pod
        .annotation(keys::VGPU_DEVICES_TO_ALLOCATE)
        .map(str::parse::<PodDevices>)
    {
        Some(Ok(d)) => d.first_pending().is_some_and(|(_, e)| e.len() == devices),
        Some(Err(_)) | None => true,
    }
}

/// Finds the pod an Allocate of `devices` device(s) on `node` is for; see
/// the module docs for the rule. `lock` is the raw node-lock value.
///
/// # Errors
/// [`AllocateError::Abandoned`] when an abandoned pod could be the sender,
/// [`AllocateError::NoPod`] when no pod matches, [`AllocateError::Ambiguous`]
/// when several do and the lock names none of them.
pub fn identify_pod<'p>(
    node: &str,
    lock: Option<&str>,
    pods: &'p [PodView],
    devices: usize,
) -> Result<(&'p PodView, PodDevices), AllocateError> {
    let abandoned: Vec<String> = pods
        .iter()
        .filter(|p| may_send_abandoned(p, node, devices))
        .map(PodView::full_name)
        .collect();
    if !abandoned.is_empty() {
        return Err(AllocateError::Abandoned {
            node: node.to_owned(),
            devices,
            abandoned,
        });
    }
    let matching: Vec<(&PodView, PodDevices)> = pods
        .iter()
        .filter_map(|p| awaiting_allocation(p, node).map(|d| (p, d)))
        .filter(|(_, d)| d.first_pending().is_some_and(|(_, e)| e.len() == devices))
        .collect();
    let owner = lock
        .and_then(|l| l.parse::<NodeLock>().ok())
        .and_then(|l| l.owner);
    if let Some(found) = owner.and_then(|owner| {
        matching
            .iter()
            .find(|(p, _)| p.namespace == owner.namespace && p.name == owner.pod)
    }) {
        return Ok(found.clone());
    }
    match matching.len() {
        1 => Ok(matching
            .into_iter()
            .next()
            .ok_or(AllocateError::EmptyRequest)?),
        0 => Err(AllocateError::NoPod {
            node: node.to_owned(),
            devices,
        }),
        _ => Err(AllocateError::Ambiguous {
            node: node.to_owned(),
            devices,
            pods: matching.iter().map(|(p, _)| p.full_name()).collect(),
        }),
    }
}

/// What serving one container request means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    /// Container index (init containers first).
    pub container: usize,
    /// Container name.
    pub container_name: String,
    /// Its env turns HAMi-core control off.
    pub cuda_disable_control: bool,
    /// It is an init container.
    pub init: bool,
    /// The slices the scheduler chose for it.
    pub devices: ContainerDevices,
    /// `vgpu-devices-to-allocate` with this container's entry erased.
    pub remaining: PodDevices,
}

impl ContainerPlan {
    /// Whether this is the pod's last pending container.
    #[must_use]
    pub fn is_last(&self) -> bool {
        !self.remaining.has_pending_devices()
    }

    /// What each GPU's ledger must hold for this container.
    #[must_use]
    pub fn slices(&self, pod_uid: &str) -> Vec<(String, SliceKey, Slice)> {
        self.devices
            .iter()
            .map(|d| {
                (
                    d.uuid.clone(),
                    SliceKey {
                        pod_uid: pod_uid.to_owned(),
                        container: self.container,
                    },
                    slice_of(d.usedmem, d.usedcores, self.init),
                )
            })
            .collect()
    }
}

fn slice_of(mem: i32, cores: i32, init: bool) -> Slice {
    Slice {
        memory_mib: u32::try_from(mem).unwrap_or(0),
        cores: u32::try_from(cores).unwrap_or(0),
        init,
    }
}

/// Takes the next pending container entry of `to_allocate` for a request
/// of `requested` devices; `is_local_gpu` says whether a UUID is on this node.
///
/// # Errors
/// A [`PodFailure`] naming what does not match.
pub fn plan_container(
    pod: &PodView,
    to_allocate: &PodDevices,
    requested: usize,
    is_local_gpu: impl Fn(&str) -> bool,
) -> Result<ContainerPlan, PodFailure> {
    let (container, devices) = to_allocate
        .first_pending()
        .ok_or(PodFailure::NothingPending)?;
    if devices.len() != requested {
        return Err(PodFailure::DeviceCount {
            container,
            requested,
            chosen: devices.len(),
        });
    }
    if let Some(d) = devices.iter().find(|d| !is_local_gpu(&d.uuid)) {
        return Err(PodFailure::UnknownGpu {
            container,
            uuid: d.uuid.clone(),
        });
    }
    let spec = pod
        .containers
        .get(container)
        .ok_or(PodFailure::NoSuchContainer(container))?;
    let remaining =
        to_allocate
            .erase_container(container)
            .map_err(|error| PodFailure::Annotation {
                key: keys::VGPU_DEVICES_TO_ALLOCATE,
                error,
            })?;
    Ok(ContainerPlan {
        container,
        container_name: spec.name.clone(),
        cuda_disable_control: spec.cuda_disable_control,
        init: spec.init,
        devices: devices.clone(),
        remaining,
    })
}

/// Decodes a pod's `vgpu-devices-to-allocate`.
///
/// # Errors
/// [`PodFailure::NoRequest`] when absent, [`PodFailure::Annotation`] when
/// malformed.
pub fn to_allocate(pod: &PodView) -> Result<PodDevices, PodFailure> {
    pod.annotation(keys::VGPU_DEVICES_TO_ALLOCATE)
        .ok_or(PodFailure::NoRequest)?
        .parse()
        .map_err(|error| PodFailure::Annotation {
            key: keys::VGPU_DEVICES_TO_ALLOCATE,
            error,
        })
}

/// One slice a GPU's ledger must hold after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The GPU.
    pub uuid: String,
    /// Who holds it.
    pub key: SliceKey,
    /// What is held.
    pub slice: Slice,
}

/// The slices already handed out on `node`: for each live pod bound here
/// (not finished, `bind-phase` not failed), every container whose entry is
/// in `vgpu-devices-allocated` but erased from `vgpu-devices-to-allocate`
/// (its Allocate completed). Pods whose annotations do not decode are
/// returned as errors and contribute nothing.
#[must_use]
pub fn rebuild_holdings(node: &str, pods: &[PodView]) -> (Vec<Holding>, Vec<AllocateError>) {
    let mut holdings = Vec::new();
    let mut errors = Vec::new();
    for pod in pods {
        if pod.is_terminal() || pod.annotation(keys::VGPU_NODE) != Some(node) {
            continue;
        }
        if pod.annotation(keys::BIND_PHASE) == Some(BindPhase::Failed.as_str()) {
            continue;
        }
        let Some(raw) = pod.annotation(keys::VGPU_DEVICES_ALLOCATED) else {
            continue;
        };
        let allocated: PodDevices = match raw.parse() {
            Ok(d) => d,
            Err(error) => {
                errors.push(
                    PodFailure::Annotation {
                        key: keys::VGPU_DEVICES_ALLOCATED,
                        error,
                    }
                    .of(pod),
                );
                continue;
            }
        };
        let pending = match pod.annotation(keys::VGPU_DEVICES_TO_ALLOCATE) {
            None => PodDevices::default(),
            Some(raw) => match raw.parse::<PodDevices>() {
                Ok(d) => d,
                Err(error) => {
                    errors.push(
                        PodFailure::Annotation {
                            key: keys::VGPU_DEVICES_TO_ALLOCATE,
                            error,
                        }
                        .of(pod),
                    );
                    continue;
                }
            },
        };
        for (container, devices) in allocated.containers().iter().enumerate() {
            let still_pending = pending
                .containers()
                .get(container)
                .is_some_and(|e| !e.is_empty());
            if still_pending {
                continue;
            }
            let init = pod.containers.get(container).is_some_and(|c| c.init);
            holdings.extend(devices.iter().map(|d| Holding {
                uuid: d.uuid.clone(),
                key: SliceKey {
                    pod_uid: pod.uid.clone(),
                    container,
                },
                slice: slice_of(d.usedmem, d.usedcores, init),
            }));
        }
    }
    (holdings, errors)
}

/// Picks `size` IDs from `available` for a container whose scheduler-chosen
/// GPUs are `chosen` (UUIDs): every ID of `must_include`, then one ID on
/// each chosen GPU not covered yet, then other available IDs (on GPUs not
/// yet used first) if still short.
#[must_use]
pub fn prefer_devices(
    chosen: &[String],
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut picked: Vec<String> = must_include.to_vec();
    for uuid in chosen {
        if picked.iter().any(|id| physical_uuid(id) == uuid) {
            continue;
        }
        if let Some(id) = available
            .iter()
            .find(|id| physical_uuid(id) == uuid && !picked.contains(id))
        {
            picked.push(id.clone());
        }
    }
    for distinct_gpus in [true, false] {
        for id in available {
            if picked.len() >= size {
                break;
            }
            let gpu_used = picked.iter().any(|p| physical_uuid(p) == physical_uuid(id));
            if !picked.contains(id) && (!distinct_gpus || !gpu_used) {
                picked.push(id.clone());
            }
        }
    }
    picked.truncate(size);
    picked
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cluster::ContainerView;

    const NODE: &str = "n1";

    /// A pod bound to [`NODE`] by the scheduler, waiting for Allocate.
    fn bound_pod(name: &str, to_allocate: &str) -> PodView {
        let annotations: BTreeMap<String, String> = [
            (keys::VGPU_NODE, NODE),
            (keys::BIND_PHASE, "allocating"),
            (keys::VGPU_DEVICES_TO_ALLOCATE, to_allocate),
            (keys::VGPU_DEVICES_ALLOCATED, to_allocate),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        PodView {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            phase: "Pending".into(),
            terminating: false,
            annotations,
            containers: vec![
                ContainerView {
                    name: "init".into(),
                    cuda_disable_control: false,
                    init: true,
                },
                ContainerView {
                    name: "app".into(),
                    cuda_disable_control: false,
                    init: false,
                },
            ],
        }
    }

    fn with(mut pod: PodView, key: &str, value: &str) -> PodView {
        pod.annotations.insert(key.into(), value.into());
        pod
    }

    fn lock(pod: &str) -> String {
        format!("2025-10-20T03:07:02Z,ns,{pod}")
    }

    #[test]
    fn identification_table() {
        let one_gpu = ";GPU-a,NVIDIA,3000,30:;";
        let two_gpus = "GPU-a,NVIDIA,1000,0:GPU-b,NVIDIA,1000,0:;;";
        let a = bound_pod("a", one_gpu);
        let b = bound_pod("b", one_gpu);
        let c = bound_pod("c", two_gpus);
        let done = bound_pod("done", ";;");
        let failed = with(bound_pod("failed", one_gpu), keys::BIND_PHASE, "failed");
        let elsewhere = with(bound_pod("elsewhere", one_gpu), keys::VGPU_NODE, "n2");
        let running = PodView {
            phase: "Running".into(),
            ..bound_pod("running", one_gpu)
        };
        let deleting = PodView {
            terminating: true,
            ..bound_pod("deleting", one_gpu)
        };
        let unrelated = PodView {
            annotations: BTreeMap::new(),
            ..bound_pod("plain", one_gpu)
        };
        type Case<'a> = (
            &'a str,
            Option<String>,
            Vec<PodView>,
            usize,
            Result<&'a str, &'a str>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "lone matching pod",
                None,
                vec![a.clone(), unrelated.clone()],
                1,
                Ok("a"),
            ),
            (
                "lock owner first",
                Some(lock("b")),
                vec![a.clone(), b.clone()],
                1,
                Ok("b"),
            ),
            (
                "two identical, no lock",
                None,
                vec![a.clone(), b.clone()],
                1,
                Err("Ambiguous"),
            ),
            (
                "two identical, lock names another",
                Some(lock("zz")),
                vec![a.clone(), b.clone()],
                1,
                Err("Ambiguous"),
            ),
            (
                "count tells them apart",
                None,
                vec![a.clone(), c.clone()],
                2,
                Ok("c"),
            ),
            (
                "lock owner with other count",
                Some(lock("c")),
                vec![a.clone(), c.clone()],
                1,
                Ok("a"),
            ),
            (
                "legacy lock names nobody",
                Some("2025-10-20T03:07:02Z".into()),
                vec![a.clone()],
                1,
                Ok("a"),
            ),
            (
                "garbage lock ignored",
                Some("x,y".into()),
                vec![a.clone()],
                1,
                Ok("a"),
            ),
            (
                "finished, failed, other node, running, deleting are skipped",
                None,
                vec![
                    done,
                    failed,
                    elsewhere,
                    running,
                    deleting,
                    unrelated,
                    b.clone(),
                ],
                1,
                Ok("b"),
            ),
            ("nothing waits", None, vec![c.clone()], 1, Err("NoPod")),
            ("no pods", None, vec![], 1, Err("NoPod")),
        ];
        for (name, lock, pods, devices, expected) in cases {
            let got = identify_pod(NODE, lock.as_deref(), &pods, devices);
            match (got, expected) {
                (Ok((pod, _)), Ok(want)) => assert_eq!(pod.name, want, "{name}"),
                (Err(AllocateError::Ambiguous { pods, .. }), Err("Ambiguous")) => {
                    assert_eq!(pods.len(), 2, "{name}");
                }
                (Err(AllocateError::NoPod { .. }), Err("NoPod")) => {}
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// A binder took the node lock over from `h` (bound here, never
    /// admitted) and gave it to `p`. kubelet may still admit `h`, and its
    /// Allocate looks exactly like `p`'s: the daemon must refuse rather
    /// than hand `h`'s containers `p`'s devices. Marking `h` failed alone
    /// is not enough: the failed pod is skipped and the lock owner `p`
    /// would be matched.
    #[test]
    fn an_allocate_a_taken_over_pod_could_have_sent_is_refused() {
        let one_gpu = ";GPU-a,NVIDIA,3000,30:;";
        let taken_over = |name: &str| {
            let h = with(bound_pod(name, one_gpu), keys::BIND_PHASE, "failed");
            with(h, keys::BIND_ABANDONED, NODE)
        };
        let p = bound_pod("p", one_gpu);
        let refused = |pods: &[PodView], devices: usize| {
            matches!(
                identify_pod(NODE, Some(&lock("p")), pods, devices),
                Err(AllocateError::Abandoned { .. })
            )
        };
        assert!(refused(&[taken_over("h"), p.clone()], 1));
        let mut unreadable = taken_over("h");
        unreadable
            .annotations
            .remove(keys::VGPU_DEVICES_TO_ALLOCATE);
        assert!(refused(&[unreadable, p.clone()], 1), "unknown count: any");
        // No longer a possible sender: p is served.
        let finished = PodView {
            phase: "Failed".into(),
            ..taken_over("h")
        };
        let deleting = PodView {
            terminating: true,
            ..taken_over("h")
        };
        let other_node = with(taken_over("h"), keys::BIND_ABANDONED, "n2");
        for h in [finished, deleting, other_node] {
            let pods = [h, p.clone()];
            let (pod, _) = identify_pod(NODE, Some(&lock("p")), &pods, 1).unwrap();
            assert_eq!(pod.name, "p");
        }
        // Another device count cannot be h's.
        let two = with(
            taken_over("h"),
            keys::VGPU_DEVICES_TO_ALLOCATE,
            "GPU-a,NVIDIA,1,1:GPU-b,NVIDIA,1,1:;",
        );
        assert!(!refused(&[two.clone(), p.clone()], 1));
        assert!(refused(&[two, p], 2));
    }

    #[test]
    fn ambiguity_message_names_the_pods_and_refuses_to_guess() {
        let pods = [
            bound_pod("a", "GPU-a,NVIDIA,1,1:;"),
            bound_pod("b", "GPU-b,NVIDIA,1,1:;"),
        ];
        let err = identify_pod(NODE, None, &pods, 1).unwrap_err().to_string();
        assert!(
            err.contains("ns/a") && err.contains("ns/b") && err.contains("refusing to guess"),
            "{err}"
        );
    }

    #[test]
    fn plan_takes_the_next_entry_and_erases_it() {
        let pod = bound_pod("a", ";GPU-a,NVIDIA,3000,30:;");
        let todo = to_allocate(&pod).unwrap();
        let plan = plan_container(&pod, &todo, 1, |u| u == "GPU-a").unwrap();
        assert_eq!((plan.container, plan.container_name.as_str()), (1, "app"));
        assert_eq!(plan.remaining.to_string(), ";;");
        assert!(plan.is_last());
        let slices = plan.slices(&pod.uid);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].0, "GPU-a");
        assert_eq!(slices[0].1.container, 1);
        assert_eq!(
            slices[0].2,
            Slice {
                memory_mib: 3000,
                cores: 30,
                init: false,
            }
        );
    }

    #[test]
    fn plan_of_a_two_container_pod_is_last_only_at_the_end() {
        let pod = bound_pod("a", "GPU-a,NVIDIA,1000,10:;GPU-a,NVIDIA,2000,20:;");
        let todo = to_allocate(&pod).unwrap();
        let first = plan_container(&pod, &todo, 1, |_| true).unwrap();
        assert_eq!(first.container, 0);
        assert!(!first.is_last());
        let second = plan_container(&pod, &first.remaining, 1, |_| true).unwrap();
        assert_eq!(second.container, 1);
        assert!(second.is_last());
        assert_eq!(second.remaining.to_string(), ";;");
    }

    #[test]
    fn plan_failures_are_named() {
        let pod = bound_pod("a", "GPU-a,NVIDIA,1,1:GPU-b,NVIDIA,1,1:;");
        let todo = to_allocate(&pod).unwrap();
        assert!(matches!(
            plan_container(&pod, &todo, 1, |_| true),
            Err(PodFailure::DeviceCount {
                container: 0,
                requested: 1,
                chosen: 2
            })
        ));
        assert!(matches!(
            plan_container(&pod, &todo, 2, |u| u == "GPU-a"),
            Err(PodFailure::UnknownGpu { uuid, .. }) if uuid == "GPU-b"
        ));
        let done = bound_pod("d", ";;");
        assert!(matches!(
            plan_container(&done, &to_allocate(&done).unwrap(), 1, |_| true),
            Err(PodFailure::NothingPending)
        ));
        let three = bound_pod("t", ";;GPU-a,NVIDIA,1,1:;");
        assert!(matches!(
            plan_container(&three, &to_allocate(&three).unwrap(), 1, |_| true),
            Err(PodFailure::NoSuchContainer(2))
        ));
        let mut missing = bound_pod("m", ";");
        missing.annotations.remove(keys::VGPU_DEVICES_TO_ALLOCATE);
        assert!(matches!(to_allocate(&missing), Err(PodFailure::NoRequest)));
        let bad = bound_pod("b", "GPU-a,NVIDIA:;");
        assert!(matches!(
            to_allocate(&bad),
            Err(PodFailure::Annotation { .. })
        ));
    }

    #[test]
    fn rebuild_counts_only_containers_whose_allocate_completed() {
        let mid = with(
            bound_pod("mid", "GPU-a,NVIDIA,1000,10:;GPU-b,NVIDIA,2000,20:;"),
            keys::VGPU_DEVICES_TO_ALLOCATE,
            ";GPU-b,NVIDIA,2000,20:;",
        );
        let running = PodView {
            phase: "Running".into(),
            ..with(
                bound_pod("run", "GPU-a,NVIDIA,500,5:;"),
                keys::VGPU_DEVICES_TO_ALLOCATE,
                ";",
            )
        };
        let finished = PodView {
            phase: "Succeeded".into(),
            ..running.clone()
        };
        let failed = with(running.clone(), keys::BIND_PHASE, "failed");
        let broken = with(
            bound_pod("broken", ";"),
            keys::VGPU_DEVICES_ALLOCATED,
            "GPU-a,NVIDIA:;",
        );
        let (holdings, errors) = rebuild_holdings(
            NODE,
            &[
                mid,
                running,
                finished,
                failed,
                broken,
                bound_pod("new", "GPU-a,NVIDIA,1,1:;"),
            ],
        );
        let got: Vec<(&str, &str, usize, u32)> = holdings
            .iter()
            .map(|h| {
                (
                    h.uuid.as_str(),
                    h.key.pod_uid.as_str(),
                    h.key.container,
                    h.slice.memory_mib,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![("GPU-a", "uid-mid", 0, 1000), ("GPU-a", "uid-run", 0, 500)]
        );
        assert_eq!(errors.len(), 1);
        assert!(errors[0].to_string().contains("ns/broken"), "{}", errors[0]);
    }

    #[test]
    fn physical_uuid_strips_the_replica_suffix() {
        assert_eq!(
            physical_uuid("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448-7"),
            "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
        );
        assert_eq!(
            physical_uuid("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"),
            "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
        );
        assert_eq!(
            device_ids("GPU-a", 3).collect::<Vec<_>>(),
            ["GPU-a-0", "GPU-a-1", "GPU-a-2"]
        );
    }

    #[test]
    fn preferred_ids_land_on_the_chosen_gpus() {
        let available: Vec<String> = ["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-1", "GPU-c-0"]
            .map(String::from)
            .to_vec();
        let chosen = ["GPU-b".to_owned(), "GPU-c".to_owned()];
        assert_eq!(
            prefer_devices(&chosen, &available, &[], 2),
            ["GPU-b-0", "GPU-c-0"]
        );
        assert_eq!(
            prefer_devices(&chosen[..1], &available, &["GPU-a-1".to_owned()], 2),
            ["GPU-a-1", "GPU-b-0"]
        );
        assert_eq!(
            prefer_devices(&[], &available, &[], 3),
            ["GPU-a-0", "GPU-b-0", "GPU-c-0"]
        );
        assert_eq!(
            prefer_devices(&[], &available[..2], &[], 2),
            ["GPU-a-0", "GPU-a-1"]
        );
    }
}
