//! The chaos soak's figures and its verdict. Pure: the soak records into a
//! [`Report`]; [`Report::failures`] names every must-be-0 figure that is not.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::fault::FaultKind;
use crate::checker;

/// How many examples a list-like figure prints.
const EXAMPLES: usize = 5;

/// A count with one example message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Group {
    /// How many.
    pub count: u64,
    /// The first message seen.
    pub example: String,
}

/// What the soak ran on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Header {
    /// `fake` or `real`.
    pub control_plane: String,
    /// Nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// GPU memory, MiB.
    pub gpu_memory_mib: u32,
    /// Slices per GPU.
    pub split_count: u32,
    /// The seed of the schedule.
    pub seed: u64,
    /// Length of the churn-and-fault phase, seconds.
    pub seconds: f64,
    /// Fault kinds injected.
    pub kinds: Vec<FaultKind>,
    /// Fault kinds left out, with why.
    pub disabled: Vec<(FaultKind, String)>,
}

/// The soak's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// What it ran on.
    pub header: Header,
    /// Pods the API server accepted.
    pub submitted: u64,
    /// Pod creations refused, by status.
    pub create_refused: BTreeMap<String, Group>,
    /// Pods that reached Running.
    pub ran: u64,
    /// Pods that failed, by reason.
    pub failed: BTreeMap<String, Group>,
    /// Pods the soak deleted (churn, and failed pods cleared away).
    pub deleted: u64,
    /// Deletions the API server refused (retried later).
    pub delete_refused: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// Starts after a kill that failed and were retried.
    pub revive_retries: u64,
    /// Checker runs.
    pub checks: u64,
    /// Checker runs skipped because a list failed.
    pub checks_skipped: u64,
    /// Distinct over-committed GPU resources the checker found (must be 0).
    pub overcommits: BTreeSet<String>,
    /// Distinct mismatched containers the checker found (must be 0).
    pub mismatches: BTreeSet<String>,
    /// Pods stuck (see [`super::tracker`]) (must be 0).
    pub stuck: Vec<String>,
    /// Pods that vanished without being deleted (must be 0).
    pub lost: Vec<String>,
    /// At the end, after the faults stopped: pods a fault-free cluster
    /// would still move on (must be 0), and the checker's unfinished pods
    /// (must be 0).
    pub unsettled_at_end: Vec<String>,
    /// The checker's unfinished pods at the end (must be 0).
    pub unfinished_at_end: Vec<String>,
    /// Seconds from the last fault's repair until settled.
    pub settle_seconds: f64,
    /// Pods Running at the end, and pods waiting unbound for room.
    pub at_end: (usize, usize),
}

fn add(groups: &mut BTreeMap<String, Group>, key: String, example: &str) {
    let g = groups.entry(key).or_default();
    g.count += 1;
    if g.example.is_empty() {
        example.clone_into(&mut g.example);
    }
}

impl Report {
    /// Counts a refused pod creation.
    pub fn create_refused(&mut self, key: String, message: &str) {
        add(&mut self.create_refused, key, message);
    }

    /// Counts a failed pod, grouped by its reason and the first clause of
    /// its message (the part before `;`, which names the cause, not the
    /// pod).
    pub fn failed(&mut self, reason: &str, message: &str) {
        let reason = if reason.is_empty() {
            "(no reason)"
        } else {
            reason
        };
        let cause: String = message
            .split(';')
            .next()
            .unwrap_or_default()
            .trim_start_matches("Pod was rejected: ")
            .chars()
            .take(80)
            .collect();
        add(&mut self.failed, format!("{reason}: {cause}"), message);
    }

    /// Takes in one checker run (its `unfinished` pods are in-flight
    /// mid-soak, so only the end's count, see [`Report::finish`]).
    pub fn record_check(&mut self, report: &checker::Report) {
        self.checks += 1;
        for o in &report.overcommitted {
            self.overcommits.insert(format!(
                "{} {} {}: {} > {}",
                o.node, o.uuid, o.what, o.used, o.capacity
            ));
        }
        for m in &report.mismatched {
            self.mismatches
                .insert(format!("{} {}: {}", m.pod, m.container, m.why));
        }
    }

    /// Takes in the last checker run, after the cluster settled.
    pub fn finish(&mut self, report: &checker::Report) {
        self.record_check(report);
        self.unfinished_at_end = report
            .unfinished
            .iter()
            .map(|m| format!("{}: {}", m.pod, m.why))
            .collect();
    }

    /// Every must-be-0 figure that is not 0, as `name: value`; empty when
    /// the soak passed.
    #[must_use]
    pub fn failures(&self) -> Vec<String> {
        [
            ("over-commits", self.overcommits.len()),
            ("mismatched containers", self.mismatches.len()),
            ("stuck pods", self.stuck.len()),
            ("lost pods", self.lost.len()),
            ("unsettled at the end", self.unsettled_at_end.len()),
            ("unfinished at the end", self.unfinished_at_end.len()),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{what}: {n}"))
        .collect()
    }

    /// Fault kinds that were enabled but never injected.
    #[must_use]
    pub fn kinds_not_injected(&self) -> Vec<FaultKind> {
        self.header
            .kinds
            .iter()
            .copied()
            .filter(|k| self.faults.get(k).copied().unwrap_or(0) == 0)
            .collect()
    }

    /// The report as Markdown.
    #[must_use]
    pub fn to_markdown(&self) -> String {
        let h = &self.header;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "### chaos soak: {} control plane, {} nodes × {} GPUs ({} MiB, split {}), seed {}, {:.0} s of faults",
            h.control_plane,
            h.nodes,
            h.gpus_per_node,
            h.gpu_memory_mib,
            h.split_count,
            h.seed,
            h.seconds
        );
        for (kind, why) in &h.disabled {
            let _ = writeln!(out, "\n{kind}: **not injected**, {why}.");
        }
        let _ = writeln!(out, "\n| figure | value |\n|---|---|");
        let mut row = |figure: &str, value: String| {
            let _ = writeln!(out, "| {figure} | {value} |");
        };
        row(
            "pods submitted (accepted by the API server)",
            self.submitted.to_string(),
        );
        for (key, g) in &self.create_refused {
            row(
                &format!("creations refused: {key}"),
                format!("{} (e.g. {})", g.count, one_line(&g.example)),
            );
        }
        row("pods that reached Running", self.ran.to_string());
        if self.failed.is_empty() {
            row("pods failed", "0".to_owned());
        }
        for (reason, g) in &self.failed {
            row(
                &format!("pods failed: {reason}"),
                format!("{} (e.g. {})", g.count, one_line(&g.example)),
            );
        }
        row("pods deleted by the soak", self.deleted.to_string());
        row(
            "deletions refused and retried",
            self.delete_refused.to_string(),
        );
        for kind in &h.kinds {
            row(
                &format!("faults: {kind}"),
                self.faults.get(kind).copied().unwrap_or(0).to_string(),
            );
        }
        row(
            "restarts after a kill retried",
            self.revive_retries.to_string(),
        );
        row(
            "checker runs (skipped: a list failed)",
            format!("{} ({})", self.checks, self.checks_skipped),
        );
        row("**over-commits** (must be 0)", listed(&self.overcommits));
        row(
            "**mismatched containers** (must be 0)",
            listed(&self.mismatches),
        );
        row("**pods stuck > 60 s** (must be 0)", listed(&self.stuck));
        row("**pods lost** (must be 0)", listed(&self.lost));
        row(
            "**unsettled at the end** (must be 0)",
            listed(&self.unsettled_at_end),
        );
        row(
            "**unfinished at the end, by the checker** (must be 0)",
            listed(&self.unfinished_at_end),
        );
        row(
            "seconds to settle once the faults stopped",
            format!("{:.1}", self.settle_seconds),
        );
        row(
            "at the end: Running / waiting for room",
            format!("{} / {}", self.at_end.0, self.at_end.1),
        );
        let failures = self.failures();
        let _ = writeln!(
            out,
            "\nverdict: {}",
            if failures.is_empty() {
                "PASS".to_owned()
            } else {
                format!("FAIL ({})", failures.join(", "))
            }
        );
        out
    }
}

fn one_line(s: &str) -> String {
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut short: String = s.chars().take(120).collect();
    if short.len() < s.len() {
        short.push('…');
    }
    short.replace('|', "\\|")
}

fn listed<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    let items: Vec<&String> = items.into_iter().collect();
    if items.is_empty() {
        return "0".to_owned();
    }
    let shown: Vec<String> = items.iter().take(EXAMPLES).map(|s| one_line(s)).collect();
    format!("{}: {}", items.len(), shown.join("; "))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::json;

    use super::*;

    /// Two pods holding 700 + 600 MiB of a 1000 MiB GPU, as the API server
    /// would show them.
    fn overcommitted_cluster() -> (Vec<Pod>, Vec<Node>) {
        let node = serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": {
            "hami.io/node-nvidia-register":
                r#"[{"id":"GPU-a","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-T4","health":true}]"#}}}))
        .unwrap();
        let pod = |name: &str, mem: u32| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "annotations": {
                    "hami.io/vgpu-devices-allocated": format!("GPU-a,NVIDIA,{mem},10:;"),
                    "hami.io/vgpu-devices-to-allocate": ";",
                    "hami.io/bind-phase": "success"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        (vec![pod("a", 700), pod("b", 600)], vec![node])
    }

    #[test]
    fn an_overcommitted_cluster_fails_the_soak() {
        let (pods, nodes) = overcommitted_cluster();
        let mut report = Report::default();
        report.record_check(&checker::check(&pods, &nodes));
        assert_eq!(report.failures(), ["over-commits: 1"]);
        // The same finding at the next check is the same over-commit.
        report.record_check(&checker::check(&pods, &nodes));
        assert_eq!(report.overcommits.len(), 1);
        assert!(
            report
                .to_markdown()
                .contains("verdict: FAIL (over-commits: 1)")
        );
    }

    #[test]
    fn a_clean_soak_passes_and_names_kinds_never_injected() {
        let (mut pods, nodes) = overcommitted_cluster();
        pods.pop();
        let mut report = Report {
            header: Header {
                kinds: vec![FaultKind::WatchCut, FaultKind::GpuUnhealthy],
                ..Header::default()
            },
            ..Report::default()
        };
        report.finish(&checker::check(&pods, &nodes));
        report.faults.insert(FaultKind::WatchCut, 3);
        assert!(report.failures().is_empty());
        assert_eq!(report.kinds_not_injected(), [FaultKind::GpuUnhealthy]);
        assert!(report.to_markdown().contains("verdict: PASS"));
    }

    #[test]
    fn stuck_lost_and_unfinished_pods_fail_the_soak() {
        let report = Report {
            stuck: vec!["p: bound but not running".into()],
            lost: vec!["q".into()],
            unfinished_at_end: vec!["r".into()],
            ..Report::default()
        };
        assert_eq!(
            report.failures(),
            ["stuck pods: 1", "lost pods: 1", "unfinished at the end: 1"]
        );
    }
}
