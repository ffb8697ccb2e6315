//! Who sends the real kube-apiserver how many requests: its audit log
//! (`--audit-log-path`, one JSON event per line, [`POLICY`]), tallied by
//! client, verb and resource. The API server's own request counters do
//! not name the client; its audit events do (`user.username`, the
//! `userAgent` header).

use std::collections::BTreeMap;

use serde_json::Value;

/// The audit policy: every request, at `Metadata` level (who, what verb,
/// which object; no bodies), logged once, when its response completes.
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
";

/// One kind of request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RequestKind {
    /// The user (`sa:<namespace>:<name>` for a ServiceAccount) and, in
    /// brackets, the first word of its user agent (kube-scheduler and
    /// scheduler-webhook share a ServiceAccount in the chart).
    pub client: String,
    /// `get`, `list`, `watch`, `create`, `patch`, `update`, `delete`, …
    pub verb: String,
    /// `pods`, `pods/binding`, `nodes/status`, …, or the path of a
    /// non-resource request.
    pub resource: String,
}

/// What an audit log holds: requests of each kind, and how many of them
/// were answered 409 (conflict) or 429 (throttled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests of each kind.
    pub requests: BTreeMap<RequestKind, u64>,
    /// Of them, answered 409.
    pub conflicts: u64,
    /// Of them, answered 429.
    pub throttled: u64,
    /// Lines that were not an audit event (skipped).
    pub unreadable: u64,
}

impl Tally {
    /// Every request counted.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.requests.values().sum()
    }

    /// What was added since `before` (an earlier tally of the same log).
    #[must_use]
    pub fn since(&self, before: &Tally) -> Tally {
        let requests = self
            .requests
            .iter()
            .filter_map(|(kind, &n)| {
                let new = n.saturating_sub(before.requests.get(kind).copied().unwrap_or(0));
                (new > 0).then(|| (kind.clone(), new))
            })
            .collect();
        Tally {
            requests,
            conflicts: self.conflicts.saturating_sub(before.conflicts),
            throttled: self.throttled.saturating_sub(before.throttled),
            unreadable: self.unreadable.saturating_sub(before.unreadable),
        }
    }

    /// The kinds, most requests first (ties in kind order).
    #[must_use]
    pub fn busiest(&self) -> Vec<(&RequestKind, u64)> {
        let mut kinds: Vec<(&RequestKind, u64)> =
            self.requests.iter().map(|(k, &n)| (k, n)).collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        kinds
    }
}

/// Tallies an audit log's `ResponseComplete` events (other stages, e.g. a
/// panic, are not requests completed).
#[must_use]
pub fn tally(log: &str) -> Tally {
    let mut tally = Tally::default();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            tally.unreadable += 1;
            continue;
        };
        if event["kind"] != "Event" {
            tally.unreadable += 1;
            continue;
        }
        if event["stage"] != "ResponseComplete" {
            continue;
        }
        let user = event["user"]["username"].as_str().unwrap_or("?");
        let user = user
            .strip_prefix("system:serviceaccount:")
            .map_or_else(|| user.to_owned(), |sa| format!("sa:{sa}"));
        let agent = event["userAgent"]
            .as_str()
            .and_then(|a| a.split(['/', ' ']).next())
            .filter(|a| !a.is_empty())
            .unwrap_or("?");
        let object = &event["objectRef"];
        let resource = match (object["resource"].as_str(), object["subresource"].as_str()) {
            (Some(r), Some(sub)) => format!("{r}/{sub}"),
            (Some(r), None) => r.to_owned(),
            _ => event["requestURI"]
                .as_str()
                .map_or("?", |uri| uri.split('?').next().unwrap_or(uri))
                .to_owned(),
        };
        let kind = RequestKind {
            client: format!("{user} ({agent})"),
            verb: event["verb"].as_str().unwrap_or("?").to_owned(),
            resource,
        };
        *tally.requests.entry(kind).or_insert(0) += 1;
        match event["responseStatus"]["code"].as_u64() {
            Some(409) => tally.conflicts += 1,
            Some(429) => tally.throttled += 1,
            _ => {}
        }
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(stage: &str, user: &str, agent: &str, verb: &str, object: &str, code: u16) -> String {
        format!(
            r#"{{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"{stage}","requestURI":"/api/v1/nodes/n1?timeout=10s","verb":"{verb}","user":{{"username":"{user}"}},"userAgent":"{agent}","objectRef":{object},"responseStatus":{{"code":{code}}}}}"#
        )
    }

    #[test]
    fn requests_are_counted_by_client_verb_and_resource() {
        let sa = "system:serviceaccount:gpuslice-system:gpuslice-node-daemon";
        let node = r#"{"resource":"nodes","name":"n1","apiVersion":"v1"}"#;
        let binding = r#"{"resource":"pods","subresource":"binding","namespace":"d","name":"p"}"#;
        let log = [
            event("ResponseComplete", sa, "node-daemon/0.1", "get", node, 200),
            event("ResponseComplete", sa, "node-daemon/0.1", "get", node, 200),
            event("ResponseComplete", sa, "node-daemon/0.1", "patch", node, 409),
            event("ResponseComplete", "admin", "kube-rs/1.0 (x)", "create", binding, 201),
            event("Panic", "admin", "kube-rs", "get", node, 500),
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"get","requestURI":"/readyz?verbose","user":{"username":"system:anonymous"},"userAgent":"curl/8","responseStatus":{"code":429}}"#.to_owned(),
            "not json".to_owned(),
            String::new(),
        ]
        .join("\n");
        let t = tally(&log);
        let kind = |client: &str, verb: &str, resource: &str| RequestKind {
            client: client.into(),
            verb: verb.into(),
            resource: resource.into(),
        };
        let daemon = "sa:gpuslice-system:gpuslice-node-daemon (node-daemon)";
        assert_eq!(t.requests[&kind(daemon, "get", "nodes")], 2);
        assert_eq!(t.requests[&kind(daemon, "patch", "nodes")], 1);
        assert_eq!(
            t.requests[&kind("admin (kube-rs)", "create", "pods/binding")],
            1
        );
        assert_eq!(
            t.requests[&kind("system:anonymous (curl)", "get", "/readyz")],
            1
        );
        assert_eq!(t.total(), 5, "the panic stage is not a completed request");
        assert_eq!((t.conflicts, t.throttled, t.unreadable), (1, 1, 1));
        let busiest = t.busiest();
        assert_eq!(busiest[0], (&kind(daemon, "get", "nodes"), 2));
        assert_eq!(busiest.len(), 4);

        // Later lines of the same log, counted from the first tally on.
        let later = format!(
            "{log}\n{}",
            event("ResponseComplete", sa, "node-daemon/0.1", "get", node, 429)
        );
        let added = tally(&later).since(&t);
        assert_eq!(
            added.requests.into_iter().collect::<Vec<_>>(),
            vec![(kind(daemon, "get", "nodes"), 1)]
        );
        assert_eq!(
            (added.conflicts, added.throttled, added.unreadable),
            (0, 1, 0)
        );
    }
}
