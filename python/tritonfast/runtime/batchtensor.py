"""One tensor for a whole batch: requests' inputs concatenated, outputs split back as views.

The concatenation is a copy the Rust core makes into a pooled buffer with the GIL released
(so the event loop and other instances keep running), and the buffer goes back to the pool
when the last numpy view of it dies. Splitting an output is free: each request gets a view.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonfast.runtime.bufferpool import POOL


def gather(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` (same dtype and non-batch dimensions) concatenated along dimension 0."""
    first = arrays[0]
    shape = (sum(a.shape[0] for a in arrays), *first.shape[1:])
    if first.dtype.hasobject:  # BYTES elements are references, not bytes to copy
        return np.concatenate(arrays)
    parts = [np.ascontiguousarray(a) for a in arrays]
    buffer: Any = POOL.gather(parts)
    return np.asarray(buffer).view(first.dtype).reshape(shape)


def scatter(batched: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """``batched`` split along dimension 0 into pieces of ``sizes`` rows (views, no copy)."""
    pieces = []
    start = 0
    for size in sizes:
        pieces.append(batched[start : start + size])
        start += size
    return pieces
