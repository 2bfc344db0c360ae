//! `tritonfast._core.SequenceBatcher` and `SequenceTicket`: the core's sequence batcher with
//! Python objects as items.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString};

use super::gil::without_gil;
use super::queue::{
    PyBatch, SIGNAL_CHECK_INTERVAL, rejected_batch, sequence_batch, summaries_dict,
};
use super::stats::snapshot_dict;
use crate::error::CoreError;
use crate::sequence::{
    CorrelationId, SequenceBatcher, SequenceConfig, SequencePop, SequenceTicket, Strategy,
};

/// The handle of a request pushed with `SequenceBatcher.push`.
#[pyclass(
    name = "SequenceTicket",
    module = "tritonfast._core",
    frozen,
    freelist = 64
)]
pub(crate) struct PySequenceTicket {
    inner: SequenceTicket,
}

#[pymethods]
impl PySequenceTicket {
    /// "QUEUED", "TAKEN" (handed out to run) or "CANCELLED".
    #[getter]
    fn status(&self) -> &'static str {
        if self.inner.taken() {
            "TAKEN"
        } else if self.inner.cancelled() {
            "CANCELLED"
        } else {
            "QUEUED"
        }
    }

    fn __repr__(&self) -> String {
        format!("SequenceTicket(status='{}')", self.status())
    }
}

/// A stateful model's sequence batcher: requests of one sequence (correlation ID) are pinned
/// to one instance slot, run one at a time in arrival order, and sequences beyond the slots
/// wait in a backlog (see the Rust `sequence` module for the rules).
#[pyclass(name = "SequenceBatcher", module = "tritonfast._core", frozen)]
pub(crate) struct PySequenceBatcher {
    pub(super) inner: SequenceBatcher<Py<PyAny>>,
}

#[pymethods]
impl PySequenceBatcher {
    #[new]
    #[pyo3(signature = (
        model,
        instances,
        max_batch_size = 0,
        *,
        strategy = "direct",
        max_queue_delay_us = 0,
        minimum_slot_utilization = 0.0,
        max_candidate_sequences = 0,
        preferred_batch_sizes = Vec::new(),
        max_sequence_idle_us = 1_000_000,
        latency_summaries = false,
    ))]
    #[allow(clippy::too_many_arguments)] // mirrors Triton's ModelSequenceBatching fields
    fn new(
        model: String,
        instances: usize,
        max_batch_size: u32,
        strategy: &str,
        max_queue_delay_us: u64,
        minimum_slot_utilization: f32,
        max_candidate_sequences: u32,
        preferred_batch_sizes: Vec<u32>,
        max_sequence_idle_us: u64,
        latency_summaries: bool,
    ) -> PyResult<Self> {
        let max_queue_delay = Duration::from_micros(max_queue_delay_us);
        let strategy = match strategy {
            "direct" => Strategy::Direct {
                max_queue_delay,
                minimum_slot_utilization,
            },
            "oldest" => Strategy::Oldest {
                max_candidate_sequences,
                preferred_batch_sizes,
                max_queue_delay,
            },
            other => {
                return Err(CoreError::invalid_arg(format!(
                    "strategy must be 'direct' or 'oldest', got '{other}'"
                ))
                .into());
            }
        };
        let inner = SequenceBatcher::new(SequenceConfig {
            model,
            instances,
            max_batch_size,
            strategy,
            max_sequence_idle: Duration::from_micros(max_sequence_idle_us),
            latency_summaries,
        })?;
        Ok(Self { inner })
    }

    /// Queues `item` for sequence `correlation_id` (a non-negative int below 2**64, or a str);
    /// never blocks. Raises `InvalidArgumentError` for the errors Triton gives (no correlation
    /// ID, no START for an unknown sequence, batch size above 1), `UnavailableError` for a
    /// `start` once closed.
    /// `timeout_us` (0: none) is the request's timeout: a backlog sequence is dropped when it
    /// passes before the sequence gets a slot (its requests come back in a batch whose
    /// `expired` is true).
    #[pyo3(signature = (item, correlation_id, start = false, end = false, batch_size = 1, timeout_us = 0))]
    fn push(
        &self,
        item: Py<PyAny>,
        correlation_id: &Bound<'_, PyAny>,
        start: bool,
        end: bool,
        batch_size: u32,
        timeout_us: u64,
    ) -> PyResult<PySequenceTicket> {
        let id = correlation_id_of(correlation_id)?;
        let timeout = (timeout_us > 0).then(|| Duration::from_micros(timeout_us));
        let inner = self
            .inner
            .push_timed(&id, start, end, item, batch_size, timeout)?;
        Ok(PySequenceTicket { inner })
    }

    /// Ends the live sequence `correlation_id` without a request (an iterative sequence whose
    /// request was not rescheduled): it leaves its slot once none of its requests waits.
    fn end(&self, correlation_id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.end(&correlation_id_of(correlation_id)?);
        Ok(())
    }

    /// Removes a still-waiting request so it never runs; `True` if it was removed.
    fn cancel(&self, ticket: &Bound<'_, PySequenceTicket>) -> bool {
        self.inner.cancel(&ticket.get().inner)
    }

    /// Waits up to `timeout_us` microseconds (GIL released) for a batch for instance
    /// `instance`. Returns a `Batch` whose `items` hold `None` at null entries (slots without a
    /// request) and whose `slots` name each position's slot, or whose `rejected` holds the
    /// requests of cancelled sequences (answer them CANCELLED) or, with `expired`, of backlog
    /// sequences whose timeout expired; both empty when the wait timed out. `None` once closed
    /// with nothing left for this instance.
    fn pop(&self, py: Python<'_>, instance: usize, timeout_us: u64) -> PyResult<Option<PyBatch>> {
        if instance >= self.inner.config().instances {
            return Err(CoreError::invalid_arg(format!("no instance {instance}")).into());
        }
        let deadline = Instant::now().checked_add(Duration::from_micros(timeout_us));
        loop {
            // Long waits go in slices, checking for signals (Ctrl-C) in between.
            let slice = deadline.map_or(SIGNAL_CHECK_INTERVAL, |d| {
                d.saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK_INTERVAL)
            });
            let got = without_gil(py, || Ok(self.inner.pop_batch(instance, slice)))?;
            match got {
                SequencePop::Batch(batch) => {
                    let stats = Arc::clone(self.inner.stats());
                    return Ok(Some(sequence_batch(py, batch, stats)?));
                }
                SequencePop::Cancelled(items) => {
                    let stats = Arc::clone(self.inner.stats());
                    return Ok(Some(rejected_batch(py, items, stats, false)?));
                }
                SequencePop::Expired(items) => {
                    let stats = Arc::clone(self.inner.stats());
                    return Ok(Some(rejected_batch(py, items, stats, true)?));
                }
                SequencePop::Closed => return Ok(None),
                SequencePop::TimedOut => {
                    if deadline.is_none_or(|d| Instant::now() >= d) {
                        let empty = crate::sequence::SlotBatch {
                            entries: Vec::new(),
                            seq: 0,
                        };
                        let stats = Arc::clone(self.inner.stats());
                        return Ok(Some(sequence_batch(py, empty, stats)?));
                    }
                    py.check_signals()?;
                }
            }
        }
    }

    /// Closes the batcher: new sequences are refused; live ones still run to their end (or
    /// until idle), then `pop` returns `None`.
    fn close(&self) {
        self.inner.close();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Closes the batcher for good and returns every request still waiting, to be answered
    /// (every sequence ends; later pushes fail, even for sequences that were live).
    fn abandon<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let left = without_gil(py, || Ok(self.inner.abandon()))?;
        PyList::new(py, left)
    }

    /// Sequences holding a slot or waiting in the backlog.
    #[getter]
    fn live_sequences(&self) -> usize {
        self.inner.live_sequences()
    }

    /// The model version's statistics (the layout of `RequestQueue.statistics()`).
    fn statistics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        snapshot_dict(py, &self.inner.stats().snapshot())
    }

    /// Like `RequestQueue.latency_summaries`.
    #[allow(clippy::needless_pass_by_value)] // PyO3 hands over owned arguments
    fn latency_summaries<'py>(
        &self,
        py: Python<'py>,
        quantiles: Vec<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        summaries_dict(py, self.inner.stats(), &quantiles)
    }

    /// Requests waiting to run.
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        let config = self.inner.config();
        format!(
            "SequenceBatcher(model='{}', instances={}, slots_per_instance={}, live={})",
            config.model,
            config.instances,
            config.slots_per_instance(),
            self.inner.live_sequences()
        )
    }
}

pub(super) fn correlation_id_of(value: &Bound<'_, PyAny>) -> PyResult<CorrelationId> {
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(CorrelationId::Text(text.to_str()?.to_owned()));
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(CorrelationId::Number(value.extract::<u64>()?));
    }
    Err(CoreError::bad_type("a correlation ID is an int or a str").into())
}
