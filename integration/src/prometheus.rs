//! Prometheus text pages (the exposition format every component here
//! serves on `/metrics`), read as the benches and the harness need them:
//! a histogram summed over its label sets, and one series' value.

use std::collections::BTreeMap;

/// A Prometheus histogram's cumulative buckets, every series of the
/// family summed by upper bound.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Upper bound (seconds; `+Inf` last) → cumulative count.
    buckets: Vec<(f64, f64)>,
}

/// The buckets of `family` in a Prometheus text page, summed over every
/// label set (all results, all profiles).
#[must_use]
pub fn histogram(text: &str, family: &str) -> Histogram {
    let prefix = format!("{family}_bucket{{");
    let mut sums: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((labels, value)) = line.rsplit_once('}') else {
            continue;
        };
        // The label `le` itself, not the end of another (`profile="…"`).
        let Some(le) = labels
            .split(['{', ','])
            .find_map(|label| label.strip_prefix("le=\""))
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let le: f64 = match le {
            "+Inf" => f64::INFINITY,
            other => match other.parse() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let Some(count) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        // Bounds are finite or +Inf and never NaN: their bits order them.
        let entry = sums.entry(le.to_bits()).or_insert((le, 0.0));
        entry.1 += count;
    }
    let mut buckets: Vec<(f64, f64)> = sums.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Histogram { buckets }
}

/// The value of one series in a Prometheus text page, named with its
/// labels exactly as the page writes them (e.g.
/// `scheduler_cache_size{type="nodes"}`); `None` when the page
/// has no such series or its value does not parse.
#[must_use]
pub fn gauge(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

impl Histogram {
    /// Observations counted.
    #[must_use]
    pub fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |b| b.1)
    }

    /// The largest finite upper bound (0 without buckets).
    #[must_use]
    pub fn last_finite_bound(&self) -> f64 {
        self.buckets
            .iter()
            .rev()
            .find(|b| b.0.is_finite())
            .map_or(0.0, |b| b.0)
    }

    /// The `q` quantile as Prometheus' `histogram_quantile` computes it:
    /// linear inside the bucket it falls in (from 0 for the first); the
    /// largest finite bound when it falls in `+Inf`; 0 without observations.
    #[must_use]
    pub fn quantile(&self, q: f64) -> f64 {
        let total = self.count();
        if total <= 0.0 {
            return 0.0;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(bound, cumulative) in &self.buckets {
            if cumulative >= rank {
                if bound.is_infinite() {
                    return lower.0;
                }
                let inside = cumulative - lower.1;
                if inside <= 0.0 {
                    return bound;
                }
                return lower.0 + (bound - lower.0) * (rank - lower.1) / inside;
            }
            lower = (bound, cumulative);
        }
        lower.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ATTEMPTS: &str = "scheduler_scheduling_attempt_duration_seconds";
    const ABSENT: &str = "scheduler_framework_extension_point_duration_seconds";

    const PAGE: &str = r#"# HELP scheduler_scheduling_attempt_duration_seconds x
# TYPE scheduler_scheduling_attempt_duration_seconds histogram
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="scheduled",le="0.001"} 50
scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="scheduled",le="0.002"} 90
scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="scheduled",le="+Inf"} 100
scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="unschedulable",le="0.001"} 0
scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="unschedulable",le="0.002"} 10
scheduler_scheduling_attempt_duration_seconds_bucket{profile="a",result="unschedulable",le="+Inf"} 10
scheduler_scheduling_attempt_duration_seconds_sum{profile="a",result="scheduled"} 0.1
scheduler_scheduling_attempt_duration_seconds_count{profile="a",result="scheduled"} 100
"#;

    #[test]
    fn series_of_one_family_are_summed_by_bound() {
        let h = histogram(PAGE, ATTEMPTS);
        assert_eq!(
            h.buckets,
            vec![(0.001, 50.0), (0.002, 100.0), (f64::INFINITY, 110.0)]
        );
        assert!((h.count() - 110.0).abs() < f64::EPSILON);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_like_prometheus() {
        let h = histogram(PAGE, ATTEMPTS);
        // rank 55 of 110: 5 of the 50 in (1 ms, 2 ms].
        assert!((h.quantile(0.5) - 0.0011).abs() < 1e-12);
        // rank 27.5 of 110: inside the first bucket, from 0.
        assert!((h.quantile(0.25) - 0.00055).abs() < 1e-12);
        // rank 108.9 falls in +Inf: the largest finite bound.
        assert!((h.quantile(0.99) - 0.002).abs() < 1e-12);
        assert!((h.last_finite_bound() - 0.002).abs() < 1e-12);
    }

    #[test]
    fn a_gauge_is_read_by_its_exact_series() {
        let page = "# TYPE scheduler_cache_size gauge\n\
            scheduler_cache_size{type=\"assumed_pods\"} 0\n\
            scheduler_cache_size{type=\"nodes\"} 3\n\
            scheduler_cache_size{type=\"pods\"} 12 1700000000000\n";
        let series = |t: &str| format!("scheduler_cache_size{{type=\"{t}\"}}");
        assert_eq!(gauge(page, &series("nodes")), Some(3.0));
        // A timestamp after the value is not part of it.
        assert_eq!(gauge(page, &series("pods")), Some(12.0));
        assert_eq!(gauge(page, &series("images")), None);
        // A prefix of a series name is not that series.
        assert_eq!(gauge(page, "scheduler_cache_size"), None);
    }

    #[test]
    fn an_absent_family_has_no_observations_and_quantile_zero() {
        let h = histogram(PAGE, ABSENT);
        assert!(h.count().abs() < f64::EPSILON);
        assert!(h.quantile(0.99).abs() < f64::EPSILON);
    }
}
