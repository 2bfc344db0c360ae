"""Keep MiB-sized buffers in the C heap instead of returning them to the OS at once.

glibc serves large allocations with fresh ``mmap`` pages and unmaps them on ``free``. A server
that receives and sends MiB-sized tensors (gRPC's message buffers, Python ``bytes``) would then
take a page fault per 4 KiB, and the kernel would zero every page, for every tensor of every
request. Raising the mmap and trim thresholds lets freed blocks be reused: measured on a 4 MiB
gRPC identity at concurrency 4, kernel time per request fell by about half.

All threads share one arena. glibc gives each new thread that allocates while another holds
an arena one of its own, and a block freed in one arena is reused only by that arena's threads:
with gRPC's second polling thread reading 64 MiB messages beside the first, the server held
340 MB at its highest instead of 200. Small blocks come from each thread's own cache (and
Python's from its own allocator), so the shared arena's lock costs nothing measurable
(HTTP binary and gRPC at c=16, alternating runs).
"""

from __future__ import annotations

import ctypes
import os
import sys

# glibc's mallopt parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Blocks up to this size come from the heap (glibc's own ceiling is 32 MiB on 64-bit).
MMAP_THRESHOLD = 32 << 20
# Free memory at the top of the heap is returned to the OS above this much.
TRIM_THRESHOLD = 256 << 20


def glibc_function(name: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """One of glibc's functions by name, None elsewhere (e.g. musl)."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def keep_large_buffers() -> bool:
    """Tune glibc's allocator (True if done). The user's ``MALLOC_*`` settings win."""
    if sys.platform != "linux" or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    mallopt = glibc_function("mallopt")
    if mallopt is None:
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        and mallopt(_M_ARENA_MAX, 1)
    )
