//! The fragmentation trend since start: a bounded series of samples, and
//! the task that takes one every few seconds.
//!
//! Owns the series; the model's owner is only asked, like any reader, for
//! a [`FragmentationSnapshot`]. Readers get the latest series through a
//! `watch` channel, never a lock.
//!
//! The series stays bounded without forgetting the start: when it is full,
//! every other sample is dropped and samples are kept half as often from
//! then on, so it always spans the whole run at a resolution that halves
//! each time it fills.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cache::model::FragmentationSnapshot;
use crate::cache::owner::ModelHandle;

/// How often the sampler asks the model.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples kept at most.
pub const CAPACITY: usize = 720;

/// One sample of the cluster's fragmentation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the sampler started.
    pub t: f64,
    /// Fragmented share of the idle capacity, 0 to 1.
    pub ratio: f64,
    /// Fragmented idle capacity, milli-GPU.
    pub milli: f64,
}

/// A bounded series that always spans the whole run (see the module doc).
#[derive(Debug, Clone)]
pub struct Trend {
    samples: Vec<Sample>,
    capacity: usize,
    /// Keep one sample in `stride`.
    stride: u32,
    /// Samples offered since the last one kept.
    skipped: u32,
}

impl Trend {
    /// An empty series of at most `capacity` samples (at least 2).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            samples: Vec::with_capacity(capacity.max(2)),
            capacity: capacity.max(2),
            stride: 1,
            skipped: 0,
        }
    }

    /// Offers a sample; it is kept when it falls on the current stride.
    pub fn push(&mut self, sample: Sample) {
        self.skipped += 1;
        if self.skipped < self.stride {
            return;
        }
        self.skipped = 0;
        if self.samples.len() == self.capacity {
            let mut i = 0;
            self.samples.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride = self.stride.saturating_mul(2);
        }
        self.samples.push(sample);
    }

    /// The samples kept, oldest first.
    #[must_use]
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }
}

/// What the sampler publishes: the latest snapshot and the series.
#[derive(Debug, Clone, Default)]
pub struct Latest {
    /// The last fragmentation read, with its time (seconds since start).
    pub snapshot: Option<(f64, Arc<FragmentationSnapshot>)>,
    /// The series.
    pub trend: Arc<[Sample]>,
}

/// Starts the sampler on the current runtime: it asks the model every
/// `every` and publishes the result; it stops when the model is gone.
#[must_use]
pub fn spawn(model: ModelHandle, every: Duration) -> watch::Receiver<Latest> {
    let (tx, rx) = watch::channel(Latest::default());
    tokio::spawn(async move {
        let start = Instant::now();
        let mut trend = Trend::new(CAPACITY);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Ok(snapshot) = model.fragmentation().await else {
                return;
            };
            let t = start.elapsed().as_secs_f64();
            trend.push(Sample {
                t,
                ratio: snapshot.ratio(),
                milli: snapshot.milli,
            });
            let latest = Latest {
                snapshot: Some((t, Arc::new(snapshot))),
                trend: trend.samples().into(),
            };
            if tx.send(latest).is_err() {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: u32) -> Sample {
        Sample {
            t: f64::from(t),
            ratio: 0.0,
            milli: 0.0,
        }
    }

    #[test]
    fn a_full_trend_halves_its_resolution_and_still_starts_at_the_start() {
        let mut trend = Trend::new(4);
        for t in 0..4 {
            trend.push(sample(t));
        }
        let times = |tr: &Trend| tr.samples().iter().map(|s| s.t).collect::<Vec<_>>();
        assert_eq!(times(&trend), [0.0, 1.0, 2.0, 3.0]);
        trend.push(sample(4));
        assert_eq!(times(&trend), [0.0, 2.0, 4.0]);
        // Every other sample from now on.
        trend.push(sample(5));
        trend.push(sample(6));
        assert_eq!(times(&trend), [0.0, 2.0, 4.0, 6.0]);
        for t in 7..100 {
            trend.push(sample(t));
        }
        assert!(trend.samples().len() <= 4);
        assert_eq!(trend.samples()[0].t, 0.0, "the start is never dropped");
    }
}
