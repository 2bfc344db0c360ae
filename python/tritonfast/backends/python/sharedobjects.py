"""Clients' POSIX shared-memory objects, mapped in a worker process.

The server tells a worker where a request's large shared-memory tensors lie in the client's
objects (:class:`~tritonfast.runtime.sharedmemory.ObjectPlace`); the worker maps each object
once, by its path, and reads the inputs and writes the outputs there, as the server would have
in-process. A mapping is made again when the object at the path is no longer the registered one
(identified by device and inode) or has grown past it.

Before each use the object's size is checked: touching a page past the end of an object its
owner shrank raises SIGBUS. What is left is the same race as in the server (the owner shrinking
it between the check and the access), and here it ends the worker, not the server: the batch
fails and the worker starts again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Any

import numpy as np

from tritonfast._core import copy_into
from tritonfast.errors import InternalError, InvalidArgumentError

# Where a tensor lies: (path, device, inode, offset, byte_size), an ObjectPlace as a tuple.
Place = tuple[str, int, int, int, int]


class SharedObjects:
    """The objects one worker has mapped, by path."""

    def __init__(self) -> None:
        # path -> (device, inode, descriptor, mapping)
        self._mapped: dict[str, tuple[int, int, int, mmap.mmap]] = {}

    def window(self, place: Place) -> memoryview:
        """The ``byte_size`` bytes at ``offset`` of the object, writable."""
        path, device, inode, offset, byte_size = place
        end = offset + byte_size
        entry = self._mapped.get(path)
        if entry is None or (entry[0], entry[1]) != (device, inode) or len(entry[3]) < end:
            entry = self._map(place)
        size = os.fstat(entry[2]).st_size
        if size < end:
            raise InvalidArgumentError(
                f"shared memory object '{path}' was truncated by its owner to {size} bytes"
                f" since it was registered: the {byte_size} bytes at offset {offset} are no"
                " longer there (register it again)"
            )
        return memoryview(entry[3])[offset:end]

    def write(self, place: Place, raw: np.ndarray, name: str) -> None:
        """Copy output ``name``'s bytes to its place, unless they are there already (a model
        that returned a view of an input placed at the very same bytes)."""
        target = np.frombuffer(self.window(place), np.uint8)
        if raw.nbytes > target.nbytes:
            raise InternalError(
                f"shared memory size specified with the request for output '{name}'"
                f" ({target.nbytes} bytes) should be at least {raw.nbytes} bytes to hold the"
                " results"
            )
        copy_into(target, np.ascontiguousarray(raw))  # nothing moves if already there

    def _map(self, place: Place) -> tuple[int, int, int, mmap.mmap]:
        path, device, inode = place[:3]
        self._forget(path)
        try:
            descriptor = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidArgumentError(
                f"Unable to open shared memory region: '{path}' ({exc.strerror})"
            ) from None
        try:
            stat = os.fstat(descriptor)
            if (stat.st_dev, stat.st_ino) != (device, inode):
                raise InvalidArgumentError(
                    f"shared memory object '{path}' is no longer the one registered"
                    " (register it again)"
                )
            mapping = mmap.mmap(descriptor, stat.st_size)
        except BaseException:
            os.close(descriptor)
            raise
        entry = (device, inode, descriptor, mapping)
        self._mapped[path] = entry
        return entry

    def _forget(self, path: str) -> None:
        entry = self._mapped.pop(path, None)
        if entry is not None:
            os.close(entry[2])
            with contextlib.suppress(BufferError):  # views still alive keep it mapped
                entry[3].close()

    def close(self) -> None:
        for path in list(self._mapped):
            self._forget(path)


def as_tuple(place: Any) -> Place:
    """An ObjectPlace as the tuple that travels to the worker."""
    return (place.path, place.device, place.inode, place.offset, place.byte_size)
