"""The page-locked staging buffers of memory/cudamemory.py: reuse by size class, the bound on
what is kept, and ordinary memory when nothing more can be locked. CI has no GPU, so the
allocator here is host memory behind cuda-python's calling convention; on a GPU the CUDA
shared-memory tests of tests/e2e/test_shared_memory.py drive the real one."""

from __future__ import annotations

import ctypes
import gc
from typing import Any

import numpy as np
import pytest
from tritonfast.memory import cudamemory
from tritonfast.memory.cudamemory import _Staging


class HostAllocator:
    """cudaMallocHost / cudaFreeHost over plain host memory, counting calls."""

    class cudaError_t:
        cudaSuccess = 0
        cudaErrorMemoryAllocation = 2

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.live: dict[int, Any] = {}
        self.allocated = 0
        self.freed = 0

    def cudaMallocHost(self, size: int) -> tuple[int, int]:
        if self.fail:
            return (self.cudaError_t.cudaErrorMemoryAllocation, 0)
        buffer = (ctypes.c_uint8 * size)()
        self.live[ctypes.addressof(buffer)] = buffer
        self.allocated += 1
        return (self.cudaError_t.cudaSuccess, ctypes.addressof(buffer))

    def cudaFreeHost(self, pointer: int) -> tuple[int]:
        del self.live[pointer]
        self.freed += 1
        return (self.cudaError_t.cudaSuccess,)


def test_buffers_are_reused_by_size_class() -> None:
    runtime = HostAllocator()
    staging = _Staging(runtime)
    first = staging.array(3 << 20)
    first[:] = 7
    address = first.ctypes.data
    del first
    gc.collect()
    again = staging.array(4 << 20)  # the same 4 MiB class
    assert again.ctypes.data == address and again.nbytes == 4 << 20
    assert runtime.allocated == 1


def test_idle_buffers_beyond_the_bound_are_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudamemory, "STAGED_IDLE_BYTES", 8 << 20)
    runtime = HostAllocator()
    staging = _Staging(runtime)
    arrays = [staging.array(4 << 20) for _ in range(3)]
    del arrays
    gc.collect()
    assert (runtime.allocated, runtime.freed) == (3, 1)


def test_ordinary_memory_when_none_can_be_locked() -> None:
    staging = _Staging(HostAllocator(fail=True))
    array = staging.array(2 << 20)
    assert array.nbytes == 2 << 20 and array.flags.writeable
    assert isinstance(array.base, np.ndarray) or array.base is None
