"""The core's shared-memory regions through its Python API: bounds checks (hypothesis),
in-place views, and the mapping outliving an unregister."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonfast._core import SharedMemoryRegistry
from tritonfast.errors import InvalidArgumentError, NotFoundError

OBJECT_SIZE = 3 * 4096 + 123


@pytest.fixture(scope="module")
def shm_object() -> Iterator[tuple[str, bytes]]:
    """A POSIX shared-memory object with known contents: (key, contents)."""
    key = f"/tfunit-{uuid.uuid4().hex[:8]}"
    contents = np.random.default_rng(1).integers(0, 256, OBJECT_SIZE, dtype=np.uint8).tobytes()
    path = Path("/dev/shm" + key)
    path.write_bytes(contents)
    yield key, contents
    path.unlink()


@settings(max_examples=150, deadline=None)
@given(
    offset=st.integers(0, OBJECT_SIZE + 10),
    byte_size=st.integers(0, OBJECT_SIZE + 10),
    view_offset=st.integers(0, OBJECT_SIZE + 10),
    view_size=st.integers(0, OBJECT_SIZE + 10),
)
def test_windows_and_views_are_bounds_checked(
    shm_object: tuple[str, bytes], offset: int, byte_size: int, view_offset: int, view_size: int
) -> None:
    key, contents = shm_object
    registry = SharedMemoryRegistry()
    if offset + byte_size > OBJECT_SIZE:
        with pytest.raises(InvalidArgumentError, match="invalid args"):
            registry.register("w", key, offset, byte_size)
        assert registry.status() == []
        return
    registry.register("w", key, offset, byte_size)
    inside = view_offset + view_size <= byte_size and (
        view_offset < byte_size or (view_offset == 0 and view_size == 0)
    )
    if not inside:
        with pytest.raises(InvalidArgumentError, match="Invalid offset"):
            registry.view("w", view_offset, view_size)
        return
    view = np.asarray(registry.view("w", view_offset, view_size))
    start = offset + view_offset
    assert view.tobytes() == contents[start : start + view_size]
    assert not view.flags.writeable


def test_writes_land_in_the_object_and_survive_unregister(shm_object: tuple[str, bytes]) -> None:
    key, contents = shm_object
    registry = SharedMemoryRegistry()
    registry.register("w", key, 4096, 64)
    window = registry.view("w", 8, 16, writable=True)
    reader = np.asarray(registry.view("w", 0, 64))
    registry.unregister("w")  # the views keep the mapping alive
    with pytest.raises(NotFoundError):
        registry.view("w", 0, 1)
    window.write(np.arange(16, dtype=np.uint8))
    assert reader[8:24].tolist() == list(range(16))
    with pytest.raises(ValueError, match="do not fit"):
        window.write(np.zeros(17, np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        registry.register("w", key, 4096, 64) or registry.view("w", 0, 4).write(np.zeros(1))
    with open("/dev/shm" + key, "r+b") as handle:  # put the module's object back
        os.pwrite(handle.fileno(), contents[4096 + 8 : 4096 + 24], 4096 + 8)
