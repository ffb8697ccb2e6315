//! Follows every pod the soak submitted from what the API server lists, and
//! says when one ran, failed, vanished or got stuck. Pure: time and the
//! lists are passed in.
//!
//! **Stuck**, precisely: a pod that is neither Running nor finished, not
//! deleted by the soak, and whose progress state — `(phase, hami.io/bind-phase,
//! spec.nodeName)` — has not changed for `stuck_after` (60 s) while a
//! fault-free cluster could have moved it on:
//! - a **bound** pod always could (the kubelet admits it, node-daemon
//!   allocates): stuck once its state is that old;
//! - an **unbound** pod could if it fits: one node has `gpus` healthy GPUs
//!   each with a free slot, `mem` MiB and `cores` % free, by the
//!   independent checker's reading of the register and pod annotations
//!   ([`crate::checker::gpu_use`]). It is stuck once it has fitted at
//!   every observation for `stuck_after` and its state is that old. A
//!   pod that waits because the cluster is full is not stuck.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::checker::GpuUse;
use crate::harness::bound_node;

const BIND_PHASE: &str = "hami.io/bind-phase";

/// What a soak pod asks for: `gpus` GPUs, each `mem_mib` and `cores` %.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// `nvidia.com/gpu`.
    pub gpus: u32,
    /// `nvidia.com/gpumem` per GPU, MiB.
    pub mem_mib: u64,
    /// `nvidia.com/gpucores` per GPU, %.
    pub cores: u64,
}

impl Request {
    /// Whether one node has `gpus` healthy GPUs each with room for it.
    #[must_use]
    pub fn fits(&self, gpus: &[GpuUse]) -> bool {
        let mut per_node: BTreeMap<&str, u32> = BTreeMap::new();
        for g in gpus {
            let (slots, mem, cores) = g.capacity;
            let (used_slots, used_mem, used_cores) = g.used;
            if g.healthy
                && used_slots < slots
                && mem.saturating_sub(used_mem) >= self.mem_mib
                && cores.saturating_sub(used_cores) >= self.cores
            {
                *per_node.entry(g.node.as_str()).or_default() += 1;
            }
        }
        per_node.values().any(|&n| n >= self.gpus)
    }
}

/// A pod's progress state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct State {
    phase: String,
    bind_phase: String,
    node: String,
}

impl State {
    fn of(pod: &Pod) -> Self {
        Self {
            phase: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            bind_phase: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(BIND_PHASE).cloned())
                .unwrap_or_default(),
            node: bound_node(pod).unwrap_or_default().to_owned(),
        }
    }

    fn settled(&self) -> bool {
        matches!(self.phase.as_str(), "Running" | "Succeeded" | "Failed")
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or = |s: &str| {
            if s.is_empty() {
                "-".to_owned()
            } else {
                s.to_owned()
            }
        };
        write!(
            f,
            "phase {}, bind-phase {}, node {}",
            or(&self.phase),
            or(&self.bind_phase),
            or(&self.node)
        )
    }
}

#[derive(Debug)]
struct Tracked {
    request: Request,
    state: State,
    changed_at: Instant,
    fits_since: Option<Instant>,
    ran: bool,
    stuck: bool,
}

/// Something the tracker saw happen to a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// It reached Running (once per pod).
    Ran(String),
    /// It failed: `(pod, reason, message)`. The tracker forgets it.
    Failed(String, String, String),
    /// It got stuck (once per pod): `(pod, description)`.
    Stuck(String, String),
    /// It vanished without the soak deleting it. The tracker forgets it.
    Lost(String),
}

/// The soak's pods and their progress.
#[derive(Debug)]
pub struct Tracker {
    pods: BTreeMap<String, Tracked>,
    stuck_after: Duration,
}

impl Tracker {
    /// No pods yet; a pod is stuck after `stuck_after` without progress.
    #[must_use]
    pub fn new(stuck_after: Duration) -> Self {
        Self {
            pods: BTreeMap::new(),
            stuck_after,
        }
    }

    /// The soak created pod `name` asking for `request`.
    pub fn submitted(&mut self, name: &str, request: Request, now: Instant) {
        self.pods.insert(
            name.to_owned(),
            Tracked {
                request,
                state: State::default(),
                changed_at: now,
                fits_since: None,
                ran: false,
                stuck: false,
            },
        );
    }

    /// The soak deleted pod `name`: it is no longer followed.
    pub fn deleted(&mut self, name: &str) {
        self.pods.remove(name);
    }

    /// Pods followed (submitted, neither deleted, failed nor lost).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    /// How many pods are followed.
    #[must_use]
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is followed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Takes in a list of the pods at `now` and the GPUs' use read from the
    /// same list.
    pub fn observe(&mut self, now: Instant, pods: &[Pod], gpus: &[GpuUse]) -> Vec<Seen> {
        let listed: BTreeMap<&str, &Pod> = pods
            .iter()
            .filter_map(|p| Some((p.metadata.name.as_deref()?, p)))
            .collect();
        let mut seen = Vec::new();
        let mut forget = Vec::new();
        for (name, t) in &mut self.pods {
            let Some(pod) = listed.get(name.as_str()) else {
                seen.push(Seen::Lost(name.clone()));
                forget.push(name.clone());
                continue;
            };
            let state = State::of(pod);
            if state != t.state {
                t.state = state;
                t.changed_at = now;
            }
            match t.state.phase.as_str() {
                "Running" if !t.ran => {
                    t.ran = true;
                    seen.push(Seen::Ran(name.clone()));
                }
                "Failed" => {
                    let status = pod.status.as_ref();
                    let reason = status.and_then(|s| s.reason.clone()).unwrap_or_default();
                    let message = status.and_then(|s| s.message.clone()).unwrap_or_default();
                    seen.push(Seen::Failed(name.clone(), reason, message));
                    forget.push(name.clone());
                    continue;
                }
                _ => {}
            }
            let could_progress = if t.state.settled() {
                false
            } else if t.state.node.is_empty() {
                if t.request.fits(gpus) {
                    t.fits_since.get_or_insert(now);
                    true
                } else {
                    t.fits_since = None;
                    false
                }
            } else {
                t.fits_since = None;
                true
            };
            let since = t.fits_since.map_or(t.changed_at, |f| f.max(t.changed_at));
            if could_progress && !t.stuck && now.duration_since(since) >= self.stuck_after {
                t.stuck = true;
                let why = if t.state.node.is_empty() {
                    "unbound although it fitted"
                } else {
                    "bound but not running"
                };
                seen.push(Seen::Stuck(
                    name.clone(),
                    format!(
                        "{why}; {} for {:.0} s; asks {} GPU × {} MiB, {} %",
                        t.state,
                        now.duration_since(since).as_secs_f64(),
                        t.request.gpus,
                        t.request.mem_mib,
                        t.request.cores
                    ),
                ));
            }
        }
        for name in forget {
            self.pods.remove(&name);
        }
        seen
    }

    /// Pods a fault-free cluster would still move on (bound and not
    /// running, or unbound and fitting), with their state: empty once the
    /// cluster has settled.
    #[must_use]
    pub fn unsettled(&self, gpus: &[GpuUse]) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, t)| {
                !t.state.settled() && (!t.state.node.is_empty() || t.request.fits(gpus))
            })
            .map(|(name, t)| format!("{name}: {}", t.state))
            .collect()
    }

    /// How many followed pods are Running, and how many wait unbound.
    #[must_use]
    pub fn counts(&self) -> (usize, usize) {
        let running = self
            .pods
            .values()
            .filter(|t| t.state.phase == "Running")
            .count();
        let unbound = self
            .pods
            .values()
            .filter(|t| !t.state.settled() && t.state.node.is_empty())
            .count();
        (running, unbound)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const ONE: Request = Request {
        gpus: 1,
        mem_mib: 4096,
        cores: 20,
    };

    fn pod(name: &str, node: Option<&str>, phase: &str, bind_phase: Option<&str>) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(b) = bind_phase {
            annotations.insert(BIND_PHASE.into(), b.into());
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn gpu(node: &str, healthy: bool, used_mem: u64) -> GpuUse {
        GpuUse {
            node: node.into(),
            uuid: format!("GPU-{node}"),
            healthy,
            capacity: (10, 40960, 100),
            used: (1, used_mem, 10),
        }
    }

    fn at(start: Instant, secs: u64) -> Instant {
        start + Duration::from_secs(secs)
    }

    #[test]
    fn fit_needs_enough_healthy_gpus_with_room_on_one_node() {
        let two = Request { gpus: 2, ..ONE };
        assert!(ONE.fits(&[gpu("a", true, 0)]));
        assert!(!ONE.fits(&[gpu("a", false, 0)]), "unhealthy");
        assert!(!ONE.fits(&[gpu("a", true, 40000)]), "memory");
        assert!(
            !two.fits(&[gpu("a", true, 0), gpu("b", true, 0)]),
            "two nodes"
        );
        let mut second = gpu("a", true, 0);
        second.uuid = "GPU-a2".into();
        assert!(two.fits(&[gpu("a", true, 0), second]));
    }

    #[test]
    fn a_bound_pod_without_progress_for_a_minute_is_stuck_once() {
        let t0 = Instant::now();
        let mut tracker = Tracker::new(Duration::from_secs(60));
        tracker.submitted("p", ONE, t0);
        let bound = [pod("p", Some("n"), "Pending", Some("allocating"))];
        assert!(tracker.observe(at(t0, 1), &bound, &[]).is_empty());
        assert!(tracker.observe(at(t0, 60), &bound, &[]).is_empty());
        let seen = tracker.observe(at(t0, 61), &bound, &[]);
        assert!(
            matches!(&seen[..], [Seen::Stuck(p, why)] if p == "p" && why.starts_with("bound but not running")),
            "{seen:?}"
        );
        assert!(tracker.observe(at(t0, 200), &bound, &[]).is_empty(), "once");
    }

    #[test]
    fn progress_resets_the_clock_and_running_pods_are_never_stuck() {
        let t0 = Instant::now();
        let mut tracker = Tracker::new(Duration::from_secs(60));
        tracker.submitted("p", ONE, t0);
        tracker.observe(
            at(t0, 1),
            &[pod("p", Some("n"), "Pending", Some("allocating"))],
            &[],
        );
        tracker.observe(
            at(t0, 50),
            &[pod("p", Some("n"), "Pending", Some("success"))],
            &[],
        );
        assert!(
            tracker
                .observe(
                    at(t0, 100),
                    &[pod("p", Some("n"), "Pending", Some("success"))],
                    &[]
                )
                .is_empty()
        );
        let running = [pod("p", Some("n"), "Running", Some("success"))];
        assert_eq!(
            tracker.observe(at(t0, 101), &running, &[]),
            [Seen::Ran("p".into())]
        );
        assert!(tracker.observe(at(t0, 1000), &running, &[]).is_empty());
    }

    #[test]
    fn an_unbound_pod_is_stuck_only_after_fitting_for_a_minute() {
        let t0 = Instant::now();
        let mut tracker = Tracker::new(Duration::from_secs(60));
        tracker.submitted("p", ONE, t0);
        let pending = [pod("p", None, "Pending", None)];
        let (full, free) = ([gpu("a", true, 40000)], [gpu("a", true, 0)]);
        // Waiting while the cluster is full is not stuck, however long.
        assert!(tracker.observe(at(t0, 1), &pending, &full).is_empty());
        assert!(tracker.observe(at(t0, 300), &pending, &full).is_empty());
        // Room appears at 300 s: 60 s later it is stuck.
        assert!(tracker.observe(at(t0, 300), &pending, &free).is_empty());
        assert!(tracker.observe(at(t0, 359), &pending, &free).is_empty());
        let seen = tracker.observe(at(t0, 360), &pending, &free);
        assert!(
            matches!(&seen[..], [Seen::Stuck(_, why)] if why.starts_with("unbound although it fitted")),
            "{seen:?}"
        );
        assert_eq!(tracker.unsettled(&free).len(), 1);
        assert!(tracker.unsettled(&full).is_empty());
    }

    #[test]
    fn failed_and_vanished_pods_are_reported_and_forgotten() {
        let t0 = Instant::now();
        let mut tracker = Tracker::new(Duration::from_secs(60));
        tracker.submitted("f", ONE, t0);
        tracker.submitted("gone", ONE, t0);
        let mut failed = pod("f", Some("n"), "Failed", None);
        failed.status.as_mut().unwrap().reason = Some("UnexpectedAdmissionError".into());
        let seen = tracker.observe(at(t0, 1), &[failed], &[]);
        assert_eq!(
            seen,
            [
                Seen::Failed("f".into(), "UnexpectedAdmissionError".into(), String::new()),
                Seen::Lost("gone".into())
            ]
        );
        assert!(tracker.is_empty());
    }
}
