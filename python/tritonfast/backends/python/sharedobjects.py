"""Clients' POSIX shared-memory objects, mapped in a worker process.

The server tells a worker where a request's large shared-memory tensors lie in the client's
objects (:class:`~tritonfast.memory.sharedmemory.ObjectPlace`: a path under ``/dev/shm``
and the identity, device and inode, of the object the server mapped at registration); the
worker maps the object by that path and reads the inputs and writes the outputs there, as the
server would have in-process. It opens only a regular file that is not a symbolic link and is
that very object. Mappings are kept for the next batches: at most :data:`MAPPED_OBJECTS` (or
as many as one batch uses), the least recently used dropped first; those whose path no
longer leads to their object (unlinked or replaced by the client) are dropped whenever another
object is mapped, and at the start of a batch once :data:`SWEEP_S` have passed, so that an
object the client removed does not stay pinned in memory by the worker for long.

The server's own request-body objects (:func:`is_body_object`) come the same way: the large
inputs of a body received into one are read where they arrived, and an output that is a view
of such an input is answered by its place there (:meth:`SharedObjects.body_place_of`), for the
server to send it from the body: neither is copied.

Before each use the object's size is checked: touching a page past the end of an object its
owner shrank raises SIGBUS. What is left is the same race as in the server (the owner shrinking
it between the check and the access), and here it ends the worker, not the server: the batch
fails and the worker starts again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from tritonfast._core import copy_into
from tritonfast.errors import InternalError, InvalidArgumentError
from tritonfast.memory.sharedmemory import output_too_large
from tritonfast.memory.shmsegment import BODY_PREFIX, idle_body_bytes

# Where a tensor lies: (path, device, inode, offset, byte_size), an ObjectPlace as a tuple.
Place = tuple[str, int, int, int, int]
# The most bytes of body objects kept mapped once their batch is over (the most recently used
# first): as many as the server's pool keeps idle, which are those it hands out again. One the
# server has removed (beyond its own bound) would otherwise stay in /dev/shm while mapped here.
KEPT_BODY_BYTES = idle_body_bytes()
# The most objects one worker keeps mapped, beyond those of the batch it runs.
MAPPED_OBJECTS = 16
# How often a batch start looks for mappings of objects their clients removed.
SWEEP_S = 1.0


def is_body_object(path: str) -> bool:
    """Whether ``path`` is one of the server's request-body objects (memory.bufferpool)."""
    return os.path.basename(path).startswith(BODY_PREFIX + "-")


class SharedObjects:
    """The objects one worker has mapped, by path, least recently used first."""

    def __init__(self) -> None:
        # path -> (device, inode, mapping of the whole object)
        self._mapped: OrderedDict[str, tuple[int, int, mmap.mmap]] = OrderedDict()
        self._starts: dict[str, int] = {}  # path -> the address its mapping starts at
        self._in_batch: set[str] = set()  # the paths the running batch uses: never dropped
        self._swept = time.monotonic()

    def start_batch(self) -> None:
        """A new batch: the last one's objects may be dropped again; now and then, those
        their clients removed are."""
        self._in_batch.clear()
        if self._mapped and time.monotonic() - self._swept >= SWEEP_S:
            self._sweep()

    def maps_bodies(self) -> bool:
        """Whether a body object of the server's is mapped here."""
        return bool(self._starts)

    def end_batch(self) -> None:
        """The batch is answered: keep at most :data:`KEPT_BODY_BYTES` of body objects mapped,
        the most recently used (the others unmapped once the batch's last views are gone)."""
        if not self._starts:
            return  # (no body object mapped: the usual batch)
        kept = 0
        for path in reversed(list(self._mapped)):  # most recently used first
            if path not in self._starts:
                continue  # a client's object
            size = len(self._mapped[path][2])
            if kept + size > KEPT_BODY_BYTES:
                self._forget(path)
            else:
                kept += size

    def window(self, place: Place) -> memoryview:
        """The ``byte_size`` bytes at ``offset`` of the object, writable. Raises
        :class:`InternalError` when the object cannot be mapped as the one registered, and
        :class:`InvalidArgumentError` when it no longer holds those bytes."""
        path, device, inode, offset, byte_size = place
        end = offset + byte_size
        entry = self._mapped.get(path)
        if entry is None or (entry[0], entry[1]) != (device, inode) or len(entry[2]) < end:
            entry = self._map(place)
        else:
            self._mapped.move_to_end(path)
        self._in_batch.add(path)
        size = entry[2].size()  # the object's size now
        if size < end:
            raise InvalidArgumentError(
                f"shared memory object '{path}' was truncated by its owner to {size} bytes"
                f" since it was registered: the {byte_size} bytes at offset {offset} are no"
                " longer there (register it again)"
            )
        return memoryview(entry[2])[offset:end]

    def body_place_of(self, raw: np.ndarray, inputs: list[Place]) -> Place | None:
        """Where ``raw`` (an output's bytes, C-contiguous) lies when it is inside one of
        ``inputs``, places of the request's inputs in the server's body object this batch
        mapped (a model that returned a view of such an input); None otherwise."""
        start = raw.__array_interface__["data"][0]
        for path, device, inode, offset, byte_size in inputs:
            base = self._starts.get(path)
            if base is None or path not in self._in_batch:
                continue
            window = base + offset
            if window <= start and start + raw.nbytes <= window + byte_size:
                return (path, device, inode, offset + start - window, raw.nbytes)
        return None

    @staticmethod
    def put(window: memoryview, raw: np.ndarray, name: str) -> None:
        """Copy output ``name``'s bytes to the start of ``window`` (nothing moves when they are
        there already: a model that returned a view of an input placed at the same bytes)."""
        target = np.frombuffer(window, np.uint8)
        if raw.nbytes > target.nbytes:
            raise output_too_large(name, target.nbytes, raw.nbytes)
        copy_into(target, np.ascontiguousarray(raw))

    def _map(self, place: Place) -> tuple[int, int, mmap.mmap]:
        path, device, inode, _, _ = place
        self._forget(path)
        self._sweep()
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise InternalError(
                f"Unable to open shared memory region: '{path}' ({exc.strerror})"
            ) from None
        try:
            found = os.fstat(descriptor)
            if not stat.S_ISREG(found.st_mode) or (found.st_dev, found.st_ino) != (device, inode):
                raise InternalError(
                    f"shared memory object '{path}' is no longer the one registered"
                    " (register it again)"
                )
            try:
                mapping = mmap.mmap(descriptor, found.st_size)
            except (OSError, ValueError) as exc:  # emptied meanwhile, or no room
                raise InvalidArgumentError(
                    f"shared memory object '{path}' cannot be mapped ({exc}); was it truncated"
                    " by its owner since it was registered?"
                ) from None
        finally:
            os.close(descriptor)  # the mapping keeps its own
        entry = (device, inode, mapping)
        self._mapped[path] = entry
        if is_body_object(path) and len(mapping):
            self._starts[path] = np.frombuffer(mapping, np.uint8).__array_interface__["data"][0]
        for old in list(self._mapped):  # least recently used first
            if len(self._mapped) <= MAPPED_OBJECTS:
                break
            if old not in self._in_batch and old != path:
                self._forget(old)
        return entry

    def _sweep(self) -> None:
        """Drop the mappings whose path no longer leads to their object."""
        self._swept = time.monotonic()
        for path, (device, inode, _) in list(self._mapped.items()):
            try:
                now = os.stat(path, follow_symlinks=False)
            except OSError:
                self._forget(path)
                continue
            if (now.st_dev, now.st_ino) != (device, inode):
                self._forget(path)

    def _forget(self, path: str) -> None:
        self._starts.pop(path, None)
        entry = self._mapped.pop(path, None)
        if entry is not None:
            with contextlib.suppress(BufferError):  # views still alive keep it mapped
                entry[2].close()

    def close(self) -> None:
        for path in list(self._mapped):
            self._forget(path)


def as_tuple(place: Any) -> Place:
    """An ObjectPlace as the tuple that travels to the worker."""
    return (place.path, place.device, place.inode, place.offset, place.byte_size)
