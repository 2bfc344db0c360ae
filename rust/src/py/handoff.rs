//! `tritonfast._core.Handoff`: instance threads offer their batches to the event loop (see the
//! core's `handoff` module for why), and `RequestQueue.pop_or_hand_off`, the instance threads'
//! side of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::gil::without_gil;
use super::queue::{PyBatch, PyRequestQueue, SIGNAL_CHECK_INTERVAL, to_batch};
use crate::error::CoreError;
use crate::handoff::{Completion, Handoff};
use crate::queue::{Batch, PopResult, Queued};

/// A batch offered by the instance with this index.
type Offer = (usize, Batch<Queued<Py<PyAny>>>);

/// Batches that instance threads formed and the event loop runs. Watch `fileno()` for
/// readability (`loop.add_reader`), then call `take()`. Switched off when created.
#[pyclass(name = "Handoff", module = "tritonfast._core", frozen)]
pub(crate) struct PyHandoff {
    inner: Arc<Handoff<Offer>>,
    queue: Py<PyRequestQueue>,
}

#[pymethods]
impl PyHandoff {
    #[new]
    fn new(queue: Py<PyRequestQueue>) -> PyResult<Self> {
        let inner = Handoff::new().map_err(CoreError::from)?;
        Ok(Self {
            inner: Arc::new(inner),
            queue,
        })
    }

    fn fileno(&self) -> i32 {
        self.inner.fd()
    }

    /// Whether instance threads offer their batches (else they run them themselves).
    #[getter]
    fn enabled(&self) -> bool {
        self.inner.is_enabled()
    }

    #[setter]
    fn set_enabled(&self, enabled: bool) {
        self.inner.set_enabled(enabled);
    }

    /// Switches offers off for good (`enabled = True` no longer switches them on).
    fn close(&self) {
        self.inner.close();
    }

    /// The offered batches, oldest first, as `(instance index, Batch, HandoffDone)`. Call
    /// `done.complete()` once the batch has run (dropping `done` does the same), which lets the
    /// instance take its next batch.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let queue = self.queue.bind(py);
        // Every completion is wrapped first: if a conversion below fails, the batches not yet
        // converted are dropped with their `HandoffDone`, which lets their instances go on.
        let offered: Vec<_> = self
            .inner
            .take()
            .into_iter()
            .map(|((instance, batch), completion)| (instance, batch, HandoffDone(completion)))
            .collect();
        let taken = PyList::empty(py);
        for (instance, batch, done) in offered {
            let batch = to_batch(queue, PopResult::Batch(batch))?;
            taken.append((instance, batch, done))?;
        }
        Ok(taken)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// Completes one handed-off batch: the instance that offered it waits for this.
#[pyclass(name = "HandoffDone", module = "tritonfast._core", frozen)]
pub(crate) struct HandoffDone(Arc<Completion>);

#[pymethods]
impl HandoffDone {
    fn complete(&self) {
        self.0.complete();
    }
}

impl Drop for HandoffDone {
    /// A batch whose runner went away without saying so must not leave its instance waiting.
    fn drop(&mut self) {
        self.0.complete();
    }
}

/// What one GIL-free stretch of `pop_or_hand_off` ended with.
enum Stretch {
    /// A pop result for Python: a batch the handoff refused, rejections, a timeout, closed.
    Pop(PopResult<Queued<Py<PyAny>>>),
    /// The stretch's time ran out (batches may have been handed off and run meanwhile).
    SliceOver,
}

/// `RequestQueue.pop_or_hand_off` (documented there).
pub(super) fn pop_or_hand_off(
    queue: &Bound<'_, PyRequestQueue>,
    timeout_us: u64,
    handoff: &Bound<'_, PyHandoff>,
    instance: usize,
) -> PyResult<Option<PyBatch>> {
    let py = queue.py();
    let this = queue.get();
    let handoff = &handoff.get().inner;
    let deadline = Instant::now().checked_add(Duration::from_micros(timeout_us));
    loop {
        let slice_end = Instant::now() + SIGNAL_CHECK_INTERVAL;
        let end = deadline.map_or(slice_end, |d| d.min(slice_end));
        let stretch = without_gil(py, || {
            Ok(loop {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Stretch::SliceOver;
                }
                match this.inner.pop_batch_queued(left) {
                    PopResult::Batch(batch) => match handoff.offer((instance, batch)) {
                        Ok(done) => done.wait(),
                        Err((_, batch)) => break Stretch::Pop(PopResult::Batch(batch)),
                    },
                    PopResult::TimedOut => break Stretch::SliceOver,
                    other => break Stretch::Pop(other),
                }
            })
        })?;
        match stretch {
            Stretch::Pop(result) => return to_batch(queue, result),
            Stretch::SliceOver if deadline.is_some_and(|d| Instant::now() >= d) => {
                return to_batch(queue, PopResult::TimedOut);
            }
            Stretch::SliceOver => py.check_signals()?,
        }
    }
}
