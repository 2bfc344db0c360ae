"""Tensor contents as raw bytes: the one layout every wire and the Python backend share.

HTTP's binary tensor data, gRPC's ``raw_input_contents`` / ``raw_output_contents`` and the
Python backend's serialized byte tensors all lay a tensor out the same way, in row-major
order: fixed-size elements as their little-endian bytes (BF16 as the ``uint16`` bit
patterns), and BYTES elements each as a 4-byte little-endian length followed by that many
bytes. Decoding views fixed-size data in place (``np.frombuffer``), never copying it.

The checks and their messages are those of Triton's core, so a client gets the same text
whichever protocol it speaks.
"""

from __future__ import annotations

import math
import struct
import sys
from typing import Any

import numpy as np

from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.errors import InvalidArgumentError

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("tritonfast's tensor layout assumes a little-endian host")

_LEN = struct.Struct("<I")
_U8 = np.dtype(np.uint8)
_U16 = np.dtype(np.uint16)
_OBJECT = np.dtype(np.object_)
# The numpy dtype of each fixed-size datatype (all but BYTES).
FIXED_SIZE_DTYPES = {name: dtype for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"}
_ONLY_BYTES = frozenset((bytes,))


# -- errors -----------------------------------------------------------------------------------
def request_prefix(request_id: str) -> str:
    """How Triton's core starts messages about a request."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def byte_size_error(
    name: str, model: str, request_id: str, expected: int, got: int
) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{request_prefix(request_id)}input byte size mismatch for input '{name}' for model"
        f" '{model}'. Expected {expected}, got {got}"
    )


def string_count_error(
    name: str, model: str, request_id: str, expected: int, got: int
) -> InvalidArgumentError:
    """Triton's error for ``got`` BYTES elements where the shape holds ``expected``."""
    prefix = request_prefix(request_id)
    if got > expected:
        # Triton stops at the first element too many.
        return InvalidArgumentError(
            f"{prefix}unexpected number of string elements {expected + 1} for inference input"
            f" '{name}' for model '{model}', expecting {expected}"
        )
    return InvalidArgumentError(
        f"{prefix}expected {expected} string elements for inference input '{name}' for model"
        f" '{model}', got {got}"
    )


def element_count(shape: tuple[int, ...], name: str, model: str, request_id: str) -> int:
    """How many elements ``shape`` holds; every dimension must be known (>= 0)."""
    if shape and min(shape) < 0:
        dims = ",".join(map(str, shape))
        raise InvalidArgumentError(
            f"{request_prefix(request_id)}All input dimensions should be specified for input"
            f" '{name}' for model '{model}', got [{dims}]"
        )
    return math.prod(shape)


def numeric_dtype(datatype: str, name: str, model: str) -> np.dtype[Any]:
    """The numpy dtype of a fixed-size datatype (not BYTES)."""
    dtype = FIXED_SIZE_DTYPES.get(datatype)
    if dtype is None:
        raise InvalidArgumentError(
            f"invalid datatype '{datatype}' for input tensor '{name}' for model '{model}'"
        )
    return dtype


# -- raw bytes -> numpy -----------------------------------------------------------------------
def split_bytes(
    buf: bytes | memoryview, count: int = -1, name: str = "", model: str = "", request_id: str = ""
) -> list[bytes]:
    """The elements of a BYTES tensor's raw data: exactly ``count`` of them (any if < 0)."""
    view = memoryview(buf)
    items: list[bytes] = []
    append = items.append
    unpack = _LEN.unpack_from
    end = len(view)
    pos = 0
    while end - pos >= 4:
        if len(items) == count:
            raise string_count_error(name, model, request_id, count, count + 1)
        (length,) = unpack(view, pos)
        start = pos + 4
        pos = start + length
        if pos > end:
            raise InvalidArgumentError(
                f"incomplete string data for inference input '{name}', expecting string of "
                f"length {length} but only {end - start} bytes available"
            )
        append(view[start:pos].tobytes())
    if pos != end:
        raise InvalidArgumentError(
            f"{request_prefix(request_id)}element byte size indicator exceeds the end of the"
            " buffer."
        )
    if count >= 0 and len(items) != count:
        raise string_count_error(name, model, request_id, count, len(items))
    return items


def bytes_array(items: list[bytes]) -> np.ndarray:
    """A 1-D object array holding ``items`` (numpy would make a fixed-width ``S`` array)."""
    array = np.empty(len(items), dtype=_OBJECT)
    array[:] = items
    return array


def from_raw(
    datatype: str,
    shape: tuple[int, ...],
    buf: bytes | memoryview,
    name: str,
    model: str,
    request_id: str = "",
) -> np.ndarray:
    """One input tensor from its raw data, shaped: a read-only view, or an object array."""
    count = element_count(shape, name, model, request_id)
    if datatype == "BYTES":
        return bytes_array(split_bytes(buf, count, name, model, request_id)).reshape(shape)
    dtype = numeric_dtype(datatype, name, model)
    expected = count * dtype.itemsize
    if len(buf) != expected:
        raise byte_size_error(name, model, request_id, expected, len(buf))
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


# -- numpy -> raw bytes -----------------------------------------------------------------------
def element_bytes(item: Any) -> bytes:
    """One BYTES element as bytes (``str`` and anything else as its UTF-8 text)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_bytes(array: np.ndarray) -> bytes:
    """The raw data of a BYTES tensor (its elements in row-major order)."""
    items = array.ravel().tolist()
    if not set(map(type, items)) <= _ONLY_BYTES:
        items = [element_bytes(item) for item in items]
    parts: list[bytes] = [b""] * (2 * len(items))
    parts[0::2] = map(_LEN.pack, map(len, items))
    parts[1::2] = items
    return b"".join(parts)


def wire_array(datatype: str, data: np.ndarray) -> np.ndarray:
    """``data`` as a C-contiguous array of the datatype's numpy dtype (copied only if needed).

    BF16 data of another 2-byte dtype (such as ``ml_dtypes.bfloat16``) is reinterpreted, not
    converted: its bits are already the wire's.
    """
    dtype = NUMPY_DTYPES[datatype]
    if data.dtype != dtype and datatype == "BF16" and data.dtype.itemsize == 2:
        data = data.view(_U16)
    if data.dtype != dtype or not data.flags.c_contiguous:
        data = np.ascontiguousarray(data, dtype=dtype)
    return data


def wire_bytes(datatype: str, data: np.ndarray) -> bytes:
    """One tensor's raw data as bytes, a copy: for a small one, quicker than :func:`to_raw`'s
    view and a copy of that."""
    if datatype == "BYTES":
        return serialize_bytes(np.asarray(data, dtype=_OBJECT))
    if data.dtype == NUMPY_DTYPES[datatype]:
        return data.tobytes()  # (row-major, contiguous or not)
    return wire_array(datatype, data).tobytes()


def to_raw(datatype: str, data: np.ndarray) -> bytes | np.ndarray:
    """One output tensor's raw data: bytes for BYTES, else a ``uint8`` view (no copy)."""
    if datatype == "BYTES":
        return serialize_bytes(np.asarray(data, dtype=_OBJECT))
    return wire_array(datatype, data).reshape(-1).view(_U8)
