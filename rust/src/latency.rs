//! Latency summaries: quantiles of recent request durations, for Prometheus summaries
//! (Triton's `--metrics-config summary_latencies=true`).
//!
//! Each window keeps the samples of the last [`MAX_AGE`] (at most [`MAX_SAMPLES`] of them,
//! oldest dropped first) and, for all time, their count and sum. Recording a request's five
//! durations takes one short lock, and only for models whose summaries are switched on.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How far back quantiles look (what Prometheus client libraries default to).
pub const MAX_AGE: Duration = Duration::from_mins(1);
/// The most samples a window holds.
pub const MAX_SAMPLES: usize = 8192;

/// A summary's state: quantiles of the recent window, count and sum since the start.
#[derive(Debug, Clone, PartialEq)]
pub struct SummarySnapshot {
    pub count: u64,
    pub sum: u64,
    /// `(quantile, value)`; the value is NaN while the window is empty.
    pub quantiles: Vec<(f64, f64)>,
}

/// Recent values of one duration (microseconds).
#[derive(Debug, Default)]
struct Samples {
    recent: VecDeque<(Instant, u64)>,
    count: u64,
    sum: u64,
}

impl Samples {
    fn record(&mut self, now: Instant, value: u64) {
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
        if self.recent.len() == MAX_SAMPLES {
            self.recent.pop_front();
        }
        self.recent.push_back((now, value));
    }

    /// Drops the samples older than [`MAX_AGE`]; the values left, and the count and sum.
    fn recent(&mut self, now: Instant) -> (Vec<u64>, u64, u64) {
        while self
            .recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > MAX_AGE)
        {
            self.recent.pop_front();
        }
        let values = self.recent.iter().map(|(_, v)| *v).collect();
        (values, self.count, self.sum)
    }
}

/// The count, sum and `quantiles` (nearest rank) of `values`.
fn summarize(mut values: Vec<u64>, count: u64, sum: u64, quantiles: &[f64]) -> SummarySnapshot {
    values.sort_unstable();
    let quantiles = quantiles
        .iter()
        .map(|&q| (q, nearest_rank(&values, q)))
        .collect();
    SummarySnapshot {
        count,
        sum,
        quantiles,
    }
}

/// The value at quantile `q` of sorted `values` (NaN when there are none).
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn nearest_rank(values: &[u64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    // Rank ceil(q * n), 1-based, clamped to the range: exact for the small counts here.
    let rank = (q.clamp(0.0, 1.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1] as f64
}

/// The summaries Triton exports per model version, in its order.
pub const SUMMARY_NAMES: [&str; 5] = [
    "request",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
];

/// The five summaries of one model version, in microseconds, behind one lock.
#[derive(Debug, Default)]
pub struct LatencySummaries {
    windows: Mutex<[Samples; 5]>,
}

impl LatencySummaries {
    /// Records one request's durations, in the order of [`SUMMARY_NAMES`].
    pub fn record(&self, now: Instant, values: [u64; 5]) {
        let mut windows = self.windows.lock();
        for (window, value) in windows.iter_mut().zip(values) {
            window.record(now, value);
        }
    }

    /// `(name, snapshot)` for each summary, in Triton's order. The lock is held only to copy
    /// the recent values out; sorting happens after.
    pub fn snapshot(&self, quantiles: &[f64]) -> [(&'static str, SummarySnapshot); 5] {
        self.snapshot_at(Instant::now(), quantiles)
    }

    fn snapshot_at(&self, now: Instant, quantiles: &[f64]) -> [(&'static str, SummarySnapshot); 5] {
        let recent: Vec<_> = self
            .windows
            .lock()
            .iter_mut()
            .map(|w| w.recent(now))
            .collect();
        let mut snapshots = recent
            .into_iter()
            .map(|(values, count, sum)| summarize(values, count, sum, quantiles));
        SUMMARY_NAMES.map(|name| (name, snapshots.next().expect("five windows")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records `value` as every one of the five durations.
    fn record_all(summaries: &LatencySummaries, now: Instant, value: u64) {
        summaries.record(now, [value; 5]);
    }

    fn first(summaries: &LatencySummaries, now: Instant, quantiles: &[f64]) -> SummarySnapshot {
        summaries.snapshot_at(now, quantiles)[0].1.clone()
    }

    #[test]
    fn each_duration_has_its_own_summary() {
        let summaries = LatencySummaries::default();
        let now = Instant::now();
        summaries.record(now, [1, 2, 3, 4, 5]);
        summaries.record(now, [10, 20, 30, 40, 50]);
        let snapshots = summaries.snapshot_at(now, &[1.0]);
        let names: Vec<_> = snapshots.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, SUMMARY_NAMES);
        let sums: Vec<_> = snapshots.iter().map(|(_, s)| s.sum).collect();
        assert_eq!(sums, [11, 22, 33, 44, 55]);
        let maxima: Vec<_> = snapshots.iter().map(|(_, s)| s.quantiles[0].1).collect();
        assert_eq!(maxima, [10.0, 20.0, 30.0, 40.0, 50.0]);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let window = LatencySummaries::default();
        let now = Instant::now();
        for value in 1..=100 {
            record_all(&window, now, value);
        }
        let snapshot = first(&window, now, &[0.5, 0.9, 0.99, 1.0]);
        assert_eq!(snapshot.count, 100);
        assert_eq!(snapshot.sum, 5050);
        let values: Vec<f64> = snapshot.quantiles.iter().map(|(_, v)| *v).collect();
        assert_eq!(values, [50.0, 90.0, 99.0, 100.0]);
    }

    #[test]
    fn old_samples_leave_the_window_but_not_the_totals() {
        let window = LatencySummaries::default();
        let start = Instant::now();
        record_all(&window, start, 1000);
        let later = start + MAX_AGE + Duration::from_secs(1);
        record_all(&window, later, 5);
        let snapshot = first(&window, later, &[0.5]);
        assert_eq!((snapshot.count, snapshot.sum), (2, 1005));
        assert!((snapshot.quantiles[0].1 - 5.0).abs() < f64::EPSILON);
        let empty = first(&LatencySummaries::default(), later, &[0.5]);
        assert!(empty.quantiles[0].1.is_nan());
    }

    #[test]
    fn a_window_holds_a_bounded_number_of_samples() {
        let window = LatencySummaries::default();
        let now = Instant::now();
        for value in 0..(MAX_SAMPLES as u64 + 10) {
            record_all(&window, now, value);
        }
        let snapshot = first(&window, now, &[0.0]);
        assert!((snapshot.quantiles[0].1 - 10.0).abs() < f64::EPSILON);
        assert_eq!(snapshot.count, MAX_SAMPLES as u64 + 10);
    }
}
