"""The raw tensor layout that HTTP, gRPC and the Python backend share.

Round trips run for every datatype; the layout is checked against tritonclient's own
serializer, and the error texts against both codecs, which must word them the same.
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.utils as tc_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.backends.python import pb_utils
from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.errors import InvalidArgumentError
from tritonfast.frontends.grpc import codec as grpc_codec
from tritonfast.frontends.http import codec as http_codec

DATATYPES = sorted(NUMPY_DTYPES)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def arrays(datatype: str) -> st.SearchStrategy[np.ndarray]:
    """Arrays as the server holds them (BF16: uint16 bits; BYTES: object array of bytes)."""
    if datatype != "BYTES":
        return hnp.arrays(NUMPY_DTYPES[datatype], shapes)

    def fill(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
        count = int(np.prod(shape))
        items = st.lists(st.binary(max_size=12), min_size=count, max_size=count)
        return items.map(lambda values: rawtensor.bytes_array(values).reshape(shape))

    return shapes.flatmap(fill)


def triton_layout(datatype: str, array: np.ndarray) -> bytes:
    """The raw bytes tritonclient sends for ``array``."""
    if datatype != "BYTES":
        return array.tobytes()
    serialized = tc_utils.serialize_byte_tensor(array)
    return serialized.item() if serialized.size else b""


@pytest.mark.parametrize("datatype", DATATYPES)
@SETTINGS
@given(data=st.data())
def test_round_trip_every_datatype(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays(datatype))
    raw = rawtensor.to_raw(datatype, array)
    wire = bytes(raw)
    assert wire == triton_layout(datatype, array)
    assert len(raw) == len(wire)
    # HTTP hands over a slice of the request body; gRPC a bytes object of its own.
    body = b"JSON" + wire + b"NEXT"
    for buf in (memoryview(body)[4 : 4 + len(wire)], wire):
        back = rawtensor.from_raw(datatype, array.shape, buf, "X", "m")
        assert back.shape == array.shape
        assert back.dtype == NUMPY_DTYPES[datatype]
        if datatype == "BYTES":
            assert back.ravel().tolist() == array.ravel().tolist()
        else:
            assert back.tobytes() == array.tobytes()
            assert not back.flags.owndata  # a view over the buffer, not a copy
            assert not back.flags.writeable


@SETTINGS
@given(st.lists(st.binary(max_size=20), max_size=30))
def test_bytes_split_and_serialize_are_inverse(items: list[bytes]) -> None:
    wire = rawtensor.serialize_bytes(rawtensor.bytes_array(items))
    assert rawtensor.split_bytes(wire) == items
    assert rawtensor.split_bytes(wire, len(items), "X", "m") == items
    assert pb_utils.deserialize_bytes_tensor(wire).tolist() == items
    flat = pb_utils.serialize_byte_tensor(rawtensor.bytes_array(items))
    assert flat is not None
    assert flat.tobytes() == wire


def test_elements_that_are_not_bytes() -> None:
    elements: list[Any] = ["é", b"\xff", bytearray(b"ba"), memoryview(b"mv"), 7, np.bytes_(b"n")]
    mixed = rawtensor.bytes_array(elements)
    assert rawtensor.serialize_bytes(mixed) == b"".join(
        len(b).to_bytes(4, "little") + b for b in ("é".encode(), b"\xff", b"ba", b"mv", b"7", b"n")
    )
    fixed_width = np.array([b"ab", b"c"], dtype="S2")
    assert rawtensor.serialize_bytes(fixed_width) == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    assert rawtensor.to_raw("BYTES", np.empty((0, 3), dtype=object)) == b""


def test_wire_array_copies_only_when_it_must() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert rawtensor.wire_array("FP32", data) is data
    transposed = rawtensor.wire_array("FP32", data.T)
    assert transposed.flags.c_contiguous
    assert bytes(rawtensor.to_raw("FP32", data.T)) == data.T.tobytes()
    assert rawtensor.wire_array("INT8", np.array([1, 300])).tolist() == [1, 44]  # wraps
    # bfloat16 values keep their bits; other dtypes are converted to the wire's.
    bf16 = np.array([1.0, -2.0], dtype=ml_dtypes.bfloat16)
    assert rawtensor.wire_array("BF16", bf16).tolist() == [0x3F80, 0xC000]
    assert rawtensor.wire_array("BF16", bf16[::-1]).tolist() == [0xC000, 0x3F80]


# -- errors ------------------------------------------------------------------------------------


def raises(message: str) -> Any:
    """Expect an InvalidArgumentError with exactly ``message``."""
    return pytest.raises(InvalidArgumentError, match="^" + re.escape(message) + "$")


def test_byte_size_mismatch() -> None:
    with raises(
        "[request id: r7] input byte size mismatch for input 'X' for model 'm'. Expected 16, got 12"
    ):
        rawtensor.from_raw("FP32", (4,), b"\x00" * 12, "X", "m", "r7")


def test_unknown_dimension_and_datatype() -> None:
    with raises(
        "[request id: <id_unknown>] All input dimensions should be specified for input 'X' for "
        "model 'm', got [2,-1]"
    ):
        rawtensor.from_raw("FP32", (2, -1), b"", "X", "m")
    with raises("invalid datatype 'FP8' for input tensor 'X' for model 'm'"):
        rawtensor.from_raw("FP8", (1,), b"\x00", "X", "m")


BAD_BYTES = [
    (
        b"\x01\x00\x00\x00a\x01\x00\x00\x00b\x01\x00\x00\x00c",
        "[request id: r1] unexpected number of string elements 3 for inference input 'X' for "
        "model 'm', expecting 2",
    ),
    (
        b"\x01\x00\x00\x00a",
        "[request id: r1] expected 2 string elements for inference input 'X' for model 'm', got 1",
    ),
    (
        b"\x09\x00\x00\x00abc",
        "incomplete string data for inference input 'X', expecting string of length 9 but "
        "only 3 bytes available",
    ),
    (
        b"\x01\x00\x00\x00a\x01\x00",
        "[request id: r1] element byte size indicator exceeds the end of the buffer.",
    ),
]


@pytest.mark.parametrize(("payload", "message"), BAD_BYTES)
def test_bad_bytes_same_text_on_every_wire(payload: bytes, message: str) -> None:
    with raises(message):
        rawtensor.from_raw("BYTES", (2,), payload, "X", "m", "r1")

    head = orjson.dumps(
        {
            "id": "r1",
            "inputs": [
                {
                    "name": "X",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
        }
    )
    with raises(message):
        http_codec.decode_infer_request(head + payload, len(head), "m")

    request = pb.ModelInferRequest(model_name="m", id="r1")
    request.inputs.add(name="X", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(payload)
    with raises(message):
        grpc_codec.decode_infer_request(request)


def test_string_count_from_json_and_typed_contents() -> None:
    too_many = "[request id: r1] unexpected number of string elements 2 for inference input"
    head = orjson.dumps(
        {
            "id": "r1",
            "inputs": [{"name": "X", "datatype": "BYTES", "shape": [1], "data": ["a", "b"]}],
        }
    )
    with raises(f"{too_many} 'X' for model 'm', expecting 1"):
        http_codec.decode_infer_request(head, len(head), "m")
    request = pb.ModelInferRequest(model_name="m", id="r1")
    request.inputs.add(name="X", datatype="BYTES", shape=[1]).contents.bytes_contents.extend(
        [b"a", b"b"]
    )
    with raises(f"{too_many} 'X' for model 'm', expecting 1"):
        grpc_codec.decode_infer_request(request)


def test_split_without_a_count_still_checks_the_layout() -> None:
    assert rawtensor.split_bytes(b"") == []
    indicator = "[request id: <id_unknown>] element byte size indicator exceeds the end"
    with raises(f"{indicator} of the buffer."):
        rawtensor.split_bytes(b"\x00\x00")
