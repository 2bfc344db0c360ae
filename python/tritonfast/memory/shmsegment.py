"""A growable POSIX shared-memory segment that one process writes and another maps by name.

Segments live in ``/dev/shm`` (Linux's POSIX shared-memory file system), are created with
mode 0600 under a name unique to the creating process, and are removed by their creator.
Python's ``multiprocessing.shared_memory`` is not used because, before Python 3.13, every
process that merely attaches a segment also registers it for removal at exit.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
from pathlib import Path

from tritonfast.errors import UnavailableError

SHM_DIR = Path("/dev/shm")
# The name of the server's request-body objects (memory.bufferpool), before -<pid>-<n>.
BODY_PREFIX = "tritonfast-body"
# Tensors start on 64-byte boundaries (cache lines; what numpy's SIMD loops like best).
ALIGNMENT = 64
_serial = itertools.count()


def idle_body_bytes() -> int:
    """How many bytes of request-body objects may stay in ``/dev/shm`` while no request uses
    them (kept by the server's pool, and mapped by a worker): 64 MiB, or an eighth of the
    shared-memory file system when that is less (a container's is 64 MiB unless given more),
    so that idle bodies never take the room the server's segments need."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return min(64 << 20, stat.f_blocks * stat.f_frsize // 8)


def aligned(offset: int) -> int:
    return (offset + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def _back(fd: int, name: str, size: int) -> None:
    """Take the memory of a new segment's ``size`` bytes now: its writer writes all of them,
    and a page the file system cannot back kills the writing process (SIGBUS), where this
    raises UnavailableError."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        raise UnavailableError(
            f"no shared memory left for segment '{name}' of {size} bytes ({exc.strerror}; a"
            f" container's --shm-size sets how much {SHM_DIR} holds)"
        ) from None


class Segment:
    """A mapped segment. ``owner`` segments are created here and unlinked by :meth:`close`."""

    def __init__(self, name: str, size: int, *, owner: bool) -> None:
        self.name = name
        self.size = size
        self._owner = owner
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if owner else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if owner:
                os.ftruncate(fd, size)
                _back(fd, name, size)
            self.buffer = mmap.mmap(fd, size)
        except BaseException:
            if owner:
                path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    @classmethod
    def create(cls, prefix: str, size: int) -> Segment:
        return cls(f"{prefix}-{os.getpid()}-{next(_serial)}", max(size, ALIGNMENT), owner=True)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        return cls(name, size, owner=False)

    def close(self) -> None:
        """Unlink (if ours) and unmap; views still alive keep the memory until they die."""
        if self._owner:
            (SHM_DIR / self.name).unlink(missing_ok=True)
        # While numpy views still point into it, the mapping lives on until they die.
        with contextlib.suppress(BufferError):
            self.buffer.close()


class SegmentWriter:
    """The writing side: lays tensors out one after another and grows by replacement."""

    def __init__(self, prefix: str, initial_size: int = 1 << 20) -> None:
        self._prefix = prefix
        self._initial_size = initial_size
        self.segment = Segment.create(prefix, initial_size)

    def reserve(self, nbytes: int) -> Segment:
        """The segment to write the next message into, replaced by one of at least ``nbytes``
        (UnavailableError when shared memory has no room for it: the writer then holds one of
        its first size again)."""
        if nbytes > self.segment.size:
            self.segment.close()
            try:
                self.segment = Segment.create(self._prefix, 1 << (nbytes - 1).bit_length())
            except UnavailableError:
                self.segment = Segment.create(self._prefix, self._initial_size)
                raise
        return self.segment

    def close(self) -> None:
        self.segment.close()


def remove_segments(prefix: str) -> None:
    """Unlink every segment created under ``prefix`` (by a process that can no longer)."""
    for path in SHM_DIR.glob(f"{prefix}-*"):
        path.unlink(missing_ok=True)


class SegmentReader:
    """The reading side: maps the writer's current segment, re-mapping when it is replaced."""

    def __init__(self) -> None:
        self.segment: Segment | None = None

    def map(self, name: str, size: int) -> Segment:
        if self.segment is None or self.segment.name != name:
            if self.segment is not None:
                self.segment.close()
            self.segment = Segment.attach(name, size)
        return self.segment

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()
