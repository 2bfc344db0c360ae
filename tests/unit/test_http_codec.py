"""The HTTP codec against tritonclient's own request encoder and response decoder.

Requests are built with ``tritonclient.http.InferenceServerClient.generate_request_body``
(exactly the bytes tritonclient sends) and decoded by our codec; responses are encoded by
our codec and read back with ``parse_response_body`` (exactly what tritonclient does with a
server's reply).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.data.types import (
    InferRequest,
    InferResponse,
    OutputTensor,
    RequestedOutput,
)
from tritonfast.errors import Code, InvalidArgumentError, TritonError
from tritonfast.frontends.http import codec, tensordata

Client = httpclient.InferenceServerClient
DATATYPES = sorted(NUMPY_DTYPES)
NUMERIC = [d for d in DATATYPES if d not in ("BYTES", "BF16")]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw, datatype: str, *, json: bool = False) -> np.ndarray:
    """An array as the codec holds it (BF16: uint16 bits; BYTES: object array of bytes)."""
    shape = draw(shapes)
    if datatype == "BYTES":
        items = st.text(max_size=8).map(str.encode) if json else st.binary(max_size=8)
        values = draw(st.lists(items, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    elements = None
    if json and dtype.kind == "f":
        elements = st.floats(allow_nan=False, allow_infinity=False, width=dtype.itemsize * 8)
    if json and datatype == "BF16":
        # Finite bfloat16 values only: exponent bits not all ones.
        elements = st.integers(0, 0xFFFF).filter(lambda b: (b >> 7) & 0xFF != 0xFF)
    return draw(hnp.arrays(dtype, shape, elements=elements))


def client_array(datatype: str, array: np.ndarray) -> np.ndarray:
    """The array as tritonclient expects it (BF16 as ml_dtypes.bfloat16)."""
    return array.view(ml_dtypes.bfloat16) if datatype == "BF16" else array


def assert_same(datatype: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if datatype == "BYTES":
        # tritonclient hands JSON BYTES back as str, binary BYTES as bytes.
        as_bytes = [x.encode() if isinstance(x, str) else bytes(x) for x in got.reshape(-1)]
        assert as_bytes == list(want.reshape(-1))
    else:
        # Bitwise: NaN payloads and signed zeros must survive too.
        assert got.dtype.itemsize == want.dtype.itemsize
        assert got.tobytes() == want.tobytes()


def decode_client_body(inputs, outputs=None, **kwargs):
    body, json_size = Client.generate_request_body(inputs, outputs, **kwargs)
    length = codec.header_length(None if json_size is None else str(json_size), len(body))
    return codec.decode_infer_request(bytearray(body), length, "model", "")


@pytest.mark.parametrize(
    ("value", "length"),
    [("12", 12), (" \t12abc", 12), ("+3", 3), ("x12", 0), ("\x1f12", 0), ("\u0663", 0)],
)
def test_the_header_length_is_read_as_strtol_reads_it(value: str, length: int) -> None:
    # C's white space only, ASCII digits only; no number at all reads as 0 (a raw request).
    assert codec.header_length(value, 100) == length


# -- requests -------------------------------------------------------------------------------
@SETTINGS
@given(data=st.data(), datatype=st.sampled_from(DATATYPES))
def test_binary_input_round_trip(data, datatype):
    array = data.draw(tensors(datatype))
    infer_input = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    infer_input.set_data_from_numpy(client_array(datatype, array), binary_data=True)
    request, binary_default = decode_client_body([infer_input])
    assert binary_default is True  # no outputs named: tritonclient asks for binary
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", datatype, array.shape)
    assert tensor.parameters == {}
    assert_same(datatype, tensor.data, array)


@SETTINGS
@given(data=st.data(), datatype=st.sampled_from([d for d in DATATYPES if d != "BF16"]))
def test_json_input_round_trip(data, datatype):
    array = data.draw(tensors(datatype, json=True))
    infer_input = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    infer_input.set_data_from_numpy(array, binary_data=False)
    request, _ = decode_client_body([infer_input])
    (tensor,) = request.inputs
    assert tensor.shape == array.shape
    assert_same(datatype, tensor.data, array)


@SETTINGS
@given(array=tensors("BF16", json=True))
def test_json_bf16_input_is_numbers(array):
    # tritonclient refuses BF16 in JSON; any client may still send the values as numbers.
    values = array.view(ml_dtypes.bfloat16).astype(np.float64).reshape(-1).tolist()
    doc = {
        "inputs": [{"name": "X", "datatype": "BF16", "shape": list(array.shape), "data": values}]
    }
    body = orjson.dumps(doc)
    request, _ = codec.decode_infer_request(body, len(body), "m")
    assert_same("BF16", request.inputs[0].data, array)


def test_binary_inputs_are_views_over_the_body():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([1.5, -2.0], dtype=np.float64)
    inputs = []
    for name, array in (("A", a), ("B", b)):
        inputs.append(httpclient.InferInput(name, list(array.shape), codec_dt(array)))
        inputs[-1].set_data_from_numpy(array)
    body, json_size = Client.generate_request_body(inputs)
    buf = bytearray(body)
    request, _ = codec.decode_infer_request(buf, json_size, "m")
    got_a, got_b = (t.data for t in request.inputs)
    assert np.shares_memory(got_a, np.frombuffer(buf, np.uint8))
    assert got_a.flags.writeable  # a bytearray body gives writable zero-copy tensors
    buf[json_size] = 0xFF  # first byte of A's data
    assert got_a[0, 0] == 0xFF
    np.testing.assert_array_equal(got_b, b)


def codec_dt(array: np.ndarray) -> str:
    return {np.dtype(np.int32): "INT32", np.dtype(np.float64): "FP64"}[array.dtype]


def test_bytes_with_nul_and_non_utf8_round_trip_binary():
    array = np.array([b"\x00\xff\xfe", b"", b"a\x00b", "é".encode()], dtype=object)
    infer_input = httpclient.InferInput("S", [4], "BYTES")
    infer_input.set_data_from_numpy(array)
    request, _ = decode_client_body([infer_input])
    assert list(request.inputs[0].data) == list(array)


def test_request_fields_and_parameters():
    x = httpclient.InferInput("X", [2], "INT64")
    x.set_data_from_numpy(np.array([1, 2], dtype=np.int64), binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput("OUT1", binary_data=True),
        httpclient.InferRequestedOutput("OUT0", binary_data=False),
    ]
    request, binary_default = decode_client_body(
        [x],
        outputs,
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        priority=3,
        timeout=100,
        parameters={"custom": "v", "n": 5, "f": 0.25, "flag": False},
    )
    assert request.id == "req-7"
    assert binary_default is False
    assert [(o.name, o.parameters) for o in request.outputs] == [
        ("OUT1", {"binary_data": True}),
        ("OUT0", {"binary_data": False}),
    ]
    assert request.parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 3,
        "timeout": 100,
        "custom": "v",
        "n": 5,
        "f": 0.25,
        "flag": False,
    }


# -- responses ------------------------------------------------------------------------------
def response_with(*tensors: OutputTensor, **kwargs) -> InferResponse:
    return InferResponse(model_name="m", model_version="3", outputs=list(tensors), **kwargs)


@SETTINGS
@given(data=st.data(), datatype=st.sampled_from(DATATYPES), binary=st.booleans())
def test_output_round_trip(data, datatype, binary):
    array = data.draw(tensors(datatype, json=not binary))
    response = response_with(OutputTensor("OUT", datatype, array.shape, array))
    request = InferRequest("m", outputs=[RequestedOutput("OUT", {"binary_data": binary})])
    body, header_length = codec.encode_infer_response(response, request, False)
    result = Client.parse_response_body(body, header_length=header_length)
    got = result.as_numpy("OUT")
    if datatype == "BF16":
        got = got.view(np.uint16)
    assert_same(datatype, got, array)
    out = result.get_output("OUT")
    assert (out["datatype"], out["shape"]) == (datatype, list(array.shape))


def test_response_json_shape():
    response = response_with(
        OutputTensor("A", "INT32", (2,), np.array([1, 2], dtype=np.int32)),
        OutputTensor("B", "FP32", (1,), np.array([0.5], dtype=np.float32)),
        parameters={"p": 1, "s": "x"},
    )
    request = InferRequest("m", id="abc")
    body, header_length = codec.encode_infer_response(response, request, False)
    assert header_length is None
    assert orjson.loads(body) == {
        "id": "abc",
        "model_name": "m",
        "model_version": "3",
        "parameters": {"p": 1, "s": "x"},
        "outputs": [
            {"name": "A", "datatype": "INT32", "shape": [2], "data": [1, 2]},
            {"name": "B", "datatype": "FP32", "shape": [1], "data": [0.5]},
        ],
    }
    # No id in the response when the request had none.
    body, _ = codec.encode_infer_response(response, InferRequest("m"), False)
    assert "id" not in orjson.loads(body)


def test_binary_output_layout_and_requested_subset():
    a = np.arange(3, dtype=np.int16)
    s = np.array([b"x\x00", b"yz"], dtype=object)
    response = response_with(
        OutputTensor("A", "INT16", (3,), a),
        OutputTensor("S", "BYTES", (2,), s),
        OutputTensor("C", "BOOL", (1,), np.array([True])),
    )
    request = InferRequest(
        "m", outputs=[RequestedOutput("S", {"binary_data": True}), RequestedOutput("A")]
    )
    body, header_length = codec.encode_infer_response(response, request, True)
    header = orjson.loads(body[:header_length])
    # Only the requested outputs, in the response's order; A defaults to JSON when named.
    assert [o["name"] for o in header["outputs"]] == ["A", "S"]
    assert header["outputs"][0]["data"] == [0, 1, 2]
    assert header["outputs"][1]["parameters"] == {"binary_data_size": 12}
    assert body[header_length:] == b"\x02\x00\x00\x00x\x00\x02\x00\x00\x00yz"


def test_binary_data_output_applies_to_unnamed_outputs():
    a = np.arange(4, dtype=np.float32)
    response = response_with(OutputTensor("A", "FP32", (4,), a))
    body, header_length = codec.encode_infer_response(response, InferRequest("m"), True)
    assert header_length is not None
    assert body[header_length:] == a.tobytes()


def test_non_utf8_bytes_output_in_json_is_still_valid_json():
    s = np.array([b"ok", b"\xff"], dtype=object)
    response = response_with(OutputTensor("S", "BYTES", (2,), s))
    body, _ = codec.encode_infer_response(response, InferRequest("m"), False)
    assert orjson.loads(body)["outputs"][0]["data"] == ["ok", "\ufffd"]


# -- errors ---------------------------------------------------------------------------------
def decode_doc(doc, tail: bytes = b"", length: int | None = None):
    head = orjson.dumps(doc)
    body = head + tail
    return codec.decode_infer_request(body, len(head) if length is None else length, "m")


def raises(message: str):
    """The error ``message``, of whichever code Triton gives it (parse failures are INTERNAL,
    checked over the wire in tests/e2e/test_http_errors.py)."""
    return pytest.raises(TritonError, match="^" + re.escape(message) + "$")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "The document is empty. at 0"),
        (b"   ", "The document is empty. at 3"),
        (b"AAAA", "Invalid value. at 0"),
        (b"not json", "Invalid value. at 1"),
        (b"{", "Missing a name for object member. at 1"),
        (b'{"a" 1}', "Missing a colon after a name of object member. at 5"),
        (b'{"a":1 "b":2}', "Missing a comma or '}' after an object member. at 7"),
        (b'{"a":[1 2]}', "Missing a comma or ']' after an array element. at 8"),
        (b'{"a":[1,]}', "Invalid value. at 8"),
        (b'{"a":1,}', "Missing a name for object member. at 7"),
        (b'{"a":tru}', "Invalid value. at 8"),
        (b'{"a":1.}', "Miss fraction part in number. at 7"),
        (b'{"a":1e+}', "Miss exponent in number. at 8"),
        (b'{"a":-}', "Invalid value. at 6"),
        (b'{"a":"x', "Missing a closing quotation mark in string. at 7"),
        (b'{"a":"\\q"}', "Invalid escape character in string. at 6"),
        (b'{"a":"\\u12G4"}', "Incorrect hex digit after \\u escape in string. at 6"),
        (b'{"a":"\\ud800"}', "The surrogate pair in string is invalid. at 6"),
        (b'{"a":"\x01"}', "Invalid encoding in string. at 6"),
        (b"{} {}", "The document root must not be followed by other values. at 3"),
        (b"[NaN]", "Invalid value. at 1"),
    ],
)
def test_malformed_json_messages(body, message):
    with raises("failed to parse the request JSON buffer: " + message):
        codec.decode_infer_request(body, len(body), "m")


def test_json_rapidjson_accepts_but_orjson_does_not():
    # A NUL ends the document for RapidJSON; invalid UTF-8 inside strings is kept as is.
    doc = b'{"inputs":[{"name":"S","datatype":"BYTES","shape":[1],"data":["\xff\x00"]}]}'
    body = doc.replace(b"\x00", b"") + b"\x00trailing"
    request, _ = codec.decode_infer_request(body, len(body), "m")
    assert list(request.inputs[0].data) == [b"\xff"]


FP32_INPUT = {"name": "X", "datatype": "FP32", "shape": [2]}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        ([], "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        ({"inputs": {}}, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
        (
            {"id": 5, "inputs": []},
            "Unable to parse 'id': attempt to access JSON non-string as string",
        ),
        (
            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2]}]},
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
        ),
        (
            {"inputs": [{**FP32_INPUT, "data": [1, 2], "parameters": {"binary_data_size": 8}}]},
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But set 'data' "
            "'binary_data_size'",
        ),
        (
            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [-1], "data": [1]}]},
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        (
            {"inputs": [{"name": 1, "datatype": "FP32", "shape": [1], "data": [1]}]},
            "Unable to parse 'name': attempt to access JSON non-string as string",
        ),
        (
            {"inputs": [{"name": "X", "datatype": "FLOAT", "shape": [1], "data": [1]}]},
            "invalid datatype for input X",
        ),
        (
            {"inputs": [{**FP32_INPUT, "data": [1, 2, 3]}]},
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        (
            {"inputs": [{**FP32_INPUT, "data": [[1]]}]},
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        (
            {"inputs": [{**FP32_INPUT, "data": [1, "2"]}]},
            "Unable to parse 'data': attempt to access JSON non-number as double",
        ),
        (
            {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1.5]}]},
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
        ),
        (
            {"inputs": [{"name": "X", "datatype": "UINT8", "shape": [1], "data": [-1]}]},
            "Unable to parse 'data': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        (
            {"inputs": [{"name": "X", "datatype": "BOOL", "shape": [1], "data": [1]}]},
            "Unable to parse 'data': attempt to access JSON non-boolean as boolean",
        ),
        (
            {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1], "data": [1]}]},
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
        ),
        (
            {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [3], "data": ["a", "b"]}]},
            "[request id: <id_unknown>] expected 3 string elements for inference input 'S' for"
            " model 'm', got 2",
        ),
        (
            {"inputs": [], "parameters": {"triton_x": 1}},
            "parameter keys starting with 'triton_' are reserved for Triton usage and should "
            "not be specified.",
        ),
        (
            {"inputs": [], "parameters": {"p": [1]}},
            "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        (
            {"inputs": [], "parameters": {"binary_data_output": 1}},
            "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean",
        ),
        (
            {"inputs": [], "outputs": [{"name": "O", "parameters": {"binary_data": "yes"}}]},
            "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean",
        ),
    ],
)
def test_request_errors(doc, message):
    with raises(message):
        decode_doc(doc)


def test_nested_json_data_is_flattened_like_triton():
    request, _ = decode_doc(
        {"inputs": [{"name": "X", "datatype": "INT8", "shape": [2, 2], "data": [[1, [2]], 3, [4]]}]}
    )
    np.testing.assert_array_equal(request.inputs[0].data, [[1, 2], [3, 4]])


def binary_doc(size: int, datatype: str = "FP32", shape=(2,)) -> dict:
    return {
        "inputs": [
            {
                "name": "X",
                "datatype": datatype,
                "shape": list(shape),
                "parameters": {"binary_data_size": size},
            }
        ]
    }


def test_truncated_binary_data():
    with raises("unexpected size for input 'X', expecting 3 additional bytes for model 'm'"):
        decode_doc(binary_doc(8), tail=b"\x00" * 5)


def test_binary_input_without_header_length():
    head = orjson.dumps(binary_doc(8))
    with raises("unexpected size for input 'X', expecting 8 additional bytes for model 'm'"):
        codec.decode_infer_request(head, codec.header_length(None, len(head)), "m")


def test_additional_binary_data():
    with raises("unexpected additional input data for model 'm'"):
        decode_doc(binary_doc(8), tail=b"\x00" * 9)


def test_binary_size_does_not_match_shape():
    with raises(
        "[request id: <id_unknown>] input byte size mismatch for input 'X' for model 'm'."
        " Expected 8, got 4"
    ):
        decode_doc(binary_doc(4), tail=b"\x00" * 4)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            b"\x01\x00\x00\x00a\x01\x00\x00\x00b\x01\x00\x00\x00c",
            "[request id: <id_unknown>] unexpected number of string elements 3 for inference"
            " input 'X' for model 'm', expecting 2",
        ),
        (
            b"\x01\x00\x00\x00a",
            "[request id: <id_unknown>] expected 2 string elements for inference input 'X' for"
            " model 'm', got 1",
        ),
        (
            b"\x09\x00\x00\x00abc",
            "incomplete string data for inference input 'X', expecting string of length 9 but "
            "only 3 bytes available",
        ),
        (
            b"\x01\x00\x00\x00a\x01\x00",
            "[request id: <id_unknown>] element byte size indicator exceeds the end of the buffer.",
        ),
    ],
)
def test_bad_binary_bytes(payload, message):
    with raises(message):
        decode_doc(binary_doc(len(payload), "BYTES"), tail=payload)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("100", "inference header size should be in range (0, 50), got: 100"),
        ("-1", "inference header size should be in range (0, 50), got: -1"),
    ],
)
def test_header_length_errors(value, message):
    with raises(message):
        codec.header_length(value, 50)


@pytest.mark.parametrize(("value", "length"), [("0", 0), ("abc", 0), (" 7", 7), ("12abc", 12)])
def test_header_length_reads_the_leading_number_as_triton_does(value, length):
    assert codec.header_length(value, 50) == length  # 0: a raw binary request


def test_status_table_covers_every_code():
    assert set(codec.HTTP_STATUS) == set(Code)
    assert codec.HTTP_STATUS[Code.INVALID_ARG] == 400
    assert codec.HTTP_STATUS[Code.NOT_FOUND] == 404
    assert codec.HTTP_STATUS[Code.INTERNAL] == 500
    assert codec.HTTP_STATUS[Code.UNAVAILABLE] == 503
    assert codec.HTTP_STATUS[Code.UNSUPPORTED] == 501


@SETTINGS
@given(st.lists(st.floats(width=32), max_size=20))
def test_bf16_conversion_matches_ml_dtypes(values):
    floats = np.array(values, dtype=np.float32)
    ours = tensordata.float_to_bf16(floats)
    theirs = floats.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(floats)
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.isnan(tensordata.bf16_to_float(ours[~finite])).all()
    np.testing.assert_array_equal(
        tensordata.bf16_to_float(theirs), theirs.view(ml_dtypes.bfloat16).astype(np.float32)
    )


def test_huge_bytes_shape_is_an_error_not_an_allocation():
    payload = b"\x04\x00\x00\x00abcd"
    with raises(
        "[request id: <id_unknown>] expected 1000000000000 string elements for inference input"
        " 'X' for model 'm', got 1"
    ):
        decode_doc(binary_doc(len(payload), "BYTES", shape=(10**12,)), tail=payload)


def test_error_body_survives_invalid_utf8_from_the_client():
    # A name with invalid UTF-8 (kept by the lenient JSON path) inside an error message.
    body = b'{"inputs":[{"name":"\xff","datatype":"NOPE","shape":[1],"data":[1]}]}'
    with pytest.raises(InvalidArgumentError) as info:
        codec.decode_infer_request(body, len(body), "m")
    assert orjson.loads(codec.error_body(info.value.message)) == {
        "error": "invalid datatype for input \ufffd"
    }
