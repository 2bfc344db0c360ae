"""Clients' CUDA shared-memory regions (Triton's CUDA shared-memory extension).

A client allocates device memory, exports it with ``cudaIpcGetMemHandle`` and registers the
raw 64-byte handle with a device id and a byte size. The server opens the handle once
(``cudaIpcOpenMemHandle``) and copies tensors between that memory and the host (models here
run on the CPU). Copies of :data:`STAGED_BYTES` and more go through page-locked host buffers
(:class:`_Staging`): between device memory and ordinary (pageable) host memory they ran at
about 2 GB/s on an H100 machine. Everything goes through cuda-python, imported only when a region is
registered.

On a machine without a usable GPU (no cuda-python, no driver, no device) the endpoints still
answer as Triton's do: status lists no region, unregister succeeds, and register fails with
"GPUs not supported".
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonfast._core import copy_into
from tritonfast.errors import (
    AlreadyExistsError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
)

IPC_HANDLE_BYTES = 64
# Copies from this size on are staged through page-locked memory.
STAGED_BYTES = 1 << 20
# Page-locked buffers kept for reuse, at most this many bytes of them.
STAGED_IDLE_BYTES = 256 << 20


def cuda_runtime() -> Any | None:
    """cuda-python's runtime module if at least one GPU can be used, else None."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # cuda-python before 12.6
        except ImportError:
            return None
    try:
        error, count = runtime.cudaGetDeviceCount()
    except Exception:  # a broken install is "no GPU", not a server error
        return None
    if error != runtime.cudaError_t.cudaSuccess or not count:
        return None
    return runtime


def cuda_check(runtime: Any, result: Any, what: str) -> Any:
    """The value of a cuda-python call returning ``(error, value...)``; raise on error."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != runtime.cudaError_t.cudaSuccess:
        raise InternalError(f"{what} failed: {error}")
    return values[0] if len(values) == 1 else None


class _Staging:
    """Page-locked host buffers (``cudaMallocHost``) in power-of-two sizes, reused: pinning
    memory is slow, copying through it fast."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._idle: dict[int, list[int]] = {}
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def array(self, nbytes: int) -> np.ndarray:
        """A ``uint8`` array of ``nbytes`` in page-locked memory, back here once it dies; in
        ordinary memory when no more can be locked."""
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            idle = self._idle.get(size)
            pointer = idle.pop() if idle else None
            if pointer is not None:
                self._idle_bytes -= size
        if pointer is None:
            try:
                pointer = int(
                    cuda_check(self._runtime, self._runtime.cudaMallocHost(size), "cudaMallocHost")
                )
            except InternalError:  # slower, not wrong
                return np.empty(nbytes, np.uint8)
        memory = (ctypes.c_uint8 * size).from_address(pointer)
        weakref.finalize(memory, self._give, pointer, size)
        return np.frombuffer(memoryview(memory), np.uint8, nbytes)

    def _give(self, pointer: int, size: int) -> None:
        with self._lock:
            if self._idle_bytes + size <= STAGED_IDLE_BYTES:
                self._idle.setdefault(size, []).append(pointer)
                self._idle_bytes += size
                return
        self._runtime.cudaFreeHost(pointer)


_staging: list[_Staging] = []  # the process's one, made with its first staged copy


def _staging_for(runtime: Any) -> _Staging:
    if not _staging:
        _staging.append(_Staging(runtime))
    return _staging[0]


@dataclass
class _Region:
    """An opened IPC handle; closed when the last reference (registry or window) goes, so
    unregistering while requests use the region is safe."""

    name: str
    device_id: int
    byte_size: int
    address: int  # device pointer from cudaIpcOpenMemHandle
    runtime: Any

    def __del__(self) -> None:
        self.runtime.cudaSetDevice(self.device_id)  # the mapping belongs to its device
        self.runtime.cudaIpcCloseMemHandle(self.address)


class CudaWindow:
    """``byte_size`` bytes at ``offset`` of a CUDA region; ``numpy.asarray`` copies them to the
    host, :meth:`write` copies host bytes in."""

    def __init__(self, region: _Region, offset: int, byte_size: int) -> None:
        self._runtime = region.runtime
        self._region = region
        self._address = region.address + offset
        self.nbytes = byte_size

    @property
    def address(self) -> int:
        """The window's device pointer (in this process), for device-to-device copies."""
        return self._address

    @property
    def device_id(self) -> int:
        return self._region.device_id

    def _copy(self, destination: int, source: int, count: int) -> None:
        runtime = self._runtime
        cuda_check(runtime, runtime.cudaSetDevice(self._region.device_id), "cudaSetDevice")
        kind = runtime.cudaMemcpyKind.cudaMemcpyDefault
        cuda_check(runtime, runtime.cudaMemcpy(destination, source, count, kind), "cudaMemcpy")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = (
            _staging_for(self._runtime).array(self.nbytes)
            if self.nbytes >= STAGED_BYTES
            else np.empty(self.nbytes, np.uint8)
        )
        if self.nbytes:
            self._copy(host.ctypes.data, self._address, self.nbytes)
        return host if dtype is None else host.astype(dtype)

    def write(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        if array.nbytes > self.nbytes:
            raise ValueError(f"{array.nbytes} bytes do not fit in a window of {self.nbytes}")
        if array.nbytes >= STAGED_BYTES:  # one host copy into pinned memory, then a fast one
            staged = _staging_for(self._runtime).array(array.nbytes)
            copy_into(staged, array.reshape(-1).view(np.uint8))
            array = staged
        if array.nbytes:
            self._copy(self._address, array.ctypes.data, array.nbytes)


class CudaMemory:
    def __init__(self) -> None:
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        self._runtime: Any | None = None

    def has(self, name: str) -> bool:
        return name in self._regions

    def status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            if not name:
                regions = sorted(self._regions.values(), key=lambda r: r.name)
            elif name in self._regions:
                regions = [self._regions[name]]
            else:
                raise NotFoundError(f"Unable to find cuda shared memory region: '{name}'")
        return [
            {"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions
        ]

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        with self._lock:
            if name in self._regions:
                raise AlreadyExistsError(f"shared memory region '{name}' already in manager")
            runtime = self._runtime or cuda_runtime()
            if runtime is None:
                raise InvalidArgumentError(
                    f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
                )
            self._runtime = runtime
            if len(raw_handle) != IPC_HANDLE_BYTES:
                raise InvalidArgumentError(
                    f"failed to register CUDA shared memory region '{name}': the raw handle has"
                    f" {len(raw_handle)} bytes, a cudaIpcMemHandle_t has {IPC_HANDLE_BYTES}"
                )
            handle = runtime.cudaIpcMemHandle_t()
            ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_BYTES)
            try:
                cuda_check(runtime, runtime.cudaSetDevice(device_id), "cudaSetDevice")
                flags = runtime.cudaIpcMemLazyEnablePeerAccess
                address = cuda_check(
                    runtime, runtime.cudaIpcOpenMemHandle(handle, flags), "cudaIpcOpenMemHandle"
                )
            except InternalError as error:
                raise InvalidArgumentError(
                    f"failed to register CUDA shared memory region '{name}': {error.message}"
                ) from None
            self._regions[name] = _Region(name, device_id, byte_size, int(address), runtime)

    def unregister(self, name: str = "") -> None:
        """Forget ``name`` (every CUDA region if empty); unknown names are not an error."""
        with self._lock:
            if name:
                self._regions.pop(name, None)
            else:
                self._regions.clear()

    def window(self, name: str, offset: int, byte_size: int) -> CudaWindow:
        region = self._regions.get(name)
        if region is None:
            raise NotFoundError(f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size and not (offset == 0 and byte_size == 0):
            raise InvalidArgumentError(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise InvalidArgumentError(
                f"Invalid offset + byte size for shared memory region: '{name}'"
            )
        return CudaWindow(region, offset, byte_size)
