"""Device memory and a stream for one TensorRT instance, through cuda-python's runtime API.

Each engine tensor has a :class:`DeviceBuffer` that grows to the largest batch seen (never
shrinks, so a steady load allocates nothing), on the instance's own device and stream. Copies
are asynchronous on that stream; :meth:`Stream.synchronize` waits for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonfast.errors import UnavailableError
from tritonfast.memory.cudamemory import cuda_check, cuda_runtime


def runtime_or_unavailable(model: str) -> Any:
    runtime = cuda_runtime()
    if runtime is None:
        raise UnavailableError(
            f"model '{model}': a TensorRT engine needs a GPU and cuda-python (cuda-bindings);"
            " none can be used here"
        )
    return runtime


class Stream:
    """A CUDA stream on ``device``."""

    def __init__(self, runtime: Any, device: int) -> None:
        self.runtime = runtime
        self.device = device
        cuda_check(runtime, runtime.cudaSetDevice(device), "cudaSetDevice")
        self.handle = cuda_check(runtime, runtime.cudaStreamCreate(), "cudaStreamCreate")

    @property
    def address(self) -> int:
        """The stream as the integer TensorRT's ``execute_async_v3`` takes."""
        return int(self.handle)

    def use_device(self) -> None:
        cuda_check(self.runtime, self.runtime.cudaSetDevice(self.device), "cudaSetDevice")

    def to_device(self, destination: int, array: np.ndarray) -> None:
        runtime = self.runtime
        kind = runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
        cuda_check(
            runtime,
            runtime.cudaMemcpyAsync(
                destination, array.ctypes.data, array.nbytes, kind, self.handle
            ),
            "cudaMemcpyAsync",
        )

    def device_to_device(self, destination: int, source: int, count: int) -> None:
        runtime = self.runtime
        kind = runtime.cudaMemcpyKind.cudaMemcpyDefault  # peer copies too (unified addressing)
        cuda_check(
            runtime,
            runtime.cudaMemcpyAsync(destination, source, count, kind, self.handle),
            "cudaMemcpyAsync",
        )

    def to_host(self, array: np.ndarray, source: int) -> None:
        runtime = self.runtime
        kind = runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
        cuda_check(
            runtime,
            runtime.cudaMemcpyAsync(array.ctypes.data, source, array.nbytes, kind, self.handle),
            "cudaMemcpyAsync",
        )

    def synchronize(self) -> None:
        cuda_check(
            self.runtime, self.runtime.cudaStreamSynchronize(self.handle), "cudaStreamSynchronize"
        )

    def close(self) -> None:
        if self.handle is not None:
            self.runtime.cudaStreamDestroy(self.handle)
            self.handle = None


class DeviceBuffer:
    """Device memory that grows to the largest size asked for."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self.address = 0
        self.capacity = 0

    def ensure(self, nbytes: int) -> int:
        """The buffer's address, with room for at least ``nbytes`` (at least one byte, so
        that an empty tensor still has an address)."""
        nbytes = max(nbytes, 1)
        if nbytes > self.capacity:
            self.free()
            runtime = self._runtime
            self.address = int(cuda_check(runtime, runtime.cudaMalloc(nbytes), "cudaMalloc"))
            self.capacity = nbytes
        return self.address

    def free(self) -> None:
        if self.address:
            self._runtime.cudaFree(self.address)
            self.address = 0
            self.capacity = 0
