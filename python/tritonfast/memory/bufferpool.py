"""The process's pools of recycled tensor buffers (the Rust core's ``TensorPool``).

Batch tensors and large request bodies come from here: a buffer is reused once the last numpy
view of it dies, so big tensors cost neither fresh page faults nor zero-filling each time.
A large HTTP request body is received into a shared-memory object of its own
(:func:`shared_body`), from which a model's worker reads its large inputs where they arrived.
"""

from __future__ import annotations

import numpy as np

from tritonfast._core import PooledBuffer, TensorPool
from tritonfast.errors import TritonError
from tritonfast.memory.shmsegment import BODY_PREFIX, idle_body_bytes

POOL = TensorPool()
# Each buffer a shared-memory object of its own, named tritonfast-body-<pid>-<n> (what a killed
# server leaves behind is swept by memory.leftovers).
BODY_POOL = TensorPool(objects=BODY_PREFIX, idle_bytes=idle_body_bytes())
# Bodies up to this size go into shared-memory objects, which the pool recycles (its idle
# bound, 64 MiB where /dev/shm is large, holds two of the largest) and a worker maps once.
# A larger one would be a new object each time, whose pages both processes fault in one by
# one (no huge pages in /dev/shm): that costs a 64 MiB identity request about 20% more than
# the heap and its two copies do.
BODY_OBJECT_BYTES = 32 << 20


def pooled_memory(nbytes: int) -> memoryview:
    """``nbytes`` uninitialised bytes on loan from the pool (back when the last view dies)."""
    return np.asarray(POOL.acquire(nbytes)).data


def shared_body(nbytes: int, reserved: int) -> tuple[memoryview, PooledBuffer | None]:
    """``nbytes`` uninitialised bytes for a request body: a shared-memory object's, its first
    ``reserved`` bytes' memory taken already (see ``PooledBuffer.reserve``), and the object's
    buffer; the heap's (and None) for a body over :data:`BODY_OBJECT_BYTES`, or when shared
    memory has no room."""
    if nbytes > BODY_OBJECT_BYTES:
        return pooled_memory(nbytes), None
    try:
        buffer = BODY_POOL.acquire(nbytes)
        buffer.reserve(reserved)
    except (TritonError, MemoryError, ValueError):
        return pooled_memory(nbytes), None
    return np.asarray(buffer).data, buffer
