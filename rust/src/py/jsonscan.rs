//! [`crate::jsonscan`] for the HTTP frontend's JSON bodies.

use pyo3::prelude::*;

use super::gil::without_gil;
use super::pool::{borrowed_bytes, contiguous_bytes};

/// `(offset, message)` of the first error `RapidJSON` would report in `document` (a
/// C-contiguous numpy array of its bytes, read in place), or `(end, None)` where a valid
/// document ends. Runs without the GIL.
#[pyfunction]
pub(crate) fn json_error(
    py: Python<'_>,
    document: &Bound<'_, PyAny>,
) -> PyResult<(usize, Option<&'static str>)> {
    let (address, len) = contiguous_bytes(document)?;
    // `document` (borrowed from the caller) keeps the bytes alive until this returns, and the
    // HTTP handler that owns a request body does not write to it while it is being checked.
    let outcome = without_gil(py, move || {
        // SAFETY: alive and unwritten while it is scanned (see above).
        let bytes = unsafe { borrowed_bytes(address, len) };
        Ok(crate::jsonscan::scan(bytes))
    })?;
    Ok(match outcome {
        Ok(end) => (end, None),
        Err((error, offset)) => (offset, Some(error.message())),
    })
}
