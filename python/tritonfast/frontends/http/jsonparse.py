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
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from tritonfast._core import json_error
from tritonfast.errors import InternalError

CHECK_FIRST_BYTES = 1 << 20


def loads(buf: bytes | bytearray | memoryview) -> Any:
    """Parse ``buf`` as one JSON document; raise InternalError as Triton words it."""
    end = _checked_end(buf) if len(buf) >= CHECK_FIRST_BYTES else None
    if end is None or end == len(buf):
        try:
            return orjson.loads(buf)
        except orjson.JSONDecodeError:
            pass
    if end is None:
        end = _checked_end(buf)
    return _laxer_loads(bytes(buf[:end]))


def _checked_end(buf: bytes | bytearray | memoryview) -> int:
    """Where the document RapidJSON reads in ``buf`` ends, or its first error raised."""
    end, error = json_error(np.frombuffer(buf, np.uint8))
    if error is not None:
        # Triton answers a body it cannot parse with INTERNAL.
        raise InternalError(f"failed to parse the request JSON buffer: {error} at {end}")
    return end


def _laxer_loads(document: bytes) -> Any:
    """A document RapidJSON accepts and orjson does not: the standard library is laxer."""
    return json.loads(document.decode("utf-8", "surrogateescape"))
