"""remotewire, the only thing RemoteTriton's host and its proxy model send each other: every
dtype it carries comes back from decode() as encode() was given it (fixed-size dtypes byte for
byte, BYTES item for item, any shape including zero-size ones), the header's other keys
survive, and whatever else arrives (a truncated or malformed message, a dtype it does not
carry, bytes past the end, a pickle) is refused with WireError and never runs anything."""

from __future__ import annotations

import ast
import json
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as npst
from tritonfast.pytriton import remote
from tritonfast.pytriton.remote import PROXY_MODEL
from tritonfast.pytriton.remotewire import (
    BYTES,
    DTYPES,
    MAX_HEADER_BYTES,
    WireError,
    decode,
    encode,
)

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIXED_DTYPES = sorted(DTYPES)
# Shapes up to 4 dimensions, zero-size sides included (they carry no bytes but keep the shape).
shapes = npst.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
fixed_arrays = st.sampled_from(FIXED_DTYPES).flatmap(
    lambda dtype: npst.arrays(np.dtype(dtype), shapes)
)
bytes_arrays = npst.arrays(object, shapes, elements=st.binary(max_size=12), fill=st.nothing())
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)
# The header's own keys: anything JSON but "arrays", which encode() writes itself.
headers = st.dictionaries(st.text(max_size=8).filter(lambda key: key != "arrays"), json_values)


def framed(header: bytes, tail: bytes = b"") -> bytes:
    """A message with this header text (whatever it holds) and ``tail`` after it."""
    return struct.pack(">I", len(header)) + header + tail


def with_header(header: Any, tail: bytes = b"") -> bytes:
    return framed(json.dumps(header).encode(), tail)


def assert_same_array(sent: np.ndarray, received: np.ndarray) -> None:
    """Fixed dtypes compare byte for byte (NaN payloads and -0.0 included); BYTES item by
    item, each a ``bytes``."""
    assert received.shape == sent.shape
    if sent.dtype == object:
        assert received.dtype == object
        assert all(type(item) is bytes for item in received.flat)
        assert list(received.flat) == list(sent.flat)
    else:
        assert received.dtype.str == sent.dtype.str
        assert received.tobytes() == sent.tobytes()


# -- round trips -------------------------------------------------------------------------------


@PROPERTY
@given(header=headers, arrays=st.lists(fixed_arrays | bytes_arrays, max_size=4))
def test_any_arrays_and_header_come_back_as_sent(
    header: dict[str, Any], arrays: list[np.ndarray]
) -> None:
    received_header, received = decode(encode(header, arrays))
    assert received_header == header
    assert len(received) == len(arrays)
    for sent, back in zip(arrays, received, strict=True):
        assert_same_array(sent, back)


@pytest.mark.parametrize("dtype", FIXED_DTYPES)
def test_every_fixed_dtype_round_trips(dtype: str) -> None:
    # Values at the edges of each dtype, so nothing is narrowed on the way.
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else None
    if np.dtype(dtype).kind == "b":
        values = np.array([[True, False, True]], dtype=dtype)
    elif info is not None:
        values = np.array([[info.min, -0.0, info.max], [np.nan, np.inf, info.tiny]], dtype=dtype)
    else:
        limits = np.iinfo(dtype)
        values = np.array([[limits.min, 0, limits.max]], dtype=dtype)
    _, (back,) = decode(encode({}, [values]))
    assert_same_array(values, back)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 5), ()])
@pytest.mark.parametrize("dtype", [*FIXED_DTYPES, BYTES])
def test_zero_size_and_scalar_shapes_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    sent = np.full(shape, b"item", dtype=object) if dtype == BYTES else np.ones(shape, dtype=dtype)
    _, (back,) = decode(encode({}, [sent]))
    assert_same_array(sent, back)


def test_bytes_items_keep_empty_strings_and_any_byte_values() -> None:
    sent = np.array([[b"", b"\x00", b"\xff" * 300], [b"", b"", b"a\x00b"]], dtype=object)
    _, (back,) = decode(encode({}, [sent]))
    assert_same_array(sent, back)


def test_a_big_endian_array_arrives_little_endian_with_the_same_values() -> None:
    sent = np.array([1, -2, 2**30], dtype=">i4")
    _, (back,) = decode(encode({}, [sent]))
    assert back.dtype.str == "<i4"
    assert back.tolist() == sent.tolist()


def test_the_header_keeps_its_other_keys_and_drops_only_arrays() -> None:
    header = {"requests": [{"inputs": ["A"], "parameters": {"p": 1}}], "note": "kept"}
    received, arrays = decode(encode(header, [np.zeros(2, np.float32)]))
    assert received == header
    assert len(arrays) == 1


@pytest.mark.parametrize("dtype", ["<c8", "<M8[s]", "<m8[s]", "V4", "<f16"])
def test_encode_refuses_dtypes_it_cannot_carry(dtype: str) -> None:
    with pytest.raises(WireError):
        encode({}, [np.zeros(2, dtype=dtype)])


# -- refusals ----------------------------------------------------------------------------------

VALID = encode({"k": "v"}, [np.arange(3, dtype="<i4"), np.array([b"ab", b""], dtype=object)])

MALFORMED = {
    "empty": b"",
    "shorter than the header length": b"\x00\x00\x01",
    "header length past the end": struct.pack(">I", 100) + b'{"arrays": []}',
    "header length past the limit": struct.pack(">I", MAX_HEADER_BYTES + 1)
    + b" " * (MAX_HEADER_BYTES + 1),
    "header not JSON": framed(b"not json"),
    "header not UTF-8": framed(b'{"arrays": [], "\xff": 1}'),
    "header nested past the parser's depth": framed(b"[" * 100_000 + b"]" * 100_000),
    "header not an object": with_header([]),
    "header a number": with_header(1),
    "arrays missing": with_header({}),
    "arrays null": with_header({"arrays": None}),
    "arrays an object": with_header({"arrays": {"<f4": [1]}}),
    "arrays a string": with_header({"arrays": "<f4"}),
    "array description not a list": with_header({"arrays": ["<f4"]}),
    "array description of one item": with_header({"arrays": [["<f4"]]}),
    "array description of three items": with_header({"arrays": [["<f4", [1], 0]]}, b"\0" * 4),
    "dtype not a string": with_header({"arrays": [[4, [1]]]}, b"\0" * 4),
    "shape not a list": with_header({"arrays": [["<f4", 1]]}, b"\0" * 4),
    "negative dim": with_header({"arrays": [["<f4", [-1]]]}),
    "negative dim beside a zero": with_header({"arrays": [["<f4", [0, -1]]]}),
    "bool dim": with_header({"arrays": [["<f4", [True]]]}, b"\0" * 4),
    "float dim": with_header({"arrays": [["<f4", [1.0]]]}, b"\0" * 4),
    "null dim": with_header({"arrays": [["<f4", [None]]]}),
    "dim past what numpy holds": with_header({"arrays": [["<f4", [0, 2**70]]]}),
    "bytes dim past what numpy holds": with_header({"arrays": [[BYTES, [0, 2**64]]]}),
    "more dims than numpy holds": with_header({"arrays": [["<f4", [1] * 65]]}, b"\0" * 4),
    "more bytes dims than numpy holds": with_header(
        {"arrays": [[BYTES, [1] * 65]]}, struct.pack("<I", 0)
    ),
    "array past the end": with_header({"arrays": [["<f4", [2]]]}, b"\0" * 7),
    "huge array past the end": with_header({"arrays": [["<f8", [2**40, 2**40]]]}, b"\0" * 8),
    "bytes item length cut": with_header({"arrays": [[BYTES, [1]]]}, b"\x05\x00"),
    "bytes item past the end": with_header(
        {"arrays": [[BYTES, [1]]]}, struct.pack("<I", 9) + b"ab"
    ),
    "bytes items fewer than the shape": with_header(
        {"arrays": [[BYTES, [2**62]]]}, struct.pack("<I", 0) * 3
    ),
    "trailing bytes": VALID + b"\0",
    "trailing bytes after no arrays": with_header({"arrays": []}, b"x"),
}
# Dtypes numpy knows but the wire does not carry: objects (a pickle by another name), complex,
# strings, datetimes, records, big-endian and unsized spellings.
FOREIGN_DTYPES = ["|O", "O", "<c8", "<c16", "<U1", "|S1", "<M8[s]", "|V4", ">f4", "float32", "f4"]


@pytest.mark.parametrize("message", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_message_is_refused(message: bytes) -> None:
    with pytest.raises(WireError):
        decode(message)


@pytest.mark.parametrize("dtype", FOREIGN_DTYPES)
def test_a_dtype_outside_the_list_is_refused(dtype: str) -> None:
    with pytest.raises(WireError, match="dtype"):
        decode(with_header({"arrays": [[dtype, [1]]]}, b"\0" * 16))


def test_every_prefix_of_a_message_is_refused() -> None:
    # A message cut anywhere (a short read, a peer that stops writing) is never taken for a
    # shorter message.
    for end in range(len(VALID)):
        with pytest.raises(WireError):
            decode(VALID[:end])


def assert_typed_or_refused(message: bytes) -> None:
    """decode() either refuses ``message`` with WireError (and nothing else) or gives typed
    data only: a dict, and arrays of a listed dtype or of bytes items."""
    try:
        header, arrays = decode(message)
    except WireError:
        return
    assert isinstance(header, dict)
    for array in arrays:
        assert isinstance(array, np.ndarray)
        if array.dtype == object:
            assert all(type(item) is bytes for item in array.flat)
        else:
            assert array.dtype.str in DTYPES


@PROPERTY
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    assert_typed_or_refused(data)


descriptions = st.lists(
    st.sampled_from([*FIXED_DTYPES, BYTES, *FOREIGN_DTYPES]) | json_values, max_size=3
).map(list) | st.tuples(
    st.sampled_from([*FIXED_DTYPES, BYTES]),
    st.lists(st.integers(-2, 3) | st.integers(0, 2**70) | st.booleans() | json_values, max_size=6),
).map(list)


@PROPERTY
@given(
    arrays=st.lists(descriptions, max_size=3) | json_values,
    tail=st.binary(max_size=64),
)
def test_headers_that_describe_anything_decode_or_raise_wire_error(
    arrays: Any, tail: bytes
) -> None:
    # Close to valid on purpose: real dtypes, shapes of every kind, any bytes after them.
    assert_typed_or_refused(with_header({"arrays": arrays}, tail))


# -- pickles -----------------------------------------------------------------------------------


class RunsCommand:
    """Unpickled, runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch '{self.marker}'",))


class WritesFile:
    """Unpickled, writes ``marker`` (no shell: a file API called by the unpickler)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "unpickled"))


PAYLOADS = [RunsCommand, WritesFile]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda kind: kind.__name__)
def test_the_payloads_are_live(payload: type, tmp_path: Path) -> None:
    # The control: unpickled, each payload does create its file, so the tests below that
    # find no file prove that decode() ran nothing.
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda kind: kind.__name__)
def test_a_pickle_is_refused_and_runs_nothing(payload: type, protocol: int, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with pytest.raises(WireError):
        decode(pickle.dumps(payload(marker), protocol=protocol))
    assert not marker.exists()


def test_a_pickle_framed_as_a_message_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    # The pickle where the header goes, its length correct: still not JSON.
    marker = tmp_path / "marker"
    with pytest.raises(WireError):
        decode(framed(pickle.dumps(RunsCommand(marker))))
    assert not marker.exists()


def test_a_pickle_inside_a_bytes_array_stays_bytes(tmp_path: Path) -> None:
    # BYTES items are data: a pickle sent as one comes back as its bytes, never loaded.
    marker = tmp_path / "marker"
    payload = pickle.dumps(WritesFile(marker))
    _, (back,) = decode(encode({}, [np.array([payload], dtype=object)]))
    assert back[0] == payload
    assert not marker.exists()


def unpickling_calls(source: str) -> list[str]:
    """The calls in ``source`` that would unpickle: imports of pickle-like modules, and
    ``Connection.recv``/``send`` (multiprocessing pickles through them; ``recv_bytes`` and
    ``send_bytes`` carry bytes only)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names]
            if isinstance(node, ast.ImportFrom):
                modules.append(node.module or "")
            found += [m for m in modules if m.split(".")[0] in {"pickle", "marshal", "dill"}]
        if isinstance(node, ast.Attribute) and node.attr in {"recv", "send", "loads", "load"}:
            found.append(ast.unparse(node))
    return [f for f in found if f != "json.loads"]


def test_neither_side_of_the_socket_unpickles() -> None:
    # The proxy model (which the server runs, with remotewire's source inside it) and the
    # host (remote.py) read the socket with recv_bytes and decode() only.
    assert unpickling_calls(PROXY_MODEL) == []
    assert unpickling_calls(Path(remote.__file__).read_text()) == []
