//! `tritonfast._core.RequestQueue` and its companions: `QueuePolicy`, `Ticket`, `Batch`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyBaseException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::gil::without_gil;
use super::handoff::{PyHandoff, pop_or_hand_off};
use super::stats::snapshot_dict;
use crate::error::CoreError;
use crate::queue::{
    BatchPolicy, PopResult, QueueConfig, QueuePolicy, Queued, RequestMeta, RequestQueue, Ticket,
    TicketStatus, TimeoutAction,
};
use crate::sequence::SlotBatch;
use crate::stats::{ComputeTimes, ModelStats, RequestTiming};

/// Longest stretch a `pop` waits without coming back for the GIL to check for signals, so
/// Ctrl-C reaches a main thread blocked in `pop`.
pub(super) const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// One priority level's queue policy (Triton's `ModelQueuePolicy`).
#[pyclass(name = "QueuePolicy", module = "tritonfast._core", frozen)]
pub(crate) struct PyQueuePolicy {
    inner: QueuePolicy,
}

#[pymethods]
impl PyQueuePolicy {
    #[new]
    #[pyo3(signature = (
        timeout_action = "REJECT",
        default_timeout_us = 0,
        allow_timeout_override = false,
        max_queue_size = 0,
    ))]
    fn new(
        timeout_action: &str,
        default_timeout_us: u64,
        allow_timeout_override: bool,
        max_queue_size: u32,
    ) -> PyResult<Self> {
        let timeout_action = match timeout_action {
            "REJECT" => TimeoutAction::Reject,
            "DELAY" => TimeoutAction::Delay,
            other => {
                return Err(CoreError::invalid_arg(format!(
                    "timeout_action must be 'REJECT' or 'DELAY', got '{other}'"
                ))
                .into());
            }
        };
        Ok(Self {
            inner: QueuePolicy {
                timeout_action,
                default_timeout: Duration::from_micros(default_timeout_us),
                allow_timeout_override,
                max_queue_size,
            },
        })
    }

    #[getter]
    fn timeout_action(&self) -> &'static str {
        action_name(self.inner.timeout_action)
    }

    #[getter]
    fn default_timeout_us(&self) -> u128 {
        self.inner.default_timeout.as_micros()
    }

    #[getter]
    fn allow_timeout_override(&self) -> bool {
        self.inner.allow_timeout_override
    }

    #[getter]
    fn max_queue_size(&self) -> u32 {
        self.inner.max_queue_size
    }

    fn __repr__(&self) -> String {
        format!(
            "QueuePolicy(timeout_action='{}', default_timeout_us={}, allow_timeout_override={}, \
             max_queue_size={})",
            action_name(self.inner.timeout_action),
            self.inner.default_timeout.as_micros(),
            py_bool(self.inner.allow_timeout_override),
            self.inner.max_queue_size,
        )
    }
}

fn action_name(action: TimeoutAction) -> &'static str {
    match action {
        TimeoutAction::Reject => "REJECT",
        TimeoutAction::Delay => "DELAY",
    }
}

fn py_bool(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

/// The handle of a request pushed with `RequestQueue.push_cancellable`.
#[pyclass(name = "Ticket", module = "tritonfast._core", frozen, freelist = 256)]
pub(crate) struct PyTicket {
    pub(super) inner: Ticket,
}

#[pymethods]
impl PyTicket {
    /// "QUEUED", "TAKEN" (handed out to run), "CANCELLED" or "REJECTED" (timed out).
    #[getter]
    fn status(&self) -> &'static str {
        match self.inner.status() {
            TicketStatus::Queued => "QUEUED",
            TicketStatus::Taken => "TAKEN",
            TicketStatus::Cancelled => "CANCELLED",
            TicketStatus::Rejected => "REJECTED",
        }
    }

    fn __repr__(&self) -> String {
        format!("Ticket(status='{}')", self.status())
    }
}

/// What one `RequestQueue.pop` returned: a batch to run, or requests rejected by a queue
/// timeout (both empty when the wait timed out).
#[pyclass(name = "Batch", module = "tritonfast._core", frozen, freelist = 64)]
pub(crate) struct PyBatch {
    items: Py<PyList>,
    /// `None` for none (the getter then returns the shared empty tuple).
    rejected: Option<Py<PyTuple>>,
    seq: u64,
    timings: Timings,
    /// Where its execution is recorded.
    stats: StatsOwner,
    /// Sequence batches: each position's slot, and which positions are null entries (no
    /// request; excluded from the statistics).
    slots: Option<Box<[usize]>>,
    nulls: Option<Box<[bool]>>,
    reported: AtomicBool,
    /// Its `rejected` items are of backlog sequences whose timeout expired (sequence batches).
    expired: bool,
}

/// What holds the statistics a batch reports to.
pub(super) enum StatsOwner {
    /// A request queue (a plain reference count under the GIL, cheaper than an `Arc`).
    Queue(Py<PyRequestQueue>),
    Shared(Arc<ModelStats>),
}

impl StatsOwner {
    fn stats(&self) -> &ModelStats {
        match self {
            StatsOwner::Queue(queue) => queue.get().inner.stats(),
            StatsOwner::Shared(stats) => stats,
        }
    }
}

#[pymethods]
impl PyBatch {
    /// The garbage collector sees what a batch holds: a batch kept by a closure whose frames an
    /// error's traceback keeps (a failed execution's result), and whose items lead back to that
    /// error, is a cycle that must be collectable, or every such failure would hold its
    /// requests for good. (Nothing to clear: the items list, the error and the frames break
    /// such a cycle.)
    #[allow(clippy::needless_pass_by_value)] // PyO3 hands the visitor over by value
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.items)?;
        if let Some(rejected) = &self.rejected {
            visit.call(rejected)?;
        }
        if let StatsOwner::Queue(queue) = &self.stats {
            visit.call(queue)?;
        }
        Ok(())
    }

    /// The batch's items, in the order they were batched (priority, then arrival).
    #[getter]
    fn items(&self, py: Python<'_>) -> Py<PyList> {
        self.items.clone_ref(py)
    }

    /// Items whose queue timeout expired (REJECT): answer each with "Request timeout expired".
    #[getter]
    fn rejected(&self, py: Python<'_>) -> Py<PyTuple> {
        match &self.rejected {
            Some(rejected) => rejected.clone_ref(py),
            None => PyTuple::empty(py).unbind(),
        }
    }

    /// 0, 1, 2, ... in the order batches left the queue (for a sequence batch: left this
    /// instance's slots).
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }

    /// True when `rejected` holds the requests of backlog sequences whose timeout expired
    /// (answer them UNAVAILABLE), not of cancelled ones.
    #[getter]
    fn expired(&self) -> bool {
        self.expired
    }

    /// A sequence batch's slot for each item (null entries included); `None` otherwise.
    #[getter]
    fn slots<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.slots
            .as_ref()
            .map(|slots| PyTuple::new(py, slots.iter()))
            .transpose()
    }

    /// Records the batch's execution in the queue's statistics: `results` holds one entry per
    /// item, an exception instance for a request that failed; the durations are the batch's,
    /// measured from when the batch was handed out (which is how the queue time ends). Call
    /// once per batch, right after running it.
    fn report(
        &self,
        results: &Bound<'_, PyAny>,
        compute_input_ns: u64,
        compute_infer_ns: u64,
        compute_output_ns: u64,
    ) -> PyResult<()> {
        let timings = self.timings.as_slice();
        let expected = self
            .nulls
            .as_ref()
            .map_or(timings.len(), |nulls| nulls.len());
        if results.len()? != expected {
            return Err(CoreError::bad_value(format!(
                "report() got {} results for a batch of {expected}",
                results.len()?,
            ))
            .into());
        }
        // A list (the usual case) is read in place; anything else is collected first.
        let collected;
        let results: &Bound<'_, PyList> = if let Ok(list) = results.cast::<PyList>() {
            list
        } else {
            collected = PyList::new(
                results.py(),
                results.try_iter()?.collect::<PyResult<Vec<_>>>()?,
            )?;
            &collected
        };
        if self.reported.swap(true, Ordering::Relaxed) {
            return Err(CoreError::bad_value("this batch was already reported").into());
        }
        let compute = ComputeTimes {
            input: Duration::from_nanos(compute_input_ns),
            infer: Duration::from_nanos(compute_infer_ns),
            output: Duration::from_nanos(compute_output_ns),
        };
        // The computation ran from the hand-out until now: the batch left the queue that long
        // ago. (Deriving it here spares `pop` a clock read.)
        let now = Instant::now();
        let dequeued_at = now
            .checked_sub(compute.input + compute.infer + compute.output)
            .unwrap_or(now);
        let succeeded = |result: Bound<'_, PyAny>| !result.is_instance_of::<PyBaseException>();
        let stats = self.stats.stats();
        match &self.nulls {
            None => stats.record_execution(
                timings
                    .iter()
                    .zip(results.iter())
                    .map(|(timing, result)| (*timing, succeeded(result))),
                dequeued_at,
                compute,
            ),
            Some(nulls) => stats.record_execution(
                timings
                    .iter()
                    .zip(
                        results
                            .iter()
                            .zip(nulls.iter())
                            .filter(|(_, null)| !**null)
                            .map(|(result, _)| succeeded(result)),
                    )
                    .map(|(timing, ok)| (*timing, ok)),
                dequeued_at,
                compute,
            ),
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.nulls
            .as_ref()
            .map_or(self.timings.as_slice().len(), |nulls| nulls.len())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Batch(seq={}, items={}, rejected={})",
            self.seq,
            self.items.bind(py).len(),
            self.rejected.as_ref().map_or(0, |r| r.bind(py).len())
        )
    }
}

/// Each item's batch size and enqueue time, without a heap allocation for the one-item batches
/// of unbatched models.
pub(super) enum Timings {
    One(RequestTiming),
    Many(Vec<RequestTiming>),
}

impl Timings {
    fn as_slice(&self) -> &[RequestTiming] {
        match self {
            Timings::One(timing) => std::slice::from_ref(timing),
            Timings::Many(timings) => timings,
        }
    }
}

/// A per-model request queue with priority levels, queue policies, cancellation, dynamic
/// batching and statistics (see the Rust `queue` and `batcher` modules for the rules).
///
/// Items are any Python objects; they are not traversed by the garbage collector while queued,
/// so an item should not hold the only path to its queue in a reference cycle.
#[pyclass(name = "RequestQueue", module = "tritonfast._core", frozen)]
pub(crate) struct PyRequestQueue {
    pub(super) inner: RequestQueue<Py<PyAny>>,
}

#[pymethods]
impl PyRequestQueue {
    #[new]
    #[pyo3(signature = (
        max_batch_size = 0,
        max_queue_delay_us = 0,
        preferred_batch_sizes = Vec::new(),
        *,
        priority_levels = 0,
        default_priority_level = 0,
        default_queue_policy = None,
        priority_queue_policy = None,
        latency_summaries = false,
        share_statistics_with = None,
    ))]
    #[allow(clippy::too_many_arguments)] // mirrors Triton's ModelDynamicBatching fields
    fn new(
        max_batch_size: u32,
        max_queue_delay_us: u64,
        preferred_batch_sizes: Vec<u32>,
        priority_levels: u32,
        default_priority_level: u32,
        default_queue_policy: Option<Bound<'_, PyQueuePolicy>>,
        priority_queue_policy: Option<HashMap<u32, Bound<'_, PyQueuePolicy>>>,
        latency_summaries: bool,
        share_statistics_with: Option<Bound<'_, PyRequestQueue>>,
    ) -> PyResult<Self> {
        let mut levels: Vec<(u32, QueuePolicy)> = priority_queue_policy
            .unwrap_or_default()
            .into_iter()
            .map(|(level, policy)| (level, policy.get().inner.clone()))
            .collect();
        levels.sort_by_key(|&(level, _)| level);
        let config = QueueConfig {
            batch: BatchPolicy {
                max_batch_size,
                max_queue_delay: Duration::from_micros(max_queue_delay_us),
                preferred_batch_sizes,
            },
            priority_levels,
            default_priority_level,
            default_queue_policy: default_queue_policy
                .map(|policy| policy.get().inner.clone())
                .unwrap_or_default(),
            priority_queue_policy: levels,
            latency_summaries,
        };
        let inner = match share_statistics_with {
            Some(other) => {
                RequestQueue::with_shared_stats(config, Arc::clone(other.get().inner.stats()))?
            }
            None => RequestQueue::with_config(config)?,
        };
        Ok(Self { inner })
    }

    /// Enqueues `item`; never blocks. Raises `UnavailableError` once closed or when the
    /// request's priority level is full ("Exceeds maximum queue size"), `InvalidArgumentError`
    /// for a bad batch size.
    #[pyo3(signature = (item, batch_size = 1, priority = 0, timeout_us = 0, shape_key = 0))]
    fn push(
        &self,
        item: Py<PyAny>,
        batch_size: u32,
        priority: u32,
        timeout_us: u64,
        shape_key: u64,
    ) -> PyResult<()> {
        let meta = request_meta(batch_size, priority, timeout_us, shape_key);
        Ok(self.inner.push_with(item, meta)?)
    }

    /// Like `push`, returning a `Ticket` for `cancel`.
    #[pyo3(signature = (item, batch_size = 1, priority = 0, timeout_us = 0, shape_key = 0))]
    fn push_cancellable(
        &self,
        item: Py<PyAny>,
        batch_size: u32,
        priority: u32,
        timeout_us: u64,
        shape_key: u64,
    ) -> PyResult<PyTicket> {
        let meta = request_meta(batch_size, priority, timeout_us, shape_key);
        let inner = self.inner.push_cancellable(item, meta)?;
        Ok(PyTicket { inner })
    }

    /// Removes a still-queued request so it never runs; `True` if it was removed, `False` if it
    /// was already handed out, rejected or cancelled. Never blocks.
    fn cancel(&self, ticket: &Bound<'_, PyTicket>) -> PyResult<bool> {
        Ok(self.inner.cancel(&ticket.get().inner)?)
    }

    /// Waits up to `timeout_us` microseconds (GIL released) for work. Returns a `Batch` (whose
    /// `items` and `rejected` are both empty when the wait timed out), or `None` once the queue
    /// is closed and drained. `timeout_us=0` polls: it returns a batch only if one may leave
    /// right now.
    fn pop(slf: &Bound<'_, Self>, timeout_us: u64) -> PyResult<Option<PyBatch>> {
        let py = slf.py();
        let this = slf.get();
        // Fast path, GIL held: a batch that is ready now needs no wait, no GIL hand-off and no
        // clock reads.
        match this.inner.try_pop_batch_queued() {
            PopResult::TimedOut => {}
            ready => return to_batch(slf, ready),
        }
        if timeout_us == 0 {
            return to_batch(slf, PopResult::TimedOut);
        }
        let timeout = Duration::from_micros(timeout_us);
        if timeout <= SIGNAL_CHECK_INTERVAL {
            let got = without_gil(py, || Ok(this.inner.pop_batch_queued(timeout)))?;
            return to_batch(slf, got);
        }
        // Long waits go in slices, checking for signals (Ctrl-C) in between.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let slice = deadline.map_or(SIGNAL_CHECK_INTERVAL, |d| {
                d.saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK_INTERVAL)
            });
            let got = without_gil(py, || Ok(this.inner.pop_batch_queued(slice)))?;
            let expired = deadline.is_some_and(|d| Instant::now() >= d);
            if !matches!(got, PopResult::TimedOut) || expired {
                return to_batch(slf, got);
            }
            py.check_signals()?;
        }
    }

    /// Like `pop`, for instance `instance` of a model whose batches may run on the event loop:
    /// while `handoff` is on, each batch is offered to it and this thread waits (GIL released)
    /// until the loop has run it, then takes the next. Returns what the thread must handle
    /// itself: a `Batch` to run (handoff off) or with rejections, an empty `Batch` once
    /// `timeout_us` has passed, `None` once closed and drained.
    fn pop_or_hand_off(
        slf: &Bound<'_, Self>,
        timeout_us: u64,
        handoff: &Bound<'_, PyHandoff>,
        instance: usize,
    ) -> PyResult<Option<PyBatch>> {
        pop_or_hand_off(slf, timeout_us, handoff, instance)
    }

    /// Closes the queue: pushes fail from now on, blocked `pop` calls wake, and queued items
    /// are still handed out before `pop` returns `None`.
    fn close(&self) {
        self.inner.close();
    }

    /// Closes the queue and returns every item still in it, to be answered (each counted as a
    /// failure); waits (GIL released) for a `pop` forming a batch to finish first.
    fn abandon<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let left = without_gil(py, || Ok(self.inner.abandon()))?;
        PyList::new(py, left)
    }

    /// Whether `close()` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The model version's statistics as a dict (see `tritonfast.runtime.scheduler`): those of
    /// every queue that shares them (`share_statistics_with`).
    fn statistics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        snapshot_dict(py, &self.inner.stats().snapshot())
    }

    /// `{"request" | "queue" | "compute_input" | "compute_infer" | "compute_output":
    /// (count, sum_us, [(quantile, value_us)])}`, or None when summaries are not kept.
    #[allow(clippy::needless_pass_by_value)] // PyO3 hands over owned arguments
    fn latency_summaries<'py>(
        &self,
        py: Python<'py>,
        quantiles: Vec<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        summaries_dict(py, self.inner.stats(), &quantiles)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        let config = self.inner.config();
        format!(
            "RequestQueue(max_batch_size={}, max_queue_delay_us={}, preferred_batch_sizes={:?}, \
             priority_levels={}, len={}, closed={})",
            config.batch.max_batch_size,
            config.batch.max_queue_delay.as_micros(),
            config.batch.preferred_batch_sizes,
            config.priority_levels,
            self.inner.len(),
            py_bool(self.inner.is_closed()),
        )
    }
}

/// The latency summaries of `stats` as `latency_summaries()` returns them.
pub(super) fn summaries_dict<'py>(
    py: Python<'py>,
    stats: &ModelStats,
    quantiles: &[f64],
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(summaries) = stats.latency_summaries(quantiles) else {
        return Ok(None);
    };
    let dict = PyDict::new(py);
    for (name, snapshot) in summaries {
        dict.set_item(name, (snapshot.count, snapshot.sum, snapshot.quantiles))?;
    }
    Ok(Some(dict))
}

fn request_meta(batch_size: u32, priority: u32, timeout_us: u64, shape_key: u64) -> RequestMeta {
    RequestMeta {
        batch_size,
        priority,
        timeout: Duration::from_micros(timeout_us),
        shape_key,
    }
}

/// The Python face of a pop result: `None` when closed, else a `Batch`.
pub(super) fn to_batch(
    queue: &Bound<'_, PyRequestQueue>,
    result: PopResult<Queued<Py<PyAny>>>,
) -> PyResult<Option<PyBatch>> {
    let py = queue.py();
    let (taken, rejected, seq) = match result {
        PopResult::Closed => return Ok(None),
        PopResult::TimedOut => (Vec::new(), Vec::new(), 0),
        PopResult::Rejected(rejected) => (Vec::new(), rejected, 0),
        PopResult::Batch(batch) => (batch.items, Vec::new(), batch.seq),
    };
    let timing = |queued: &Queued<Py<PyAny>>| RequestTiming {
        batch_size: queued.batch_size,
        enqueued_at: queued.enqueued_at(),
    };
    let (items, timings) = if let [queued] = taken.as_slice() {
        let timings = Timings::One(timing(queued));
        let item = taken.into_iter().next().map(|queued| queued.item);
        (PyList::new(py, item)?, timings)
    } else {
        let mut timings = Vec::with_capacity(taken.len());
        let items = PyList::new(
            py,
            taken.into_iter().map(|queued| {
                timings.push(timing(&queued));
                queued.item
            }),
        )?;
        (items, Timings::Many(timings))
    };
    let rejected = if rejected.is_empty() {
        None
    } else {
        let items = rejected.into_iter().map(|queued| queued.item);
        Some(PyTuple::new(py, items)?.unbind())
    };
    Ok(Some(PyBatch {
        items: items.unbind(),
        rejected,
        seq,
        timings,
        stats: StatsOwner::Queue(queue.clone().unbind()),
        slots: None,
        nulls: None,
        reported: AtomicBool::new(false),
        expired: false,
    }))
}

/// A batch holding only `rejected` items: the requests of cancelled sequences, or with
/// `expired` of backlog sequences whose timeout expired.
pub(super) fn rejected_batch(
    py: Python<'_>,
    items: Vec<Py<PyAny>>,
    stats: Arc<ModelStats>,
    expired: bool,
) -> PyResult<PyBatch> {
    Ok(PyBatch {
        items: PyList::empty(py).unbind(),
        rejected: Some(PyTuple::new(py, items)?.unbind()),
        seq: 0,
        timings: Timings::Many(Vec::new()),
        stats: StatsOwner::Shared(stats),
        slots: Some(Box::default()),
        nulls: Some(Box::default()),
        reported: AtomicBool::new(false),
        expired,
    })
}

/// A sequence batch's Python face: `items` holds `None` at null entries.
pub(super) fn sequence_batch(
    py: Python<'_>,
    batch: SlotBatch<Py<PyAny>>,
    stats: Arc<ModelStats>,
) -> PyResult<PyBatch> {
    let count = batch.entries.len();
    let mut timings = Vec::with_capacity(count);
    let mut slots = Vec::with_capacity(count);
    let mut nulls = Vec::with_capacity(count);
    let mut items = Vec::with_capacity(count);
    for entry in batch.entries {
        slots.push(entry.slot);
        nulls.push(entry.request.is_none());
        match entry.request {
            Some(taken) => {
                timings.push(RequestTiming {
                    batch_size: taken.batch_size,
                    enqueued_at: taken.enqueued_at,
                });
                items.push(taken.item);
            }
            None => items.push(py.None()),
        }
    }
    Ok(PyBatch {
        items: PyList::new(py, items)?.unbind(),
        rejected: None,
        seq: batch.seq,
        timings: Timings::Many(timings),
        stats: StatsOwner::Shared(stats),
        slots: Some(slots.into_boxed_slice()),
        nulls: Some(nulls.into_boxed_slice()),
        reported: AtomicBool::new(false),
        expired: false,
    })
}
