"""The process's pool of recycled tensor buffers (the Rust core's ``TensorPool``).

Large request bodies and batch tensors come from here: a buffer is reused once the last numpy
view of it dies, so big tensors cost neither fresh page faults nor zero-filling each time.
"""

from __future__ import annotations

import numpy as np

from tritonfast._core import TensorPool

POOL = TensorPool()


def pooled_memory(nbytes: int) -> memoryview:
    """``nbytes`` uninitialised bytes on loan from the pool (back when the last view dies)."""
    return np.asarray(POOL.acquire(nbytes)).data
