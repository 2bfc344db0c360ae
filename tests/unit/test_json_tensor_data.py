"""Large JSON requests: inputs' ``data`` arrays parsed in the Rust core
(``jsonparse.loads_request``, ``tensordata.from_json`` with ``TensorNumbers``) give the same
arrays, and the same errors, as orjson and the general rules."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonfast.errors import TritonError
from tritonfast.frontends.http import jsonparse, tensordata

PAD = " " * jsonparse.CHECK_FIRST_BYTES  # makes a document large enough for the Rust path

NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -0.0, 1e308, 5e-324]),
)
ELEMENTS = st.one_of(NUMBERS, st.booleans(), st.text(max_size=3))
DATATYPES = ["FP32", "FP64", "FP16", "BF16", "INT8", "INT32", "INT64", "UINT8", "UINT64", "BOOL"]


def decode(document: bytes, datatype: str, shape: tuple[int, ...], left_out: bool):
    if left_out:
        doc, found = jsonparse.loads_request(document)
        assert doc["inputs"][0]["data"] == []  # left out of the parse
        assert set(found) == {0}
        data = found[0]
    else:
        data = jsonparse.loads(document)["inputs"][0]["data"]
    try:
        return tensordata.from_json(datatype, shape, data, "x", "m")
    except TritonError as err:
        return (err.code, err.message)


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(NUMBERS, max_size=20) | st.lists(ELEMENTS, max_size=6),
    nested=st.booleans(),
    datatype=st.sampled_from(DATATYPES),
    extra=st.integers(0, 1),
)
def test_the_same_arrays_and_errors_as_the_general_path(values, nested, datatype, extra):
    data = [values[: len(values) // 2], values[len(values) // 2 :]] if nested else values
    shape = (len(values) + extra,)
    document = json.dumps(
        {
            "id": "r",
            "inputs": [{"name": "x", "shape": list(shape), "datatype": datatype, "data": data}],
            "pad": PAD,
        }
    ).encode()
    assert same(decode(document, datatype, shape, True), decode(document, datatype, shape, False))


def test_ambiguous_members_are_left_to_orjson() -> None:
    document = b'{"inputs":[{"data":[1],"data":[2,3],"datatype":"INT32","shape":[2]}],"p":"'
    document += PAD.encode() + b'"}'
    doc, found = jsonparse.loads_request(document)
    assert found == {} and doc["inputs"][0]["data"] == [2, 3]


def test_a_small_document_is_parsed_whole() -> None:
    doc, found = jsonparse.loads_request(b'{"inputs":[{"data":[1]}]}')
    assert (doc, found) == ({"inputs": [{"data": [1]}]}, {})


@pytest.mark.parametrize("broken", [b'{"inputs":[{"data":[1,]}]', b'{"inputs":[{"data":[1]}]'])
def test_broken_documents_are_refused_as_before(broken: bytes) -> None:
    document = broken[:-1] + b',"p":"' + PAD.encode() + b'"' + broken[-1:]
    with pytest.raises(TritonError) as refused:
        jsonparse.loads_request(document)
    with pytest.raises(TritonError) as before:
        jsonparse.loads(document)
    assert refused.value.message == before.value.message
