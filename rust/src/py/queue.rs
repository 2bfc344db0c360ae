//! `tritonfast._core.RequestQueue`: the core queue holding Python objects.

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::gil::without_gil;
use crate::queue::{BatchPolicy, PopResult, RequestQueue};

/// Longest stretch a `pop_batch` waits without coming back for the GIL to check for signals, so
/// Ctrl-C reaches a main thread blocked in `pop_batch`.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// A per-model request queue with dynamic batching (see the Rust `queue` module for the rules).
///
/// Items are any Python objects; they are not traversed by the garbage collector while queued,
/// so an item should not hold the only path to its queue in a reference cycle.
#[pyclass(name = "RequestQueue", module = "tritonfast._core", frozen)]
pub(crate) struct PyRequestQueue {
    inner: RequestQueue<Py<PyAny>>,
}

#[pymethods]
impl PyRequestQueue {
    #[new]
    #[pyo3(signature = (max_batch_size = 0, max_queue_delay_us = 0, preferred_batch_sizes = Vec::new()))]
    fn new(
        max_batch_size: u32,
        max_queue_delay_us: u64,
        preferred_batch_sizes: Vec<u32>,
    ) -> PyResult<Self> {
        let inner = RequestQueue::new(BatchPolicy {
            max_batch_size,
            max_queue_delay: Duration::from_micros(max_queue_delay_us),
            preferred_batch_sizes,
        })?;
        Ok(Self { inner })
    }

    /// Enqueues `item`; raises `UnavailableError` once closed, `InvalidArgumentError` for a bad
    /// batch size. Never blocks.
    #[pyo3(signature = (item, batch_size = 1))]
    fn push(&self, item: Py<PyAny>, batch_size: u32) -> PyResult<()> {
        Ok(self.inner.push(item, batch_size)?)
    }

    /// Waits up to `timeout_us` microseconds (GIL released) for a batch. Returns the batch as a
    /// list, `[]` on timeout, or `None` once the queue is closed and drained. `timeout_us=0`
    /// polls: it returns a batch only if one may leave right now.
    fn pop_batch<'py>(
        &self,
        py: Python<'py>,
        timeout_us: u64,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        // Fast path, GIL held: a batch that is ready now needs no wait, no GIL hand-off and no
        // clock reads.
        match self.inner.try_pop_batch() {
            PopResult::Batch(items) => return Ok(Some(PyList::new(py, items)?)),
            PopResult::Closed => return Ok(None),
            PopResult::TimedOut => {}
        }
        if timeout_us == 0 {
            return Ok(Some(PyList::empty(py)));
        }
        let timeout = Duration::from_micros(timeout_us);
        if timeout <= SIGNAL_CHECK_INTERVAL {
            return self.wait_for_batch(py, timeout);
        }
        // Long waits go in slices, checking for signals (Ctrl-C) in between.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let slice = deadline.map_or(SIGNAL_CHECK_INTERVAL, |d| {
                d.saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK_INTERVAL)
            });
            let batch = self.wait_for_batch(py, slice)?;
            let expired = deadline.is_some_and(|d| Instant::now() >= d);
            if batch.as_ref().is_none_or(|b| !b.is_empty()) || expired {
                return Ok(batch);
            }
            py.check_signals()?;
        }
    }

    /// Closes the queue: pushes fail from now on, blocked `pop_batch` calls wake, and queued
    /// items are still handed out before `pop_batch` returns `None`.
    fn close(&self) {
        self.inner.close();
    }

    /// Whether `close()` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        let policy = self.inner.policy();
        format!(
            "RequestQueue(max_batch_size={}, max_queue_delay_us={}, preferred_batch_sizes={:?}, \
             len={}, closed={})",
            policy.max_batch_size,
            policy.max_queue_delay.as_micros(),
            policy.preferred_batch_sizes,
            self.inner.len(),
            if self.inner.is_closed() {
                "True"
            } else {
                "False"
            },
        )
    }
}

impl PyRequestQueue {
    /// One blocking `pop_batch` with the GIL released; `[]` on timeout, `None` when closed.
    fn wait_for_batch<'py>(
        &self,
        py: Python<'py>,
        timeout: Duration,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        match without_gil(py, || Ok(self.inner.pop_batch(timeout)))? {
            PopResult::Batch(items) => Ok(Some(PyList::new(py, items)?)),
            PopResult::TimedOut => Ok(Some(PyList::empty(py))),
            PopResult::Closed => Ok(None),
        }
    }
}
