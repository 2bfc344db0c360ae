//! `TensorPool` and `PooledBuffer`: pooled buffers that numpy views without a copy.
//!
//! The extension targets the stable ABI of Python 3.10, which has no buffer protocol, so a
//! `PooledBuffer` offers numpy's `__array_interface__` instead: `numpy.asarray(buffer)` is a
//! `uint8` view whose base is the buffer object, and the memory returns to the pool when the
//! last view is gone.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::gil::without_gil;
use crate::error::CoreError;
use crate::pool::{IDLE_MAPPED_BYTES, PoolBuffer, TensorPool};

#[pyclass(name = "TensorPool", module = "tritonfast._core", frozen)]
pub(crate) struct PyTensorPool {
    pool: TensorPool,
}

/// The (address, byte length) of a C-contiguous numpy array, from its array interface.
pub(crate) fn contiguous_bytes(array: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
    let (address, nbytes, _) = array_memory(array)?;
    Ok((address, nbytes))
}

/// The `len` bytes at `address` (from [`contiguous_bytes`]) as a slice.
///
/// # Safety
/// The array they came from must stay alive, and nothing may write to those bytes, while the
/// slice is used.
pub(crate) unsafe fn borrowed_bytes<'a>(address: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: numpy's `__array_interface__` of a C-contiguous array gives the start of
    // `nbytes` readable bytes; the caller keeps them alive and unwritten.
    unsafe { std::slice::from_raw_parts(address as *const u8, len) }
}

/// The (address, byte length, read-only) of a C-contiguous numpy array.
pub(crate) fn array_memory(array: &Bound<'_, PyAny>) -> PyResult<(usize, usize, bool)> {
    let interface = array.getattr("__array_interface__")?;
    if !interface.get_item("strides")?.is_none() {
        return Err(CoreError::bad_value(
            "expected a C-contiguous array (numpy.ascontiguousarray)",
        )
        .into());
    }
    let (address, read_only): (usize, bool) = interface.get_item("data")?.extract()?;
    let nbytes: usize = array.getattr("nbytes")?.extract()?;
    Ok((address, nbytes, read_only))
}

#[pymethods]
impl PyTensorPool {
    /// A heap pool; or, given `segment` (a POSIX name) and `segment_bytes`, a pool whose
    /// buffers are ranges of that new shared-memory segment (see `PooledBuffer.offset`); or,
    /// given `objects` (a POSIX name prefix), a pool each of whose buffers is a shared-memory
    /// object of its own (see `PooledBuffer.object`), idle ones kept up to `idle_bytes`.
    #[new]
    #[pyo3(signature = (max_free_per_class = 4, segment = None, segment_bytes = 0, objects = None, idle_bytes = IDLE_MAPPED_BYTES))]
    fn new(
        max_free_per_class: usize,
        segment: Option<&str>,
        segment_bytes: usize,
        objects: Option<&str>,
        idle_bytes: usize,
    ) -> PyResult<Self> {
        let pool = match (segment, objects) {
            (Some(name), _) => TensorPool::in_segment(name, segment_bytes, max_free_per_class)?,
            (None, Some(prefix)) => TensorPool::in_objects(prefix, max_free_per_class, idle_bytes),
            (None, None) => TensorPool::new(max_free_per_class),
        };
        Ok(Self { pool })
    }

    /// The shared segment's POSIX name (None for a heap pool).
    #[getter]
    fn segment(&self) -> Option<&str> {
        self.pool.segment_name()
    }

    /// One pooled buffer holding the bytes of `arrays` (C-contiguous numpy arrays) back to
    /// back; the copy runs with the GIL released.
    fn gather(&self, py: Python<'_>, arrays: &Bound<'_, PyList>) -> PyResult<PyPooledBuffer> {
        let mut parts = Vec::with_capacity(arrays.len());
        for array in arrays.iter() {
            parts.push(contiguous_bytes(&array)?);
        }
        let pool = self.pool.clone();
        // `arrays` (borrowed from the caller) keeps every array, and so every address, alive
        // until this method returns.
        let buffer = without_gil(py, move || {
            let slices: Vec<&[u8]> = parts
                .iter()
                // SAFETY: the arrays are alive (see above), and nothing writes to them while
                // we copy (the thread that owns these inputs is the caller, blocked here).
                .map(|&(address, len)| unsafe { borrowed_bytes(address, len) })
                .collect();
            pool.gather(&slices)
        })?;
        Ok(PyPooledBuffer::new(buffer))
    }

    /// A pooled buffer of `nbytes` bytes (contents unspecified).
    fn acquire(&self, nbytes: usize) -> PyResult<PyPooledBuffer> {
        Ok(PyPooledBuffer::new(self.pool.acquire(nbytes)?))
    }

    /// `{"allocated", "reused", "bytes_gathered", "idle_buffers"}`.
    fn statistics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.pool.stats();
        let dict = PyDict::new(py);
        dict.set_item("allocated", stats.allocated)?;
        dict.set_item("reused", stats.reused)?;
        dict.set_item("bytes_gathered", stats.bytes_gathered)?;
        dict.set_item("idle_buffers", self.pool.idle_buffers())?;
        Ok(dict)
    }
}

/// Bytes on loan from a `TensorPool`, returned to it when this object is collected.
#[pyclass(name = "PooledBuffer", module = "tritonfast._core", frozen)]
pub(crate) struct PyPooledBuffer {
    // Only its metadata is read until drop: numpy writes through `address` meanwhile.
    buffer: PoolBuffer,
    address: usize,
    len: usize,
}

impl PyPooledBuffer {
    fn new(mut buffer: PoolBuffer) -> Self {
        let address = buffer.as_mut_ptr() as usize;
        let len = buffer.len();
        Self {
            buffer,
            address,
            len,
        }
    }
}

#[pymethods]
impl PyPooledBuffer {
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Where the buffer starts in its pool's shared segment (None for heap buffers).
    #[getter]
    fn offset(&self) -> Option<usize> {
        self.buffer.offset()
    }

    /// The shared-memory object the buffer is, as another process opens it: `(path, device,
    /// inode)`; None unless its pool was made with `objects`.
    #[getter]
    fn object(&self) -> Option<(String, u64, u64)> {
        let object = self.buffer.object()?;
        let (device, inode) = object.identity()?;
        Some((object.path(), device, inode))
    }

    /// Takes the memory of the first `nbytes` bytes of an object buffer now, so that writing
    /// them cannot fail; raises UNAVAILABLE when shared memory has no room for them.
    fn reserve(&self, nbytes: usize) -> PyResult<()> {
        Ok(self.buffer.reserve(nbytes)?)
    }

    /// numpy's array interface (version 3): a writable 1-D `uint8` array over the buffer.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface(py, self.address, self.len, false)
    }

    fn __len__(&self) -> usize {
        self.len
    }
}

/// Bytes the core made (an inflated body, parsed numbers), viewed by numpy without a copy
/// (`numpy.asarray(buffer)`, then `.view(dtype)`), freed when the last view is gone.
#[pyclass(name = "OwnedBytes", module = "tritonfast._core", frozen)]
pub(crate) struct PyOwnedBytes {
    // Never touched until drop: numpy reads and writes through `address` meanwhile. (Moving
    // the vector into the box leaves its elements where they are.)
    _owner: Box<dyn std::any::Any + Send + Sync>,
    address: usize,
    len: usize,
}

impl PyOwnedBytes {
    pub(crate) fn from_vec<T: Send + Sync + 'static>(mut values: Vec<T>) -> Self {
        let address = values.as_mut_ptr() as usize;
        let len = std::mem::size_of_val(values.as_slice());
        Self {
            _owner: Box::new(values),
            address,
            len,
        }
    }
}

#[pymethods]
impl PyOwnedBytes {
    /// numpy's array interface (version 3): a writable 1-D `uint8` array over the bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        array_interface(py, self.address, self.len, false)
    }

    fn __len__(&self) -> usize {
        self.len
    }
}

/// numpy's array interface (version 3) for `len` bytes at `address`: a 1-D `uint8` array.
pub(crate) fn array_interface(
    py: Python<'_>,
    address: usize,
    len: usize,
    read_only: bool,
) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    // numpy rejects a null pointer even for zero bytes; any aligned address will do.
    let address = if len == 0 && address == 0 {
        64
    } else {
        address
    };
    dict.set_item("data", (address, read_only))?;
    dict.set_item("shape", (len,))?;
    dict.set_item("typestr", "|u1")?;
    dict.set_item("version", 3)?;
    Ok(dict)
}
