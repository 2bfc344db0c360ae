//! `tritonfast._core.Inflater` and `InflatedBody`: [`crate::inflate`] for the HTTP frontend's
//! compressed request bodies, each step run without the GIL.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::gil::without_gil;
use super::pool::{array_interface, borrowed_bytes, contiguous_bytes};
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
    fn take(&self) -> PyInflatedBody {
        let out = self
            .inner
            .lock()
            .take()
            .map(Inflater::into_output)
            .unwrap_or_default();
        PyInflatedBody::new(out)
    }
}

/// An inflated body, viewed by numpy without a copy (`numpy.asarray(body)`).
#[pyclass(name = "InflatedBody", module = "tritonfast._core", frozen)]
pub(crate) struct PyInflatedBody {
    // Never touched until drop: numpy reads and writes through `address` meanwhile.
    _bytes: Vec<u8>,
    address: usize,
    len: usize,
}

impl PyInflatedBody {
    fn new(mut bytes: Vec<u8>) -> Self {
        let address = bytes.as_mut_ptr() as usize;
        let len = bytes.len();
        Self {
            _bytes: bytes,
            address,
            len,
        }
    }
}

#[pymethods]
impl PyInflatedBody {
    /// numpy's array interface (version 3): a writable 1-D `uint8` array over the bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface(py, self.address, self.len, false)
    }

    fn __len__(&self) -> usize {
        self.len
    }
}
