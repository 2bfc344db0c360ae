//! Latency summaries: quantiles of recent request durations, for Prometheus summaries
//! (Triton's `--metrics-config summary_latencies=true`).
//!
//! Each window keeps the samples of the last [`MAX_AGE`] (at most [`MAX_SAMPLES`] of them,
//! oldest dropped first) and, for all time, their count and sum. Recording takes a short lock
//! once per request, and only for models whose summaries are switched on.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How far back quantiles look (what Prometheus client libraries default to).
pub const MAX_AGE: Duration = Duration::from_secs(60);
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

#[derive(Debug, Default)]
struct Samples {
    recent: VecDeque<(Instant, u64)>,
    count: u64,
    sum: u64,
}

/// Recent values of one duration (microseconds).
#[derive(Debug, Default)]
pub struct LatencyWindow {
    samples: Mutex<Samples>,
}

impl LatencyWindow {
    pub fn record(&self, now: Instant, value: u64) {
        let mut samples = self.samples.lock();
        samples.count += 1;
        samples.sum = samples.sum.saturating_add(value);
        if samples.recent.len() == MAX_SAMPLES {
            samples.recent.pop_front();
        }
        samples.recent.push_back((now, value));
    }

    /// The count, sum and `quantiles` (nearest rank) of the samples younger than [`MAX_AGE`].
    pub fn snapshot(&self, now: Instant, quantiles: &[f64]) -> SummarySnapshot {
        let mut samples = self.samples.lock();
        while samples
            .recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > MAX_AGE)
        {
            samples.recent.pop_front();
        }
        let mut values: Vec<u64> = samples.recent.iter().map(|(_, v)| *v).collect();
        let (count, sum) = (samples.count, samples.sum);
        drop(samples);
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

/// The five summaries Triton exports per model version, in microseconds.
#[derive(Debug, Default)]
pub struct LatencySummaries {
    pub request: LatencyWindow,
    pub queue: LatencyWindow,
    pub compute_input: LatencyWindow,
    pub compute_infer: LatencyWindow,
    pub compute_output: LatencyWindow,
}

impl LatencySummaries {
    /// `(name, snapshot)` for each summary, in Triton's order.
    pub fn snapshot(&self, quantiles: &[f64]) -> [(&'static str, SummarySnapshot); 5] {
        let now = Instant::now();
        [
            ("request", self.request.snapshot(now, quantiles)),
            ("queue", self.queue.snapshot(now, quantiles)),
            ("compute_input", self.compute_input.snapshot(now, quantiles)),
            ("compute_infer", self.compute_infer.snapshot(now, quantiles)),
            (
                "compute_output",
                self.compute_output.snapshot(now, quantiles),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let window = LatencyWindow::default();
        let now = Instant::now();
        for value in 1..=100 {
            window.record(now, value);
        }
        let snapshot = window.snapshot(now, &[0.5, 0.9, 0.99, 1.0]);
        assert_eq!(snapshot.count, 100);
        assert_eq!(snapshot.sum, 5050);
        let values: Vec<f64> = snapshot.quantiles.iter().map(|(_, v)| *v).collect();
        assert_eq!(values, [50.0, 90.0, 99.0, 100.0]);
    }

    #[test]
    fn old_samples_leave_the_window_but_not_the_totals() {
        let window = LatencyWindow::default();
        let start = Instant::now();
        window.record(start, 1000);
        let later = start + MAX_AGE + Duration::from_secs(1);
        window.record(later, 5);
        let snapshot = window.snapshot(later, &[0.5]);
        assert_eq!((snapshot.count, snapshot.sum), (2, 1005));
        assert!((snapshot.quantiles[0].1 - 5.0).abs() < f64::EPSILON);
        let empty = LatencyWindow::default().snapshot(later, &[0.5]);
        assert!(empty.quantiles[0].1.is_nan());
    }

    #[test]
    fn a_window_holds_a_bounded_number_of_samples() {
        let window = LatencyWindow::default();
        let now = Instant::now();
        for value in 0..(MAX_SAMPLES as u64 + 10) {
            window.record(now, value);
        }
        let snapshot = window.snapshot(now, &[0.0]);
        assert!((snapshot.quantiles[0].1 - 10.0).abs() < f64::EPSILON);
        assert_eq!(snapshot.count, MAX_SAMPLES as u64 + 10);
    }
}
