//! [`crate::copy`] for Python: one array's bytes into another's.

use pyo3::prelude::*;

use super::gil::without_gil;
use super::pool::array_memory;
use crate::error::CoreError;

/// Copies the bytes of `source` to the start of `destination` (C-contiguous numpy arrays,
/// `destination` writable and at least as large) with the GIL released: large copies on the
/// core's copy threads, with streaming stores. Overlapping arrays are moved as by `memmove`.
/// Trusted callers only: any object with an array interface is taken at its word.
#[pyfunction]
pub(crate) fn copy_into(
    py: Python<'_>,
    destination: &Bound<'_, PyAny>,
    source: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (to, room, read_only) = array_memory(destination)?;
    let (from, len, _) = array_memory(source)?;
    if read_only {
        return Err(CoreError::bad_value("the destination array is read-only").into());
    }
    if len > room {
        return Err(CoreError::bad_value(format!(
            "{len} bytes do not fit in a destination of {room} bytes"
        ))
        .into());
    }
    // SAFETY: numpy's interface of the two C-contiguous arrays gives `len` readable bytes at
    // `from` and at least `len` writable bytes at `to` (checked above), both kept alive by the
    // arrays borrowed for this call.
    unsafe { move_bytes(py, from, to, len) }
}

/// Moves `len` bytes from address `from` to address `to` with the GIL released, as `memmove`
/// (nothing to do when they are the same place): large non-overlapping copies on the core's
/// copy threads ([`crate::copy::copy_nonoverlapping`]).
///
/// # Safety
/// `from` must be valid for reads and `to` for writes of `len` bytes for the whole call, and
/// nothing else may write either range meanwhile. Overlap is judged by address: the two must
/// not be distinct mappings of the same memory.
pub(crate) unsafe fn move_bytes(
    py: Python<'_>,
    from: usize,
    to: usize,
    len: usize,
) -> PyResult<()> {
    if len == 0 || from == to {
        return Ok(());
    }
    let overlapping = from < to.saturating_add(len) && to < from.saturating_add(len);
    without_gil(py, || {
        // SAFETY: the caller's contract; overlapping ranges take `copy`, which allows them.
        unsafe {
            if overlapping {
                std::ptr::copy(from as *const u8, to as *mut u8, len);
            } else {
                crate::copy::copy_nonoverlapping(from as *const u8, to as *mut u8, len);
            }
        }
        Ok(())
    })
}
