"""Fuzzing the wire codecs: whatever bytes arrive, decoding ends in a request or in a
TritonError (which the frontends answer with its status), never in another exception."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.errors import TritonError
from tritonfast.frontends.grpc import codec as grpc_codec
from tritonfast.frontends.http import codec as http_codec

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DATATYPES = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES"]
datatypes = st.sampled_from(DATATYPES) | st.text(max_size=6)
shapes = st.lists(st.integers(-3, 6) | st.integers(-(2**63), 2**63 - 1), max_size=4)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
parameters = st.dictionaries(
    st.sampled_from(
        [
            "binary_data",
            "binary_data_size",
            "shared_memory_region",
            "shared_memory_byte_size",
            "shared_memory_offset",
            "classification",
            "priority",
            "timeout",
            "sequence_id",
            "x",
        ]
    ),
    scalars,
    max_size=3,
)


@st.composite
def http_documents(draw: Any) -> dict[str, Any]:
    """Inference request headers shaped like real ones, with anything in their fields."""
    tensor = st.fixed_dictionaries(
        {"name": st.text(max_size=6), "shape": shapes | json_values, "datatype": datatypes},
        optional={"data": json_values, "parameters": parameters},
    )
    return draw(
        st.fixed_dictionaries(
            {"inputs": st.lists(tensor, max_size=3) | json_values},
            optional={
                "id": scalars,
                "outputs": st.lists(
                    st.fixed_dictionaries(
                        {"name": st.text(max_size=6)}, optional={"parameters": parameters}
                    ),
                    max_size=2,
                ),
                "parameters": parameters,
            },
        )
    )


def _settles(call: Any) -> None:
    with contextlib.suppress(TritonError):  # answered with its status by the frontends
        call()


@FUZZ
@given(doc=http_documents() | json_values, tail=st.binary(max_size=48), cut=st.integers(-4, 4))
def test_http_infer_bodies_decode_or_fail_with_a_triton_error(doc, tail, cut) -> None:
    head = json.dumps(doc).encode()
    body = bytearray(head + tail)

    _settles(lambda: http_codec.decode_infer_request(body, max(0, len(head) + cut), "m"))


@FUZZ
@given(body=st.binary(max_size=200), length=st.integers(-5, 300))
def test_http_infer_bodies_of_random_bytes(body, length) -> None:
    _settles(lambda: http_codec.decode_infer_request(bytearray(body), length, "m"))


@FUZZ
@given(value=st.none() | st.text(max_size=12), content_length=st.integers(0, 1 << 31))
def test_http_header_lengths(value, content_length) -> None:
    _settles(lambda: http_codec.header_length(value, content_length))


def _grpc_request(draw: Any) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=6)))
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add()
        tensor.name = draw(st.text(max_size=6))
        tensor.datatype = draw(datatypes)
        tensor.shape.extend(draw(st.lists(st.integers(-3, 8), max_size=4)))
        which = draw(st.integers(0, 3))
        if which == 1:
            tensor.contents.int_contents.extend(
                draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8))
            )
        elif which == 2:
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=4)))
        elif which == 3:
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=8)))
    for _ in range(draw(st.integers(0, 3))):
        message.raw_input_contents.append(draw(st.binary(max_size=40)))
    if draw(st.booleans()):
        message.parameters["sequence_id"].int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    return message


@FUZZ
@given(data=st.data())
def test_grpc_infer_messages_decode_or_fail_with_a_triton_error(data) -> None:
    message = _grpc_request(data.draw)
    serialized = bytearray(message.SerializeToString())
    # Mutations of the wire bytes: flipped bytes, a cut, junk appended.
    for _ in range(data.draw(st.integers(0, 3))):
        if serialized:
            index = data.draw(st.integers(0, len(serialized) - 1))
            serialized[index] = data.draw(st.integers(0, 255))
    serialized = serialized[: data.draw(st.integers(0, len(serialized)))] + data.draw(
        st.binary(max_size=8)
    )

    def decode() -> None:
        parsed, raw = grpc_codec.parse_infer_request(bytes(serialized))
        grpc_codec.decode_infer_request(parsed, raw)

    _settles(decode)
    _settles(lambda: grpc_codec.decode_infer_request(message))


def test_fuzzing_reaches_the_decoders() -> None:
    """A sanity check of the harness: a well-formed request does decode."""
    body = bytearray(
        json.dumps(
            {"inputs": [{"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}]}
        ).encode()
    )
    request, _ = http_codec.decode_infer_request(body, len(body), "m")
    np.testing.assert_array_equal(request.inputs[0].data, [1, 2])
