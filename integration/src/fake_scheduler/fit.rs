//! The filter and score plugins the fake runs before the extender, as
//! kube-scheduler computes them: effective pod requests (containers summed,
//! init containers as their peak, sidecars included, overhead added),
//! NodeUnschedulable, NodeAffinity (`nodeSelector` only), TaintToleration,
//! NodeResourcesFit (pods, cpu, memory, ephemeral-storage, extended
//! resources minus the ignored ones), LeastAllocated scoring, and the
//! `FitError` message (`0/3 nodes are available: 1 Insufficient cpu.`).
//!
//! Pure functions over k8s-openapi types; quantities in milli-units.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Node, Pod, Taint};

/// Resource amounts in milli-units (1 cpu = 1000, 1 byte of memory = 1000).
pub type Resources = BTreeMap<String, i128>;

/// A quantity string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {0:?}"
)]
pub struct QuantityError(pub String);

/// Parses a Kubernetes quantity (`"100m"`, `"1.5Gi"`, `"2"`, `"1e3"`) into
/// milli-units, rounding up as `resource.Quantity.MilliValue` does.
pub fn parse_milli(text: &str) -> Result<i128, QuantityError> {
    let bad = || QuantityError(text.to_string());
    let s = text.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    if number.is_empty() || number.matches('.').count() > 1 || number == "." {
        return Err(bad());
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let digits: i128 = format!("{int_part}{frac_part}")
        .parse()
        .map_err(|_| bad())?;
    let frac_len = u32::try_from(frac_part.len()).map_err(|_| bad())?;
    // value = digits * num / den
    let (mut num, mut den): (i128, i128) = (1, 10i128.checked_pow(frac_len).ok_or_else(bad)?);
    let pow2 = |e: u32| 1i128 << e;
    let pow10 = |e: u32| 10i128.pow(e);
    match suffix {
        "" => {}
        "n" => den = den.checked_mul(pow10(9)).ok_or_else(bad)?,
        "u" => den = den.checked_mul(pow10(6)).ok_or_else(bad)?,
        "m" => den = den.checked_mul(pow10(3)).ok_or_else(bad)?,
        "k" => num = pow10(3),
        "M" => num = pow10(6),
        "G" => num = pow10(9),
        "T" => num = pow10(12),
        "P" => num = pow10(15),
        "E" => num = pow10(18),
        "Ki" => num = pow2(10),
        "Mi" => num = pow2(20),
        "Gi" => num = pow2(30),
        "Ti" => num = pow2(40),
        "Pi" => num = pow2(50),
        "Ei" => num = pow2(60),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| bad())?;
            if e.unsigned_abs() > 30 {
                return Err(bad());
            }
            if e >= 0 {
                num = pow10(e.unsigned_abs());
            } else {
                den = den.checked_mul(pow10(e.unsigned_abs())).ok_or_else(bad)?;
            }
        }
        _ => return Err(bad()),
    }
    let scaled = digits
        .checked_mul(num)
        .and_then(|v| v.checked_mul(1000))
        .ok_or_else(bad)?;
    let milli = (scaled + den - 1) / den;
    Ok(if negative { -milli } else { milli })
}

/// One container's requests; a resource with only a limit counts the limit,
/// as the apiserver defaults requests from limits.
fn container_requests(container: &Container) -> Result<Resources, QuantityError> {
    let mut out = Resources::new();
    let Some(resources) = &container.resources else {
        return Ok(out);
    };
    if let Some(limits) = &resources.limits {
        for (name, q) in limits {
            out.insert(name.clone(), parse_milli(&q.0)?);
        }
    }
    if let Some(requests) = &resources.requests {
        for (name, q) in requests {
            out.insert(name.clone(), parse_milli(&q.0)?);
        }
    }
    Ok(out)
}

fn add_into(total: &mut Resources, more: &Resources) {
    for (name, v) in more {
        *total.entry(name.clone()).or_insert(0) += v;
    }
}

fn max_into(total: &mut Resources, other: &Resources) {
    for (name, v) in other {
        let e = total.entry(name.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

/// The pod's effective requests (`resourcehelper.PodRequests`): app
/// containers plus restartable init containers (sidecars), at least the
/// peak of each regular init container with the sidecars started before
/// it, plus `spec.overhead`.
pub fn pod_requests(pod: &Pod) -> Result<Resources, QuantityError> {
    let Some(spec) = &pod.spec else {
        return Ok(Resources::new());
    };
    let mut apps = Resources::new();
    for c in &spec.containers {
        add_into(&mut apps, &container_requests(c)?);
    }
    let mut sidecars = Resources::new();
    let mut init_peak = Resources::new();
    for c in spec.init_containers.iter().flatten() {
        let req = container_requests(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            add_into(&mut sidecars, &req);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut with_sidecars = sidecars.clone();
            add_into(&mut with_sidecars, &req);
            max_into(&mut init_peak, &with_sidecars);
        }
    }
    add_into(&mut apps, &sidecars);
    max_into(&mut apps, &init_peak);
    if let Some(overhead) = &spec.overhead {
        for (name, q) in overhead {
            *apps.entry(name.clone()).or_insert(0) += parse_milli(&q.0)?;
        }
    }
    Ok(apps)
}

/// Whether any container or init container requests or limits one of
/// `names` (the extender's `IsInterested`; all pods when `names` is empty).
pub fn requests_any(pod: &Pod, names: &BTreeSet<String>) -> bool {
    if names.is_empty() {
        return true;
    }
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .any(|r| {
            let in_map = |m: &Option<BTreeMap<String, _>>| {
                m.as_ref()
                    .is_some_and(|m| m.keys().any(|k| names.contains(k)))
            };
            in_map(&r.requests) || in_map(&r.limits)
        })
}

/// A node's `status.allocatable` in milli-units (unparsable values count 0).
pub fn allocatable(node: &Node) -> Resources {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| {
            a.iter()
                .map(|(k, q)| (k.clone(), parse_milli(&q.0).unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

/// What is already placed on a node: summed requests and pod count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeUsage {
    /// Summed effective requests of the node's non-terminal pods.
    pub requested: Resources,
    /// Number of such pods.
    pub pods: usize,
}

impl NodeUsage {
    /// Adds one pod's requests.
    pub fn add(&mut self, requests: &Resources) {
        add_into(&mut self.requested, requests);
        self.pods += 1;
    }

    /// Takes back one pod's requests that [`NodeUsage::add`] counted.
    pub fn take(&mut self, requests: &Resources) {
        for (name, v) in requests {
            *self.requested.entry(name.clone()).or_insert(0) -= v;
        }
        self.pods = self.pods.saturating_sub(1);
    }
}

fn tolerates(pod: &Pod, taint: &Taint) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations.into_iter().flatten().any(|t| {
        if t.effect
            .as_deref()
            .is_some_and(|e| !e.is_empty() && e != taint.effect)
        {
            return false;
        }
        if t.key
            .as_deref()
            .is_some_and(|k| !k.is_empty() && k != taint.key)
        {
            return false;
        }
        match t.operator.as_deref() {
            Some("Exists") => true,
            None | Some("") | Some("Equal") => {
                t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            Some(_) => false,
        }
    })
}

/// Runs the filter plugins for `pod` on `node`; an empty result means the
/// node fits. `ignored` are the extender's `ignoredByScheduler` resources.
pub fn filter_node(
    pod: &Pod,
    requests: &Resources,
    node: &Node,
    usage: &NodeUsage,
    ignored: &BTreeSet<String>,
) -> Vec<String> {
    let spec = node.spec.as_ref();
    // NodeUnschedulable
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        if !tolerates(pod, &taint) {
            return vec!["node(s) were unschedulable".into()];
        }
    }
    // NodeAffinity (nodeSelector)
    let labels = node.metadata.labels.as_ref();
    let selector = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref());
    if selector
        .into_iter()
        .flatten()
        .any(|(k, v)| labels.and_then(|l| l.get(k)) != Some(v))
    {
        return vec!["node(s) didn't match Pod's node affinity/selector".into()];
    }
    // TaintToleration
    for taint in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        if (taint.effect == "NoSchedule" || taint.effect == "NoExecute") && !tolerates(pod, taint) {
            return vec![format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.as_deref().unwrap_or("")
            )];
        }
    }
    // NodeResourcesFit
    let alloc = allocatable(node);
    let mut reasons = Vec::new();
    let allowed_pods = alloc.get("pods").copied().unwrap_or(0) / 1000;
    if i128::try_from(usage.pods + 1).unwrap_or(i128::MAX) > allowed_pods {
        reasons.push("Too many pods".to_string());
    }
    for (name, want) in requests {
        if *want <= 0 || name == "pods" || ignored.contains(name) {
            continue;
        }
        let free =
            alloc.get(name).copied().unwrap_or(0) - usage.requested.get(name).copied().unwrap_or(0);
        if *want > free {
            reasons.push(format!("Insufficient {name}"));
        }
    }
    reasons
}

/// LeastAllocated score (0..=100) over cpu and memory after placing the pod.
pub fn least_allocated_score(requests: &Resources, node: &Node, usage: &NodeUsage) -> i128 {
    let alloc = allocatable(node);
    let mut total = 0;
    for name in ["cpu", "memory"] {
        let capacity = alloc.get(name).copied().unwrap_or(0);
        if capacity <= 0 {
            continue;
        }
        let used = usage.requested.get(name).copied().unwrap_or(0)
            + requests.get(name).copied().unwrap_or(0);
        total += ((capacity - used).max(0) * 100) / capacity;
    }
    total / 2
}

/// kube-scheduler's `FitError` text: `0/N nodes are available: ` then the
/// reasons as a sorted histogram (`"2 Insufficient cpu"`), then `.`.
pub fn no_fit_message(total_nodes: usize, statuses: &BTreeMap<String, Vec<String>>) -> String {
    let mut histogram: BTreeMap<&str, usize> = BTreeMap::new();
    for reasons in statuses.values() {
        for reason in reasons {
            *histogram.entry(reason.as_str()).or_insert(0) += 1;
        }
    }
    let mut parts: Vec<String> = histogram
        .iter()
        .map(|(reason, n)| format!("{n} {reason}"))
        .collect();
    parts.sort();
    format!("0/{total_nodes} nodes are available: {}.", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn node(alloc: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata":{"name":"n"},"status":{"allocatable":alloc}}))
            .unwrap()
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_milli("100m").unwrap(), 100);
        assert_eq!(parse_milli("2").unwrap(), 2000);
        assert_eq!(parse_milli("1.5").unwrap(), 1500);
        assert_eq!(parse_milli("1Ki").unwrap(), 1_024_000);
        assert_eq!(parse_milli("1Gi").unwrap(), (1i128 << 30) * 1000);
        assert_eq!(parse_milli("1k").unwrap(), 1_000_000);
        assert_eq!(parse_milli("1e3").unwrap(), 1_000_000);
        assert_eq!(parse_milli("1n").unwrap(), 1, "rounds up");
        for bad in ["", "x", "1.2.3", "1Zi", ".", "1e99"] {
            assert!(parse_milli(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn effective_requests_take_init_peak_and_sidecars() {
        let p = pod(json!({"spec":{
            "initContainers":[
                {"name":"side","restartPolicy":"Always","resources":{"requests":{"cpu":"100m"}}},
                {"name":"init","resources":{"requests":{"cpu":"2","memory":"1Gi"}}}],
            "containers":[
                {"name":"a","resources":{"requests":{"cpu":"500m"},"limits":{"memory":"256Mi","x/y":"1"}}},
                {"name":"b","resources":{"requests":{"cpu":"250m"}}}],
            "overhead":{"cpu":"10m"}}}));
        let r = pod_requests(&p).unwrap();
        // init 2000 + sidecar 100 = 2100 > apps 750 + sidecar 100; + 10 overhead
        assert_eq!(r["cpu"], 2110);
        assert_eq!(r["memory"], (1i128 << 30) * 1000);
        assert_eq!(r["x/y"], 1000, "limit-only resource counts");
    }

    #[test]
    fn fit_reports_each_insufficient_resource_and_skips_ignored() {
        let p = pod(
            json!({"spec":{"containers":[{"name":"a","resources":{"requests":
            {"cpu":"2","memory":"1Gi","nvidia.com/gpu":"1","example.com/foo":"1"}}}]}}),
        );
        let req = pod_requests(&p).unwrap();
        let n = node(json!({"cpu":"4","memory":"2Gi","pods":"110"}));
        let mut usage = NodeUsage::default();
        usage.add(
            &pod_requests(&pod(json!({"spec":{"containers":[{"name":"a",
            "resources":{"requests":{"cpu":"3"}}}]}})))
            .unwrap(),
        );
        let ignored: BTreeSet<String> = ["nvidia.com/gpu".to_string()].into();
        assert_eq!(
            filter_node(&p, &req, &n, &usage, &ignored),
            vec!["Insufficient cpu", "Insufficient example.com/foo"]
        );
        assert!(
            filter_node(&p, &req, &n, &NodeUsage::default(), &ignored)
                .contains(&"Insufficient example.com/foo".to_string())
        );
        let full = node(json!({"cpu":"4","memory":"2Gi","pods":"1"}));
        assert_eq!(
            filter_node(&p, &BTreeMap::new(), &full, &usage, &ignored),
            vec!["Too many pods"]
        );
    }

    #[test]
    fn unschedulable_selector_and_taints() {
        let p = pod(json!({"spec":{"containers":[],"nodeSelector":{"gpu":"yes"},
            "tolerations":[{"key":"a","operator":"Exists"}]}}));
        let mut n: Node =
            serde_json::from_value(json!({"metadata":{"name":"n","labels":{"gpu":"yes"}},
            "spec":{"taints":[{"key":"a","effect":"NoSchedule"}]},
            "status":{"allocatable":{"pods":"10"}}}))
            .unwrap();
        let none = BTreeSet::new();
        assert!(filter_node(&p, &BTreeMap::new(), &n, &NodeUsage::default(), &none).is_empty());
        n.spec
            .as_mut()
            .unwrap()
            .taints
            .as_mut()
            .unwrap()
            .push(Taint {
                key: "b".into(),
                value: Some("v".into()),
                effect: "NoExecute".into(),
                ..Taint::default()
            });
        assert_eq!(
            filter_node(&p, &BTreeMap::new(), &n, &NodeUsage::default(), &none),
            vec!["node(s) had untolerated taint {b: v}"]
        );
        n.metadata.labels = None;
        assert_eq!(
            filter_node(&p, &BTreeMap::new(), &n, &NodeUsage::default(), &none),
            vec!["node(s) didn't match Pod's node affinity/selector"]
        );
        n.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_eq!(
            filter_node(&p, &BTreeMap::new(), &n, &NodeUsage::default(), &none),
            vec!["node(s) were unschedulable"]
        );
    }

    #[test]
    fn interest_and_messages() {
        let p = pod(
            json!({"spec":{"containers":[{"name":"a","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}),
        );
        let gpu: BTreeSet<String> = ["nvidia.com/gpu".to_string()].into();
        let other: BTreeSet<String> = ["x/y".to_string()].into();
        assert!(requests_any(&p, &gpu));
        assert!(!requests_any(&p, &other));
        assert!(requests_any(&p, &BTreeSet::new()));
        let statuses: BTreeMap<String, Vec<String>> = [
            ("a".to_string(), vec!["Insufficient memory".to_string()]),
            (
                "b".to_string(),
                vec![
                    "Insufficient cpu".to_string(),
                    "Insufficient memory".to_string(),
                ],
            ),
            (
                "c".to_string(),
                vec!["2/2 CardInsufficientMemory".to_string()],
            ),
        ]
        .into();
        assert_eq!(
            no_fit_message(3, &statuses),
            "0/3 nodes are available: 1 2/2 CardInsufficientMemory, 1 Insufficient cpu, 2 Insufficient memory."
        );
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node() {
        let req = pod_requests(&pod(json!({"spec":{"containers":[{"name":"a","resources":{"requests":{"cpu":"1","memory":"1Gi"}}}]}}))).unwrap();
        let n = node(json!({"cpu":"4","memory":"4Gi","pods":"10"}));
        let mut busy = NodeUsage::default();
        busy.add(&req);
        assert!(
            least_allocated_score(&req, &n, &NodeUsage::default())
                > least_allocated_score(&req, &n, &busy)
        );
    }
}
