"""Give freed heap memory back to the kernel after large request bodies.

glibc's allocator keeps what is freed in its arenas for reuse (and the server asks it to keep
up to 256 MiB at the top of its heap, :mod:`tritonfast.memory.allocator`, so that tensors of
a few MiB reuse warm pages). A burst of very large requests (gRPC messages arrive in many
pieces, allocated on gRPC's own threads; inflated bodies in pieces) would then leave hundreds
of megabytes of free pages counted in the server's resident memory for good. After a body of
:data:`~tritonfast.memory.bodybudget.TRIM_AFTER_BYTES` or more is let go, :func:`soon`
asks a background thread to run ``malloc_trim(0)``, which returns every arena's wholly free
pages. It runs at most once per :data:`PAUSE_S`, off the event loop and without the GIL;
without glibc it does nothing."""

from __future__ import annotations

import contextlib
import queue
import threading
import time

from tritonfast.memory.allocator import glibc_function

# Trims are this far apart at least, and this long after the body that asked for one let go.
PAUSE_S = 0.25


class _Trimmer:
    def __init__(self) -> None:
        self._trim = glibc_function("malloc_trim")
        # Asks for a trim. SimpleQueue.put is reentrant: safe from a finalizer that runs in
        # the middle of any code, this class's own thread included.
        self._asks: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._started = False

    def start(self) -> None:
        """Start the trimming thread (the server does, once; a finalizer that asks for a trim
        must never be the one to start a thread)."""
        if self._trim is None or self._started:
            return
        self._started = True
        threading.Thread(target=self._run, name="tritonfast-memtrim", daemon=True).start()

    def soon(self) -> None:
        """Ask for a trim (from any thread, finalizers included); nothing before :meth:`start`."""
        if self._started:
            self._asks.put(None)

    def _run(self) -> None:
        trim = self._trim
        assert trim is not None
        while True:
            self._asks.get()
            # Let the request that asked finish freeing its memory (and others coalesce).
            time.sleep(PAUSE_S)
            with contextlib.suppress(queue.Empty):
                while True:
                    self._asks.get_nowait()
            trim(0)


_TRIMMER = _Trimmer()
start = _TRIMMER.start
soon = _TRIMMER.soon
