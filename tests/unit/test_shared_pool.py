"""A tensor pool that lives in a shared-memory segment: another process finds a buffer's bytes
by the segment's name and the buffer's offset."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from tritonfast._core import TensorPool
from tritonfast.errors import UnavailableError

READER = """
import mmap, os, sys
name, offset, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open("/dev/shm" + name, os.O_RDONLY)
with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as memory:
    sys.stdout.write(memory[offset:offset + size].hex())
"""


def test_another_process_reads_a_buffer_by_offset() -> None:
    name = f"/tritonfast-unit-{uuid.uuid4().hex[:8]}"
    pool = TensorPool(2, segment=name, segment_bytes=1 << 20)
    assert pool.segment == name
    first = np.arange(100, dtype=np.float32)
    second = np.arange(7, dtype=np.int64)
    buffers = [pool.gather([first]), pool.gather([second, second])]
    expected = [first.tobytes(), second.tobytes() * 2]
    for buffer, data in zip(buffers, expected, strict=True):
        assert buffer.offset is not None and buffer.offset % 64 == 0
        seen = subprocess.run(
            [sys.executable, "-c", READER, name, str(buffer.offset), str(len(data))],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert bytes.fromhex(seen) == data
    # Writes through numpy land in the segment too.
    view = np.asarray(buffers[0])
    view[:4] = [1, 2, 3, 4]
    raw = Path("/dev/shm" + name).read_bytes()
    assert raw[buffers[0].offset : buffers[0].offset + 4] == bytes([1, 2, 3, 4])
    with pytest.raises(UnavailableError, match="is full"):
        pool.acquire(2 << 20)
    del buffers, buffer, view, pool
    assert not Path("/dev/shm" + name).exists()


def test_heap_pools_have_no_segment() -> None:
    pool = TensorPool()
    assert pool.segment is None
    assert pool.acquire(10).offset is None
