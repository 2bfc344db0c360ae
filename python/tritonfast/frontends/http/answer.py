"""What an HTTP handler answers, and how an answer's status line and headers are written.

An :class:`Answer` is a status, a body made of parts (bytes or numpy arrays, sent as they are)
and its headers. A streamed answer (``stream`` set: Server-Sent Events, say) sends its parts
first and then each piece of its stream as it comes, as a chunked body (HTTP/1.1), or until
the connection closes (HTTP/1.0). Only what a Triton client reads is written: ``Content-Type`` and
``Content-Length``, the handler's own extra lines, and ``Connection`` when the connection
does not follow the HTTP version's default. Formatting the head is one f-string, where a
framework response object with a header multidict costs more than all else the frontend
does for a small request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from http import HTTPStatus
from typing import Any, NamedTuple

JSON = "application/json"
_REASONS = {status.value: status.phrase for status in HTTPStatus}


class Answer(NamedTuple):
    status: int = 200
    parts: Sequence[Any] = ()  # the body: bytes-like objects, written in order
    content_type: str | None = None
    extra: str = ""  # more header lines, each ending in CRLF
    sent: Callable[[], None] | None = None  # called once the body is handed to the socket
    stream: AsyncIterator[bytes] | None = None  # more of the body, written as it comes
    # The head and ``parts`` are on their way already (written by another thread on the
    # connection's writer stream: see tritonfast._core.EventWriter); only ``stream`` is left.
    written: bool = False

    @property
    def length(self) -> int:
        """The body's size in bytes."""
        total = 0
        for part in self.parts:
            total += len(part) if type(part) is bytes else memoryview(part).nbytes
        return total


def json_answer(body: bytes, status: int = 200, extra: str = "") -> Answer:
    return Answer(status, (body,), JSON, extra)


def head(answer: Answer, length: int | None, version: tuple[int, int], keep_alive: bool) -> bytes:
    """The status line and headers of ``answer`` with a body of ``length`` bytes (None: a
    streamed body, chunked for HTTP/1.1)."""
    if keep_alive:
        connection = "Connection: keep-alive\r\n" if version == (1, 0) else ""
    else:
        connection = "Connection: close\r\n" if version >= (1, 1) else ""
    content_type = f"Content-Type: {answer.content_type}\r\n" if answer.content_type else ""
    status = answer.status
    if length is not None:
        framing = f"Content-Length: {length}\r\n"
    else:
        framing = "Transfer-Encoding: chunked\r\n" if version >= (1, 1) else ""
    return (
        f"HTTP/{version[0]}.{version[1]} {status} {_REASONS.get(status, '')}\r\n{content_type}"
        f"{framing}{answer.extra}{connection}\r\n"
    ).encode("latin-1")


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (empty data ends the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def response_encoding(accept: str | None) -> str | None:
    """Triton's choice among identity, gzip and deflate: the highest q-value wins, ties first."""
    if not accept:
        return None
    best, weight = "identity", 0.0
    for item in accept.split(","):
        name, _, q = item.strip().partition(";q=")
        if not name:
            continue
        try:
            value = float(q) if q else 1.0
        except ValueError:
            continue
        if name in ("identity", "gzip", "deflate") and value > weight:
            best, weight = name, value
    return None if best == "identity" else best
