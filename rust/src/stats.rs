//! Per model-version statistics: lock-free counters and cumulative durations.
//!
//! The numbers are the ones Triton's statistics extension reports for a model version
//! (`ModelStatistics` in `grpc_service.proto`), counted where the work happens:
//!
//! * `success` / `fail`: requests that completed or failed, with their cumulative request
//!   duration (enqueue until the instance finished the batch; for a failure before execution,
//!   until it failed);
//! * `queue`: time from enqueue until a model instance took the request (successful requests);
//! * `compute_input` / `compute_infer` / `compute_output`: each successful request adds its
//!   batch's durations, so the counts equal `success.count`, as in Triton;
//! * `inference_count`: the sum of the batch sizes of successful requests; `execution_count`:
//!   the number of model executions (batches);
//! * `batch_stats`: per executed batch size, how many executions and their compute durations;
//! * `last_inference_ms`: when the last execution finished, in milliseconds since the epoch;
//! * failures by reason (`REJECTED`, `CANCELED`, `BACKEND`, `OTHER`), the label of Triton's
//!   `nv_inference_request_failure` metric.
//!
//! A [`ModelStats`] holds only these cumulative numbers, nothing about any one queue, so
//! several queues may record into one (one queue per model instance, one set of statistics per
//! model version: [`RequestQueue::with_shared_stats`](crate::RequestQueue::with_shared_stats)).
//!
//! Every update is a handful of relaxed atomic adds; a [`snapshot`](ModelStats::snapshot)
//! reads them without locks, so it is not one consistent cut (a count and its duration may be
//! one update apart).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::latency::{LatencySummaries, SummarySnapshot};

/// A count and a cumulative duration, as Triton's `StatisticDuration`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatDuration {
    pub count: u64,
    pub ns: u64,
}

/// Why a request failed; the `reason` label of `nv_inference_request_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// Refused by the scheduler: a full queue, or a queue timeout with the REJECT action.
    Rejected,
    /// Cancelled by the client while it waited in the queue.
    Canceled,
    /// The model or its backend returned an error.
    Backend,
    /// Anything else.
    Other,
}

impl FailureReason {
    /// Every reason, in the order [`StatsSnapshot::failures`] lists them.
    pub const ALL: [FailureReason; 4] = [
        FailureReason::Rejected,
        FailureReason::Canceled,
        FailureReason::Backend,
        FailureReason::Other,
    ];

    /// The reason as Triton spells it in metric labels.
    pub const fn name(self) -> &'static str {
        match self {
            FailureReason::Rejected => "REJECTED",
            FailureReason::Canceled => "CANCELED",
            FailureReason::Backend => "BACKEND",
            FailureReason::Other => "OTHER",
        }
    }

    /// Parses [`name`](Self::name).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.name() == name)
    }

    const fn index(self) -> usize {
        match self {
            FailureReason::Rejected => 0,
            FailureReason::Canceled => 1,
            FailureReason::Backend => 2,
            FailureReason::Other => 3,
        }
    }
}

/// One request of an executed batch: its batch size and when it was enqueued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTiming {
    pub batch_size: u32,
    pub enqueued_at: Instant,
}

/// How long one execution spent preparing inputs, running the model and producing outputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComputeTimes {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

/// Counters for one executed batch size.
#[derive(Debug, Default)]
struct BatchTally {
    count: AtomicU64,
    input_ns: AtomicU64,
    infer_ns: AtomicU64,
    output_ns: AtomicU64,
}

impl BatchTally {
    fn add(&self, compute: (u64, u64, u64)) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.input_ns.fetch_add(compute.0, Ordering::Relaxed);
        self.infer_ns.fetch_add(compute.1, Ordering::Relaxed);
        self.output_ns.fetch_add(compute.2, Ordering::Relaxed);
    }

    fn snapshot(&self, batch_size: u32) -> BatchStat {
        let count = self.count.load(Ordering::Relaxed);
        let tally = |ns: &AtomicU64| StatDuration {
            count,
            ns: ns.load(Ordering::Relaxed),
        };
        BatchStat {
            batch_size,
            compute_input: tally(&self.input_ns),
            compute_infer: tally(&self.infer_ns),
            compute_output: tally(&self.output_ns),
        }
    }
}

#[derive(Debug, Default)]
struct Tally {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Tally {
    fn add(&self, count: u64, ns: u64) {
        self.count.fetch_add(count, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn snapshot(&self) -> StatDuration {
        StatDuration {
            count: self.count.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
        }
    }
}

/// Executions per batch size, with the compute durations of each size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchStat {
    pub batch_size: u32,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
}

/// A copy of the counters at one moment (see the module docs for what each one counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub success: StatDuration,
    pub fail: StatDuration,
    pub queue: StatDuration,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
    pub inference_count: u64,
    pub execution_count: u64,
    /// Milliseconds since the Unix epoch when the last execution finished; 0 before the first.
    pub last_inference_ms: u64,
    /// Batch sizes that were executed at least once, smallest first.
    pub batch_stats: Vec<BatchStat>,
    /// Failed requests per reason, in [`FailureReason::ALL`] order.
    pub failures: [(FailureReason, u64); 4],
}

/// The statistics of one model version. See the module docs.
#[derive(Debug)]
pub struct ModelStats {
    success: Tally,
    fail: Tally,
    queue: Tally,
    compute_input: Tally,
    compute_infer: Tally,
    compute_output: Tally,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    last_inference_ms: AtomicU64,
    failures: [AtomicU64; 4],
    /// Indexed by batch size (slot 0 unused), up to the largest size a batch can have.
    batches: Box<[BatchTally]>,
    /// Sizes beyond `batches` (not expected: batches never exceed the maximum batch size).
    oversized: Mutex<Vec<(u32, BatchTally)>>,
    /// Recent durations for quantiles, when asked for.
    summaries: Option<LatencySummaries>,
}

/// Saturating nanoseconds of a duration.
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl ModelStats {
    /// Counters for a model whose batches hold at most `max_batch_size` (0: no batching, every
    /// execution has batch size 1).
    pub fn new(max_batch_size: u32) -> Self {
        let slots = max_batch_size.max(1) as usize + 1;
        Self {
            success: Tally::default(),
            fail: Tally::default(),
            queue: Tally::default(),
            compute_input: Tally::default(),
            compute_infer: Tally::default(),
            compute_output: Tally::default(),
            inference_count: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            last_inference_ms: AtomicU64::new(0),
            failures: Default::default(),
            batches: (0..slots).map(|_| BatchTally::default()).collect(),
            oversized: Mutex::new(Vec::new()),
            summaries: None,
        }
    }

    /// Like [`ModelStats::new`], also keeping recent durations for latency summaries.
    pub fn with_latency_summaries(max_batch_size: u32) -> Self {
        Self {
            summaries: Some(LatencySummaries::default()),
            ..Self::new(max_batch_size)
        }
    }

    /// Whether recent durations are kept for latency summaries.
    pub fn keeps_latency_summaries(&self) -> bool {
        self.summaries.is_some()
    }

    /// The latency summaries (microseconds) at `quantiles`, when they are kept.
    pub fn latency_summaries(
        &self,
        quantiles: &[f64],
    ) -> Option<[(&'static str, SummarySnapshot); 5]> {
        self.summaries
            .as_ref()
            .map(|summaries| summaries.snapshot(quantiles))
    }

    /// Records one execution: `requests` are the batch's requests with whether each succeeded,
    /// `dequeued_at` is when an instance took the batch, and `compute` its durations. The
    /// requests' durations run until now.
    pub fn record_execution(
        &self,
        requests: impl IntoIterator<Item = (RequestTiming, bool)>,
        dequeued_at: Instant,
        compute: ComputeTimes,
    ) {
        let now = Instant::now();
        let compute_ns = (
            nanos(compute.input),
            nanos(compute.infer),
            nanos(compute.output),
        );
        let (mut ok, mut failed) = (0u64, 0u64);
        let (mut ok_ns, mut failed_ns, mut queue_ns) = (0u64, 0u64, 0u64);
        let (mut ok_size, mut batch_size) = (0u64, 0u64);
        for (timing, success) in requests {
            // Triton counts a request without a batch dimension as batch size 1.
            let size = u64::from(timing.batch_size.max(1));
            let request_ns = nanos(now.saturating_duration_since(timing.enqueued_at));
            batch_size += size;
            if success {
                ok += 1;
                ok_size += size;
                ok_ns = ok_ns.saturating_add(request_ns);
                let waited = nanos(dequeued_at.saturating_duration_since(timing.enqueued_at));
                queue_ns = queue_ns.saturating_add(waited);
                if let Some(summaries) = &self.summaries {
                    let durations = [request_ns, waited, compute_ns.0, compute_ns.1, compute_ns.2];
                    summaries.record(now, durations.map(|ns| ns / 1000));
                }
            } else {
                failed += 1;
                failed_ns = failed_ns.saturating_add(request_ns);
            }
        }
        if ok > 0 {
            self.success.add(ok, ok_ns);
            self.queue.add(ok, queue_ns);
            self.compute_input.add(ok, compute_ns.0.saturating_mul(ok));
            self.compute_infer.add(ok, compute_ns.1.saturating_mul(ok));
            self.compute_output.add(ok, compute_ns.2.saturating_mul(ok));
            self.inference_count.fetch_add(ok_size, Ordering::Relaxed);
        }
        if failed > 0 {
            self.fail.add(failed, failed_ns);
            self.failures[FailureReason::Backend.index()].fetch_add(failed, Ordering::Relaxed);
        }
        if batch_size == 0 {
            return;
        }
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        if let Some(tally) = usize::try_from(batch_size)
            .ok()
            .and_then(|size| self.batches.get(size))
        {
            tally.add(compute_ns);
        } else {
            let size = u32::try_from(batch_size).unwrap_or(u32::MAX);
            let mut oversized = self.oversized.lock();
            if let Some((_, tally)) = oversized.iter().find(|(s, _)| *s == size) {
                tally.add(compute_ns);
            } else {
                let tally = BatchTally::default();
                tally.add(compute_ns);
                oversized.push((size, tally));
            }
        }
        self.last_inference_ms
            .fetch_max(epoch_ms(), Ordering::Relaxed);
    }

    /// Records one request that failed without being executed (or outside any batch), after
    /// `duration`.
    pub fn record_failure(&self, reason: FailureReason, duration: Duration) {
        self.fail.add(1, nanos(duration));
        self.failures[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now, read without locks (except for the never-expected oversized batches).
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut batch_stats: Vec<BatchStat> = self
            .batches
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, tally)| tally.count.load(Ordering::Relaxed) > 0)
            .map(|(size, tally)| tally.snapshot(u32::try_from(size).unwrap_or(u32::MAX)))
            .collect();
        {
            let oversized = self.oversized.lock();
            batch_stats.extend(oversized.iter().map(|(size, tally)| tally.snapshot(*size)));
        }
        batch_stats.sort_by_key(|stat| stat.batch_size);
        StatsSnapshot {
            success: self.success.snapshot(),
            fail: self.fail.snapshot(),
            queue: self.queue.snapshot(),
            compute_input: self.compute_input.snapshot(),
            compute_infer: self.compute_infer.snapshot(),
            compute_output: self.compute_output.snapshot(),
            inference_count: self.inference_count.load(Ordering::Relaxed),
            execution_count: self.execution_count.load(Ordering::Relaxed),
            last_inference_ms: self.last_inference_ms.load(Ordering::Relaxed),
            batch_stats,
            failures: FailureReason::ALL.map(|reason| {
                (
                    reason,
                    self.failures[reason.index()].load(Ordering::Relaxed),
                )
            }),
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(batch_size: u32, ago: Duration) -> RequestTiming {
        RequestTiming {
            batch_size,
            enqueued_at: Instant::now().checked_sub(ago).unwrap(),
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_execution_counts_requests_batches_and_durations() {
        let stats = ModelStats::new(8);
        let requests = [(timing(2, 5 * MS), true), (timing(3, 5 * MS), true)];
        let dequeued = Instant::now();
        let compute = ComputeTimes {
            input: Duration::from_nanos(100),
            infer: Duration::from_micros(1),
            output: Duration::from_nanos(10),
        };
        stats.record_execution(requests, dequeued, compute);
        let snap = stats.snapshot();
        assert_eq!(snap.success.count, 2);
        assert!(snap.success.ns >= 2 * 5_000_000);
        assert_eq!(snap.queue.count, 2);
        assert!(snap.queue.ns >= 2 * 5_000_000 && snap.queue.ns <= snap.success.ns);
        assert_eq!(snap.compute_infer, StatDuration { count: 2, ns: 2000 });
        assert_eq!(snap.compute_input.ns, 200);
        assert_eq!(snap.compute_output.ns, 20);
        assert_eq!(snap.inference_count, 5);
        assert_eq!(snap.execution_count, 1);
        assert_eq!(snap.fail, StatDuration::default());
        assert_eq!(snap.batch_stats.len(), 1);
        let batch = snap.batch_stats[0];
        assert_eq!(batch.batch_size, 5);
        assert_eq!(batch.compute_infer, StatDuration { count: 1, ns: 1000 });
        assert!(snap.last_inference_ms > 1_600_000_000_000);
    }

    #[test]
    fn failed_requests_count_as_backend_failures_and_not_as_inferences() {
        let stats = ModelStats::new(4);
        stats.record_execution(
            [(timing(1, MS), true), (timing(1, MS), false)],
            Instant::now(),
            ComputeTimes::default(),
        );
        let snap = stats.snapshot();
        assert_eq!((snap.success.count, snap.fail.count), (1, 1));
        assert_eq!(snap.inference_count, 1);
        assert_eq!(snap.queue.count, 1);
        assert_eq!(snap.batch_stats[0].batch_size, 2);
        assert_eq!(snap.failures[2], (FailureReason::Backend, 1));
    }

    #[test]
    fn unbatched_requests_count_as_batch_size_one() {
        let stats = ModelStats::new(0);
        stats.record_execution(
            [(timing(0, MS), true)],
            Instant::now(),
            ComputeTimes::default(),
        );
        let snap = stats.snapshot();
        assert_eq!(snap.inference_count, 1);
        assert_eq!(snap.batch_stats[0].batch_size, 1);
    }

    #[test]
    fn oversized_batches_are_still_counted() {
        let stats = ModelStats::new(2);
        for _ in 0..2 {
            stats.record_execution(
                (0..3).map(|_| (timing(1, MS), true)),
                Instant::now(),
                ComputeTimes::default(),
            );
        }
        let snap = stats.snapshot();
        assert_eq!(snap.batch_stats.len(), 1);
        assert_eq!(snap.batch_stats[0].batch_size, 3);
        assert_eq!(snap.batch_stats[0].compute_infer.count, 2);
    }

    #[test]
    fn failures_by_reason() {
        let stats = ModelStats::new(0);
        stats.record_failure(FailureReason::Rejected, MS);
        stats.record_failure(FailureReason::Canceled, MS);
        stats.record_failure(FailureReason::Canceled, MS);
        let snap = stats.snapshot();
        assert_eq!(
            snap.fail,
            StatDuration {
                count: 3,
                ns: 3_000_000
            }
        );
        assert_eq!(
            snap.failures.map(|(_, n)| n),
            [1, 2, 0, 0],
            "{:?}",
            snap.failures
        );
        assert_eq!(snap.execution_count, 0);
        assert_eq!(
            FailureReason::from_name("CANCELED"),
            Some(FailureReason::Canceled)
        );
        assert_eq!(FailureReason::from_name("nope"), None);
    }
}
