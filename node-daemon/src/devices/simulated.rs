//! Simulated GPUs for machines without one: described in the config
//! (`simulatedGpus` × `simulatedGpuModel`/`simulatedGpuMemoryMib`, or the
//! heterogeneous `simulatedGpuList`), with UUIDs derived from the node name
//! and index so a restarted daemon reports the same GPUs, a
//! [`HealthSwitch`] through which tests flip a GPU's health, and a
//! [`UsageBoard`] through which they set what a GPU reports as used (a
//! simulated GPU runs nothing: 0 bytes and 0 % until set).

use futures::StreamExt as _;
use futures::stream::BoxStream;
use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};

use super::topology::{Link, PairLinks};
use super::{DeviceError, DeviceSource, HealthEvent, HostUsage, ReportedGpu};
use crate::settings::{Settings, SimulatedGpu};

/// Simulated GPUs of one node.
#[derive(Debug, Clone)]
pub struct SimulatedDevices {
    gpus: Vec<ReportedGpu>,
    /// Each GPU's NVLink group, in `gpus`' order.
    topology: Vec<NvlinkGroup>,
    switch: HealthSwitch,
    board: UsageBoard,
}

/// A simulated GPU's NVLinks: joined to every GPU of the same group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NvlinkGroup {
    group: Option<u32>,
    links: u32,
}

/// Sets what simulated GPUs report as used; clones share the same GPUs.
#[derive(Debug, Clone)]
pub struct UsageBoard {
    usage: Arc<watch::Sender<BTreeMap<String, HostUsage>>>,
}

impl UsageBoard {
    /// From now on `usage.uuid` reports `usage`.
    pub fn set(&self, usage: HostUsage) {
        self.usage.send_modify(|all| {
            all.insert(usage.uuid.clone(), usage);
        });
    }
}

/// Flips the health of simulated GPUs; clones share the same GPUs.
#[derive(Debug, Clone)]
pub struct HealthSwitch {
    events: broadcast::Sender<HealthEvent>,
}

impl HealthSwitch {
    /// Reports `uuid` as healthy or not to every health watcher; returns
    /// whether anyone was watching.
    pub fn set(&self, uuid: &str, healthy: bool) -> bool {
        self.events
            .send(HealthEvent {
                uuid: uuid.to_owned(),
                healthy,
            })
            .is_ok()
    }
}

/// A UUID in NVIDIA's shape, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`,
/// derived from the node name and the GPU index (FNV-1a then SplitMix64).
#[must_use]
pub fn simulated_uuid(node: &str, index: u32) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain([b'/']).chain(index.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b) = (mix(h), mix(h ^ 0x5851_f42d_4c95_7f2d));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

impl SimulatedDevices {
    /// The GPUs the settings describe for `node`: `simulatedGpuList` when
    /// non-empty, otherwise `simulatedGpus` identical ones.
    #[must_use]
    pub fn from_settings(settings: &Settings, node: &str) -> Self {
        let list: Vec<SimulatedGpu> = if settings.simulated_gpu_list.is_empty() {
            let one = SimulatedGpu {
                model: settings.simulated_gpu_model.clone(),
                memory_mib: settings.simulated_gpu_memory_mib,
                numa: 0,
                nvlink_group: None,
                nvlinks: crate::settings::DEFAULT_SIMULATED_NVLINKS,
            };
            vec![one; settings.simulated_gpus as usize]
        } else {
            settings.simulated_gpu_list.clone()
        };
        Self::new(node, &list)
    }

    /// GPUs `list[i]` at index `i` of `node`.
    #[must_use]
    pub fn new(node: &str, list: &[SimulatedGpu]) -> Self {
        let gpus = (0u32..)
            .zip(list)
            .map(|(index, g)| ReportedGpu {
                uuid: simulated_uuid(node, index),
                index,
                model: g.model.clone(),
                memory_mib: Some(u64::from(g.memory_mib)),
                numa: i64::from(g.numa),
            })
            .collect();
        let topology = list
            .iter()
            .map(|g| NvlinkGroup {
                group: g.nvlink_group,
                links: g.nvlinks,
            })
            .collect();
        let (events, _) = broadcast::channel(64);
        Self {
            gpus,
            topology,
            switch: HealthSwitch { events },
            board: UsageBoard {
                usage: Arc::new(watch::Sender::new(BTreeMap::new())),
            },
        }
    }

    /// The board that sets these GPUs' usage.
    #[must_use]
    pub fn usage_board(&self) -> UsageBoard {
        self.board.clone()
    }

    /// The switch that flips these GPUs' health.
    #[must_use]
    pub fn health_switch(&self) -> HealthSwitch {
        self.switch.clone()
    }
}

impl DeviceSource for SimulatedDevices {
    fn discover(&self) -> Result<Vec<ReportedGpu>, DeviceError> {
        Ok(self.gpus.clone())
    }

    /// Same NUMA node: [`Link::SameCpu`], else [`Link::CrossCpu`]; two GPUs
    /// of one `nvlinkGroup` are also joined by `nvlinks` NVLinks.
    fn links(&self) -> Result<PairLinks, DeviceError> {
        let mut links = PairLinks::new();
        for (a, (ga, la)) in self.gpus.iter().zip(&self.topology).enumerate() {
            for (b, (gb, lb)) in self.gpus.iter().zip(&self.topology).enumerate() {
                if a == b {
                    continue;
                }
                let mut pair = vec![if ga.numa == gb.numa {
                    Link::SameCpu
                } else {
                    Link::CrossCpu
                }];
                if la.group.is_some() && la.group == lb.group {
                    pair.push(Link::NvLink(la.links.min(lb.links)));
                }
                links.insert((ga.uuid.clone(), gb.uuid.clone()), pair);
            }
        }
        Ok(links)
    }

    fn usage(&self) -> Result<Vec<HostUsage>, DeviceError> {
        let set = self.board.usage.borrow();
        Ok(self
            .gpus
            .iter()
            .map(|g| {
                set.get(&g.uuid).cloned().unwrap_or_else(|| HostUsage {
                    uuid: g.uuid.clone(),
                    memory_used_bytes: Some(0),
                    gpu_utilization: Some(0),
                    memory_utilization: Some(0),
                    temperature_celsius: None,
                    power_watts: None,
                })
            })
            .collect())
    }

    fn health_events(&self) -> Result<BoxStream<'static, HealthEvent>, DeviceError> {
        let rx = self.switch.events.subscribe();
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(event) => return Some((event, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_deterministic_distinct_and_nvidia_shaped() {
        let a = simulated_uuid("node-a", 0);
        assert_eq!(a, simulated_uuid("node-a", 0));
        assert_ne!(a, simulated_uuid("node-a", 1));
        assert_ne!(a, simulated_uuid("node-b", 0));
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, vec![3, 8, 4, 4, 4, 12], "{a}");
        assert!(a.starts_with("GPU-"));
        assert!(
            a[4..]
                .bytes()
                .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn identical_gpus_from_count_and_heterogeneous_from_list() {
        let s = Settings {
            simulated_gpus: 3,
            simulated_gpu_model: "Tesla T4".into(),
            simulated_gpu_memory_mib: 15_360,
            ..Settings::default()
        };
        let gpus = SimulatedDevices::from_settings(&s, "n").discover().unwrap();
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus[2].index, 2);
        assert_eq!(gpus[2].memory_mib, Some(15_360));
        let s = Settings {
            simulated_gpu_list: vec![SimulatedGpu {
                model: "NVIDIA A10".into(),
                memory_mib: 23_028,
                numa: 1,
                nvlink_group: None,
                nvlinks: crate::settings::DEFAULT_SIMULATED_NVLINKS,
            }],
            ..s
        };
        let gpus = SimulatedDevices::from_settings(&s, "n").discover().unwrap();
        assert_eq!(gpus.len(), 1);
        assert_eq!((gpus[0].model.as_str(), gpus[0].numa), ("NVIDIA A10", 1));
    }

    #[test]
    fn usage_is_idle_until_the_board_sets_it() {
        let src = SimulatedDevices::new(
            "n",
            &[SimulatedGpu {
                model: "A".into(),
                memory_mib: 1,
                numa: 0,
                nvlink_group: None,
                nvlinks: crate::settings::DEFAULT_SIMULATED_NVLINKS,
            }],
        );
        let uuid = src.discover().unwrap()[0].uuid.clone();
        let idle = src.usage().unwrap();
        assert_eq!(idle[0].memory_used_bytes, Some(0));
        assert_eq!(idle[0].temperature_celsius, None);
        let busy = HostUsage {
            uuid: uuid.clone(),
            memory_used_bytes: Some(5 << 30),
            gpu_utilization: Some(70),
            ..HostUsage::default()
        };
        src.clone().usage_board().set(busy.clone());
        assert_eq!(src.usage().unwrap(), vec![busy]);
    }

    #[tokio::test]
    async fn health_switch_reaches_every_watcher() {
        let src = SimulatedDevices::new(
            "n",
            &[SimulatedGpu {
                model: "A".into(),
                memory_mib: 1,
                numa: 0,
                nvlink_group: None,
                nvlinks: crate::settings::DEFAULT_SIMULATED_NVLINKS,
            }],
        );
        let uuid = src.discover().unwrap()[0].uuid.clone();
        let switch = src.health_switch();
        assert!(!switch.set(&uuid, false), "nobody watches yet");
        let mut first = src.health_events().unwrap();
        let mut second = src.health_events().unwrap();
        assert!(switch.set(&uuid, false));
        let expected = HealthEvent {
            uuid,
            healthy: false,
        };
        assert_eq!(first.next().await, Some(expected.clone()));
        assert_eq!(second.next().await, Some(expected));
    }
}
