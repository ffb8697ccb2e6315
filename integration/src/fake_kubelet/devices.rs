//! The device table of one fake kubelet: which devices each registered
//! resource has, their health, and which pod container holds which device IDs.
//!
//! This is kubelet's device manager bookkeeping (`healthyDevices`,
//! `unhealthyDevices`, `podDevices`, `allocatedDevices`) as a plain struct with
//! no I/O, so every rule is unit-tested here. It does not talk to plugins, read
//! pods or write files: the admission worker asks it what to allocate, calls the
//! plugin, then commits or aborts.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use super::record::AllocateReply;

/// Why devices cannot be chosen for a container. The `Display` texts are
/// kubelet's own (`pkg/kubelet/cm/devicemanager/manager.go`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// No plugin ever registered this resource (and nothing holds it).
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    /// The resource is registered but has no healthy device at all.
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthyDevices(String),
    /// Devices this container already holds are no longer healthy.
    #[error(
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {0}"
    )]
    PreviouslyAllocatedUnhealthy(String),
    /// A container's request changed after its devices were allocated.
    #[error(
        "pod {pod:?} container {container:?} changed request for resource {resource:?} from {had} to {required}"
    )]
    RequestChanged {
        /// Pod UID.
        pod: String,
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Devices already held.
        had: usize,
        /// Devices now requested.
        required: u64,
    },
    /// Fewer free healthy devices than needed.
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        /// Resource name.
        resource: String,
        /// Devices still needed.
        requested: u64,
        /// Free healthy devices.
        available: usize,
    },
}

/// What a container asks of one resource, with the admission context kubelet
/// passes to `devicesToAllocate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// Pod UID (kubelet keys allocations by UID).
    pub pod_uid: String,
    /// Container name.
    pub container: String,
    /// Extended resource name.
    pub resource: String,
    /// Number of devices requested (limits, falling back to requests).
    pub required: u64,
    /// Devices of earlier init containers of this pod that may be reused.
    pub reusable: BTreeSet<String>,
    /// The container is already running (a pod seen `Running` at start-up):
    /// kubelet does not allocate for running containers it has no record of.
    pub already_running: bool,
}

/// The question kubelet puts to a plugin in `GetPreferredAllocation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferredQuery {
    /// `available_deviceIDs`: free healthy devices plus those already chosen.
    pub available: Vec<String>,
    /// `must_include_deviceIDs`: devices already chosen (reused ones).
    pub must_include: Vec<String>,
    /// `allocation_size`: the whole request.
    pub size: u64,
}

/// What to do for one container and resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Nothing to allocate: the container already holds its devices (after a
    /// restart) or is already running.
    Nothing,
    /// These device IDs are reserved; call `Allocate` with them, then
    /// [`DeviceTable::commit`] or [`DeviceTable::abort_pod`].
    Allocate(Vec<String>),
}

/// Capacity and allocatable count of one resource, as kubelet reports them in
/// the node status (`GetCapacity`: capacity counts unhealthy devices too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResourceCount {
    /// Healthy plus unhealthy devices.
    pub capacity: u64,
    /// Healthy devices.
    pub allocatable: u64,
}

/// Devices held by one container for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldDevices {
    /// Device IDs.
    pub ids: BTreeSet<String>,
    /// The plugin's `Allocate` reply for these devices.
    pub reply: AllocateReply,
}

/// Pod UID → container → resource → devices.
pub type PodDevices = BTreeMap<String, BTreeMap<String, BTreeMap<String, HeldDevices>>>;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    pod_uid: String,
    container: String,
    resource: String,
    ids: BTreeSet<String>,
}

/// Kubelet's device-manager state for one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceTable {
    /// Registered resources → device ID → healthy.
    resources: BTreeMap<String, BTreeMap<String, bool>>,
    /// Committed allocations (kubelet's `podDevices`, what it checkpoints).
    pods: PodDevices,
    /// Devices reserved for the `Allocate` call in flight.
    pending: Option<Pending>,
    /// Bumped on every change to devices or committed allocations.
    revision: u64,
}

// === impl DeviceTable ===

impl DeviceTable {
    /// A table restored from a checkpoint: the allocations survive, and every
    /// resource that had devices is registered with none, so capacity reads 0
    /// until its plugin registers again (kubelet's `readCheckpoint`).
    pub fn restored(pods: PodDevices, registered: impl IntoIterator<Item = String>) -> Self {
        Self {
            resources: registered
                .into_iter()
                .map(|r| (r, BTreeMap::new()))
                .collect(),
            pods,
            pending: None,
            revision: 0,
        }
    }

    /// Changes whenever devices or committed allocations change (not for
    /// reservations), so observers can skip recomputing their views.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Replaces the whole device list of `resource` (one `ListAndWatch`
    /// message). `devices` are `(id, healthy)` pairs.
    pub fn replace_devices(
        &mut self,
        resource: &str,
        devices: impl IntoIterator<Item = (String, bool)>,
    ) {
        self.resources
            .insert(resource.to_owned(), devices.into_iter().collect());
        self.revision += 1;
    }

    /// Marks every device of `resource` unhealthy: the plugin's stream ended
    /// (kubelet's `markResourceUnhealthy`).
    pub fn mark_unhealthy(&mut self, resource: &str) {
        if let Some(devices) = self.resources.get_mut(resource) {
            devices.values_mut().for_each(|healthy| *healthy = false);
            self.revision += 1;
        }
    }

    /// Kubelet restarted: devices are forgotten until plugins register again;
    /// allocations stay (they are in the checkpoint).
    pub fn forget_devices(&mut self) {
        self.resources.values_mut().for_each(BTreeMap::clear);
        self.pending = None;
        self.revision += 1;
    }

    /// Node status figures for every registered resource.
    pub fn counts(&self) -> BTreeMap<String, ResourceCount> {
        self.resources
            .iter()
            .map(|(resource, devices)| {
                let allocatable = devices.values().filter(|healthy| **healthy).count() as u64;
                let count = ResourceCount {
                    capacity: devices.len() as u64,
                    allocatable,
                };
                (resource.clone(), count)
            })
            .collect()
    }

    /// Device list of `resource` as `(id, healthy)` pairs.
    pub fn devices(&self, resource: &str) -> Vec<(String, bool)> {
        self.resources
            .get(resource)
            .map(|d| d.iter().map(|(id, h)| (id.clone(), *h)).collect())
            .unwrap_or_default()
    }

    /// Resources ever registered (what the checkpoint lists).
    pub fn registered(&self) -> impl Iterator<Item = &String> {
        self.resources.keys()
    }

    /// Committed allocations.
    pub fn pods(&self) -> &PodDevices {
        &self.pods
    }

    /// Whether kubelet treats `resource` as a device-plugin resource: it is
    /// registered, or some pod still holds devices of it.
    pub fn is_device_plugin_resource(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
            || self
                .pods
                .values()
                .flat_map(BTreeMap::values)
                .any(|r| r.contains_key(resource))
    }

    /// Devices currently held or reserved for `resource`.
    fn in_use(&self, resource: &str) -> BTreeSet<String> {
        let mut used: BTreeSet<String> = self
            .pods
            .values()
            .flat_map(BTreeMap::values)
            .filter_map(|r| r.get(resource))
            .flat_map(|held| held.ids.iter().cloned())
            .collect();
        if let Some(p) = self.pending.as_ref().filter(|p| p.resource == resource) {
            used.extend(p.ids.iter().cloned());
        }
        used
    }

    /// Free healthy devices of `resource`.
    pub fn available(&self, resource: &str) -> BTreeSet<String> {
        let used = self.in_use(resource);
        self.resources
            .get(resource)
            .into_iter()
            .flatten()
            .filter(|(id, healthy)| **healthy && !used.contains(*id))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Devices `container` of `pod_uid` already holds for `resource`.
    pub fn held(&self, pod_uid: &str, container: &str, resource: &str) -> Option<&HeldDevices> {
        self.pods.get(pod_uid)?.get(container)?.get(resource)
    }

    /// All devices `container` holds, per resource.
    pub fn container_devices(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> BTreeMap<String, BTreeSet<String>> {
        self.pods
            .get(pod_uid)
            .and_then(|c| c.get(container))
            .map(|r| {
                r.iter()
                    .map(|(res, held)| (res.clone(), held.ids.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The checks kubelet makes before choosing (first half of
    /// `devicesToAllocate`). `Ok(None)`: nothing to allocate. `Ok(Some(n))`:
    /// `n` devices are needed.
    fn needed(&self, req: &DeviceRequest) -> Result<Option<u64>, DeviceError> {
        let held = self.held(&req.pod_uid, &req.container, &req.resource);
        if let Some(held) = held
            && held.ids.len() as u64 != req.required
        {
            return Err(DeviceError::RequestChanged {
                pod: req.pod_uid.clone(),
                container: req.container.clone(),
                resource: req.resource.clone(),
                had: held.ids.len(),
                required: req.required,
            });
        }
        // Kubelet restarted and the container is still running: it already
        // has its devices (recorded or not), so there is nothing to check.
        if req.already_running {
            return Ok(None);
        }
        let Some(devices) = self.resources.get(&req.resource) else {
            return Err(DeviceError::Unregistered(req.resource.clone()));
        };
        if !devices.values().any(|healthy| *healthy) {
            return Err(DeviceError::NoHealthyDevices(req.resource.clone()));
        }
        if let Some(held) = held {
            if held.ids.iter().any(|id| devices.get(id) != Some(&true)) {
                return Err(DeviceError::PreviouslyAllocatedUnhealthy(
                    req.resource.clone(),
                ));
            }
            return Ok(None);
        }
        Ok(Some(req.required).filter(|n| *n > 0))
    }

    /// Splits a request into reused devices and what is still needed, and
    /// checks there are enough free devices.
    fn split(
        &self,
        req: &DeviceRequest,
        needed: u64,
    ) -> Result<(Vec<String>, u64, BTreeSet<String>), DeviceError> {
        let reused: Vec<String> = req
            .reusable
            .iter()
            .take(usize::try_from(needed).unwrap_or(usize::MAX))
            .cloned()
            .collect();
        let still = needed - reused.len() as u64;
        let available = self.available(&req.resource);
        if still > 0 && (available.len() as u64) < still {
            return Err(DeviceError::Unavailable {
                resource: req.resource.clone(),
                requested: still,
                available: available.len(),
            });
        }
        Ok((reused, still, available))
    }

    /// The `GetPreferredAllocation` question for `req`, or `None` when kubelet
    /// would not ask (nothing to allocate, or reused devices suffice).
    pub fn preferred_query(
        &self,
        req: &DeviceRequest,
    ) -> Result<Option<PreferredQuery>, DeviceError> {
        let Some(needed) = self.needed(req)? else {
            return Ok(None);
        };
        let (reused, still, available) = self.split(req, needed)?;
        if still == 0 {
            return Ok(None);
        }
        let mut candidates: BTreeSet<String> = available;
        candidates.extend(reused.iter().cloned());
        Ok(Some(PreferredQuery {
            available: candidates.into_iter().collect(),
            must_include: reused,
            size: req.required,
        }))
    }

    /// Chooses and reserves devices for `req` (second half of
    /// `devicesToAllocate`): reusable devices first, then the plugin's
    /// `preferred` IDs that are free and healthy, then the remaining free
    /// healthy IDs in order.
    pub fn choose(
        &mut self,
        req: &DeviceRequest,
        preferred: &[String],
    ) -> Result<Choice, DeviceError> {
        let Some(needed) = self.needed(req)? else {
            return Ok(Choice::Nothing);
        };
        let (reused, mut still, available) = self.split(req, needed)?;
        let mut chosen: Vec<String> = reused;
        let mut seen: BTreeSet<String> = chosen.iter().cloned().collect();
        let preferred_free = preferred.iter().filter(|id| available.contains(*id));
        for id in preferred_free.chain(available.iter()) {
            if still == 0 {
                break;
            }
            if seen.insert(id.clone()) {
                chosen.push(id.clone());
                still -= 1;
            }
        }
        self.pending = Some(Pending {
            pod_uid: req.pod_uid.clone(),
            container: req.container.clone(),
            resource: req.resource.clone(),
            ids: chosen.iter().cloned().collect(),
        });
        Ok(Choice::Allocate(chosen))
    }

    /// Records the reserved devices as held, with the plugin's reply.
    /// Returns `false` when nothing was reserved for this container.
    pub fn commit(
        &mut self,
        pod_uid: &str,
        container: &str,
        resource: &str,
        reply: AllocateReply,
    ) -> bool {
        let Some(p) = self.pending.take() else {
            return false;
        };
        if p.pod_uid != pod_uid || p.container != container || p.resource != resource {
            self.pending = Some(p);
            return false;
        }
        let held = HeldDevices { ids: p.ids, reply };
        self.pods
            .entry(p.pod_uid)
            .or_default()
            .entry(p.container)
            .or_default()
            .insert(p.resource, held);
        self.revision += 1;
        true
    }

    /// Drops the reservation in flight and everything `pod_uid` holds (the
    /// pod failed admission or is gone). Returns whether anything was freed.
    pub fn abort_pod(&mut self, pod_uid: &str) -> bool {
        let pending = self.pending.as_ref().is_some_and(|p| p.pod_uid == pod_uid);
        if pending {
            self.pending = None;
        }
        self.remove_pod(pod_uid) || pending
    }

    /// Frees every device `pod_uid` holds. Returns whether it held any.
    pub fn remove_pod(&mut self, pod_uid: &str) -> bool {
        let removed = self.pods.remove(pod_uid).is_some();
        if removed {
            self.revision += 1;
        }
        removed
    }

    /// Frees the devices of every pod not in `active` (kubelet's
    /// `UpdateAllocatedDevices`). Returns the UIDs freed.
    pub fn retain_pods(&mut self, active: &BTreeSet<String>) -> Vec<String> {
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !active.contains(*uid))
            .cloned()
            .collect();
        for uid in &gone {
            self.remove_pod(uid);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ids: &[(&str, bool)]) -> DeviceTable {
        let mut t = DeviceTable::default();
        t.replace_devices(
            "example.com/gpu",
            ids.iter().map(|(id, h)| ((*id).to_owned(), *h)),
        );
        t
    }

    fn req(pod: &str, container: &str, required: u64) -> DeviceRequest {
        DeviceRequest {
            pod_uid: pod.to_owned(),
            container: container.to_owned(),
            resource: "example.com/gpu".to_owned(),
            required,
            reusable: BTreeSet::new(),
            already_running: false,
        }
    }

    fn ids(choice: Choice) -> Vec<String> {
        match choice {
            Choice::Allocate(ids) => ids,
            Choice::Nothing => panic!("expected an allocation"),
        }
    }

    #[test]
    fn counts_report_unhealthy_devices_in_capacity_only() {
        let t = table(&[("a", true), ("b", false), ("c", true)]);
        assert_eq!(
            t.counts()["example.com/gpu"],
            ResourceCount {
                capacity: 3,
                allocatable: 2
            }
        );
    }

    #[test]
    fn choose_takes_free_healthy_devices_in_order_without_hint() {
        let mut t = table(&[("a", false), ("b", true), ("c", true), ("d", true)]);
        assert_eq!(ids(t.choose(&req("p", "c0", 2), &[]).unwrap()), ["b", "c"]);
    }

    #[test]
    fn choose_prefers_valid_hint_and_ignores_invalid_ids() {
        let mut t = table(&[("a", true), ("b", true), ("c", true), ("d", false)]);
        let hint = ["d".to_owned(), "zz".to_owned(), "c".to_owned()];
        assert_eq!(
            ids(t.choose(&req("p", "c0", 2), &hint).unwrap()),
            ["c", "a"]
        );
    }

    #[test]
    fn reserved_and_committed_devices_are_not_offered_again() {
        let mut t = table(&[("a", true), ("b", true), ("c", true)]);
        assert_eq!(ids(t.choose(&req("p1", "c0", 1), &[]).unwrap()), ["a"]);
        assert_eq!(
            t.available("example.com/gpu").len(),
            2,
            "pending reservation counts as used"
        );
        assert!(t.commit("p1", "c0", "example.com/gpu", AllocateReply::default()));
        assert_eq!(ids(t.choose(&req("p2", "c0", 2), &[]).unwrap()), ["b", "c"]);
    }

    #[test]
    fn too_few_devices_fails_with_kubelets_message() {
        let mut t = table(&[("a", true), ("b", true)]);
        t.choose(&req("p1", "c0", 1), &[]).unwrap();
        t.commit("p1", "c0", "example.com/gpu", AllocateReply::default());
        let err = t.choose(&req("p2", "c0", 2), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1"
        );
    }

    #[test]
    fn unregistered_and_all_unhealthy_resources_fail() {
        let mut t = DeviceTable::default();
        assert_eq!(
            t.choose(&req("p", "c", 1), &[]),
            Err(DeviceError::Unregistered("example.com/gpu".into()))
        );
        let mut t = table(&[("a", false)]);
        assert_eq!(
            t.choose(&req("p", "c", 1), &[]),
            Err(DeviceError::NoHealthyDevices("example.com/gpu".into()))
        );
    }

    #[test]
    fn removing_a_pod_frees_its_devices() {
        let mut t = table(&[("a", true)]);
        t.choose(&req("p1", "c0", 1), &[]).unwrap();
        t.commit("p1", "c0", "example.com/gpu", AllocateReply::default());
        assert!(t.available("example.com/gpu").is_empty());
        assert!(t.remove_pod("p1"));
        assert_eq!(t.available("example.com/gpu").len(), 1);
        assert!(!t.remove_pod("p1"));
    }

    #[test]
    fn abort_drops_reservation_and_earlier_containers() {
        let mut t = table(&[("a", true), ("b", true)]);
        t.choose(&req("p", "c0", 1), &[]).unwrap();
        t.commit("p", "c0", "example.com/gpu", AllocateReply::default());
        t.choose(&req("p", "c1", 1), &[]).unwrap();
        assert!(t.abort_pod("p"));
        assert_eq!(t.available("example.com/gpu").len(), 2);
    }

    #[test]
    fn held_devices_are_not_allocated_again() {
        let mut t = table(&[("a", true), ("b", true)]);
        t.choose(&req("p", "c0", 1), &[]).unwrap();
        t.commit("p", "c0", "example.com/gpu", AllocateReply::default());
        assert_eq!(t.choose(&req("p", "c0", 1), &[]), Ok(Choice::Nothing));
        assert!(matches!(
            t.choose(&req("p", "c0", 2), &[]),
            Err(DeviceError::RequestChanged { .. })
        ));
    }

    #[test]
    fn restart_keeps_allocations_but_forgets_devices_until_reregistration() {
        let mut t = table(&[("a", true), ("b", true)]);
        t.choose(&req("p", "c0", 1), &[]).unwrap();
        t.commit("p", "c0", "example.com/gpu", AllocateReply::default());
        let restored = DeviceTable::restored(t.pods().clone(), t.registered().cloned());
        assert_eq!(
            restored.counts()["example.com/gpu"],
            ResourceCount::default()
        );
        let mut restored = restored;
        restored.replace_devices("example.com/gpu", [("a".into(), true), ("b".into(), true)]);
        assert_eq!(
            restored
                .available("example.com/gpu")
                .into_iter()
                .collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(
            restored.choose(&req("p", "c0", 1), &[]),
            Ok(Choice::Nothing)
        );
    }

    #[test]
    fn running_container_needs_no_healthy_devices_after_restart() {
        let mut t = table(&[("a", true)]);
        t.choose(&req("p", "c0", 1), &[]).unwrap();
        t.commit("p", "c0", "example.com/gpu", AllocateReply::default());
        t.forget_devices();
        let mut r = req("p", "c0", 1);
        r.already_running = true;
        assert_eq!(t.choose(&r, &[]), Ok(Choice::Nothing));
        assert!(t.held("p", "c0", "example.com/gpu").is_some());
        r.already_running = false;
        assert!(matches!(
            t.choose(&r, &[]),
            Err(DeviceError::NoHealthyDevices(_))
        ));
    }

    #[test]
    fn running_container_without_record_is_not_allocated() {
        let mut t = table(&[("a", true)]);
        let mut r = req("p", "c0", 1);
        r.already_running = true;
        assert_eq!(t.choose(&r, &[]), Ok(Choice::Nothing));
    }

    #[test]
    fn reusable_init_devices_come_first_and_are_must_include() {
        let mut t = table(&[("a", true), ("b", true), ("c", true)]);
        t.choose(&req("p", "init", 1), &[]).unwrap();
        t.commit("p", "init", "example.com/gpu", AllocateReply::default());
        let mut r = req("p", "app", 2);
        r.reusable = BTreeSet::from(["a".to_owned()]);
        let q = t.preferred_query(&r).unwrap().unwrap();
        assert_eq!(q.must_include, ["a"]);
        assert_eq!(q.available, ["a", "b", "c"]);
        assert_eq!(q.size, 2);
        assert_eq!(ids(t.choose(&r, &["c".to_owned()]).unwrap()), ["a", "c"]);
    }

    #[test]
    fn unhealthy_marking_zeroes_allocatable_but_keeps_capacity() {
        let mut t = table(&[("a", true), ("b", true)]);
        t.mark_unhealthy("example.com/gpu");
        assert_eq!(
            t.counts()["example.com/gpu"],
            ResourceCount {
                capacity: 2,
                allocatable: 0
            }
        );
    }
}
