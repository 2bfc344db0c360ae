//! `SharedMemoryRegistry` and `RegionView`: clients' shared-memory regions, seen from Python.
//!
//! A `RegionView` holds its region alive, so numpy arrays made from it (through
//! `__array_interface__`, as for pooled buffers) stay valid after the region is unregistered.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::gil::without_gil;
use crate::error::CoreError;
use crate::shm::{Region, RegionRegistry};

#[pyclass(name = "SharedMemoryRegistry", module = "tritonfast._core", frozen)]
pub(crate) struct PySharedMemoryRegistry {
    registry: Arc<RegionRegistry>,
}

impl PySharedMemoryRegistry {
    /// The registry itself, for the lanes whose requests name its regions.
    pub(crate) fn regions(&self) -> Arc<RegionRegistry> {
        Arc::clone(&self.registry)
    }
}

#[pymethods]
impl PySharedMemoryRegistry {
    #[new]
    fn new() -> Self {
        Self {
            registry: Arc::new(RegionRegistry::new()),
        }
    }

    /// Maps `byte_size` bytes at `offset` of the POSIX shared-memory object `key` as `name`.
    fn register(
        &self,
        py: Python<'_>,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> PyResult<()> {
        without_gil(py, || self.registry.register(name, key, offset, byte_size))
    }

    /// Forgets `name` (True if it was registered); requests using it keep it mapped.
    fn unregister(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        // Unmapping (when no request holds the region) is a system call: release the GIL.
        without_gil(py, || Ok(self.registry.unregister(name)))
    }

    /// Forgets every region; returns how many there were.
    fn unregister_all(&self, py: Python<'_>) -> PyResult<usize> {
        without_gil(py, || Ok(self.registry.unregister_all()))
    }

    /// `[{"name", "key", "offset", "byte_size"}]` for every region (by name), or for `name`.
    #[pyo3(signature = (name = None))]
    fn status<'py>(&self, py: Python<'py>, name: Option<&str>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for info in self.registry.status(name)? {
            let entry = PyDict::new(py);
            entry.set_item("name", info.name)?;
            entry.set_item("key", info.key)?;
            entry.set_item("offset", info.offset)?;
            entry.set_item("byte_size", info.byte_size)?;
            list.append(entry)?;
        }
        Ok(list)
    }

    /// `(key, offset, device, inode)` of region `name`: the object it maps (identified as the
    /// server opened it) and where the region starts in it; None for an unknown region.
    fn object_of(&self, name: &str) -> Option<(String, u64, u64, u64)> {
        let region = self.registry.get(name).ok()?;
        let (device, inode) = region.object_identity()?;
        let info = region.info();
        Some((info.key.clone(), info.offset, device, inode))
    }

    /// `byte_size` bytes at `offset` of region `name`, as an object numpy can view
    /// (read-only unless `writable`).
    #[pyo3(signature = (name, offset, byte_size, writable = false))]
    fn view(
        &self,
        name: &str,
        offset: u64,
        byte_size: u64,
        writable: bool,
    ) -> PyResult<RegionView> {
        let region = self.registry.get(name)?;
        let address = region.address(offset, byte_size)? as usize;
        let len = usize::try_from(byte_size).map_err(|_| CoreError::bad_value("too large"))?;
        Ok(RegionView {
            _region: region,
            address,
            len,
            writable,
        })
    }
}

/// A window of a registered region that numpy can view without a copy.
#[pyclass(name = "RegionView", module = "tritonfast._core", frozen)]
pub(crate) struct RegionView {
    // Keeps the mapping alive while numpy arrays point into it.
    _region: Arc<Region>,
    address: usize,
    len: usize,
    writable: bool,
}

#[pymethods]
impl RegionView {
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Copies the bytes of `array` (a C-contiguous numpy array) to the start of this
    /// writable window, with the GIL released.
    fn write(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        if !self.writable {
            return Err(CoreError::bad_value("this region view is read-only").into());
        }
        let (address, len) = super::pool::contiguous_bytes(array)?;
        if len > self.len {
            return Err(CoreError::bad_value(format!(
                "{len} bytes do not fit in a window of {} bytes",
                self.len
            ))
            .into());
        }
        // SAFETY: numpy's interface of a C-contiguous array gives `len` readable bytes at
        // `address`, kept alive by `array` (borrowed for this call); the window holds at least
        // `len` bytes at `self.address` (checked above when it was made, and `_region` keeps
        // the mapping alive). An output computed in place (the model returned a view of an
        // input placed at this very window) is already where it belongs: nothing moves.
        unsafe { super::copy::move_bytes(py, address, self.address, len) }
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// numpy's array interface (version 3): a 1-D `uint8` array over the window.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        super::pool::array_interface(py, self.address, self.len, !self.writable)
    }
}
