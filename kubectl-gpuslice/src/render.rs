//! Tables for a person, and JSON/YAML for a program (pure: views in, text
//! out). Colours only when asked to (a terminal, and `NO_COLOR` unset).

use std::fmt::Write as _;

use serde::Serialize;

use crate::inventory::{Gpu, NodeSummary, PodSummary};
use crate::why::Why;

/// How to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table.
    Table,
    /// A table with more columns.
    Wide,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Serializes `value` as JSON or YAML.
///
/// # Errors
/// The serializer failed (it does not for these types).
pub fn structured<T: Serialize>(value: &T, output: Output) -> anyhow::Result<String> {
    Ok(match output {
        Output::Yaml => serde_saphyr::to_string(value)?,
        _ => serde_json::to_string_pretty(value)? + "\n",
    })
}

/// A fixed-width usage bar with the percentage, coloured green, yellow or
/// red when `colour` is on.
#[must_use]
pub fn bar(used: u64, total: u64, colour: bool) -> String {
    const WIDTH: u64 = 10;
    let percent = (used * 100).checked_div(total).unwrap_or(0);
    let filled =
        usize::try_from((used * WIDTH).checked_div(total).unwrap_or(0).min(WIDTH)).unwrap_or(0);
    let body = format!(
        "{}{}",
        "#".repeat(filled),
        ".".repeat(usize::try_from(WIDTH).unwrap_or(10) - filled)
    );
    let text = format!("[{body}] {percent:>3}%");
    if !colour {
        return text;
    }
    let code = match percent {
        0..=59 => "32",
        60..=89 => "33",
        _ => "31",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// Lays out rows under a header, columns padded to their widest cell
/// (ANSI colour codes do not count towards a width).
#[must_use]
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let visible = |s: &str| {
        let mut n = 0;
        let mut in_escape = false;
        for c in s.chars() {
            match (in_escape, c) {
                (false, '\x1b') => in_escape = true,
                (true, 'm') => in_escape = false,
                (true, _) => {}
                (false, _) => n += 1,
            }
        }
        n
    };
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(visible(cell));
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - visible(cell) + 3;
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `kubectl gpuslice top nodes`.
#[must_use]
pub fn nodes(nodes: &[NodeSummary], output: Output, colour: bool) -> String {
    let wide = output == Output::Wide;
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let mut row = vec![
                n.name.clone(),
                n.gpus.to_string(),
                format!("{}/{} MiB", n.used_memory_mib, n.memory_mib),
                bar(n.used_memory_mib, n.memory_mib, colour),
                format!("{}/{}", n.used_cores, n.cores),
                format!("{}/{}", n.used_slots, n.slots),
                n.unhealthy.to_string(),
            ];
            if wide {
                row.push(n.error.clone().unwrap_or_default());
            }
            row
        })
        .collect();
    let mut header = vec![
        "NODE",
        "GPUS",
        "MEMORY",
        "MEMORY%",
        "CORES",
        "SLOTS",
        "UNHEALTHY",
    ];
    if wide {
        header.push("ERROR");
    }
    table(&header, &rows)
}

/// `kubectl gpuslice top gpus`.
#[must_use]
pub fn gpus(gpus: &[Gpu], output: Output, colour: bool) -> String {
    let wide = output == Output::Wide;
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .map(|g| {
            let pods = g
                .holders
                .iter()
                .map(|h| {
                    format!(
                        "{}/{} ({} MiB, {}%)",
                        h.namespace, h.name, h.memory_mib, h.cores
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let mut row = vec![g.node.clone(), g.index.to_string()];
            if wide {
                row.push(g.uuid.clone());
            }
            row.extend([
                g.model.clone(),
                if g.healthy { "yes" } else { "NO" }.to_owned(),
                bar(g.used_memory_mib, g.memory_mib, colour),
                bar(g.used_cores, g.cores, colour),
                format!("{}/{}", g.used_slots, g.slots),
                if pods.is_empty() {
                    "-".to_owned()
                } else {
                    pods
                },
            ]);
            row
        })
        .collect();
    let mut header = vec!["NODE", "GPU"];
    if wide {
        header.push("UUID");
    }
    header.extend(["MODEL", "HEALTHY", "MEMORY", "CORES", "SLOTS", "PODS"]);
    table(&header, &rows)
}

/// `kubectl gpuslice top pods`.
#[must_use]
pub fn pods(pods: &[PodSummary], output: Output) -> String {
    let wide = output == Output::Wide;
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            let mut row = vec![
                p.namespace.clone(),
                p.name.clone(),
                p.phase.clone(),
                p.node.clone().unwrap_or_else(|| "-".to_owned()),
                p.gpus.len().to_string(),
                format!("{} MiB", p.memory_mib),
                p.cores.to_string(),
                p.bind_phase.clone().unwrap_or_else(|| "-".to_owned()),
                p.allocating_seconds
                    .map_or_else(|| "-".to_owned(), |s| format!("{s}s")),
            ];
            if wide {
                row.push(p.gpus.join(","));
            }
            row
        })
        .collect();
    let mut header = vec![
        "NAMESPACE",
        "NAME",
        "PHASE",
        "NODE",
        "GPUS",
        "MEMORY",
        "CORES",
        "BIND-PHASE",
        "ALLOCATING",
    ];
    if wide {
        header.push("GPU-UUIDS");
    }
    table(&header, &rows)
}

/// `kubectl gpuslice why POD`.
#[must_use]
pub fn why(namespace: &str, name: &str, why: &Why) -> String {
    let mut out = String::new();
    match why {
        Why::Bound {
            node,
            bind_phase,
            slices,
            scheduler_said,
            policies,
        } => {
            let _ = writeln!(
                out,
                "{namespace}/{name} is on node {node} (bind-phase {}).",
                bind_phase.as_deref().unwrap_or("unknown")
            );
            for s in slices {
                let _ = writeln!(
                    out,
                    "  container {}: {} MiB, {}% of {}",
                    s.container, s.memory_mib, s.cores, s.uuid
                );
            }
            if let Some(said) = scheduler_said {
                let _ = writeln!(out, "The GPU scheduler said: {said}");
            }
            for (k, v) in policies {
                let _ = writeln!(out, "  asked: {k}={v}");
            }
        }
        Why::Pending {
            reasons,
            candidates,
            kube_scheduler_said,
            no_events,
        } => {
            let _ = writeln!(out, "{namespace}/{name} is not placed.");
            if *no_events {
                let _ = writeln!(
                    out,
                    "No event names it yet: the scheduler has not tried it (is its schedulerName a gpuslice/HAMi scheduler?)."
                );
            }
            if !reasons.is_empty() {
                let _ = writeln!(out, "The GPU scheduler refused {candidates} node(s):");
                for r in reasons {
                    let _ = writeln!(out, "  {} node(s): {}", r.nodes, r.reason);
                }
            }
            if let Some(said) = kube_scheduler_said {
                let _ = writeln!(out, "kube-scheduler said: {said}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_and_colour_only_when_asked() {
        assert_eq!(bar(0, 0, false), "[..........]   0%");
        assert_eq!(bar(5, 10, false), "[#####.....]  50%");
        assert_eq!(bar(20, 10, false), "[##########] 200%");
        assert!(bar(9, 10, true).starts_with("\x1b[31m"));
    }

    #[test]
    fn columns_line_up_ignoring_colour_codes() {
        let text = table(
            &["A", "B"],
            &[
                vec![bar(1, 2, true), "x".into()],
                vec!["short".into(), "y".into()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        let col = |l: &str| l.rfind(['B', 'x', 'y']).unwrap();
        assert_eq!(col(lines[2]), col(lines[0]));
        assert_eq!(lines[1].matches("\x1b[").count(), 2);
    }
}
