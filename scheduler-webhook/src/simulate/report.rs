//! How replay results are shown: a readable table with per-policy means,
//! one JSON object per run, and an SVG chart of the allocation curves.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::simulate::replay::{IdleGpus, ReplayResult};

/// Errors drawing the chart.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// plotters failed (I/O or layout).
    #[error("drawing {path}: {message}")]
    Plot {
        /// Output file.
        path: String,
        /// plotters' message.
        message: String,
    },
    /// A result could not be serialised.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Results grouped by (policy, split count), in first-seen order.
fn groups(results: &[ReplayResult]) -> Vec<((String, u32), Vec<&ReplayResult>)> {
    let mut out: Vec<((String, u32), Vec<&ReplayResult>)> = Vec::new();
    for r in results {
        let key = (r.policy.clone(), r.split_count);
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(r),
            None => out.push((key, vec![r])),
        }
    }
    out
}

#[allow(clippy::cast_precision_loss)]
fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// The readable table: one row per run, then the mean over seeds per
/// policy and split count.
#[must_use]
pub fn table(results: &[ReplayResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:>5} {:>6} {:>8} {:>11} {:>8} {:>9} {:>7} {:>10}",
        "policy",
        "split",
        "seed",
        "alloc %",
        "unalloc GPU",
        "frag %",
        "scheduled",
        "failed",
        "gpu failed"
    );
    for r in results {
        let _ = write!(
            s,
            "{:<8} {:>5} {:>6} {:>8.2} {:>11.1}",
            r.policy,
            r.split_count,
            r.seed,
            100.0 * r.allocation_ratio,
            r.unallocated_gpus,
        );
        let _ = match r.fragmentation_ratio {
            // A replay: it placed pods.
            Some(f) => writeln!(
                s,
                " {:>8.2} {:>9} {:>7} {:>10}",
                100.0 * f,
                r.pods_scheduled,
                r.pods_failed,
                r.gpu_pods_failed
            ),
            // The bound places nothing.
            None => writeln!(s, " {:>8} {:>9} {:>7} {:>10}", "-", "-", "-", "-"),
        };
    }
    let Some(first) = results.first() else {
        return s;
    };
    let _ = writeln!(
        s,
        "\nmean over seeds ({} GPUs, arrived demand {:.0} %):",
        first.total_gpus,
        100.0 * mean(results.iter().map(|r| r.demand))
    );
    let _ = writeln!(
        s,
        "{:<8} {:>5} {:>6} {:>8} {:>11} {:>8}",
        "policy", "split", "seeds", "alloc %", "unalloc GPU", "frag %"
    );
    for ((policy, split), rs) in groups(results) {
        let _ = write!(
            s,
            "{:<8} {:>5} {:>6} {:>8.2} {:>11.1}",
            policy,
            split,
            rs.len(),
            100.0 * mean(rs.iter().map(|r| r.allocation_ratio)),
            mean(rs.iter().map(|r| r.unallocated_gpus)),
        );
        let frags: Vec<f64> = rs.iter().filter_map(|r| r.fragmentation_ratio).collect();
        let _ = if frags.is_empty() {
            writeln!(s, " {:>8}", "-")
        } else {
            writeln!(s, " {:>8.2}", 100.0 * mean(frags.into_iter()))
        };
    }
    idle_table(&mut s, results);
    s
}

/// Where the unallocated GPUs are at the end, per policy and split count
/// and per GPU model, mean over seeds (replays only; the bound places
/// nothing).
fn idle_table(s: &mut String, results: &[ReplayResult]) {
    let replays: Vec<&ReplayResult> = results.iter().filter(|r| r.idle.is_some()).collect();
    if replays.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\nunallocated GPUs at the end by GPU model and why, mean over seeds: each node's \
         idle GPUs split by the trace's GPU pods\n(usable: they would fit whole; \
         host-bound: they would fit the GPUs, not the free CPU or memory; slivers: \
         they would not fit the GPUs):"
    );
    let _ = writeln!(
        s,
        "{:<8} {:>5} {:<10} {:>8} {:>11} {:>8} {:>8}",
        "policy", "split", "model", "usable", "host-bound", "slivers", "total"
    );
    let owned: Vec<ReplayResult> = replays.into_iter().cloned().collect();
    for ((policy, split), rs) in groups(&owned) {
        let mut models: Vec<&String> = rs
            .iter()
            .flat_map(|r| r.idle.iter().flat_map(BTreeMap::keys))
            .collect();
        models.sort();
        models.dedup();
        let part = |m: &str, f: fn(&IdleGpus) -> f64| {
            mean(
                rs.iter()
                    .map(|r| r.idle.as_ref().and_then(|i| i.get(m)).map_or(0.0, f)),
            )
        };
        let mut sum = IdleGpus::default();
        for m in models {
            let row = IdleGpus {
                usable: part(m, |i| i.usable),
                host_bound: part(m, |i| i.host_bound),
                slivers: part(m, |i| i.slivers),
            };
            sum.usable += row.usable;
            sum.host_bound += row.host_bound;
            sum.slivers += row.slivers;
            idle_row(s, &policy, split, m, &row);
        }
        idle_row(s, &policy, split, "all", &sum);
        slices_row(s, &policy, split, &rs);
    }
}

/// The three idle slice sizes that leave the most GPUs unallocated, mean
/// over seeds.
fn slices_row(s: &mut String, policy: &str, split: u32, rs: &[&ReplayResult]) {
    let mut by_size: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    #[allow(clippy::cast_precision_loss)]
    let n = rs.len().max(1) as f64;
    for r in rs {
        for (&milli, &count) in r.slices.iter().flatten() {
            let e = by_size.entry(milli).or_default();
            #[allow(clippy::cast_precision_loss)]
            let count = count as f64;
            e.0 += count / n;
            e.1 += count * f64::from(milli) / 1000.0 / n;
        }
    }
    let mut top: Vec<(u32, (f64, f64))> = by_size.into_iter().collect();
    top.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
    let parts: Vec<String> = top
        .iter()
        .take(3)
        .map(|(milli, (cards, gpus))| format!("{milli} milli on {cards:.0} GPUs = {gpus:.1}"))
        .collect();
    if !parts.is_empty() {
        let _ = writeln!(
            s,
            "{policy:<8} {split:>5} largest idle slices: {}",
            parts.join("; ")
        );
    }
}

fn idle_row(s: &mut String, policy: &str, split: u32, model: &str, row: &IdleGpus) {
    let _ = writeln!(
        s,
        "{:<8} {:>5} {:<10} {:>8.1} {:>11.1} {:>8.1} {:>8.1}",
        policy,
        split,
        model,
        row.usable,
        row.host_bound,
        row.slivers,
        row.usable + row.host_bound + row.slivers
    );
}

/// One JSON object per run, one per line.
///
/// # Errors
/// Serialisation failure (not expected for these types).
pub fn json_lines(results: &[ReplayResult]) -> Result<String, ReportError> {
    let mut s = String::new();
    for r in results {
        s.push_str(&serde_json::to_string(r)?);
        s.push('\n');
    }
    Ok(s)
}

/// Draws the allocation curves (mean over seeds) of every policy and split
/// count on one SVG chart.
///
/// # Errors
/// plotters cannot write or lay out the chart.
pub fn plot(results: &[ReplayResult], path: &Path) -> Result<(), ReportError> {
    let err = |e: &dyn std::fmt::Display| ReportError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let max_x = results
        .iter()
        .flat_map(|r| r.curve.last())
        .map(|p| 100.0 * p[0])
        .fold(100.0_f64, f64::max)
        .ceil();
    let gpus = results.first().map_or(0, |r| r.total_gpus);
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("GPU allocation vs arrived demand ({gpus} GPUs, mean over seeds)"),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_x, 0.0..100.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("arrived GPU demand (% of capacity)")
        .y_desc("GPU allocation ratio (%)")
        .draw()
        .map_err(|e| err(&e))?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    for (i, ((policy, split), rs)) in groups(results).into_iter().enumerate() {
        let len = rs.iter().map(|r| r.curve.len()).min().unwrap_or(0);
        let points: Vec<(f64, f64)> = (0..len)
            .map(|k| {
                (
                    100.0 * mean(rs.iter().map(|r| r.curve[k][0])),
                    100.0 * mean(rs.iter().map(|r| r.curve[k][1])),
                )
            })
            .collect();
        let color = palette[i % palette.len()];
        let style = if split >= 100 {
            color.stroke_width(2)
        } else {
            color.stroke_width(1)
        };
        let final_alloc = 100.0 * mean(rs.iter().map(|r| r.allocation_ratio));
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(|e| err(&e))?
            .label(format!("{policy} split {split}: {final_alloc:.2} %"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Mean allocation ratio per (policy, split count), for callers that want
/// the summary as data.
#[must_use]
pub fn means(results: &[ReplayResult]) -> BTreeMap<(String, u32), f64> {
    groups(results)
        .into_iter()
        .map(|(k, rs)| (k, mean(rs.iter().map(|r| r.allocation_ratio))))
        .collect()
}
