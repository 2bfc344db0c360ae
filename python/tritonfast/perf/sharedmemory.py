"""``--shared-memory system|cuda``: the load's inputs written once into regions the server is
told about, and its outputs written by the server into regions of ``--output-shared-memory-
size`` bytes, so that requests carry only the regions' names (as perf_analyzer's do).

System regions are POSIX shared memory made here; CUDA regions need a GPU and tritonclient's
CUDA helpers (``pip install 'tritonclient[cuda]'``). Every region is unregistered and freed
when the run ends."""

from __future__ import annotations

import base64
import contextlib
import os
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from tritonfast.perf.inputs import InputError
from tritonfast.perf.server import GrpcControl, HttpControl, ServerError

# Where a tensor lies: (region name, byte size).
Placed = tuple[str, int]


class Regions:
    """The regions of one run, made and registered as the requests are planned."""

    def __init__(self, control: HttpControl | GrpcControl, kind: str, output_size: int) -> None:
        self.control, self.kind, self.output_size = control, kind, output_size
        self.prefix = f"tritonfast_perf_{os.getpid()}"
        self.inputs: dict[bytes, Placed] = {}
        self.outputs: dict[str, Placed] = {}
        self.owned: list[Any] = []  # the regions' memory, kept until close
        self.registered: list[str] = []
        if kind == "cuda":
            try:
                from tritonclient.utils import cuda_shared_memory
            except ImportError:
                raise InputError(
                    "--shared-memory cuda needs tritonclient's CUDA helpers"
                    " (pip install 'tritonclient[cuda]') and a GPU"
                ) from None
            self.cuda: Any = cuda_shared_memory

    def input(self, data: bytes) -> Placed:
        """A region holding ``data`` (one per distinct content)."""
        if data not in self.inputs:
            name = self._make(f"in{len(self.inputs)}", len(data), data)
            self.inputs[data] = (name, len(data))
        return self.inputs[data]

    def output(self, output: str) -> Placed:
        """The region the server writes ``output`` into (shared by every request)."""
        if output not in self.outputs:
            name = self._make(f"out{len(self.outputs)}", self.output_size, None)
            self.outputs[output] = (name, self.output_size)
        return self.outputs[output]

    def _make(self, label: str, size: int, data: bytes | None) -> str:
        name = f"{self.prefix}_{label}"
        size = max(size, 1)
        if self.kind == "system":
            memory = shared_memory.SharedMemory(name=name, create=True, size=size)
            self.owned.append(memory)
            if data:
                assert memory.buf is not None  # open until close()
                memory.buf[: len(data)] = data
            self.control.register_system(name, f"/{name}", size)
        else:
            handle = self.cuda.create_shared_memory_region(name, size, 0)
            self.owned.append(handle)
            if data:
                self.cuda.set_shared_memory_region(handle, [np.frombuffer(data, np.uint8)])
            raw = base64.b64decode(self.cuda.get_raw_handle(handle))
            self.control.register_cuda(name, raw, 0, size)
        self.registered.append(name)
        return name

    def close(self) -> None:
        """Unregisters and frees every region (what fails is left to the server's own end)."""
        for name in self.registered:
            # A server that went away has let go of its regions already.
            with contextlib.suppress(ServerError):
                self.control.unregister(self.kind, name)
        for memory in self.owned:
            if self.kind == "system":
                memory.close()
                memory.unlink()
            else:
                self.cuda.destroy_shared_memory_region(memory)
        self.registered.clear()
        self.owned.clear()
