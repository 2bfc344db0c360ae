"""How a worker lays a batch's tensors out for the core: small outputs in the reply message
itself (``inline_tensors``), others in its segment (``write_tensors``); and how it views the
inputs the core laid out (``read_tensor``). The two output layouts must give the core the
same bytes for every datatype, whatever the model's array looks like."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonfast.backends.python.segmentlayout import (
    INLINE_BYTES,
    Laid,
    inline_tensors,
    read_tensor,
    write_tensors,
)
from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.errors import InvalidArgumentError
from tritonfast.memory.shmsegment import SegmentWriter

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5)


@st.composite
def outputs(draw: st.DrawFn) -> Laid:
    """An output as a model may return it: any datatype, BYTES as bytes or str, BF16 as
    uint16 bits or ml_dtypes' bfloat16, arrays of another dtype than the wire's (numpy
    converts them), and non-contiguous views."""
    datatype = draw(st.sampled_from(sorted(NUMPY_DTYPES)))
    shape = draw(shapes)
    if datatype == "BYTES":
        count = int(np.prod(shape))
        items = draw(
            st.lists(st.binary(max_size=9) | st.text(max_size=5), min_size=count, max_size=count)
        )
        array = np.empty(count, dtype=object)
        array[:] = items
        array = array.reshape(shape)
    elif datatype == "BF16" and draw(st.booleans()):
        array = draw(hnp.arrays(np.float32, shape, elements=st.floats(-4, 4, width=32)))
        array = array.astype(ml_dtypes.bfloat16)
    elif datatype in ("FP32", "FP64") and draw(st.booleans()):
        other = np.float64 if datatype == "FP32" else np.float32
        array = draw(hnp.arrays(other, shape, elements=st.floats(-4, 4, width=32)))
    else:
        array = draw(hnp.arrays(NUMPY_DTYPES[datatype], shape))
    if array.ndim and array.shape[0] > 1 and draw(st.booleans()):
        array = array[::2]  # a view with strides
    return ("OUT", datatype, array.shape, array, None)


def laid_bytes(memory: bytes | memoryview, slots: list[tuple]) -> list[bytes]:
    return [bytes(memory[offset : offset + nbytes]) for _, _, _, offset, nbytes, _ in slots]


@SETTINGS
@given(st.lists(outputs(), min_size=1, max_size=4))
def test_inline_outputs_give_the_bytes_the_segment_would(tensors: list[Laid]) -> None:
    writer = SegmentWriter(f"/tritonfast-test-layout-{os.getpid()}", 4096)
    try:
        _, _, segment_slots = write_tensors(writer, tensors)
        in_segment = laid_bytes(writer.segment.buffer, segment_slots)
        inline = inline_tensors(tensors)
        assert inline is not None  # (a few small tensors)
        data, inline_slots = inline
        assert laid_bytes(data, inline_slots) == in_segment
        # The same names, datatypes and shapes; offsets into the reply's data, back to back.
        assert [s[:3] for s in inline_slots] == [s[:3] for s in segment_slots]
        assert sum(s[4] for s in inline_slots) == len(data)
        # And they are the model's values, as the core reads them back.
        for (_, datatype, shape, array, _), raw in zip(tensors, in_segment, strict=True):
            read = rawtensor.from_raw(datatype, tuple(shape), memoryview(raw), "OUT", "m")
            if datatype == "BYTES":
                expected = [v if isinstance(v, bytes) else v.encode() for v in array.ravel()]
                assert list(read.ravel()) == expected
            else:
                assert read.tobytes() == rawtensor.wire_array(datatype, array).tobytes()
    finally:
        writer.close()


def test_outputs_over_the_limit_go_to_the_segment() -> None:
    half = np.zeros(INLINE_BYTES // 8 + 1, dtype=np.float32)  # just over half the limit
    small = ("A", "FP32", half.shape, half, None)
    assert inline_tensors([small]) is not None
    assert inline_tensors([small, ("B", "FP32", half.shape, half, None)]) is None
    strings = np.array([b"x" * (INLINE_BYTES // 2)] * 3, dtype=object)
    assert inline_tensors([("S", "BYTES", strings.shape, strings, None)]) is None


def test_an_output_placed_in_a_clients_object_is_described_not_carried() -> None:
    raw = np.arange(4, dtype=np.float32).view(np.uint8)
    place = ("client_object", 0, 16, 0, 16)
    other = np.array([7], dtype=np.int64)
    data, slots = inline_tensors(
        [("P", "FP32", (4,), raw, place), ("Q", "INT64", (1,), other, None)]
    ) or (b"", [])
    assert slots[0] == ("P", "FP32", (4,), 0, 16, place)
    assert slots[1] == ("Q", "INT64", (1,), 0, 8, None)
    assert data == other.tobytes()


@SETTINGS
@given(st.sampled_from(sorted(set(NUMPY_DTYPES) - {"BYTES"})), shapes, st.integers(0, 3))
def test_an_input_is_viewed_where_it_lies(datatype: str, shape: tuple, lead: int) -> None:
    itemsize = NUMPY_DTYPES[datatype].itemsize
    count = int(np.prod(shape))
    offset = lead * 64
    buffer = bytearray(offset + count * itemsize + 64)
    values = np.arange(count).astype(NUMPY_DTYPES[datatype])
    buffer[offset : offset + count * itemsize] = values.tobytes()
    slot = ("IN", datatype, shape, offset, count * itemsize, None)
    array = read_tensor(buffer, slot, "m", None, copy=False)
    assert array.shape == shape
    assert array.dtype == NUMPY_DTYPES[datatype]
    assert array.tobytes() == values.tobytes()
    if count:  # a view, not a copy
        assert np.shares_memory(array, np.frombuffer(buffer, np.uint8))


def test_a_slot_that_does_not_fit_its_shape_gets_tritons_error() -> None:
    buffer = bytearray(64)
    with pytest.raises(InvalidArgumentError, match="input byte size mismatch"):
        read_tensor(buffer, ("IN", "FP32", (1, 4), 0, 12, None), "m", None, copy=False)
    with pytest.raises(InvalidArgumentError, match="input byte size mismatch"):
        read_tensor(buffer, ("IN", "FP32", (1, 4), 0, 14, None), "m", None, copy=False)
