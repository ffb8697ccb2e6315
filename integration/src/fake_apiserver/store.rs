//! The object store of the fake kube-apiserver: every object as JSON keyed by
//! (resource, namespace, name), one cluster-wide monotonically increasing
//! resourceVersion, a bounded history of change events for watches and a
//! broadcast of each change to open watches.
//!
//! Owns the semantics of each verb (create, get, list, update, patch,
//! delete, binding) including the defaulting and status/subresource rules of
//! the real registries. It does not own HTTP, streaming or fault injection
//! (see `http`). All methods are synchronous; the caller serialises access.
//!
//! Deliberate simplifications, all documented in the README: deletes are
//! immediate (no graceful pod deletion, no finalizers), deleting a namespace
//! deletes its objects at once, pages of a `limit`ed list after the first read
//! the current state rather than the first page's snapshot.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

pub use super::objects::ObjectKey;
use super::objects::Objects;
use super::patch::{self, PatchFormat};
use super::resources::{INITIAL_NAMESPACES, ResourceDef};
use super::selector::Selectors;
use super::status::{ApiError, Result};

/// Capacity of the change broadcast; a watch that falls further behind is
/// ended with a 410 Expired error event, as the real watch cache does.
const BROADCAST_CAPACITY: usize = 4096;

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl EventType {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// resourceVersion of the change.
    pub resource_version: u64,
    /// What happened.
    pub event_type: EventType,
    /// Which object.
    pub key: ObjectKey,
    /// The object after the change (for a delete: the last state, carrying
    /// the delete's resourceVersion).
    pub object: Value,
    /// The object before a modification, to translate selector transitions.
    pub previous: Option<Value>,
    /// `object` as JSON, written by the first watcher that sends it and
    /// shared by the others, as the real watch cache serializes an event
    /// once for all its watchers (`cachingObject`).
    object_json: OnceLock<Vec<u8>>,
}

/// Equal when the change is: the cached serialization is not part of it.
impl PartialEq for StoredEvent {
    fn eq(&self, other: &Self) -> bool {
        self.resource_version == other.resource_version
            && self.event_type == other.event_type
            && self.key == other.key
            && self.object == other.object
            && self.previous == other.previous
    }
}

impl StoredEvent {
    /// A change, not yet serialized.
    pub fn new(
        resource_version: u64,
        event_type: EventType,
        key: ObjectKey,
        object: Value,
        previous: Option<Value>,
    ) -> Self {
        Self {
            resource_version,
            event_type,
            key,
            object,
            previous,
            object_json: OnceLock::new(),
        }
    }

    /// `object` as JSON, serialized on the first call only (a `Value`
    /// always serializes: its keys are strings).
    pub fn object_json(&self) -> &[u8] {
        self.object_json
            .get_or_init(|| serde_json::to_vec(&self.object).unwrap_or_default())
    }

    /// How a watcher of `def` in `namespace` (None = all) with `selectors`
    /// sees this change: a modification that moves an object into the
    /// selection is ADDED, out of it DELETED, as the real watch cache does.
    pub fn as_seen_by(
        &self,
        def: &ResourceDef,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> Option<EventType> {
        if self.key.group != def.group || self.key.plural != def.plural {
            return None;
        }
        if namespace.is_some_and(|ns| ns != self.key.namespace) {
            return None;
        }
        let now = selectors.matches(&self.object);
        match self.event_type {
            EventType::Added | EventType::Deleted => now.then_some(self.event_type),
            EventType::Modified => {
                let before = self.previous.as_ref().is_some_and(|p| selectors.matches(p));
                match (before, now) {
                    (true, true) => Some(EventType::Modified),
                    (false, true) => Some(EventType::Added),
                    (true, false) => Some(EventType::Deleted),
                    (false, false) => None,
                }
            }
        }
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// No resourceVersion or `"0"`: synthetic ADDED events for every
    /// current object, then live changes.
    Now,
    /// After this resourceVersion, replaying retained history.
    After(u64),
}

/// What a watch needs to begin: events to send first and the live feed,
/// taken atomically so that nothing is lost or repeated.
#[derive(Debug)]
pub struct WatchFeed {
    /// Events to send before live ones.
    pub replay: Vec<Arc<StoredEvent>>,
    /// Live changes committed after the replay.
    pub live: broadcast::Receiver<Arc<StoredEvent>>,
    /// resourceVersion the watch is current at after the replay.
    pub resource_version: u64,
}

/// Which part of an object an update or patch writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The object itself: `status` is kept from the stored object for
    /// resources with a status subresource.
    Main,
    /// The `status` subresource: only `status` changes.
    Status,
}

/// What a delete answers with.
#[derive(Debug, Clone, PartialEq)]
pub enum Deleted {
    /// The deleted object (pods and namespaces, `ReturnDeletedObject`).
    Object(Value),
    /// A Success Status (every other resource).
    Status(Value),
}

/// The in-memory store.
#[derive(Debug)]
pub struct Store {
    objects: Objects,
    resource_version: u64,
    history: VecDeque<Arc<StoredEvent>>,
    history_limit: usize,
    /// Watches from a resourceVersion below this are answered 410.
    oldest_watchable: u64,
    changes: broadcast::Sender<Arc<StoredEvent>>,
    /// Bound pods are deleted gracefully (see [`Store::delete`]).
    graceful_pod_deletion: bool,
}

fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x9e37_79b9_7f4a_7c15);
    hasher.finish()
}

fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    let hex = format!("{a:016x}{b:016x}");
    // RFC 4122 layout, version 4 nibble.
    format!(
        "{}-{}-4{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The 5-character suffix the apiserver appends to `generateName`.
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = random_u64();
    let mut out = String::new();
    for _ in 0..5 {
        let idx = usize::try_from(n % ALPHABET.len() as u64).unwrap_or(0);
        out.push(char::from(ALPHABET[idx]));
        n /= ALPHABET.len() as u64;
    }
    out
}

/// Current time as the apiserver writes timestamps (`2026-01-02T03:04:05Z`).
pub fn now_timestamp() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut node = value;
    for p in path {
        node = &node[*p];
    }
    node.as_str().unwrap_or_default()
}

fn set_default(map: &mut Map<String, Value>, key: &str, value: Value) {
    if map.get(key).is_none_or(Value::is_null) {
        map.insert(key.to_string(), value);
    }
}

/// Pod defaulting done by the real server's `SetDefaults_Pod` and friends
/// (the parts clients observe).
fn default_pod(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "enableServiceLinks", json!(true));
    set_default(spec, "priority", json!(0));
    set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
            let latest = container
                .get("image")
                .and_then(Value::as_str)
                .is_some_and(|i| !i.contains(':') || i.ends_with(":latest"));
            let policy = if latest { "Always" } else { "IfNotPresent" };
            set_default(container, "imagePullPolicy", json!(policy));
            set_default(
                container,
                "terminationMessagePath",
                json!("/dev/termination-log"),
            );
            set_default(container, "terminationMessagePolicy", json!("File"));
            set_default(container, "resources", json!({}));
        }
    }
}

/// `status.qosClass` as `GetPodQOS` computes it (cpu and memory only).
fn pod_qos(pod: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    let containers = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .chain(pod["spec"]["initContainers"].as_array())
        .flatten();
    for container in containers {
        let requests = &container["resources"]["requests"];
        let limits = &container["resources"]["limits"];
        for res in ["cpu", "memory"] {
            let req = requests.get(res);
            let lim = limits.get(res);
            any |= req.is_some() || lim.is_some();
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(r), Some(l)) if r != l => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The pod spec with the fields an update may change removed
/// (`ValidatePodUpdate`: images, activeDeadlineSeconds, tolerations,
/// terminationGracePeriodSeconds, schedulingGates).
fn immutable_pod_spec(spec: &Value) -> Value {
    let mut spec = spec.clone();
    if let Some(map) = spec.as_object_mut() {
        for key in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
            "schedulingGates",
        ] {
            map.remove(key);
        }
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            if let Some(items) = map.get_mut(list).and_then(Value::as_array_mut) {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    item.remove("image");
                }
            }
        }
    }
    spec
}

fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    object.get_mut("metadata").and_then(Value::as_object_mut)
}

impl Store {
    /// An empty cluster with the four standard namespaces.
    pub fn new(history_limit: usize) -> Self {
        let (changes, _) = broadcast::channel(BROADCAST_CAPACITY);
        let mut store = Self {
            objects: Objects::default(),
            resource_version: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            oldest_watchable: 0,
            changes,
            graceful_pod_deletion: false,
        };
        if let Some(namespaces) = ResourceDef::find("", "v1", "namespaces") {
            for ns in INITIAL_NAMESPACES {
                // Creating a fixed, valid namespace in an empty store cannot
                // fail; an error would only leave the namespace out.
                let _ = store.create(namespaces, None, json!({"metadata": {"name": ns}}));
            }
        }
        store
    }

    /// A detached copy of the objects for a `dryRun` request: writes to it
    /// are validated and answered like real ones but reach no watcher and
    /// are discarded.
    pub fn dry_run_copy(&self) -> Self {
        Self {
            objects: self.objects.clone(),
            resource_version: self.resource_version,
            history: VecDeque::new(),
            history_limit: self.history_limit,
            oldest_watchable: self.oldest_watchable,
            changes: broadcast::channel(1).0,
            graceful_pod_deletion: self.graceful_pod_deletion,
        }
    }

    /// Switches graceful pod deletion on or off (off by default).
    ///
    /// On, a delete of a pod that is bound to an existing node, not
    /// finished, and asked with a grace period other than 0 only sets
    /// `deletionTimestamp` (now + grace) and `deletionGracePeriodSeconds`,
    /// as the real pod registry does; the kubelet (fake-kubelet) then
    /// confirms with a grace-0 delete. A pod on a node that does not exist
    /// is removed at once, as the pod garbage collector would.
    pub fn set_graceful_pod_deletion(&mut self, on: bool) {
        self.graceful_pod_deletion = on;
    }

    /// The latest committed resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// The oldest resourceVersion a watch may still start after.
    pub fn oldest_watchable(&self) -> u64 {
        self.oldest_watchable
    }

    /// Drops all retained history, like an etcd compaction: every watch
    /// from an older resourceVersion is answered 410 Expired.
    pub fn compact(&mut self) {
        self.history.clear();
        self.oldest_watchable = self.resource_version;
    }

    fn key(def: &ResourceDef, namespace: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey {
            group: def.group,
            plural: def.plural,
            namespace: if def.namespaced {
                namespace.unwrap_or_default().to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    fn commit(
        &mut self,
        event_type: EventType,
        key: ObjectKey,
        object: Value,
        previous: Option<Value>,
    ) {
        let event = Arc::new(StoredEvent::new(
            self.resource_version,
            event_type,
            key,
            object,
            previous,
        ));
        self.history.push_back(Arc::clone(&event));
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.oldest_watchable = dropped.resource_version;
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = self.changes.send(event);
    }

    fn next_resource_version(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    fn require_namespace(&self, def: &ResourceDef, namespace: Option<&str>) -> Result<()> {
        if !def.namespaced {
            return Ok(());
        }
        let ns = namespace.unwrap_or_default();
        let namespaces = ResourceDef::find("", "v1", "namespaces");
        let exists =
            namespaces.is_some_and(|nsdef| self.objects.contains_key(&Self::key(nsdef, None, ns)));
        match (exists, namespaces) {
            (true, _) => Ok(()),
            (false, Some(nsdef)) => Err(ApiError::not_found(nsdef, ns)),
            (false, None) => Err(ApiError::BadRequest(format!("namespace {ns} not served"))),
        }
    }

    /// Checks `apiVersion`/`kind` of a body and fills them in.
    fn check_type(def: &ResourceDef, body: &mut Value) -> Result<()> {
        let Some(map) = body.as_object_mut() else {
            return Err(ApiError::BadRequest(
                "the request body must be a JSON object".to_string(),
            ));
        };
        let api_version = def.api_version();
        if let Some(kind) = map.get("kind").and_then(Value::as_str)
            && !kind.is_empty()
            && kind != def.kind
        {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                def.kind
            )));
        }
        if let Some(v) = map.get("apiVersion").and_then(Value::as_str)
            && !v.is_empty()
            && v != api_version
        {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
        map.insert("kind".to_string(), json!(def.kind));
        map.insert("apiVersion".to_string(), json!(api_version));
        if !map.get("metadata").is_some_and(Value::is_object) {
            map.insert("metadata".to_string(), json!({}));
        }
        Ok(())
    }

    /// Checks the body's namespace against the request's and sets it.
    fn check_namespace(def: &ResourceDef, namespace: Option<&str>, body: &mut Value) -> Result<()> {
        let Some(meta) = metadata_mut(body) else {
            return Ok(());
        };
        if !def.namespaced {
            meta.remove("namespace");
            return Ok(());
        }
        let ns = namespace.unwrap_or_default();
        match meta.get("namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != ns => Err(ApiError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request"
                    .to_string(),
            )),
            _ => {
                meta.insert("namespace".to_string(), json!(ns));
                Ok(())
            }
        }
    }

    /// Create (POST). Fills uid, creationTimestamp, resourceVersion and a
    /// generated name, applies the registry's defaults.
    pub fn create(
        &mut self,
        def: &ResourceDef,
        namespace: Option<&str>,
        mut body: Value,
    ) -> Result<Value> {
        Self::check_type(def, &mut body)?;
        Self::check_namespace(def, namespace, &mut body)?;
        let mut name = str_at(&body, &["metadata", "name"]).to_string();
        if name.is_empty() {
            let prefix = str_at(&body, &["metadata", "generateName"]);
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    def,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
            name = format!("{prefix}{}", name_suffix());
        }
        if !valid_name(&name) {
            return Err(ApiError::invalid(
                def,
                &name,
                "metadata.name",
                &format!(
                    "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        self.require_namespace(def, namespace)?;
        let key = Self::key(def, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(def, &name));
        }
        match def.plural {
            "pods" => {
                default_pod(&mut body);
                // The pod registry drops any status sent on create.
                let qos = pod_qos(&body);
                body["status"] = json!({"phase": "Pending", "qosClass": qos});
            }
            "namespaces" => {
                body["spec"] = json!({"finalizers": ["kubernetes"]});
                body["status"] = json!({"phase": "Active"});
                if let Some(meta) = metadata_mut(&mut body) {
                    let labels = meta.entry("labels").or_insert_with(|| json!({}));
                    if let Some(labels) = labels.as_object_mut() {
                        labels.insert("kubernetes.io/metadata.name".to_string(), json!(name));
                    }
                }
            }
            "resourcequotas" => {
                if let Some(map) = body.as_object_mut() {
                    map.remove("status");
                }
            }
            _ => {}
        }
        let rv = self.next_resource_version();
        if let Some(meta) = metadata_mut(&mut body) {
            meta.insert("name".to_string(), json!(name));
            meta.insert("uid".to_string(), json!(new_uid()));
            meta.insert("creationTimestamp".to_string(), json!(now_timestamp()));
            meta.insert("resourceVersion".to_string(), json!(rv.to_string()));
            meta.remove("deletionTimestamp");
            meta.remove("deletionGracePeriodSeconds");
            meta.remove("selfLink");
        }
        self.objects.insert(key.clone(), body.clone());
        self.commit(EventType::Added, key, body.clone(), None);
        Ok(body)
    }

    /// Get one object.
    pub fn get(&self, def: &ResourceDef, namespace: Option<&str>, name: &str) -> Result<Value> {
        self.objects
            .get(&Self::key(def, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))
    }

    /// Objects of `def` in `namespace` (None = all namespaces) that match
    /// `selectors`, in key order, and the resourceVersion of the snapshot.
    pub fn list(
        &self,
        def: &ResourceDef,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> (Vec<Value>, u64) {
        let (items, _) = self.list_page(def, namespace, selectors, None, usize::MAX);
        (items.into_iter().cloned().collect(), self.resource_version)
    }

    /// One page of [`Self::list`], as the real server pages a list with
    /// `limit`: at most `limit` objects whose (namespace, name) sorts after
    /// `after`, and the (namespace, name) of the last one when more remain.
    ///
    /// The real server serves every page from the etcd snapshot of the first
    /// one; this store has no snapshots, so later pages read the current
    /// state. A client that then watches from the first page's
    /// resourceVersion sees every change made meanwhile again, in order.
    pub fn list_page<'s>(
        &'s self,
        def: &ResourceDef,
        namespace: Option<&str>,
        selectors: &Selectors,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> (Vec<&'s Value>, Option<(String, String)>) {
        // A bound pod's node is indexed, as in the real watch cache.
        let on_node = (def.group.is_empty() && def.plural == "pods")
            .then(|| selectors.fields.required("spec.nodeName"))
            .flatten()
            .filter(|n| !n.is_empty());
        let candidates: Box<dyn Iterator<Item = (&'s ObjectKey, &'s Value)> + '_> = match on_node {
            Some(node) => Box::new(self.objects.pods_on_node(node, namespace)),
            None => Box::new(self.objects.of_kind(def, namespace)),
        };
        let mut matching = candidates
            .filter(|(k, _)| {
                after.is_none_or(|(ns, name)| (k.namespace.as_str(), k.name.as_str()) > (ns, name))
            })
            .filter(|(_, v)| selectors.matches(v));
        let items: Vec<(&ObjectKey, &'s Value)> = matching.by_ref().take(limit.max(1)).collect();
        let more = matching.next().is_some();
        let last = items
            .last()
            .filter(|_| more)
            .map(|(k, _)| (k.namespace.clone(), k.name.clone()));
        (items.into_iter().map(|(_, v)| v).collect(), last)
    }

    /// Update (PUT) of the object or of its status.
    pub fn update(
        &mut self,
        def: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        mut body: Value,
        part: Part,
    ) -> Result<Value> {
        Self::check_type(def, &mut body)?;
        Self::check_namespace(def, namespace, &mut body)?;
        let body_name = str_at(&body, &["metadata", "name"]);
        if body_name != name {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let key = Self::key(def, namespace, name);
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let current_rv = str_at(&current, &["metadata", "resourceVersion"]).to_string();
        let given_rv = str_at(&body, &["metadata", "resourceVersion"]);
        if !given_rv.is_empty() && given_rv != current_rv {
            return Err(ApiError::stale(def, name));
        }
        let given_uid = str_at(&body, &["metadata", "uid"]);
        let current_uid = str_at(&current, &["metadata", "uid"]);
        if !given_uid.is_empty() && given_uid != current_uid {
            return Err(ApiError::conflict(
                def,
                def.qualified_name(),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {given_uid}, UID in object meta: {current_uid}"
                ),
            ));
        }
        let mut next = match part {
            Part::Main => {
                let mut next = body;
                if def.has_subresource("status") {
                    match current.get("status") {
                        Some(status) => next["status"] = status.clone(),
                        None => {
                            if let Some(map) = next.as_object_mut() {
                                map.remove("status");
                            }
                        }
                    }
                }
                next
            }
            Part::Status => {
                let mut next = current.clone();
                match body.get("status") {
                    Some(status) => next["status"] = status.clone(),
                    None => {
                        if let Some(map) = next.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
                next
            }
        };
        // System-owned metadata survives every update.
        if let (Some(meta), Some(old)) = (
            metadata_mut(&mut next),
            current.get("metadata").and_then(Value::as_object),
        ) {
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generateName",
                "namespace",
            ] {
                match old.get(field) {
                    Some(v) => meta.insert(field.to_string(), v.clone()),
                    None => meta.remove(field),
                };
            }
            meta.insert("resourceVersion".to_string(), json!(current_rv));
        }
        if def.plural == "pods" && part == Part::Main {
            default_pod(&mut next);
            if immutable_pod_spec(&next["spec"]) != immutable_pod_spec(&current["spec"]) {
                return Err(ApiError::invalid(
                    def,
                    name,
                    "spec",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                ));
            }
        }
        if next == current {
            // The real server does not write (or bump the resourceVersion)
            // for a no-op update.
            return Ok(current);
        }
        let rv = self.next_resource_version();
        if let Some(meta) = metadata_mut(&mut next) {
            meta.insert("resourceVersion".to_string(), json!(rv.to_string()));
        }
        self.objects.insert(key.clone(), next.clone());
        self.commit(EventType::Modified, key, next.clone(), Some(current));
        Ok(next)
    }

    /// Patch (PATCH) of the object or its status. A patch whose result
    /// carries a `metadata.resourceVersion` other than the stored one is a
    /// 409 Conflict.
    pub fn patch(
        &mut self,
        def: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        format: PatchFormat,
        body: &[u8],
        part: Part,
    ) -> Result<Value> {
        let current = self.get(def, namespace, name)?;
        let patched = patch::apply(&current, format, body)?;
        // Precondition: an explicit resourceVersion must be current.
        let current_rv = str_at(&current, &["metadata", "resourceVersion"]);
        let patched_rv = str_at(&patched, &["metadata", "resourceVersion"]);
        if !patched_rv.is_empty() && patched_rv != current_rv {
            return Err(ApiError::stale(def, name));
        }
        self.update(def, namespace, name, patched, part)
    }

    /// Delete: immediate, except for bound pods when graceful pod deletion
    /// is on (see [`Store::set_graceful_pod_deletion`]). Preconditions
    /// (`DeleteOptions.preconditions` uid/resourceVersion) are checked.
    pub fn delete(
        &mut self,
        def: &ResourceDef,
        namespace: Option<&str>,
        name: &str,
        options: &Value,
    ) -> Result<Deleted> {
        let key = Self::key(def, namespace, name);
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let pre_uid = str_at(options, &["preconditions", "uid"]);
        let uid = str_at(&current, &["metadata", "uid"]).to_string();
        if !pre_uid.is_empty() && pre_uid != uid {
            return Err(ApiError::conflict(
                def,
                def.qualified_name(),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {pre_uid}, UID in object meta: {uid}"
                ),
            ));
        }
        let pre_rv = str_at(options, &["preconditions", "resourceVersion"]);
        let rv_now = str_at(&current, &["metadata", "resourceVersion"]);
        if !pre_rv.is_empty() && pre_rv != rv_now {
            return Err(ApiError::conflict(
                def,
                def.qualified_name(),
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {pre_rv}, ResourceVersion in object meta: {rv_now}"
                ),
            ));
        }
        if def.plural == "pods"
            && let Some(grace) = self.pod_grace_period(&current, options)
        {
            if current["metadata"]["deletionTimestamp"].is_string() {
                return Ok(Deleted::Object(current));
            }
            let deadline = k8s_openapi::jiff::Timestamp::now()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
                .map_or_else(
                    |_| now_timestamp(),
                    |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                );
            let mut next = current.clone();
            let rv = self.next_resource_version();
            if let Some(meta) = metadata_mut(&mut next) {
                meta.insert("deletionTimestamp".to_string(), json!(deadline));
                meta.insert("deletionGracePeriodSeconds".to_string(), json!(grace));
                meta.insert("resourceVersion".to_string(), json!(rv.to_string()));
            }
            self.objects.insert(key.clone(), next.clone());
            self.commit(EventType::Modified, key, next.clone(), Some(current));
            return Ok(Deleted::Object(next));
        }
        if def.plural == "namespaces" {
            let contained: Vec<ObjectKey> = self
                .objects
                .keys()
                .filter(|k| !k.namespace.is_empty() && k.namespace == name)
                .cloned()
                .collect();
            for k in contained {
                self.remove(k);
            }
        }
        let gone = self.remove(key).unwrap_or(current);
        if def.plural == "pods" || def.plural == "namespaces" {
            Ok(Deleted::Object(gone))
        } else {
            Ok(Deleted::Status(json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "group": def.group, "kind": def.plural, "uid": uid},
            })))
        }
    }

    /// The grace period a pod delete waits for, or None for an immediate
    /// delete (graceful deletion off, grace 0, unbound, finished, or its
    /// node gone).
    fn pod_grace_period(&self, pod: &Value, options: &Value) -> Option<i64> {
        if !self.graceful_pod_deletion {
            return None;
        }
        let node = str_at(pod, &["spec", "nodeName"]);
        let phase = str_at(pod, &["status", "phase"]);
        if node.is_empty() || phase == "Succeeded" || phase == "Failed" {
            return None;
        }
        let node_exists = ResourceDef::find("", "v1", "nodes")
            .is_some_and(|nodes| self.objects.contains_key(&Self::key(nodes, None, node)));
        if !node_exists {
            return None;
        }
        let grace = options["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        (grace > 0).then_some(grace)
    }

    fn remove(&mut self, key: ObjectKey) -> Option<Value> {
        let mut object = self.objects.remove(&key)?;
        let rv = self.next_resource_version();
        if let Some(meta) = metadata_mut(&mut object) {
            meta.insert("resourceVersion".to_string(), json!(rv.to_string()));
        }
        self.commit(EventType::Deleted, key, object.clone(), None);
        Some(object)
    }

    /// `pods/binding` create: sets `spec.nodeName`, copies the binding's
    /// annotations and marks `PodScheduled`. An already bound pod is 409.
    pub fn bind(&mut self, namespace: &str, name: &str, binding: &Value) -> Result<Value> {
        let pods = ResourceDef::find("", "v1", "pods")
            .ok_or_else(|| ApiError::BadRequest("pods are not served".to_string()))?;
        let binding_name = str_at(binding, &["metadata", "name"]);
        if !binding_name.is_empty() && binding_name != name {
            return Err(ApiError::BadRequest(
                "name in URL does not match name in Binding object".to_string(),
            ));
        }
        let target_kind = str_at(binding, &["target", "kind"]);
        let node = str_at(binding, &["target", "name"]);
        if node.is_empty() || (!target_kind.is_empty() && target_kind != "Node") {
            return Err(ApiError::Invalid {
                message: format!(
                    "Binding \"{name}\" is invalid: target.name: Required value: a Node name is required"
                ),
                kind: "Binding".to_string(),
                name: name.to_string(),
                causes: vec![("target.name".to_string(), "Required value".to_string())],
            });
        }
        let key = Self::key(pods, Some(namespace), name);
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(pods, name))?;
        let bound_to = str_at(&current, &["spec", "nodeName"]);
        if !bound_to.is_empty() {
            return Err(ApiError::conflict(
                pods,
                "pods/binding".to_string(),
                name,
                &format!("pod {name} is already assigned to node \"{bound_to}\""),
            ));
        }
        let mut next = current.clone();
        next["spec"]["nodeName"] = json!(node);
        if let Some(annotations) = binding["metadata"]["annotations"].as_object()
            && let Some(meta) = metadata_mut(&mut next)
        {
            let target = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(target) = target.as_object_mut() {
                for (k, v) in annotations {
                    target.insert(k.clone(), v.clone());
                }
            }
        }
        let scheduled = json!({
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": null,
            "lastTransitionTime": now_timestamp(),
        });
        let status = next
            .as_object_mut()
            .map(|m| m.entry("status").or_insert_with(|| json!({})));
        if let Some(status) = status.and_then(Value::as_object_mut) {
            let conditions = status.entry("conditions").or_insert_with(|| json!([]));
            if let Some(list) = conditions.as_array_mut() {
                list.retain(|c| c["type"] != "PodScheduled");
                list.push(scheduled);
            }
        }
        let rv = self.next_resource_version();
        if let Some(meta) = metadata_mut(&mut next) {
            meta.insert("resourceVersion".to_string(), json!(rv.to_string()));
        }
        self.objects.insert(key.clone(), next.clone());
        self.commit(EventType::Modified, key, next, Some(current));
        Ok(super::status::success(201))
    }

    /// Starts a watch on `def` in `namespace` (None = all).
    pub fn watch(
        &self,
        def: &ResourceDef,
        namespace: Option<&str>,
        start: WatchStart,
    ) -> Result<WatchFeed> {
        let live = self.changes.subscribe();
        let replay = match start {
            WatchStart::Now => self
                .objects
                .of_kind(def, namespace)
                .map(|(k, v)| {
                    let rv = str_at(v, &["metadata", "resourceVersion"])
                        .parse()
                        .unwrap_or(self.resource_version);
                    Arc::new(StoredEvent::new(
                        rv,
                        EventType::Added,
                        k.clone(),
                        v.clone(),
                        None,
                    ))
                })
                .collect(),
            WatchStart::After(rv) => {
                if rv < self.oldest_watchable {
                    return Err(ApiError::Expired {
                        requested: rv,
                        oldest: self.oldest_watchable,
                    });
                }
                self.history
                    .iter()
                    .filter(|e| e.resource_version > rv)
                    .cloned()
                    .collect()
            }
        };
        Ok(WatchFeed {
            replay,
            live,
            resource_version: self.resource_version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_apiserver::resources::RESOURCES;
    use crate::fake_apiserver::selector::{FieldSelector, LabelSelector};

    fn def(plural: &str) -> &'static ResourceDef {
        RESOURCES.iter().find(|r| r.plural == plural).unwrap()
    }

    fn pod(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}})
    }

    #[test]
    fn create_fills_system_fields_and_defaults() {
        let mut store = Store::new(100);
        let created = store
            .create(def("pods"), Some("default"), pod("p1"))
            .unwrap();
        assert_eq!(created["kind"], "Pod");
        assert_eq!(created["apiVersion"], "v1");
        assert_eq!(created["metadata"]["namespace"], "default");
        assert_eq!(created["status"]["phase"], "Pending");
        assert_eq!(created["status"]["qosClass"], "BestEffort");
        assert_eq!(created["spec"]["schedulerName"], "default-scheduler");
        assert_eq!(created["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(
            created["metadata"]["resourceVersion"],
            store.resource_version().to_string()
        );
        let again = store
            .create(def("pods"), Some("default"), pod("p1"))
            .unwrap_err();
        assert_eq!(again.code(), 409);
        assert_eq!(again.reason(), "AlreadyExists");
    }

    #[test]
    fn generate_name_appends_a_suffix() {
        let mut store = Store::new(100);
        let created = store
            .create(
                def("pods"),
                Some("default"),
                json!({"metadata": {"generateName": "job-"}}),
            )
            .unwrap();
        let name = created["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("job-") && name.len() == 9, "{name}");
        let missing = store
            .create(def("pods"), Some("default"), json!({"metadata": {}}))
            .unwrap_err();
        assert_eq!(missing.code(), 422);
    }

    #[test]
    fn create_in_a_missing_namespace_is_not_found() {
        let mut store = Store::new(100);
        let err = store
            .create(def("pods"), Some("nope"), pod("p"))
            .unwrap_err();
        assert_eq!(err.to_string(), "namespaces \"nope\" not found");
        let mismatch = store
            .create(
                def("pods"),
                Some("default"),
                json!({"metadata": {"name": "p", "namespace": "kube-system"}}),
            )
            .unwrap_err();
        assert_eq!(mismatch.code(), 400);
    }

    #[test]
    fn update_with_a_stale_resource_version_conflicts() {
        let mut store = Store::new(100);
        let created = store
            .create(def("nodes"), None, json!({"metadata": {"name": "n"}}))
            .unwrap();
        let mut first = created.clone();
        first["metadata"]["labels"] = json!({"a": "1"});
        store
            .update(def("nodes"), None, "n", first, Part::Main)
            .unwrap();
        let mut stale = created;
        stale["metadata"]["labels"] = json!({"a": "2"});
        let err = store
            .update(def("nodes"), None, "n", stale, Part::Main)
            .unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(err.reason(), "Conflict");
    }

    #[test]
    fn main_update_keeps_status_and_status_update_keeps_the_rest() {
        let mut store = Store::new(100);
        let created = store
            .create(def("pods"), Some("default"), pod("p"))
            .unwrap();
        let mut attempt = created.clone();
        attempt["status"]["phase"] = json!("Running");
        attempt["metadata"]["labels"] = json!({"x": "y"});
        let updated = store
            .update(
                def("pods"),
                Some("default"),
                "p",
                attempt.clone(),
                Part::Main,
            )
            .unwrap();
        assert_eq!(updated["status"]["phase"], "Pending");
        assert_eq!(updated["metadata"]["labels"]["x"], "y");
        attempt["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"].clone();
        attempt["metadata"]["labels"] = json!({"x": "z"});
        let status = store
            .update(def("pods"), Some("default"), "p", attempt, Part::Status)
            .unwrap();
        assert_eq!(status["status"]["phase"], "Running");
        assert_eq!(status["metadata"]["labels"]["x"], "y");
    }

    #[test]
    fn pod_spec_changes_other_than_images_are_forbidden() {
        let mut store = Store::new(100);
        let created = store
            .create(def("pods"), Some("default"), pod("p"))
            .unwrap();
        let mut moved = created.clone();
        moved["spec"]["nodeName"] = json!("n1");
        let err = store
            .update(def("pods"), Some("default"), "p", moved, Part::Main)
            .unwrap_err();
        assert_eq!(err.code(), 422);
        let mut image = created;
        image["spec"]["containers"][0]["image"] = json!("busybox:2");
        store
            .update(def("pods"), Some("default"), "p", image, Part::Main)
            .unwrap();
    }

    #[test]
    fn noop_update_does_not_bump_the_resource_version() {
        let mut store = Store::new(100);
        let created = store
            .create(def("nodes"), None, json!({"metadata": {"name": "n"}}))
            .unwrap();
        let rv = store.resource_version();
        let same = store
            .patch(
                def("nodes"),
                None,
                "n",
                PatchFormat::Merge,
                b"{\"metadata\":{}}",
                Part::Main,
            )
            .unwrap();
        assert_eq!(same, created);
        assert_eq!(store.resource_version(), rv);
    }

    #[test]
    fn patch_with_an_old_resource_version_conflicts() {
        let mut store = Store::new(100);
        let created = store
            .create(def("nodes"), None, json!({"metadata": {"name": "n"}}))
            .unwrap();
        let old_rv = created["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        store
            .patch(
                def("nodes"),
                None,
                "n",
                PatchFormat::Merge,
                br#"{"metadata":{"labels":{"a":"1"}}}"#,
                Part::Main,
            )
            .unwrap();
        let body =
            json!({"metadata": {"resourceVersion": old_rv, "labels": {"a": "2"}}}).to_string();
        let err = store
            .patch(
                def("nodes"),
                None,
                "n",
                PatchFormat::Merge,
                body.as_bytes(),
                Part::Main,
            )
            .unwrap_err();
        assert_eq!(err.code(), 409);
    }

    #[test]
    fn binding_sets_the_node_once() {
        let mut store = Store::new(100);
        store
            .create(def("pods"), Some("default"), pod("p"))
            .unwrap();
        let binding = json!({"metadata": {"name": "p", "annotations": {"k": "v"}}, "target": {"kind": "Node", "name": "n1"}});
        let ok = store.bind("default", "p", &binding).unwrap();
        assert_eq!(ok["status"], "Success");
        let bound = store.get(def("pods"), Some("default"), "p").unwrap();
        assert_eq!(bound["spec"]["nodeName"], "n1");
        assert_eq!(bound["metadata"]["annotations"]["k"], "v");
        assert_eq!(bound["status"]["conditions"][0]["type"], "PodScheduled");
        let err = store.bind("default", "p", &binding).unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.to_string(),
            "Operation cannot be fulfilled on pods/binding \"p\": pod p is already assigned to node \"n1\""
        );
        let unnamed = json!({"target": {"name": "n1"}});
        assert_eq!(
            store.bind("default", "zz", &unnamed).unwrap_err().code(),
            404
        );
        assert_eq!(
            store.bind("default", "zz", &binding).unwrap_err().code(),
            400
        );
    }

    #[test]
    fn delete_returns_pods_and_a_status_for_nodes() {
        let mut store = Store::new(100);
        store
            .create(def("pods"), Some("default"), pod("p"))
            .unwrap();
        store
            .create(def("nodes"), None, json!({"metadata": {"name": "n"}}))
            .unwrap();
        let Deleted::Object(p) = store
            .delete(def("pods"), Some("default"), "p", &json!({}))
            .unwrap()
        else {
            panic!("pods return the object");
        };
        assert_eq!(
            p["metadata"]["resourceVersion"],
            store.resource_version().to_string()
        );
        assert!(matches!(
            store.delete(def("nodes"), None, "n", &json!({})).unwrap(),
            Deleted::Status(_)
        ));
        assert_eq!(
            store
                .delete(def("nodes"), None, "n", &json!({}))
                .unwrap_err()
                .code(),
            404
        );
    }

    #[test]
    fn list_filters_by_namespace_and_selectors() {
        let mut store = Store::new(100);
        store
            .create(def("pods"), Some("default"), pod("a"))
            .unwrap();
        let mut b = pod("b");
        b["metadata"]["labels"] = json!({"app": "x"});
        store.create(def("pods"), Some("kube-system"), b).unwrap();
        let all = Selectors::default();
        assert_eq!(store.list(def("pods"), None, &all).0.len(), 2);
        assert_eq!(store.list(def("pods"), Some("default"), &all).0.len(), 1);
        let labelled = Selectors {
            labels: LabelSelector::parse("app=x").unwrap(),
            fields: FieldSelector::parse("metadata.namespace=kube-system", def("pods")).unwrap(),
        };
        let (items, _) = store.list(def("pods"), None, &labelled);
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["metadata"]["name"], "b");
    }

    #[test]
    fn watch_replays_history_and_expires_after_compaction() {
        let mut store = Store::new(3);
        let start = store.resource_version();
        for n in ["a", "b"] {
            store
                .create(def("nodes"), None, json!({"metadata": {"name": n}}))
                .unwrap();
        }
        let feed = store
            .watch(def("nodes"), None, WatchStart::After(start))
            .unwrap();
        assert_eq!(feed.replay.len(), 2);
        for n in ["c", "d", "e"] {
            store
                .create(def("nodes"), None, json!({"metadata": {"name": n}}))
                .unwrap();
        }
        // History holds 3 events: a watch from `start` lost "a" and "b".
        let err = store
            .watch(def("nodes"), None, WatchStart::After(start))
            .unwrap_err();
        assert_eq!(err.code(), 410);
        let rv = store.resource_version();
        store.compact();
        assert_eq!(
            store
                .watch(def("nodes"), None, WatchStart::After(rv - 1))
                .unwrap_err()
                .code(),
            410
        );
        assert!(
            store
                .watch(def("nodes"), None, WatchStart::After(rv))
                .unwrap()
                .replay
                .is_empty()
        );
        let now = store.watch(def("nodes"), None, WatchStart::Now).unwrap();
        assert_eq!(now.replay.len(), 5);
    }

    #[test]
    fn selector_transitions_become_added_and_deleted() {
        let mut store = Store::new(100);
        store
            .create(def("pods"), Some("default"), pod("p"))
            .unwrap();
        let unbound = Selectors {
            labels: LabelSelector::default(),
            fields: FieldSelector::parse("spec.nodeName=", def("pods")).unwrap(),
        };
        let bound = Selectors {
            labels: LabelSelector::default(),
            fields: FieldSelector::parse("spec.nodeName=n1", def("pods")).unwrap(),
        };
        let mut feed = store
            .watch(
                def("pods"),
                None,
                WatchStart::After(store.resource_version()),
            )
            .unwrap();
        store
            .bind("default", "p", &json!({"target": {"name": "n1"}}))
            .unwrap();
        let event = feed.live.try_recv().unwrap();
        assert_eq!(
            event.as_seen_by(def("pods"), None, &unbound),
            Some(EventType::Deleted)
        );
        assert_eq!(
            event.as_seen_by(def("pods"), None, &bound),
            Some(EventType::Added)
        );
        assert_eq!(event.as_seen_by(def("nodes"), None, &bound), None);
        assert_eq!(event.as_seen_by(def("pods"), Some("other"), &bound), None);
    }

    #[test]
    fn a_dry_run_copy_changes_nothing_and_notifies_nobody() {
        let store = Store::new(100);
        let mut feed = store
            .watch(
                def("nodes"),
                None,
                WatchStart::After(store.resource_version()),
            )
            .unwrap();
        let mut copy = store.dry_run_copy();
        let created = copy
            .create(def("nodes"), None, json!({"metadata": {"name": "n"}}))
            .unwrap();
        assert_eq!(created["metadata"]["name"], "n");
        assert_eq!(store.get(def("nodes"), None, "n").unwrap_err().code(), 404);
        assert!(feed.live.try_recv().is_err());
    }

    #[test]
    fn graceful_deletion_marks_bound_pods_until_a_grace_zero_delete() {
        let mut store = Store::new(100);
        store.set_graceful_pod_deletion(true);
        store
            .create(def("nodes"), None, json!({"metadata": {"name": "n1"}}))
            .unwrap();
        for name in ["bound", "orphan", "pending"] {
            store
                .create(def("pods"), Some("default"), pod(name))
                .unwrap();
        }
        store
            .bind("default", "bound", &json!({"target": {"name": "n1"}}))
            .unwrap();
        store
            .bind("default", "orphan", &json!({"target": {"name": "gone"}}))
            .unwrap();

        let Deleted::Object(marked) = store
            .delete(def("pods"), Some("default"), "bound", &json!({}))
            .unwrap()
        else {
            panic!("pods return the object");
        };
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 30);
        store.get(def("pods"), Some("default"), "bound").unwrap();
        // Repeating the delete changes nothing; grace 0 removes it.
        let rv = store.resource_version();
        store
            .delete(def("pods"), Some("default"), "bound", &json!({}))
            .unwrap();
        assert_eq!(store.resource_version(), rv);
        store
            .delete(
                def("pods"),
                Some("default"),
                "bound",
                &json!({"gracePeriodSeconds": 0}),
            )
            .unwrap();
        assert_eq!(
            store
                .get(def("pods"), Some("default"), "bound")
                .unwrap_err()
                .code(),
            404
        );
        // Unbound pods and pods on missing nodes go at once.
        for name in ["orphan", "pending"] {
            store
                .delete(def("pods"), Some("default"), name, &json!({}))
                .unwrap();
            assert_eq!(
                store
                    .get(def("pods"), Some("default"), name)
                    .unwrap_err()
                    .code(),
                404
            );
        }
    }

    #[test]
    fn deleting_a_namespace_deletes_its_objects() {
        let mut store = Store::new(100);
        store
            .create(
                def("namespaces"),
                None,
                json!({"metadata": {"name": "team"}}),
            )
            .unwrap();
        store.create(def("pods"), Some("team"), pod("p")).unwrap();
        store
            .delete(def("namespaces"), None, "team", &json!({}))
            .unwrap();
        assert_eq!(
            store
                .get(def("pods"), Some("team"), "p")
                .unwrap_err()
                .code(),
            404
        );
    }
}
