//! `tritonfast._core.Inflater`: [`crate::inflate`] for the HTTP frontend's compressed request
//! bodies, each step run without the GIL.

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::gil::without_gil;
use super::pool::{PyOwnedBytes, borrowed_bytes, contiguous_bytes};
use crate::inflate::{InflateState, Inflater};

/// Inflates one compressed body (a C-contiguous numpy array of its bytes, copied when the
/// inflater is made) step by step.
#[pyclass(name = "Inflater", module = "tritonfast._core", frozen)]
pub(crate) struct PyInflater {
    // The inflater, until `take` hands its output over. Steps hold the lock without the GIL.
    inner: Mutex<Option<Inflater>>,
}

#[pymethods]
impl PyInflater {
    #[new]
    fn new(py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (address, len) = contiguous_bytes(body)?;
        // `body` (borrowed from the caller) keeps the bytes alive until this returns, and the
        // handler that owns a request body does not write to it meanwhile.
        let input = without_gil(py, move || {
            // SAFETY: alive and unwritten while they are copied (see above).
            Ok(unsafe { borrowed_bytes(address, len) }.to_vec())
        })?;
        Ok(Self {
            inner: Mutex::new(Some(Inflater::new(input))),
        })
    }

    /// Inflates up to `max_out` more bytes; returns the total inflated so far.
    fn step(&self, py: Python<'_>, max_out: usize) -> PyResult<usize> {
        without_gil(py, || {
            Ok(self
                .inner
                .lock()
                .as_mut()
                .map_or(0, |inflater| inflater.step(max_out)))
        })
    }

    /// `"running"` (step again), `"ended"`, `"truncated"` (the input stopped early: the output
    /// so far is the body), or `"corrupt"`; `"taken"` after `take`.
    #[getter]
    fn state(&self) -> &'static str {
        match self.inner.lock().as_ref().map(Inflater::state) {
            Some(InflateState::Running) => "running",
            Some(InflateState::Ended) => "ended",
            Some(InflateState::Truncated) => "truncated",
            Some(InflateState::Corrupt) => "corrupt",
            None => "taken",
        }
    }

    /// The inflated bytes (once; an empty body afterwards).
    fn take(&self) -> PyOwnedBytes {
        let out = self
            .inner
            .lock()
            .take()
            .map(Inflater::into_output)
            .unwrap_or_default();
        PyOwnedBytes::from_vec(out)
    }
}
