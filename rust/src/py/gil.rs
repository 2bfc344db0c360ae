//! The one helper every blocking call into the core goes through.

use pyo3::marker::Ungil;
use pyo3::prelude::*;

use super::error::to_py_err;
use crate::error::CoreError;

/// Runs `f` with the GIL released, so other Python threads (the event loop, other model
/// instances) keep running while it waits, then maps its error to the package's exception.
///
/// Panics inside `f` are not caught here: the GIL is reacquired on unwind and `PyO3` turns the
/// panic into `PanicException` at the method boundary.
pub(crate) fn without_gil<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: Ungil + FnOnce() -> Result<T, CoreError>,
    T: Send,
{
    py.detach(f).map_err(|err| to_py_err(py, &err))
}
