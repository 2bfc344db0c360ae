//! [`crate::jsondata`] for the HTTP frontend's large JSON requests, run without the GIL.

use pyo3::prelude::*;

use super::gil::without_gil;
use super::pool::{PyOwnedBytes, borrowed_bytes, contiguous_bytes};
use crate::error::CoreError;
use crate::jsondata::{NumberKind, Numbers, locate_input_data, parse_numbers};

/// `[(k, start, end)]`: where each `inputs[k].data` array lies in `document` (a C-contiguous
/// numpy array of a JSON document `json_error` accepted, cut at its end).
#[pyfunction]
pub(crate) fn json_input_data(
    py: Python<'_>,
    document: &Bound<'_, PyAny>,
) -> PyResult<Vec<(usize, usize, usize)>> {
    let (address, len) = contiguous_bytes(document)?;
    // `document` (borrowed from the caller) keeps the bytes alive until this returns, and the
    // handler that owns a request body does not write to it meanwhile.
    without_gil(py, move || {
        // SAFETY: alive and unwritten while they are read (see above).
        Ok(locate_input_data(unsafe { borrowed_bytes(address, len) }))
    })
}

/// The numbers of the JSON array at `document[start:end]`, flattened, as 8-byte values of
/// `kind` (`"f64"`, `"i64"` or `"u64"`) in a buffer numpy views (`.view(dtype)`); None when
/// an element is not a number of that kind.
#[pyfunction]
pub(crate) fn json_numbers(
    py: Python<'_>,
    document: &Bound<'_, PyAny>,
    start: usize,
    end: usize,
    kind: &str,
) -> PyResult<Option<PyOwnedBytes>> {
    let kind = match kind {
        "f64" => NumberKind::Float,
        "i64" => NumberKind::Signed,
        "u64" => NumberKind::Unsigned,
        _ => {
            return Err(CoreError::bad_value(format!("unknown number kind '{kind}'")).into());
        }
    };
    let (address, len) = contiguous_bytes(document)?;
    if start > end || end > len {
        return Err(CoreError::bad_value("the range is not within the document").into());
    }
    // As in `json_input_data`: alive and unwritten until this returns.
    let numbers = without_gil(py, move || {
        // SAFETY: see above; `start..end` is within the `len` bytes (checked).
        let document = unsafe { borrowed_bytes(address, len) };
        Ok(parse_numbers(&document[start..end], kind))
    })?;
    Ok(numbers.map(|numbers| match numbers {
        Numbers::Float(values) => PyOwnedBytes::from_vec(values),
        Numbers::Signed(values) => PyOwnedBytes::from_vec(values),
        Numbers::Unsigned(values) => PyOwnedBytes::from_vec(values),
    }))
}
