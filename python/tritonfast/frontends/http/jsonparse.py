"""Parse a request's JSON header the way Triton does, error messages included.

The fast path is :func:`orjson.loads`. Only when it refuses a document do we check the bytes
against RapidJSON's grammar (Triton's parser; :func:`tritonfast._core.json_error`, in Rust
without the GIL): it either finds the first error and reports it with RapidJSON's wording and
byte offset (``failed to parse the request JSON buffer: Invalid value. at 0``), or finds that
RapidJSON would have accepted the document (a NUL after the value, invalid UTF-8 inside a
string, an integer wider than 64 bits) and we parse it with the standard library instead.

A document of :data:`CHECK_FIRST_BYTES` or more is checked before orjson sees it: a body of
megabytes that breaks at its end is then refused without first building (and holding the GIL
for) every value before the break.

An inference request that large (:func:`loads_request`) has its inputs' ``data`` arrays left
out of orjson's parse: orjson builds a Python object per number holding the GIL (a quarter of
a second for 24 MiB, during which every other client waits), where the Rust core parses them
without it, straight into the numbers the input's datatype needs (:class:`TensorNumbers`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from tritonfast._core import json_error, json_input_data, json_numbers
from tritonfast.errors import InternalError

CHECK_FIRST_BYTES = 1 << 20

Buffer = bytes | bytearray | memoryview
_KIND_DTYPES = {"f64": np.dtype(np.float64), "i64": np.dtype(np.int64), "u64": np.dtype(np.uint64)}


class TensorNumbers:
    """One input's ``data`` array, left in the request's bytes by :func:`loads_request`."""

    __slots__ = ("_document", "_end", "_start")

    def __init__(self, document: np.ndarray, start: int, end: int) -> None:
        self._document = document
        self._start = start
        self._end = end

    def numbers(self, kind: str) -> np.ndarray | None:
        """Every number in the array (nested arrays flattened) as ``kind`` (``"f64"``,
        ``"i64"`` or ``"u64"``), parsed without the GIL; None when an element is not a number
        of that kind (then :meth:`as_list` and the general rules apply)."""
        owned = json_numbers(self._document, self._start, self._end, kind)
        return None if owned is None else np.asarray(owned).view(_KIND_DTYPES[kind])

    def as_list(self) -> Any:
        """The array as orjson reads it (checked already, with the whole document)."""
        return _parse(self._document[self._start : self._end].data, None)


def loads_request(buf: Buffer) -> tuple[Any, dict[int, TensorNumbers]]:
    """:func:`loads` for an inference request. From :data:`CHECK_FIRST_BYTES` on, each
    ``inputs[k].data`` array is left out of the parse (``[]`` in the document) and handed
    back as a :class:`TensorNumbers` by ``k``."""
    if len(buf) < CHECK_FIRST_BYTES:
        return loads(buf), {}
    end = _checked_end(buf)
    document = np.frombuffer(buf, np.uint8)[:end]
    ranges = json_input_data(document)
    if ranges:
        pieces = []
        last = 0
        for _, start, stop in ranges:
            pieces += [document[last:start].tobytes(), b"[]"]
            last = stop
        pieces.append(document[last:].tobytes())
        try:
            doc = orjson.loads(b"".join(pieces))
        except orjson.JSONDecodeError:  # RapidJSON-only leniency elsewhere: the general path
            pass
        else:
            return doc, {k: TensorNumbers(document, start, stop) for k, start, stop in ranges}
    return _parse(buf, end), {}


def loads(buf: Buffer) -> Any:
    """Parse ``buf`` as one JSON document; raise InternalError as Triton words it."""
    return _parse(buf, _checked_end(buf) if len(buf) >= CHECK_FIRST_BYTES else None)


def _parse(buf: Buffer, end: int | None) -> Any:
    """:func:`loads`, given where the checked document ends (None: not checked yet)."""
    if end is None or end == len(buf):
        try:
            return orjson.loads(buf)
        except orjson.JSONDecodeError:
            pass
    if end is None:
        end = _checked_end(buf)
    return _laxer_loads(bytes(buf[:end]))


def _checked_end(buf: Buffer) -> int:
    """Where the document RapidJSON reads in ``buf`` ends, or its first error raised."""
    end, error = json_error(np.frombuffer(buf, np.uint8))
    if error is not None:
        # Triton answers a body it cannot parse with INTERNAL.
        raise InternalError(f"failed to parse the request JSON buffer: {error} at {end}")
    return end


def _laxer_loads(document: bytes) -> Any:
    """A document RapidJSON accepts and orjson does not: the standard library is laxer."""
    return json.loads(document.decode("utf-8", "surrogateescape"))


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: the lone surrogates that stand for invalid UTF-8 bytes of the
    body (read with surrogateescape) become U+FFFD, for text that must be valid, such as a
    request id (Triton passes such bytes through as they came)."""
    if text.isascii():
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
