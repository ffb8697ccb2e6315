//! How the node's GPUs are linked, and the pair scores HAMi's
//! `topology-aware` policy reads from `hami.io/node-nvidia-score`.
//!
//! A source reports, for each ordered pair of GPUs, its [`Link`]s: the PCIe
//! path between them (NVML's common ancestor) and, when they have any, the
//! NVLinks joining them (directly, or through NVSwitches: then the fewer of
//! the two GPUs' switch links). [`pair_scores`] turns them into the
//! annotation's entries with HAMi's weights (its device plugin's
//! `calculate_score.go`): a cross-CPU path 10, same CPU 20, host bridge 30,
//! several PCIe switches 40, one switch 50, same board 60, plus 100 per
//! NVLink. Pure: no NVML, no clock.

use std::collections::BTreeMap;

use proto::hami::pair_score::DevicePairScore;

use super::Gpu;

/// One link between two GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// PCIe through the inter-CPU interconnect (NVML `SYSTEM`).
    CrossCpu,
    /// PCIe through one CPU's host bridges (NVML `NODE`).
    SameCpu,
    /// PCIe through one host bridge (NVML `HOSTBRIDGE`).
    HostBridge,
    /// PCIe through several switches, no host bridge (NVML `MULTIPLE`).
    MultiSwitch,
    /// PCIe through one switch (NVML `SINGLE`).
    SingleSwitch,
    /// Two GPUs on one board (NVML `INTERNAL`, e.g. a Tesla K80).
    SameBoard,
    /// This many NVLinks (direct, or the fewer switch links of the two).
    NvLink(u32),
}

impl Link {
    /// HAMi's weight of the link.
    #[must_use]
    pub fn score(self) -> i64 {
        match self {
            Self::CrossCpu => 10,
            Self::SameCpu => 20,
            Self::HostBridge => 30,
            Self::MultiSwitch => 40,
            Self::SingleSwitch => 50,
            Self::SameBoard => 60,
            Self::NvLink(n) => 100 * i64::from(n),
        }
    }
}

/// The links of each ordered pair of GPUs, by UUID (first to second).
pub type PairLinks = BTreeMap<(String, String), Vec<Link>>;

/// The pair scores of the advertised `gpus`, in their order: each GPU's
/// score against every other one is the sum of the weights of the links
/// between them, 0 for a pair without links or whose links the two ends
/// report differently (HAMi's plugin logs such a pair and scores it 0).
#[must_use]
pub fn pair_scores(gpus: &[Gpu], links: &PairLinks) -> Vec<DevicePairScore> {
    let between = |a: &str, b: &str| links.get(&(a.to_owned(), b.to_owned()));
    gpus.iter()
        .map(|gpu| DevicePairScore {
            uuid: gpu.uuid.clone(),
            score: gpus
                .iter()
                .filter(|peer| peer.uuid != gpu.uuid)
                .map(|peer| {
                    let there = between(&gpu.uuid, &peer.uuid);
                    let back = between(&peer.uuid, &gpu.uuid);
                    let score = match (there, back) {
                        (Some(there), Some(back)) if there.len() == back.len() => {
                            there.iter().map(|l| l.score()).sum()
                        }
                        _ => 0,
                    };
                    (peer.uuid.clone(), score)
                })
                .collect(),
        })
        .collect()
}

/// What NVML's `GetNvLinkRemotePciInfo`/`GetNvLinkRemoteDeviceType` say of
/// one active NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvLinkPeer {
    /// The link ends at the GPU with this PCI bus id.
    Gpu(String),
    /// The link ends at an NVSwitch.
    Switch,
}

/// The NVLink of the pair `(a, b)` from each end's active links, as HAMi's
/// plugin counts them: the links of `a` ending at `b`'s bus id; failing
/// any, when both GPUs reach NVSwitches, the fewer switch links of the two.
/// Bus ids compare without case.
#[must_use]
pub fn nvlink_between(a: &[NvLinkPeer], b: &[NvLinkPeer], b_bus_id: &str) -> Option<Link> {
    let direct = a
        .iter()
        .filter(|p| matches!(p, NvLinkPeer::Gpu(bus) if bus.eq_ignore_ascii_case(b_bus_id)))
        .count();
    let switch_links = |links: &[NvLinkPeer]| {
        links
            .iter()
            .filter(|p| matches!(p, NvLinkPeer::Switch))
            .count()
    };
    let count = if direct > 0 {
        direct
    } else {
        switch_links(a).min(switch_links(b))
    };
    u32::try_from(count)
        .ok()
        .filter(|n| *n > 0)
        .map(Link::NvLink)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, index: u32) -> Gpu {
        Gpu {
            uuid: uuid.into(),
            index,
            device_type: "NVIDIA A100-SXM4-40GB".into(),
            memory_mib: 40_960,
            cores: 100,
            split_count: 10,
            numa: 0,
            healthy: true,
            mig_profiles: Vec::new(),
        }
    }

    fn both(links: &mut PairLinks, a: &str, b: &str, l: &[Link]) {
        links.insert((a.into(), b.into()), l.to_vec());
        links.insert((b.into(), a.into()), l.to_vec());
    }

    #[test]
    fn a_pair_scores_the_sum_of_its_links_weights() {
        let gpus = [gpu("GPU-a", 0), gpu("GPU-b", 1), gpu("GPU-c", 2)];
        let mut links = PairLinks::new();
        both(
            &mut links,
            "GPU-a",
            "GPU-b",
            &[Link::SameCpu, Link::NvLink(4)],
        );
        both(&mut links, "GPU-a", "GPU-c", &[Link::CrossCpu]);
        both(&mut links, "GPU-b", "GPU-c", &[Link::SingleSwitch]);
        let scores = pair_scores(&gpus, &links);
        assert_eq!(scores.len(), 3);
        assert_eq!(scores[0].uuid, "GPU-a");
        assert_eq!(
            scores[0].score,
            BTreeMap::from([("GPU-b".into(), 420), ("GPU-c".into(), 10)])
        );
        assert_eq!(
            scores[2].score,
            BTreeMap::from([("GPU-a".into(), 10), ("GPU-b".into(), 50)])
        );
    }

    #[test]
    fn every_link_kind_has_hamis_weight() {
        let weights: Vec<i64> = [
            Link::CrossCpu,
            Link::SameCpu,
            Link::HostBridge,
            Link::MultiSwitch,
            Link::SingleSwitch,
            Link::SameBoard,
            Link::NvLink(1),
            Link::NvLink(12),
        ]
        .into_iter()
        .map(Link::score)
        .collect();
        assert_eq!(weights, [10, 20, 30, 40, 50, 60, 100, 1200]);
    }

    #[test]
    fn a_pair_without_links_or_with_lopsided_links_scores_0() {
        let gpus = [gpu("GPU-a", 0), gpu("GPU-b", 1), gpu("GPU-c", 2)];
        let mut links = PairLinks::new();
        links.insert(
            ("GPU-a".into(), "GPU-b".into()),
            vec![Link::SameCpu, Link::NvLink(2)],
        );
        links.insert(("GPU-b".into(), "GPU-a".into()), vec![Link::SameCpu]);
        let scores = pair_scores(&gpus, &links);
        assert_eq!(scores[0].score["GPU-b"], 0);
        assert_eq!(scores[0].score["GPU-c"], 0);
        assert_eq!(scores[1].score["GPU-a"], 0);
    }

    #[test]
    fn nvlinks_count_direct_links_first_then_the_fewer_switch_links() {
        let a = [
            NvLinkPeer::Gpu("00000000:07:00.0".into()),
            NvLinkPeer::Gpu("00000000:07:00.0".into()),
            NvLinkPeer::Gpu("00000000:0F:00.0".into()),
        ];
        assert_eq!(
            nvlink_between(&a, &[], "00000000:07:00.0"),
            Some(Link::NvLink(2))
        );
        assert_eq!(
            nvlink_between(&a, &[], "00000000:0f:00.0"),
            Some(Link::NvLink(1))
        );
        assert_eq!(nvlink_between(&a, &[], "00000000:47:00.0"), None);
        let twelve = vec![NvLinkPeer::Switch; 12];
        let ten = vec![NvLinkPeer::Switch; 10];
        assert_eq!(nvlink_between(&twelve, &ten, "x"), Some(Link::NvLink(10)));
        assert_eq!(nvlink_between(&twelve, &[], "x"), None);
    }
}
