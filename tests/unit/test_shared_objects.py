"""What a worker does with clients' shared-memory objects (backends/python/sharedobjects.py), and
the core's copy between two arrays that it writes outputs with."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonfast._core import TensorPool, copy_into
from tritonfast.backends.python import sharedobjects
from tritonfast.backends.python.sharedobjects import MAPPED_OBJECTS, Place, SharedObjects
from tritonfast.errors import InternalError, InvalidArgumentError

SIZE = 3 * 4096 + 100


@pytest.fixture
def shm_object() -> Iterator[Path]:
    path = Path(f"/dev/shm/tfunit-{uuid.uuid4().hex[:8]}")
    path.write_bytes(bytes(range(256)) * (SIZE // 256) + bytes(SIZE % 256))
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def objects() -> Iterator[SharedObjects]:
    mapped = SharedObjects()
    yield mapped
    mapped.close()


def place_of(path: Path, offset: int, byte_size: int) -> Place:
    identity = os.stat(path)
    return (str(path), identity.st_dev, identity.st_ino, offset, byte_size)


def test_windows_read_and_writes_land_in_the_object(
    shm_object: Path, objects: SharedObjects
) -> None:
    window = objects.window(place_of(shm_object, 256, 16))
    assert bytes(window) == bytes(range(16))
    sevens = np.full(16, 7, np.float32).view(np.uint8)
    SharedObjects.put(objects.window(place_of(shm_object, 4096, 64)), sevens, "O")
    written = np.frombuffer(shm_object.read_bytes()[4096 : 4096 + 64], np.float32)
    assert (written == 7).all()


def test_an_output_already_in_its_place_is_left_as_it_is(
    shm_object: Path, objects: SharedObjects
) -> None:
    place = place_of(shm_object, 512, 256)
    view = np.frombuffer(objects.window(place), np.uint8)  # what a model got as its input
    SharedObjects.put(objects.window(place), view, "O")
    assert shm_object.read_bytes()[512:768] == bytes(range(256))


def test_an_output_too_large_for_its_place_is_refused_and_nothing_written(
    shm_object: Path, objects: SharedObjects
) -> None:
    with pytest.raises(InternalError, match="output 'O' \\(16 bytes\\) should be at least 20"):
        SharedObjects.put(objects.window(place_of(shm_object, 0, 16)), np.ones(20, np.uint8), "O")
    assert shm_object.read_bytes()[:16] == bytes(range(16))


def test_a_truncated_object_is_refused_instead_of_raising_sigbus(
    shm_object: Path, objects: SharedObjects
) -> None:
    place = place_of(shm_object, 2 * 4096, 4096)
    objects.window(place)  # mapped while it was whole
    os.truncate(shm_object, 4096)
    with pytest.raises(InvalidArgumentError, match="was truncated by its owner to 4096 bytes"):
        objects.window(place)


def test_an_object_replaced_under_its_name_is_told_from_the_registered_one(
    shm_object: Path, objects: SharedObjects
) -> None:
    registered = place_of(shm_object, 0, 16)
    objects.window(registered)
    shm_object.unlink()
    shm_object.write_bytes(bytes(SIZE))
    # The registered object stays mapped (as the server keeps it); the new one is mapped
    # for a place that names it.
    assert bytes(objects.window(registered)) == bytes(range(16))
    assert bytes(objects.window(place_of(shm_object, 0, 16))) == bytes(16)
    fresh = SharedObjects()
    try:
        with pytest.raises(InternalError, match="no longer the one registered"):
            fresh.window(registered)  # not mapped before: the name leads to another object
    finally:
        fresh.close()


def test_an_object_that_is_gone_is_a_clear_error(objects: SharedObjects) -> None:
    with pytest.raises(InternalError, match="Unable to open shared memory region"):
        objects.window(("/dev/shm/tfunit-none", 0, 0, 0, 16))


def test_a_symbolic_link_is_never_followed(
    shm_object: Path, objects: SharedObjects, tmp_path: Path
) -> None:
    # Even one that names the registered object's identity: a client could swap its object
    # for a link to a file of the server's.
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRET" * 100)
    link = Path(f"{shm_object}-link")
    link.symlink_to(secret)
    try:
        identity = os.stat(secret)
        with pytest.raises(InternalError, match="Unable to open shared memory region"):
            objects.window((str(link), identity.st_dev, identity.st_ino, 0, 6))
    finally:
        link.unlink()


def test_objects_their_clients_removed_are_not_kept_mapped(
    shm_object: Path, objects: SharedObjects
) -> None:
    objects.window(place_of(shm_object, 0, 16))
    other = Path(f"{shm_object}-other")
    other.write_bytes(bytes(4096))
    try:
        shm_object.unlink()
        objects.window(place_of(other, 0, 16))  # mapping another one sweeps the removed one
        assert list(objects._mapped) == [str(other)]
    finally:
        other.unlink()


def test_at_most_so_many_objects_stay_mapped_but_a_batch_keeps_all_it_uses(
    objects: SharedObjects,
) -> None:
    tag = uuid.uuid4().hex[:8]
    paths = [Path(f"/dev/shm/tfunit-{tag}-{i}") for i in range(MAPPED_OBJECTS + 3)]
    try:
        for path in paths:  # one batch each: the least recently used go
            path.write_bytes(bytes(64))
            objects.start_batch()
            objects.window(place_of(path, 0, 8))
        assert list(objects._mapped) == [str(p) for p in paths[-MAPPED_OBJECTS:]]
        objects.start_batch()  # one batch using them all: none is dropped while it runs
        for path in paths:
            objects.window(place_of(path, 0, 8))
        assert len(objects._mapped) == len(paths)
        objects.start_batch()
        objects.window(place_of(paths[0], 0, 8))
        objects.window(place_of(paths[1], 0, 8))
        assert len(objects._mapped) == len(paths)  # nothing new mapped: nothing trimmed yet
    finally:
        for path in paths:
            path.unlink()


def test_a_batch_start_now_and_then_drops_objects_their_clients_removed(
    shm_object: Path, objects: SharedObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects.start_batch()
    objects.window(place_of(shm_object, 0, 16))
    shm_object.unlink()
    objects.start_batch()  # within SWEEP_S of the last look: kept
    assert list(objects._mapped) == [str(shm_object)]
    monkeypatch.setattr(sharedobjects, "SWEEP_S", 0.0)
    objects.start_batch()
    assert not objects._mapped


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(0, 300),
    source=st.integers(0, 300),
    destination=st.integers(0, 300),
)
def test_copy_into_moves_as_memmove(length: int, source: int, destination: int) -> None:
    # Within one buffer, so that the ranges overlap in every way.
    buffer = np.arange(700, dtype=np.int64).astype(np.uint8)
    length = min(length, buffer.size - source, buffer.size - destination)
    expected = buffer.copy()
    expected[destination : destination + length] = buffer[source : source + length]
    copy_into(buffer[destination:], buffer[source : source + length])
    assert (buffer == expected).all()


def test_copy_into_a_large_array_on_the_copy_threads() -> None:
    source = np.random.default_rng(3).integers(0, 256, (9 << 20) + 13, dtype=np.uint8)
    destination = np.zeros(source.nbytes + 3, np.uint8)
    copy_into(destination[3:], source)  # unaligned
    assert (destination[3:] == source).all() and not destination[:3].any()


def test_copy_into_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        copy_into(np.zeros(3, np.uint8), np.zeros(4, np.uint8))
    read_only = np.zeros(8, np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        copy_into(read_only, np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        copy_into(np.zeros(8, np.uint8), np.zeros(8, np.uint8)[::2])


def test_an_output_that_is_a_view_of_a_body_input_is_found_there(
    shm_object: Path, objects: SharedObjects
) -> None:
    """The server's request-body objects: an output lying inside one of its request's inputs
    there is described by its place; new memory, bytes of the object outside the request's
    inputs, and a client's object are not."""
    pool = TensorPool(objects="tritonfast-body")
    buffer = pool.acquire(1 << 20)
    buffer.reserve(1 << 20)
    assert buffer.object is not None
    path, device, inode = buffer.object
    assert sharedobjects.is_body_object(path)
    np.asarray(buffer)[:] = np.arange(1 << 20) % 251
    inputs: list[Place] = [(path, device, inode, 4096, 8192)]
    objects.start_batch()
    view = np.frombuffer(objects.window(inputs[0]), np.uint8)  # as the model reads the input
    assert objects.body_place_of(view, inputs) == inputs[0]
    assert objects.body_place_of(view[100:300], inputs) == (path, device, inode, 4196, 200)
    assert objects.body_place_of(view.copy(), inputs) is None
    outside = np.frombuffer(objects.window((path, device, inode, 0, 4096)), np.uint8)
    assert objects.body_place_of(outside, inputs) is None
    client = place_of(shm_object, 0, 4096)
    assert objects.body_place_of(np.frombuffer(objects.window(client), np.uint8), [client]) is None
    objects.end_batch()


def test_a_worker_keeps_no_more_body_objects_mapped_than_the_pool_keeps_idle(
    objects: SharedObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a batch only the most recently used body objects stay mapped, within
    KEPT_BODY_BYTES (what the server's pool keeps idle): the others are unmapped."""
    monkeypatch.setattr(sharedobjects, "KEPT_BODY_BYTES", 3 << 19)  # 1.5 MiB
    pool = TensorPool(objects="tritonfast-body")
    buffers = [pool.acquire(1 << 20) for _ in range(2)]
    paths = []
    objects.start_batch()
    for buffer in buffers:
        path, device, inode = buffer.object or ("", 0, 0)
        paths.append(path)
        bytes(objects.window((path, device, inode, 0, 16)))  # read, as a batch reads inputs
    objects.end_batch()
    # (This process's pool maps each object once itself.)
    mapped = Path("/proc/self/maps").read_text()
    assert mapped.count(paths[1]) == 2, "the most recently used is kept"
    assert mapped.count(paths[0]) == 1
