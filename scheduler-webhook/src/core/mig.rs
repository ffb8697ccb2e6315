//! MIG: which GPU instance a container gets on a GPU in `mig` mode, and
//! which memory slices of each MIG GPU are taken.
//!
//! HAMi v2.10's rule (`pkg/device/nvidia/device.go` `selectMigCandidate`,
//! `mig_topology.go`): the profiles the GPU offers (its register
//! `migProfiles`) are tried from the smallest memory up (then the fewest
//! compute slices); the first profile that holds the requested memory and
//! has a placement overlapping no live instance wins. Placements of `1g.*`
//! and `3g.*` profiles are tried from the highest start down, the others
//! from the lowest up, which keeps the low slices free for the big
//! profiles. The container is then charged the profile's memory and
//! compute, not what it asked (an 8000 MiB request on an A100-40GB takes a
//! `2g.10gb`: 10240 MiB and 28 % of the cores).
//!
//! The choice itself ([`choose`]) lives in [`proto::hami::mig`], since
//! the node-daemon makes the same choice for a pod the scheduler gave no
//! placement; this module applies it to the model's nodes and pods.
//!
//! Occupancy is a bit mask of memory slices per GPU (bit `i` = slice `i`),
//! kept in [`crate::core::model::Node::mig_slices`] and per pod in
//! [`crate::core::model::PodUsage::mig`]; two placements overlap exactly
//! when their masks intersect.
//!
//! Not here: creating instances (the node-daemon does), and HAMi's
//! `migProfileAllowlist` and `nvidia.com/mig-profile-preference` (not
//! supported yet: every profile the node reports may be used).

use proto::hami::mig::{MigAllocation, MigProfile};
pub use proto::hami::mig::{MigChoice, choose};
use proto::hami::register::MODE_MIG;

use crate::core::model::{Gpu, Node};

/// Whether a GPU hands out MIG instances rather than HAMi-core slices.
#[must_use]
pub fn is_mig(gpu: &Gpu) -> bool {
    &*gpu.mode == MODE_MIG
}

/// The slot count a MIG GPU offers: the largest number of instances of one
/// profile (HAMi registers `count` so).
#[must_use]
pub fn slot_count(profiles: &[MigProfile]) -> u32 {
    profiles
        .iter()
        .map(MigProfile::instance_count)
        .max()
        .unwrap_or(0)
}

/// One device entry of a pod, as [`place_entries`] and [`place_given`]
/// take it: `(container index, device index, GPU position, memory MiB)`.
pub type Entry = (usize, usize, usize, u64);

/// Where one pod's MIG entries sit on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    /// The memory slices the pod holds per MIG GPU position.
    pub masks: Vec<(usize, u32)>,
    /// Each MIG entry's instance, in entry order (the
    /// `hami.io/vgpu-mig-allocations` value).
    pub instances: Vec<MigAllocation>,
}

impl Placed {
    fn hold(&mut self, pos: usize, mask: u32) {
        match self.masks.iter_mut().find(|(p, _)| *p == pos) {
            Some((_, m)) => *m |= mask,
            None => self.masks.push((pos, mask)),
        }
    }

    fn held(&self, pos: usize) -> u32 {
        self.masks
            .iter()
            .find(|(p, _)| *p == pos)
            .map_or(0, |(_, m)| *m)
    }
}

/// The instances one pod's device entries take on `node`, entry by entry
/// in order (each MIG entry gets its own instance, as HAMi's
/// `AddResourceUsage` commits them), with `base` the slices taken per GPU
/// position before the pod. Entries on non-MIG GPUs are skipped.
///
/// # Errors
/// The UUID of the first GPU where an entry found no free placement.
pub fn place_entries(
    node: &Node,
    base: &[u32],
    entries: impl IntoIterator<Item = Entry>,
) -> Result<Placed, String> {
    let mut placed = Placed::default();
    for (container, device, pos, mem) in entries {
        let Some(gpu) = node.gpus.get(pos) else {
            continue;
        };
        if !is_mig(gpu) {
            continue;
        }
        let taken = base.get(pos).copied().unwrap_or(0) | placed.held(pos);
        let Some(c) = choose(&gpu.mig, taken, mem) else {
            return Err(gpu.uuid.clone());
        };
        placed.hold(pos, c.mask);
        placed.instances.push(allocation(container, device, gpu, c));
    }
    Ok(placed)
}

fn allocation(container: usize, device: usize, gpu: &Gpu, c: MigChoice) -> MigAllocation {
    MigAllocation {
        container_index: u32::try_from(container).unwrap_or(u32::MAX),
        device_index: u32::try_from(device).unwrap_or(u32::MAX),
        gpu_uuid: gpu.uuid.clone(),
        profile: gpu.mig[c.profile].name.clone(),
        placement: c.placement,
        runtime: None,
    }
}

/// The instances `given` (a pod's `hami.io/vgpu-mig-allocations`) name for
/// its MIG entries on `node`, when they name one for every MIG entry, on
/// that entry's GPU, of a profile the GPU offers, at one of that profile's
/// placements, and no two of the pod's own instances overlap; `None`
/// otherwise (the caller then derives them with [`place_entries`]). Other
/// pods' slices are not consulted: an allocation is a fact. Runtime
/// identities in `given` are kept.
#[must_use]
pub fn place_given(
    node: &Node,
    given: &[MigAllocation],
    entries: impl IntoIterator<Item = Entry>,
) -> Option<Placed> {
    let mut placed = Placed::default();
    for (container, device, pos, _) in entries {
        let gpu = node.gpus.get(pos)?;
        if !is_mig(gpu) {
            continue;
        }
        let a = given.iter().find(|a| {
            usize::try_from(a.container_index).ok() == Some(container)
                && usize::try_from(a.device_index).ok() == Some(device)
        })?;
        let offered = gpu
            .mig
            .iter()
            .find(|p| p.name == a.profile)
            .is_some_and(|p| p.placements.contains(&a.placement));
        if a.gpu_uuid != gpu.uuid || !offered {
            return None;
        }
        let mask = a.placement.mask()?;
        if placed.held(pos) & mask != 0 {
            return None;
        }
        placed.hold(pos, mask);
        placed.instances.push(a.clone());
    }
    Some(placed)
}

#[cfg(test)]
mod tests {
    use proto::hami::mig::{MigPlacement, known_profiles};

    use super::*;
    use crate::core::model::testutil::mk_mig_node;

    fn a100() -> Vec<MigProfile> {
        known_profiles("NVIDIA A100-SXM4-40GB").unwrap()
    }

    #[test]
    fn seven_1g_instances_fill_an_a100_then_nothing_fits() {
        let p = a100();
        let mut taken = 0;
        for _ in 0..7 {
            let c = choose(&p, taken, 1).unwrap();
            assert_eq!(p[c.profile].name, "1g.5gb");
            taken |= c.mask;
        }
        assert_eq!(choose(&p, taken, 1), None);
        assert_eq!(slot_count(&p), 7);
    }

    #[test]
    fn entries_of_one_pod_take_distinct_instances() {
        let n = mk_mig_node("m", 1);
        let placed = place_entries(
            &n,
            &[0],
            [(0, 0, 0, 10240), (1, 0, 0, 10240), (2, 0, 0, 10240)],
        )
        .unwrap();
        assert_eq!(placed.masks, vec![(0, 0b0011_1111)]);
        let at: Vec<(u32, &str, u32)> = placed
            .instances
            .iter()
            .map(|a| (a.container_index, a.profile.as_str(), a.placement.start))
            .collect();
        assert_eq!(
            at,
            [(0, "2g.10gb", 0), (1, "2g.10gb", 2), (2, "2g.10gb", 4)]
        );
        assert_eq!(
            place_entries(&n, &[0], [(0, 0, 0, 20480), (0, 1, 0, 20480), (0, 2, 0, 1)]),
            Err("GPU-m-0".to_owned())
        );
    }

    fn given(c: u32, d: u32, gpu: &str, profile: &str, start: u32, size: u32) -> MigAllocation {
        MigAllocation {
            container_index: c,
            device_index: d,
            gpu_uuid: gpu.into(),
            profile: profile.into(),
            placement: MigPlacement { start, size },
            runtime: None,
        }
    }

    #[test]
    fn given_instances_are_taken_only_when_valid_for_every_mig_entry() {
        let n = mk_mig_node("m", 1);
        let two = [(0, 0, 0, 8000), (1, 0, 0, 3000)];
        let ok = [
            given(0, 0, "GPU-m-0", "2g.10gb", 4, 2),
            given(1, 0, "GPU-m-0", "1g.5gb", 0, 1),
        ];
        let placed = place_given(&n, &ok, two).unwrap();
        assert_eq!(placed.masks, vec![(0, 0b0011_0001)]);
        assert_eq!(placed.instances, ok);
        // An entry without its instance, on another GPU, of a profile the
        // GPU does not offer, at a placement the profile does not have, or
        // overlapping the pod's own other instance: not believed.
        assert_eq!(place_given(&n, &ok[..1], two), None);
        for bad in [
            given(1, 0, "GPU-other", "1g.5gb", 0, 1),
            given(1, 0, "GPU-m-0", "4g.20gb", 0, 4),
            given(1, 0, "GPU-m-0", "2g.10gb", 1, 2),
            given(1, 0, "GPU-m-0", "1g.5gb", 5, 1),
        ] {
            let mixed = [ok[0].clone(), bad.clone()];
            assert_eq!(place_given(&n, &mixed, two), None, "{bad:?}");
        }
    }

    // === fit and ledger, end to end on one A100-40GB in mig mode ===

    use proto::hami::pod_devices::{ContainerDevice, PodDevices};

    use crate::core::fit::{Reason, fit_pod};
    use crate::core::model::Cluster;
    use crate::core::request::{DeviceRequest, MemoryRequest, PodRequest};
    use crate::core::reservation::HostResources;

    fn ask(mem: &[u64]) -> PodRequest {
        PodRequest {
            app: mem
                .iter()
                .map(|&m| {
                    Some(DeviceRequest {
                        nums: 1,
                        memory: MemoryRequest::Mib(m),
                        cores: 0,
                    })
                })
                .collect(),
            ..PodRequest::default()
        }
    }

    /// Fits `mem` on node 0 and reserves it for `uid`; the devices written.
    fn place(c: &mut Cluster, uid: &str, mem: &[u64]) -> Result<PodDevices, String> {
        let node = c.node(0).unwrap();
        let picks = fit_pod(node, &ask(mem), &[0]).map_err(|f| f.to_string())?;
        let devices = PodDevices(
            picks
                .app
                .iter()
                .map(|ps| {
                    ps.iter()
                        .map(|p| ContainerDevice {
                            uuid: node.gpus[p.gpu].uuid.clone(),
                            vendor: "NVIDIA".into(),
                            usedmem: i32::try_from(p.usedmem).unwrap(),
                            usedcores: i32::try_from(p.usedcores).unwrap(),
                        })
                        .collect()
                })
                .collect(),
        );
        c.reserve(uid, 0, &devices, 0, HostResources::default())
            .map_err(|e| e.to_string())?;
        Ok(devices)
    }

    #[test]
    fn a_memory_request_is_charged_its_profile() {
        let mut c = Cluster::new(vec![mk_mig_node("m", 1)]);
        let d = place(&mut c, "p1", &[8000]).unwrap();
        assert_eq!((d.0[0][0].usedmem, d.0[0][0].usedcores), (10240, 28));
        assert_eq!(c.node(0).unwrap().mig_slices[0], 0b0000_0011);
        assert_eq!(c.node(0).unwrap().usage[0].usedmem, 10240);
    }

    #[test]
    fn a_full_layout_refuses_with_mig_topology_infeasible_and_release_frees_it() {
        let mut c = Cluster::new(vec![mk_mig_node("m", 1)]);
        for uid in ["a", "b", "c"] {
            place(&mut c, uid, &[8000]).unwrap();
        }
        let why = place(&mut c, "d", &[8000]).unwrap_err();
        assert_eq!(
            why,
            format!("1/1 {}", Reason::CardMigTopologyInfeasible.as_str())
        );
        // A 1g still fits beside three 2g (slice 6).
        assert_eq!(place(&mut c, "e", &[3000]).unwrap().0[0][0].usedmem, 5120);
        assert!(c.release("b"));
        assert_eq!(c.node(0).unwrap().mig_slices[0], 0b0111_0011);
        assert_eq!(place(&mut c, "d", &[8000]).unwrap().0[0][0].usedmem, 10240);
    }

    #[test]
    fn topology_aware_checks_mig_placements_as_the_default_walk_does() {
        let mut c = Cluster::new(vec![mk_mig_node("m", 1)]);
        for uid in ["a", "b", "c"] {
            place(&mut c, uid, &[8000]).unwrap();
        }
        let node = c.node(0).unwrap();
        let topology = |mem| {
            let mut req = ask(&[mem]);
            req.constraints.topology = true;
            req
        };
        // 10,240 MiB are free, but no 2g placement is.
        let why = fit_pod(node, &topology(8000), &[0]).unwrap_err();
        assert_eq!(
            why.to_string(),
            format!("1/1 {}", Reason::CardMigTopologyInfeasible.as_str())
        );
        // A 1g fits, charged its profile.
        let picks = fit_pod(node, &topology(3000), &[0]).unwrap();
        assert_eq!(
            (picks.app[0][0].usedmem, picks.app[0][0].usedcores),
            (5120, 14)
        );
    }

    #[test]
    fn app_containers_of_one_pod_take_separate_instances() {
        let mut c = Cluster::new(vec![mk_mig_node("m", 1)]);
        let d = place(&mut c, "p", &[20000, 20000]).unwrap();
        assert_eq!(d.0.len(), 2);
        assert_eq!(c.node(0).unwrap().mig_slices[0], 0xff);
        assert!(place(&mut c, "q", &[1]).is_err());
        // A third 3g in the same pod has no room.
        let mut c = Cluster::new(vec![mk_mig_node("m", 1)]);
        assert!(place(&mut c, "p", &[20000, 20000, 20000]).is_err());
    }

    #[test]
    fn re_reserving_a_pod_does_not_count_its_own_instances() {
        let mut c = Cluster::new(vec![mk_mig_node("m", 1)]);
        let d = place(&mut c, "p", &[30000]).unwrap();
        c.reserve("p", 0, &d, 0, HostResources::default()).unwrap();
        assert_eq!(c.node(0).unwrap().mig_slices[0], 0xff);
    }

    #[test]
    fn a_legacy_suffixed_allocation_is_observed_on_its_gpu() {
        let mut c = Cluster::new(vec![mk_mig_node("m", 1)]);
        let d = PodDevices(vec![vec![ContainerDevice {
            uuid: "GPU-m-0[1-0]".into(),
            vendor: "NVIDIA".into(),
            usedmem: 10240,
            usedcores: 0,
        }]]);
        c.observe_allocated("old", 0, &d, 0, HostResources::default(), &[])
            .unwrap();
        assert_eq!(c.node(0).unwrap().usage[0].used, 1);
        assert_eq!(c.node(0).unwrap().mig_slices[0], 0b11);
    }

    #[test]
    fn a_gpu_not_in_mig_mode_is_unaffected() {
        let mut c = Cluster::new(vec![crate::core::model::testutil::mk_node(
            "t", 1, 10, 16000,
        )]);
        let d = place(&mut c, "p", &[8000]).unwrap();
        assert_eq!(d.0[0][0].usedmem, 8000);
        assert_eq!(c.node(0).unwrap().mig_slices[0], 0);
    }
}
