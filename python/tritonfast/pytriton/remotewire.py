"""The messages between a remote callable's host (:mod:`.remote`) and the proxy model the
server runs for it: typed data only, never pickles, so whoever reaches the socket can send
tensors and nothing that runs.

A message is a JSON header and the raw bytes of its arrays, framed as::

    <header length: 4 bytes, big-endian> <header: UTF-8 JSON> <array bytes, one after another>

The header names each array as ``[dtype, shape]``: a numpy dtype of fixed size from
:data:`DTYPES` (the bytes as they lie in memory), or ``"bytes"`` (an object array of byte
strings, each stored as a 4-byte little-endian length and its bytes, Triton's BYTES layout).
Anything else is refused with :class:`WireError`.

This module needs nothing but the standard library and numpy: its source is written into the
proxy model as it is (see ``remote.PROXY_MODEL``), so the model runs wherever the server's
Python backend does.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

# The fixed-size dtypes a message may carry (native byte order is little-endian on every
# platform the server supports; the names say it explicitly).
DTYPES = frozenset(
    ["|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"]
)
BYTES = "bytes"
# A header larger than this is refused (it describes arrays; their data follows it).
MAX_HEADER_BYTES = 16 << 20
_LENGTH = struct.Struct(">I")
_ITEM = struct.Struct("<I")


class WireError(ValueError):
    """A message that is not a well-formed message of this format."""


def encode(header: dict[str, Any], arrays: list[np.ndarray]) -> bytes:
    """One message: ``header`` (JSON-serializable; ``"arrays"`` is set here) and ``arrays``."""
    described = []
    chunks: list[bytes] = []
    for array in arrays:
        if array.dtype.hasobject or array.dtype.kind in "SU":
            described.append([BYTES, list(array.shape)])
            chunks.append(_bytes_layout(array))
            continue
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        if dtype.str not in DTYPES:
            raise WireError(f"arrays of dtype {array.dtype} cannot be sent")
        described.append([dtype.str, list(array.shape)])
        chunks.append(np.ascontiguousarray(array, dtype=dtype).tobytes())
    head = json.dumps({**header, "arrays": described}).encode()
    return b"".join([_LENGTH.pack(len(head)), head, *chunks])


def decode(message: bytes) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The header and arrays of a message made by :func:`encode`; WireError if it is not."""
    view = memoryview(message)
    if len(view) < _LENGTH.size:
        raise WireError("the message is shorter than its header length")
    (length,) = _LENGTH.unpack_from(view)
    if length > MAX_HEADER_BYTES or _LENGTH.size + length > len(view):
        raise WireError("the message's header length is out of bounds")
    try:
        header = json.loads(bytes(view[_LENGTH.size : _LENGTH.size + length]))
    except (ValueError, RecursionError) as error:  # RecursionError: nested past json's depth
        raise WireError(f"the message's header is not JSON: {error}") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        raise WireError("the message's header does not describe its arrays")
    offset = _LENGTH.size + length
    arrays = []
    for described in header.pop("arrays"):
        array, offset = _array(view, offset, described)
        arrays.append(array)
    if offset != len(view):
        raise WireError("the message holds bytes past its last array")
    return header, arrays


def _array(view: memoryview, offset: int, described: Any) -> tuple[np.ndarray, int]:
    if not (
        isinstance(described, list)
        and len(described) == 2
        and isinstance(described[0], str)
        and isinstance(described[1], list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in described[1])
    ):
        raise WireError(f"an array is described as {described!r}")
    dtype, shape = described
    count = 1
    for dim in shape:
        count *= dim
    if dtype == BYTES:
        items = []
        for _ in range(count):
            if offset + _ITEM.size > len(view):
                raise WireError("a bytes array runs past the end of the message")
            (size,) = _ITEM.unpack_from(view, offset)
            offset += _ITEM.size
            if offset + size > len(view):
                raise WireError("a bytes array runs past the end of the message")
            items.append(bytes(view[offset : offset + size]))
            offset += size
        array = np.empty(count, dtype=object)
        array[:] = items
        return _shaped(array, shape), offset
    if dtype not in DTYPES:
        raise WireError(f"arrays of dtype {dtype!r} are not accepted")
    nbytes = count * np.dtype(dtype).itemsize
    if offset + nbytes > len(view):
        raise WireError("an array runs past the end of the message")
    array = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    return _shaped(array, shape), offset + nbytes


def _shaped(array: np.ndarray, shape: list[int]) -> np.ndarray:
    """``array`` in ``shape``; WireError for a shape numpy cannot hold (more than 64 dims, or
    a zero-size one with a side past its limits), which numpy refuses with a ValueError."""
    try:
        return array.reshape(shape)
    except (ValueError, OverflowError) as error:
        raise WireError(f"an array of shape {shape} cannot be held: {error}") from None


def _bytes_layout(array: np.ndarray) -> bytes:
    chunks: list[bytes] = []
    for item in array.flat:
        data = item if isinstance(item, bytes) else str(item).encode()
        chunks += (_ITEM.pack(len(data)), data)
    return b"".join(chunks)
