//! The test-control side of the fake kube-apiserver: injected faults (fail
//! or delay the next N requests matching a method and path prefix), the
//! "cut every open watch" signal, counters tests can wait on, and a bounded
//! log of served requests.
//!
//! Owns no objects and no HTTP; `http` consults it on every request.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// How many served requests the log keeps.
const REQUEST_LOG_LIMIT: usize = 10_000;

/// One fault rule: the next `count` requests that match get the fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultSpec {
    /// HTTP method to match (`GET`, `PATCH`, ...); `None` matches any.
    #[serde(default)]
    pub method: Option<String>,
    /// Prefix of the request path (without the query) to match.
    #[serde(default)]
    pub path_prefix: String,
    /// `Some(true)`: only watch requests; `Some(false)`: only non-watch
    /// requests; `None`: both.
    #[serde(default)]
    pub watch: Option<bool>,
    /// How many matching requests get the fault.
    pub count: u32,
    /// Answer with this HTTP status (as a Status object) instead of
    /// serving the request.
    #[serde(default)]
    pub status: Option<u16>,
    /// Message of that Status.
    #[serde(default)]
    pub message: Option<String>,
    /// Hold the request this long before handling (or failing) it.
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

impl FaultSpec {
    /// Fail the next `count` requests with `method` under `path_prefix`.
    pub fn fail(method: &str, path_prefix: &str, count: u32, status: u16) -> Self {
        Self {
            method: Some(method.to_string()),
            path_prefix: path_prefix.to_string(),
            watch: None,
            count,
            status: Some(status),
            message: None,
            delay_ms: None,
        }
    }

    /// Delay the next `count` requests with `method` under `path_prefix`.
    pub fn delay(method: &str, path_prefix: &str, count: u32, delay: Duration) -> Self {
        Self {
            method: Some(method.to_string()),
            path_prefix: path_prefix.to_string(),
            watch: None,
            count,
            status: None,
            message: None,
            delay_ms: Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// Restrict the rule to watch (`true`) or non-watch (`false`) requests.
    pub fn only_watches(mut self, watch: bool) -> Self {
        self.watch = Some(watch);
        self
    }

    fn matches(&self, method: &str, path: &str, is_watch: bool) -> bool {
        self.count > 0
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && path.starts_with(&self.path_prefix)
            && self.watch.is_none_or(|w| w == is_watch)
    }
}

/// What the matching rules do to one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Total delay to apply first.
    pub delay: Duration,
    /// Fail with this status and message after the delay.
    pub fail: Option<(u16, String)>,
}

/// Counters tests can wait on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// API requests served (admin routes excluded).
    pub requests: u64,
    /// Non-watch list requests served.
    pub lists: u64,
    /// Watches started (including ones answered with a 410 event).
    pub watches_started: u64,
    /// Watches currently streaming.
    pub open_watches: u64,
    /// 410 Expired ERROR events sent.
    pub expired_sent: u64,
    /// BOOKMARK events sent.
    pub bookmarks_sent: u64,
    /// Requests that got an injected fault (failure or delay).
    pub faults_fired: u64,
    /// Times every open watch was cut.
    pub watch_cuts: u64,
}

/// One served request, for assertions on what a client did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Status code answered (200 for a watch stream).
    pub status: u16,
}

/// Faults, watch cutting, counters and the request log.
#[derive(Debug)]
pub struct Control {
    faults: Mutex<Vec<FaultSpec>>,
    log: Mutex<VecDeque<RequestRecord>>,
    stats: watch::Sender<Stats>,
    cuts: watch::Sender<u64>,
}

impl Default for Control {
    fn default() -> Self {
        Self::new()
    }
}

impl Control {
    /// No faults, zero counters.
    pub fn new() -> Self {
        Self {
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(VecDeque::new()),
            stats: watch::Sender::new(Stats::default()),
            cuts: watch::Sender::new(0),
        }
    }

    /// Adds a fault rule.
    pub fn add_fault(&self, spec: FaultSpec) {
        if let Ok(mut faults) = self.faults.lock() {
            faults.push(spec);
        }
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        if let Ok(mut faults) = self.faults.lock() {
            faults.clear();
        }
    }

    /// Consumes one use of every rule matching the request and says what
    /// to do: delays add up, the first failing rule decides the status.
    pub fn verdict(&self, method: &str, path: &str, is_watch: bool) -> Verdict {
        let mut verdict = Verdict::default();
        let Ok(mut faults) = self.faults.lock() else {
            return verdict;
        };
        for rule in faults
            .iter_mut()
            .filter(|r| r.matches(method, path, is_watch))
        {
            rule.count -= 1;
            verdict.delay += Duration::from_millis(rule.delay_ms.unwrap_or(0));
            if verdict.fail.is_none()
                && let Some(code) = rule.status
            {
                let message = rule
                    .message
                    .clone()
                    .unwrap_or_else(|| format!("injected fault: {code}"));
                verdict.fail = Some((code, message));
            }
        }
        faults.retain(|r| r.count > 0);
        if verdict != Verdict::default() {
            self.update(|s| s.faults_fired += 1);
        }
        verdict
    }

    /// Ends every open watch stream (clients see the stream end).
    pub fn cut_watches(&self) {
        self.cuts.send_modify(|n| *n += 1);
        self.update(|s| s.watch_cuts += 1);
    }

    /// A receiver that changes when watches are cut.
    pub fn cut_signal(&self) -> watch::Receiver<u64> {
        self.cuts.subscribe()
    }

    /// Changes the counters and wakes waiters.
    pub fn update(&self, change: impl FnOnce(&mut Stats)) {
        self.stats.send_modify(change);
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.stats.borrow().clone()
    }

    /// A receiver of counter changes.
    pub fn stats_signal(&self) -> watch::Receiver<Stats> {
        self.stats.subscribe()
    }

    /// Appends to the request log.
    pub fn record(&self, record: RequestRecord) {
        if let Ok(mut log) = self.log.lock() {
            if log.len() >= REQUEST_LOG_LIMIT {
                log.pop_front();
            }
            log.push_back(record);
        }
    }

    /// The request log, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.log
            .lock()
            .map(|log| log.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_fires_count_times_on_matching_requests_only() {
        let control = Control::new();
        control.add_fault(FaultSpec::fail("PATCH", "/api/v1/nodes", 2, 500));
        assert_eq!(
            control.verdict("GET", "/api/v1/nodes/a", false),
            Verdict::default()
        );
        assert_eq!(
            control.verdict("PATCH", "/api/v1/pods", false),
            Verdict::default()
        );
        for _ in 0..2 {
            let v = control.verdict("PATCH", "/api/v1/nodes/a", false);
            assert_eq!(v.fail.map(|f| f.0), Some(500));
        }
        assert_eq!(
            control.verdict("PATCH", "/api/v1/nodes/a", false),
            Verdict::default()
        );
        assert_eq!(control.stats().faults_fired, 2);
    }

    #[test]
    fn watch_only_faults_skip_lists_and_delays_add_up() {
        let control = Control::new();
        control.add_fault(FaultSpec::fail("GET", "/api/v1/pods", 1, 503).only_watches(true));
        control.add_fault(FaultSpec::delay("GET", "/api", 5, Duration::from_millis(7)));
        let list = control.verdict("GET", "/api/v1/pods", false);
        assert_eq!(list.fail, None);
        assert_eq!(list.delay, Duration::from_millis(7));
        let watch = control.verdict("GET", "/api/v1/pods", true);
        assert_eq!(watch.fail.map(|f| f.0), Some(503));
        control.clear_faults();
        assert_eq!(
            control.verdict("GET", "/api/v1/pods", true),
            Verdict::default()
        );
    }

    #[test]
    fn fault_specs_parse_from_the_admin_json() {
        let spec: FaultSpec = serde_json::from_str(
            r#"{"method":"GET","pathPrefix":"/api/v1/pods","watch":true,"count":3,"status":410}"#,
        )
        .unwrap();
        assert_eq!(spec.count, 3);
        assert_eq!(spec.watch, Some(true));
        assert_eq!(spec.status, Some(410));
    }
}
