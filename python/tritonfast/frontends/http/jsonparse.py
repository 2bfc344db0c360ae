"""Parse a request's JSON header the way Triton does, error messages included.

The fast path is :func:`orjson.loads`. Only when it refuses a document do we walk the
bytes once more with a small scanner that follows RapidJSON's grammar (Triton's parser):
it either finds the first error and reports it with RapidJSON's wording and byte offset
(``failed to parse the request JSON buffer: Invalid value. at 0``), or finds that RapidJSON
would have accepted the document (a NUL after the value, invalid UTF-8 inside a string, an
integer wider than 64 bits) and we parse it with the standard library instead.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from tritonfast.errors import InternalError

# RapidJSON's GetParseError_En texts.
_EMPTY = "The document is empty."
_NOT_SINGULAR = "The document root must not be followed by other values."
_VALUE_INVALID = "Invalid value."
_MISS_NAME = "Missing a name for object member."
_MISS_COLON = "Missing a colon after a name of object member."
_MISS_COMMA_OR_CURLY = "Missing a comma or '}' after an object member."
_MISS_COMMA_OR_SQUARE = "Missing a comma or ']' after an array element."
_BAD_HEX = "Incorrect hex digit after \\u escape in string."
_BAD_SURROGATE = "The surrogate pair in string is invalid."
_BAD_ESCAPE = "Invalid escape character in string."
_MISS_QUOTE = "Missing a closing quotation mark in string."
_BAD_ENCODING = "Invalid encoding in string."
_MISS_FRACTION = "Miss fraction part in number."
_MISS_EXPONENT = "Miss exponent in number."

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset(b'"\\/bfnrt')


class _SyntaxError(Exception):
    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


def loads(buf: bytes | bytearray | memoryview) -> Any:
    """Parse ``buf`` as one JSON document; raise InternalError as Triton words it."""
    try:
        return orjson.loads(buf)
    except orjson.JSONDecodeError:
        pass
    data = bytes(buf)
    try:
        end = _scan(data)
    except _SyntaxError as err:
        # Triton answers a body it cannot parse with INTERNAL.
        raise InternalError(
            f"failed to parse the request JSON buffer: {err.message} at {err.offset}"
        ) from None
    # RapidJSON accepts it; the standard library is laxer than orjson about what remains.
    return json.loads(data[:end].decode("utf-8", "surrogateescape"))


def _scan(b: bytes) -> int:
    """Validate ``b`` with RapidJSON's grammar; return where the document ends."""
    n = len(b)

    def peek(i: int) -> int:
        return b[i] if i < n else 0

    def ws(i: int) -> int:
        while i < n and b[i] in _WS:
            i += 1
        return i

    def member_name(i: int) -> int:
        # At the start of an object member: name, colon, then whitespace before the value.
        if peek(i) != 0x22:
            raise _SyntaxError(_MISS_NAME, i)
        i = ws(_string(b, i))
        if peek(i) != 0x3A:
            raise _SyntaxError(_MISS_COLON, i)
        return ws(i + 1)

    i = ws(0)
    if peek(i) == 0:
        raise _SyntaxError(_EMPTY, i)
    stack: list[int] = []
    while True:
        # Parse one value starting at i.
        c = peek(i)
        if c == 0x7B:  # {
            i = ws(i + 1)
            if peek(i) == 0x7D:
                i += 1
            else:
                i = member_name(i)
                stack.append(0x7B)
                continue
        elif c == 0x5B:  # [
            i = ws(i + 1)
            if peek(i) == 0x5D:
                i += 1
            else:
                stack.append(0x5B)
                continue
        elif c == 0x22:
            i = _string(b, i)
        elif c in (0x6E, 0x74, 0x66):  # null, true, false
            i = _literal(b, i)
        else:
            i = _number(b, i)
        # The value is complete: close finished containers, or move to the next element.
        while True:
            if not stack:
                i = ws(i)
                if peek(i) != 0:
                    raise _SyntaxError(_NOT_SINGULAR, i)
                return i
            i = ws(i)
            c = peek(i)
            if stack[-1] == 0x7B:
                if c == 0x2C:
                    i = member_name(ws(i + 1))
                    break
                if c == 0x7D:
                    stack.pop()
                    i += 1
                    continue
                raise _SyntaxError(_MISS_COMMA_OR_CURLY, i)
            if c == 0x2C:
                i = ws(i + 1)
                break
            if c == 0x5D:
                stack.pop()
                i += 1
                continue
            raise _SyntaxError(_MISS_COMMA_OR_SQUARE, i)


def _literal(b: bytes, i: int) -> int:
    word = {0x6E: b"null", 0x74: b"true", 0x66: b"false"}[b[i]]
    i += 1
    for ch in word[1:]:
        if i < len(b) and b[i] == ch:
            i += 1
        else:
            raise _SyntaxError(_VALUE_INVALID, i)
    return i


def _number(b: bytes, i: int) -> int:
    n = len(b)
    if i < n and b[i] == 0x2D:  # -
        i += 1
    if i < n and b[i] == 0x30:  # a leading zero stands alone
        i += 1
    elif i < n and b[i] in _DIGITS:
        while i < n and b[i] in _DIGITS:
            i += 1
    else:
        raise _SyntaxError(_VALUE_INVALID, i)
    if i < n and b[i] == 0x2E:  # .
        i += 1
        if not (i < n and b[i] in _DIGITS):
            raise _SyntaxError(_MISS_FRACTION, i)
        while i < n and b[i] in _DIGITS:
            i += 1
    if i < n and b[i] in (0x65, 0x45):  # e E
        i += 1
        if i < n and b[i] in (0x2B, 0x2D):
            i += 1
        if not (i < n and b[i] in _DIGITS):
            raise _SyntaxError(_MISS_EXPONENT, i)
        while i < n and b[i] in _DIGITS:
            i += 1
    return i


def _hex4(b: bytes, i: int, escape_at: int) -> tuple[int, int]:
    if i + 4 > len(b) or any(ch not in _HEX for ch in b[i : i + 4]):
        raise _SyntaxError(_BAD_HEX, escape_at)
    return int(b[i : i + 4], 16), i + 4


def _string(b: bytes, i: int) -> int:
    """Scan the string whose opening quote is at ``i``; return the index after it."""
    n = len(b)
    i += 1
    while True:
        c = b[i] if i < n else 0
        if c == 0x22:
            return i + 1
        if c == 0x5C:  # backslash
            escape_at = i
            e = b[i + 1] if i + 1 < n else 0
            if e in _SIMPLE_ESCAPES:
                i += 2
            elif e == 0x75:  # u
                code, i = _hex4(b, i + 2, escape_at)
                if 0xD800 <= code <= 0xDBFF:
                    if not (i + 1 < n and b[i] == 0x5C and b[i + 1] == 0x75):
                        raise _SyntaxError(_BAD_SURROGATE, escape_at)
                    low, i = _hex4(b, i + 2, escape_at)
                    if not 0xDC00 <= low <= 0xDFFF:
                        raise _SyntaxError(_BAD_SURROGATE, escape_at)
                elif 0xDC00 <= code <= 0xDFFF:
                    raise _SyntaxError(_BAD_SURROGATE, escape_at)
            else:
                raise _SyntaxError(_BAD_ESCAPE, escape_at)
        elif c < 0x20:
            raise _SyntaxError(_MISS_QUOTE if c == 0 else _BAD_ENCODING, i)
        else:
            i += 1
