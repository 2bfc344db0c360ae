//! `tritonfast._core.CallReplies` and `RequestReplies`: a gRPC stream call's queue of
//! serialized replies, which the core's reader threads fill without the GIL (see the core's
//! `lane::callreplies` module).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::lane::callreplies::{CallReplies, Pushed, Reply, RequestReplies};

/// A reply the server's Python queued: handed back as it came, not copied.
struct PythonReply(Py<PyBytes>);

/// One call's replies, in the order queued; full at `ahead`.
#[pyclass(name = "CallReplies", module = "tritonfast._core", frozen)]
pub(crate) struct PyCallReplies(pub(super) Arc<CallReplies>);

#[pymethods]
impl PyCallReplies {
    #[new]
    fn new(ahead: usize) -> Self {
        Self(Arc::new(CallReplies::new(ahead)))
    }

    /// Queues `reply`: True when the call was idle (the caller starts sending, with
    /// `next()`), False when a send in flight takes it on, None when the call is over.
    fn push(&self, reply: Py<PyBytes>) -> Option<bool> {
        match self.0.push(Box::new(PythonReply(reply))) {
            Pushed::Idle => Some(true),
            Pushed::Queued => Some(false),
            Pushed::Over => None,
        }
    }

    /// The next reply to send and how many wait behind it; None once none is queued (the
    /// call is idle from then on) or the call is over.
    fn next<'py>(&self, py: Python<'py>) -> Option<(Bound<'py, PyBytes>, usize)> {
        let (reply, left) = self.0.next()?;
        Some((python_bytes(py, reply), left))
    }

    /// Nothing more is sent: what is queued, and whatever comes, is dropped.
    fn end(&self) {
        self.0.end();
    }

    #[getter]
    fn over(&self) -> bool {
        self.0.is_over()
    }

    /// Whether a send is in flight (or about to be started).
    #[getter]
    fn sending(&self) -> bool {
        self.0.is_sending()
    }

    fn full(&self) -> bool {
        self.0.is_full()
    }
}

/// `reply` as Python bytes: the object the server's Python queued, or the core's bytes copied.
fn python_bytes(py: Python<'_>, reply: Reply) -> Bound<'_, PyBytes> {
    match reply.downcast::<PythonReply>() {
        Ok(queued) => queued.0.into_bound(py),
        Err(reply) => match reply.downcast::<Vec<u8>>() {
            Ok(bytes) => PyBytes::new(py, &bytes),
            Err(_) => PyBytes::new(py, b""), // (nothing else is queued)
        },
    }
}

/// One request's replies on its call's queue (handed to `Lane.submit_grpc`).
#[pyclass(name = "RequestReplies", module = "tritonfast._core", frozen)]
pub(crate) struct PyRequestReplies(pub(super) Arc<RequestReplies>);

#[pymethods]
impl PyRequestReplies {
    #[new]
    fn new(call: &Bound<'_, PyCallReplies>) -> Self {
        Self(Arc::new(RequestReplies::new(Arc::clone(&call.get().0))))
    }

    /// When the core queued the request's first reply (`time.perf_counter_ns()`); 0 before.
    #[getter]
    fn first_at(&self) -> u64 {
        self.0.first_at()
    }
}
