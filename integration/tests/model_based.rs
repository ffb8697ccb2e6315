//! A model-based test of the scheduler's model and the node daemon's
//! ledgers together, driven by proptest: random interleavings of filter,
//! bind (success, failure, lock busy), Allocate (one container at a time,
//! as kubelet calls it), pod deletion, the watch delivering (or not yet
//! delivering) each change, the node's liveness release from a snapshot
//! taken earlier, relists, node re-registration and restarts of the
//! scheduler and of a node daemon.
//!
//! The API server is a map of pods and node locks; both sides run their
//! pure cores (`ClusterModel`; `identify_pod`, `plan_container`,
//! `SliceLedger`, `rebuild_holdings`) exactly as the services call them.
//! After every step:
//! - no GPU ledger on a node holds more memory, cores or slots than the GPU has;
//! - every slice a node holds belongs to a live pod bound to that node
//!   whose annotations give that container that GPU, and every container
//!   whose Allocate completed is held: no pod ever holds another's slice
//!   and none is freed while its pod lives;
//! - an Allocate is never answered with another pod's devices;
//! - the scheduler model reserves no GPU beyond its capacity, and its pod
//!   book agrees with its ledger (`ClusterModel::check`).
//!
//! At the end the cluster goes quiet (every change delivered, every bound
//! pod allocated or failed, every undecided reservation released) and the
//! scheduler's use of every GPU equals the node's.

// Test helpers outside #[test] fns: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use node_daemon::allocation::{identify_pod, plan_container, rebuild_holdings};
use node_daemon::cluster::PodView;
use node_daemon::cluster::kube::pod_view;
use node_daemon::epoch::{CommitClock, Epoch};
use node_daemon::ledger::{Capacity, LiveSnapshot, SliceLedger};
use proptest::prelude::*;
use proto::hami::bind::BindPhase;
use proto::hami::keys;
use proto::hami::node_lock::NodeLock;
use proto::hami::pod_devices::PodDevices;
use proto::hami::register::{self, NodeDevice};
use scheduler_webhook::cache::model::{ClusterModel, FilterOutcome, ModelConfig};
use scheduler_webhook::core::policy::SchedulerConfig;
use scheduler_webhook::core::request::RequestConfig;
use serde_json::json;

const NODES: [&str; 2] = ["n0", "n1"];
const GPUS_PER_NODE: u32 = 2;
const GPU_MEM: u32 = 8000;
const SLOTS: u32 = 4;
const PODS: usize = 6;
const NOW: i64 = 1_760_929_622;

/// What a pod asks for: (init container (mem, cores), app GPUs, mem per GPU, cores per GPU).
#[derive(Debug, Clone, Copy)]
struct Size {
    init: Option<(u32, u32)>,
    gpus: u32,
    mem: u32,
    cores: u32,
}

const SIZES: [Size; 5] = [
    Size {
        init: None,
        gpus: 1,
        mem: 3000,
        cores: 30,
    },
    Size {
        init: None,
        gpus: 1,
        mem: 5000,
        cores: 0,
    },
    Size {
        init: None,
        gpus: 2,
        mem: 2000,
        cores: 20,
    },
    Size {
        init: Some((6000, 50)),
        gpus: 1,
        mem: 1000,
        cores: 10,
    },
    Size {
        init: None,
        gpus: 1,
        mem: 1000,
        cores: 100,
    },
];

#[derive(Debug, Clone)]
enum Op {
    Create(usize, usize),
    Filter(usize),
    Bind(usize),
    BindFails(usize),
    /// kubelet admits the pod and calls Allocate for its next container.
    Allocate(usize),
    Delete(usize),
    /// The scheduler's watch delivers the pod's latest state.
    Deliver(usize),
    /// The node daemon lists its pods (a liveness snapshot)...
    Snapshot(usize),
    /// ...and later frees every slice of a pod not in it.
    ApplySnapshot(usize),
    Relist,
    ReRegister(usize),
    RestartScheduler,
    RestartNode(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let pod = 0..PODS;
    let node = 0..NODES.len();
    prop_oneof![
        3 => (pod.clone(), 0..SIZES.len()).prop_map(|(p, s)| Op::Create(p, s)),
        4 => pod.clone().prop_map(Op::Filter),
        4 => pod.clone().prop_map(Op::Bind),
        1 => pod.clone().prop_map(Op::BindFails),
        4 => pod.clone().prop_map(Op::Allocate),
        2 => pod.clone().prop_map(Op::Delete),
        5 => pod.prop_map(Op::Deliver),
        2 => node.clone().prop_map(Op::Snapshot),
        2 => node.clone().prop_map(Op::ApplySnapshot),
        1 => Just(Op::Relist),
        1 => node.clone().prop_map(Op::ReRegister),
        1 => Just(Op::RestartScheduler),
        1 => node.prop_map(Op::RestartNode),
    ]
}

fn uuid(node: &str, i: u32) -> String {
    format!("GPU-{node}-{i}")
}

fn kube_node(name: &str) -> Node {
    let devices: Vec<NodeDevice> = (0..GPUS_PER_NODE)
        .map(|i| NodeDevice {
            id: uuid(name, i),
            index: i,
            count: SLOTS,
            devmem: GPU_MEM,
            devcore: 100,
            device_type: "NVIDIA-Tesla T4".into(),
            numa: 0,
            mode: "hami-core".into(),
            health: true,
            mig_profiles: Vec::new(),
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
        keys::NODE_NVIDIA_REGISTER: register::encode_json(&devices).unwrap()
    }}}))
    .unwrap()
}

fn new_pod(slot: usize, generation: u32, size: Size) -> Pod {
    let limits = |gpus: u32, mem: u32, cores: u32| {
        json!({"nvidia.com/gpu": gpus.to_string(), "nvidia.com/gpumem": mem.to_string(),
               "nvidia.com/gpucores": cores.to_string()})
    };
    let init: Vec<_> = size
        .init
        .map(|(mem, cores)| json!({"name": "init", "resources": {"limits": limits(1, mem, cores)}}))
        .into_iter()
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("p{slot}"), "namespace": "ns",
                     "uid": format!("uid-{slot}-{generation}"), "annotations": {}},
        "spec": {"initContainers": init, "containers": [{"name": "main", "resources": {
            "limits": limits(size.gpus, size.mem, size.cores)}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

fn annotation<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn set_annotation(pod: &mut Pod, key: &str, value: String) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_owned(), value);
}

fn set_phase(pod: &mut Pod, phase: &str) {
    pod.status.get_or_insert_with(Default::default).phase = Some(phase.to_owned());
}

/// One node daemon: a ledger per GPU, its commit clock, and the liveness
/// snapshot it took.
struct Daemon {
    gpus: BTreeMap<String, SliceLedger>,
    clock: CommitClock,
    snapshot: Option<LiveSnapshot>,
}

impl Daemon {
    fn new(node: &str) -> Self {
        let capacity = Capacity {
            slots: SLOTS,
            memory_mib: GPU_MEM,
            cores: 100,
        };
        Self {
            gpus: (0..GPUS_PER_NODE)
                .map(|i| (uuid(node, i), SliceLedger::new(capacity)))
                .collect(),
            clock: CommitClock::new(),
            snapshot: None,
        }
    }
}

struct World {
    /// The API server's pods by slot (a deleted pod is removed).
    api: Vec<Option<Pod>>,
    /// Pods deleted from a slot whose deletion the watch has not delivered.
    deleted: Vec<Vec<String>>,
    generations: Vec<u32>,
    /// Node lock owner (pod slot) per node.
    locks: Vec<Option<usize>>,
    model: ClusterModel,
    daemons: Vec<Daemon>,
}

fn fresh_model(config: &ModelConfig) -> ClusterModel {
    let mut model = ClusterModel::new(config.clone());
    for node in NODES {
        model.apply_node(&kube_node(node)).unwrap();
    }
    model
}

fn config() -> ModelConfig {
    ModelConfig {
        scheduler: SchedulerConfig::default(),
        requests: RequestConfig::default(),
        seed: 3,
    }
}

impl World {
    fn new() -> Self {
        Self {
            api: vec![None; PODS],
            deleted: vec![Vec::new(); PODS],
            generations: vec![0; PODS],
            locks: vec![None; NODES.len()],
            model: fresh_model(&config()),
            daemons: NODES.iter().map(|n| Daemon::new(n)).collect(),
        }
    }

    fn node_index(name: &str) -> Option<usize> {
        NODES.iter().position(|n| *n == name)
    }

    fn views(&self) -> Vec<PodView> {
        self.api.iter().flatten().map(pod_view).collect()
    }

    fn lock_value(&self, node: usize) -> Option<String> {
        let slot = self.locks[node]?;
        let pod = self.api[slot].as_ref()?;
        let lock = NodeLock::acquired_at(NOW, "ns", pod.metadata.name.as_deref()?).unwrap();
        Some(lock.to_string())
    }

    /// The lock is free, or its holder no longer needs it (gone, or its
    /// Allocate finished either way): what the extender's bind checks.
    fn lock_free(&self, node: usize) -> bool {
        let Some(slot) = self.locks[node] else {
            return true;
        };
        self.api[slot]
            .as_ref()
            .is_none_or(|p| annotation(p, keys::BIND_PHASE) != Some(BindPhase::Allocating.as_str()))
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Create(slot, size) => {
                if self.api[slot].is_none() {
                    self.generations[slot] += 1;
                    self.api[slot] = Some(new_pod(slot, self.generations[slot], SIZES[size]));
                }
            }
            Op::Filter(slot) => {
                // kube-scheduler filters only pods not yet bound.
                if let Some(pod) = self.api[slot]
                    .as_ref()
                    .filter(|p| annotation(p, keys::VGPU_NODE).is_none())
                {
                    let candidates: Vec<String> = NODES.iter().map(|n| (*n).to_owned()).collect();
                    if let FilterOutcome::Invalid(why) = self.model.filter(pod, &candidates) {
                        return Err(format!("a valid pod was refused as invalid: {why}"));
                    }
                }
            }
            Op::Bind(slot) => self.bind(slot),
            Op::BindFails(slot) => {
                // kube-scheduler's bind failed before anything was written
                // (a bind that wrote and then failed rolls its writes back).
                if let Some(pod) = self.api[slot]
                    .as_ref()
                    .filter(|p| annotation(p, keys::VGPU_NODE).is_none())
                {
                    self.model.release(&uid(pod));
                }
            }
            Op::Allocate(slot) => self.allocate(slot)?,
            Op::Delete(slot) => {
                if let Some(pod) = self.api[slot].take() {
                    self.deleted[slot].push(uid(&pod));
                    // kubelet tears the pod down: its daemon frees its slices.
                    if let Some(node) = annotation(&pod, keys::VGPU_NODE).and_then(Self::node_index)
                    {
                        for ledger in self.daemons[node].gpus.values_mut() {
                            ledger.release_pod(&uid(&pod));
                        }
                    }
                }
            }
            Op::Deliver(slot) => self.deliver(slot),
            Op::Snapshot(node) => {
                // The clock is read before the list is requested.
                let taken_at = self.daemons[node].clock.now();
                let live = self
                    .views()
                    .iter()
                    .filter(|p| !p.is_terminal())
                    .map(|p| p.uid.clone())
                    .collect();
                self.daemons[node].snapshot = Some(LiveSnapshot { live, taken_at });
            }
            Op::ApplySnapshot(node) => {
                if let Some(live) = self.daemons[node].snapshot.take() {
                    for ledger in self.daemons[node].gpus.values_mut() {
                        ledger.release_pods_except(&live);
                    }
                }
            }
            Op::Relist => {
                self.model.pod_relist_started();
                let mut seen = HashSet::new();
                for slot in 0..PODS {
                    self.deleted[slot].clear();
                    if let Some(pod) = &self.api[slot] {
                        self.model.apply_pod(pod);
                        seen.insert(uid(pod));
                    }
                }
                self.model.reconcile_pods(&seen);
            }
            Op::ReRegister(node) => {
                self.model.apply_node(&kube_node(NODES[node])).unwrap();
            }
            Op::RestartScheduler => {
                self.model = fresh_model(&config());
                for slot in 0..PODS {
                    self.deleted[slot].clear();
                    if let Some(pod) = &self.api[slot] {
                        self.model.apply_pod(pod);
                    }
                }
            }
            Op::RestartNode(node) => {
                let mut daemon = Daemon::new(NODES[node]);
                let (holdings, errors) = rebuild_holdings(NODES[node], &self.views());
                if !errors.is_empty() {
                    return Err(format!("rebuild refused our own annotations: {errors:?}"));
                }
                for h in holdings {
                    let ledger = daemon
                        .gpus
                        .get_mut(&h.uuid)
                        .ok_or("rebuild names an unknown GPU")?;
                    ledger
                        .commit(h.key, h.slice, Epoch::default())
                        .map_err(|e| format!("rebuild over-commits: {e}"))?;
                }
                self.daemons[node] = daemon;
            }
        }
        Ok(())
    }

    /// The extender's bind: the pod's decision, the node lock, the
    /// annotations, then the model's commit.
    fn bind(&mut self, slot: usize) {
        let Some(pod) = self.api[slot].as_ref() else {
            return;
        };
        if annotation(pod, keys::VGPU_NODE).is_some() {
            return;
        }
        let pod_uid = uid(pod);
        let Some(decision) = self.model.decision(&pod_uid).cloned() else {
            return;
        };
        let Some(node) = Self::node_index(&decision.node) else {
            return;
        };
        let lock_free = self.lock_free(node);
        let Some(pod) = self.api[slot].as_mut() else {
            return;
        };
        if !lock_free {
            // Lock timeout: the bind fails and the reservation goes.
            self.model.release(&pod_uid);
            return;
        }
        let devices = decision.devices.to_string();
        set_annotation(pod, keys::VGPU_NODE, decision.node.clone());
        set_annotation(pod, keys::VGPU_DEVICES_TO_ALLOCATE, devices.clone());
        set_annotation(pod, keys::VGPU_DEVICES_ALLOCATED, devices);
        set_annotation(
            pod,
            keys::BIND_PHASE,
            BindPhase::Allocating.as_str().to_owned(),
        );
        self.locks[node] = Some(slot);
        // Our own bind: the model commits without waiting for the watch.
        self.model.commit(&pod_uid).unwrap_or_default();
    }

    /// kubelet's Allocate for the pod's next container, answered as the
    /// daemon's Allocator does.
    fn allocate(&mut self, slot: usize) -> Result<(), String> {
        let Some(pod) = self.api[slot].as_ref() else {
            return Ok(());
        };
        let Some(node) = annotation(pod, keys::VGPU_NODE).and_then(Self::node_index) else {
            return Ok(());
        };
        let Ok(todo) = annotation(pod, keys::VGPU_DEVICES_TO_ALLOCATE)
            .unwrap_or("")
            .parse::<PodDevices>()
        else {
            return Ok(());
        };
        let Some((_, next)) = todo.first_pending() else {
            return Ok(());
        };
        if annotation(pod, keys::BIND_PHASE) != Some(BindPhase::Allocating.as_str()) {
            return Ok(());
        }
        let requested = next.len();
        let views = self.views();
        let lock = self.lock_value(node);
        let (found, todo) = match identify_pod(NODES[node], lock.as_deref(), &views, requested) {
            Ok((p, d)) => (p.clone(), d),
            // The daemon refused to guess: kubelet retries later.
            Err(_) => return Ok(()),
        };
        if found.uid != uid(pod) {
            return Err(format!(
                "Allocate for {} was answered with {}'s devices",
                uid(pod),
                found.uid
            ));
        }
        let daemon = &mut self.daemons[node];
        let plan = plan_container(&found, &todo, requested, |u| daemon.gpus.contains_key(u))
            .map_err(|e| format!("our own annotations do not plan: {e}"))?;
        let mut failed = false;
        let mut committed = Vec::new();
        for (gpu, key, slice) in plan.slices(&found.uid) {
            let ledger = daemon.gpus.get_mut(&gpu).ok_or("unknown GPU")?;
            match ledger.commit(key.clone(), slice, daemon.clock.tick()) {
                Ok(node_daemon::ledger::Committed::New) => committed.push((gpu, key)),
                Ok(_) => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        let pod = self.api[slot].as_mut().ok_or("pod vanished")?;
        if failed {
            for (gpu, key) in committed {
                daemon
                    .gpus
                    .get_mut(&gpu)
                    .ok_or("unknown GPU")?
                    .release(&key);
            }
            // Refused: bind-phase failed, and kubelet fails the pod.
            set_annotation(pod, keys::BIND_PHASE, BindPhase::Failed.as_str().to_owned());
            set_phase(pod, "Failed");
            self.locks[node] = None;
            return Ok(());
        }
        let last = plan.is_last();
        set_annotation(
            pod,
            keys::VGPU_DEVICES_TO_ALLOCATE,
            plan.remaining.to_string(),
        );
        if last {
            set_annotation(
                pod,
                keys::BIND_PHASE,
                BindPhase::Success.as_str().to_owned(),
            );
            set_phase(pod, "Running");
            self.locks[node] = None;
        }
        Ok(())
    }

    /// The watch delivers the slot's events since the last delivery: the
    /// deletions, then the pod's latest state.
    fn deliver(&mut self, slot: usize) {
        for gone in self.deleted[slot].drain(..) {
            self.model.delete_pod(&gone);
        }
        if let Some(pod) = &self.api[slot] {
            self.model.apply_pod(pod);
        }
    }

    fn check(&self) -> Result<(), String> {
        self.model.check()?;
        for gpu in self.model.gpu_snapshot() {
            if gpu.used_memory_mib > gpu.memory_mib
                || gpu.used_cores > gpu.cores
                || gpu.used_slots > gpu.slots
            {
                return Err(format!("the scheduler over-reserves {}: {gpu:?}", gpu.uuid));
            }
        }
        for (node, daemon) in self.daemons.iter().enumerate() {
            // What every live pod's completed containers must hold here.
            let mut expected: BTreeSet<(String, String, usize)> = BTreeSet::new();
            for pod in self.api.iter().flatten() {
                if annotation(pod, keys::VGPU_NODE) != Some(NODES[node])
                    || annotation(pod, keys::BIND_PHASE) == Some(BindPhase::Failed.as_str())
                {
                    continue;
                }
                let allocated: PodDevices = annotation(pod, keys::VGPU_DEVICES_ALLOCATED)
                    .unwrap()
                    .parse()
                    .unwrap();
                let todo: PodDevices = annotation(pod, keys::VGPU_DEVICES_TO_ALLOCATE)
                    .unwrap()
                    .parse()
                    .unwrap();
                for (container, devices) in allocated.0.iter().enumerate() {
                    let done = todo.0.get(container).is_none_or(Vec::is_empty);
                    if done {
                        for d in devices {
                            expected.insert((d.uuid.clone(), uid(pod), container));
                        }
                    }
                }
            }
            let mut held = BTreeSet::new();
            for (gpu, ledger) in &daemon.gpus {
                let usage = ledger.usage();
                let cap = ledger.capacity();
                if usage.slots > cap.slots
                    || usage.memory_mib > u64::from(cap.memory_mib)
                    || usage.cores > u64::from(cap.cores)
                {
                    return Err(format!("{gpu} over-committed: {usage:?} of {cap:?}"));
                }
                for (key, _) in ledger.holdings() {
                    held.insert((gpu.clone(), key.pod_uid.clone(), key.container));
                }
            }
            if let Some(stray) = held.difference(&expected).next() {
                return Err(format!(
                    "{} holds a slice no live pod was given: {stray:?}",
                    NODES[node]
                ));
            }
            if let Some(lost) = expected.difference(&held).next() {
                return Err(format!(
                    "{} freed the slice of a live pod: {lost:?}",
                    NODES[node]
                ));
            }
        }
        Ok(())
    }

    /// Every change delivered, every bound pod allocated (or failed),
    /// every reservation that will never bind released.
    fn quiesce(&mut self) -> Result<(), String> {
        for _ in 0..4 {
            for slot in 0..PODS {
                self.allocate(slot)?;
                self.allocate(slot)?;
            }
        }
        for slot in 0..PODS {
            self.deliver(slot);
            if let Some(pod) = &self.api[slot]
                && annotation(pod, keys::VGPU_NODE).is_none()
            {
                self.model.release(&uid(pod));
            }
        }
        Ok(())
    }

    fn agree(&self) -> Result<(), String> {
        for gpu in self.model.gpu_snapshot() {
            let node = Self::node_index(&gpu.node).ok_or("unknown node")?;
            let usage = self.daemons[node].gpus[&gpu.uuid].usage();
            if (
                gpu.used_memory_mib,
                u64::from(gpu.used_cores),
                gpu.used_slots,
            ) != (usage.memory_mib, usage.cores, usage.slots)
            {
                return Err(format!(
                    "quiet, but the scheduler counts {} MiB/{} cores/{} slots on {} and the node {usage:?}",
                    gpu.used_memory_mib, gpu.used_cores, gpu.used_slots, gpu.uuid
                ));
            }
        }
        Ok(())
    }
}

fn run(ops: &[Op]) -> Result<(), String> {
    let mut world = World::new();
    for (i, op) in ops.iter().enumerate() {
        world
            .apply(op)
            .and_then(|()| world.check())
            .map_err(|e| format!("step {i} {op:?}: {e}"))?;
    }
    world.quiesce()?;
    world.check().map_err(|e| format!("quiet: {e}"))?;
    world.agree()
}

proptest! {
    // PROPTEST_CASES=100000 for a longer search.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn scheduler_and_nodes_never_over_commit_and_agree_once_quiet(ops in proptest::collection::vec(op(), 1..80)) {
        if let Err(e) = run(&ops) {
            prop_assert!(false, "{e}");
        }
    }
}

/// The property can fail: a liveness snapshot taken before a pod's
/// Allocate must not free that pod's slice when applied after it.
#[test]
fn a_stale_liveness_snapshot_is_caught_if_it_frees_a_live_slice() {
    let ops = [
        Op::Snapshot(0),
        Op::Create(0, 0),
        Op::Filter(0),
        Op::Bind(0),
        Op::Allocate(0),
        Op::ApplySnapshot(0),
    ];
    // Which node the pod lands on depends on the policy; try both.
    let both = [
        ops.to_vec(),
        ops.iter()
            .map(|op| match op {
                Op::Snapshot(_) => Op::Snapshot(1),
                Op::ApplySnapshot(_) => Op::ApplySnapshot(1),
                other => other.clone(),
            })
            .collect::<Vec<_>>(),
    ];
    let results: Vec<Result<(), String>> = both.iter().map(|ops| run(ops)).collect();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}
