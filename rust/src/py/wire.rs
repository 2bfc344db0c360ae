//! The protobuf wire helpers of [`crate::wire`] for the gRPC frontend.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The message without a field, and the `(start, end)` ranges of that field's payloads.
type SplitMessage<'py> = (Bound<'py, PyBytes>, Vec<(usize, usize)>);

/// See [`crate::wire::split_field`].
#[pyfunction]
pub(crate) fn split_message_field<'py>(
    py: Python<'py>,
    message: &Bound<'py, PyBytes>,
    field: u64,
) -> PyResult<SplitMessage<'py>> {
    let (rest, spans) = crate::wire::split_field(message.as_bytes(), field)?;
    Ok((PyBytes::new(py, &rest), spans))
}

/// The key and length that precede `length` payload bytes of field `field` on the wire.
#[pyfunction]
pub(crate) fn length_delimited_prefix(
    py: Python<'_>,
    field: u64,
    length: u64,
) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &crate::wire::length_delimited_prefix(field, length))
}
