//! `tritonfast._core.Outbox` and `OutStream`: the HTTP frontend's socket writes, sent from the
//! core's writer thread (see the core's `outbox` module for why).

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use super::gil::without_gil;
use crate::error::CoreError;
use crate::outbox::{Outbox, Stream};

/// The writer thread. `open(fileno)` gives a stream for one connected socket.
#[pyclass(name = "Outbox", module = "tritonfast._core", frozen)]
pub(crate) struct PyOutbox(Outbox);

#[pymethods]
impl PyOutbox {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(Self(Outbox::new().map_err(CoreError::from)?))
    }

    /// A stream over a duplicate of the socket descriptor `fileno`, which stays the caller's.
    fn open(&self, fileno: i32) -> PyResult<PyOutStream> {
        if fileno < 0 {
            return Err(CoreError::bad_value("not an open socket").into());
        }
        // SAFETY: a caller contract, not enforced (any int can be passed): `fileno` is an open
        // socket for the duration of this call. It is only duplicated here, never closed, so
        // a wrong number at worst duplicates another descriptor or fails with EBADF.
        let fd = unsafe { BorrowedFd::borrow_raw(fileno) };
        Ok(PyOutStream(self.0.open(fd).map_err(CoreError::from)?))
    }

    /// Ends the writer thread once everything written has been sent, or after `timeout_s`
    /// at the latest (the GIL is released meanwhile).
    fn finish(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        let within = Duration::try_from_secs_f64(timeout_s)
            .map_err(|_| CoreError::bad_value("timeout_s must be a finite number >= 0"))?;
        without_gil(py, || {
            self.0.finish(within);
            Ok(())
        })
    }
}

/// One connection's outgoing bytes, sent in the order written.
#[pyclass(name = "OutStream", module = "tritonfast._core", frozen)]
pub(crate) struct PyOutStream(pub(super) Arc<Stream>);

#[pymethods]
impl PyOutStream {
    /// Queues `data`; `ConnectionError` once the stream is closed or its peer gone.
    fn write(&self, data: &[u8]) -> PyResult<()> {
        Ok(self.0.write(data).map_err(CoreError::from)?)
    }

    /// Sends `data` now on this thread if nothing written before it waits (what the socket
    /// does not take is queued); else queues it like `write`.
    fn write_now(&self, data: &[u8]) -> PyResult<()> {
        Ok(self.0.write_now(data).map_err(CoreError::from)?)
    }

    /// Closes the stream's hold on the socket once everything written is sent.
    fn close(&self) {
        self.0.close();
    }

    /// Drops what is unsent and lets go of the socket.
    fn abort(&self) {
        self.0.abort();
    }

    /// Bytes written and not yet handed to the kernel.
    #[getter]
    fn unsent(&self) -> usize {
        self.0.unsent()
    }
}
