"""Batch tensors from the core's pool: gather is np.concatenate into a pooled buffer, or no copy
at all when the arrays already lie back to back in one buffer (a batch the core laid out)."""

from __future__ import annotations

import gc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonfast._core import TensorPool
from tritonfast.runtime import batchtensor

DTYPES = [np.float32, np.int64, np.uint8, np.float16, np.bool_]


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    rows=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    width=st.integers(0, 7),
)
def test_gather_equals_concatenate_and_scatter_undoes_it(dtype, rows, width) -> None:
    rng = np.random.default_rng(sum(rows) + width)
    arrays = [(rng.random((n, width)) * 100).astype(dtype) for n in rows]
    batched = batchtensor.gather(arrays)
    np.testing.assert_array_equal(batched, np.concatenate(arrays))
    assert batched.dtype == np.dtype(dtype)
    for piece, original in zip(batchtensor.scatter(batched, rows), arrays, strict=True):
        np.testing.assert_array_equal(piece, original)
        assert piece.base is not None  # a view, not a copy


def test_arrays_back_to_back_in_one_buffer_are_viewed_not_copied() -> None:
    segment = bytearray(256)
    view = memoryview(segment)
    first = np.frombuffer(view[0:32], np.float32).reshape(2, 4)
    second = np.frombuffer(view[32:48], np.float32).reshape(1, 4)
    apart = np.frombuffer(view[64:80], np.float32).reshape(1, 4)
    np.frombuffer(segment, np.float32)[:] = np.arange(64)
    batched = batchtensor.gather([first, second])
    np.testing.assert_array_equal(batched, np.arange(12, dtype=np.float32).reshape(3, 4))
    assert not batched.flags.writeable
    np.frombuffer(segment, np.float32)[8] = -1  # second's first element: the same memory
    assert batched[2, 0] == -1
    # A gap between them, or arrays of their own: copied.
    np.testing.assert_array_equal(batchtensor.gather([first, apart]), np.vstack([first, apart]))
    owned = [np.ones((1, 4), np.float32), np.ones((1, 4), np.float32)]
    assert batchtensor.gather(owned).shape == (2, 4)
    # One array: itself.
    assert batchtensor.gather([first]) is first


def test_non_contiguous_and_object_inputs() -> None:
    wide = np.arange(24, dtype=np.float32).reshape(4, 6)
    strided = wide[:, ::2]
    np.testing.assert_array_equal(batchtensor.gather([strided, strided]), np.vstack([strided] * 2))
    words = [np.array([[b"a"]], dtype=object), np.array([[b"bc"], [b""]], dtype=object)]
    assert batchtensor.gather(words).tolist() == [[b"a"], [b"bc"], [b""]]


def test_buffer_returns_to_the_pool_when_the_last_view_dies() -> None:
    pool = TensorPool(max_free_per_class=2)
    parts = [np.ones(100, np.float32), np.zeros(50, np.float32)]
    view = np.asarray(pool.gather(parts)).view(np.float32)
    assert view.shape == (150,) and view[:100].sum() == 100 and view[100:].sum() == 0
    view[0] = 7  # writable
    assert pool.statistics()["idle_buffers"] == 0
    piece = view[10:20]
    del view
    gc.collect()
    assert pool.statistics()["idle_buffers"] == 0  # a view is still alive
    del piece
    gc.collect()
    assert pool.statistics()["idle_buffers"] == 1
    pool.gather(parts)  # same size class: recycled
    stats = pool.statistics()
    assert (stats["allocated"], stats["reused"]) == (1, 1)
    assert stats["bytes_gathered"] == 2 * 600


def test_gather_inputs_matches_inputs_by_name_whatever_their_order() -> None:
    from tritonfast.data.types import InferRequest, InputTensor

    def request(order: list[str], value: float) -> InferRequest:
        tensors = {
            "A": InputTensor("A", "FP32", (1, 2), np.full((1, 2), value, np.float32)),
            "B": InputTensor("B", "FP32", (1, 2), np.full((1, 2), -value, np.float32)),
        }
        return InferRequest("m", inputs=[tensors[name] for name in order])

    inputs, sizes = batchtensor.gather_inputs([request(["A", "B"], 1), request(["B", "A"], 2)])
    assert sizes == [1, 1]
    assert inputs["A"].tolist() == [[1, 1], [2, 2]]
    assert inputs["B"].tolist() == [[-1, -1], [-2, -2]]
