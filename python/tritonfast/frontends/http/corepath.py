"""HTTP inference requests handed to the Rust core whole.

For a model whose requests the core takes all the way (:mod:`tritonfast.runtime.lane`), an
inference request (``infer``; the generate extension's ``generate`` for a model that is
neither decoupled nor a sequence model, and its ``generate_stream`` over HTTP/1.1 for a
decoupled one that keeps no first-response histogram, whose events the core writes as they
come) whose body has arrived goes to the model's lane in one call: the core
decodes and checks it, queues it, runs its batch on the worker and writes its response on the
connection's :class:`~tritonfast._core.OutStream`, then names it in the server's
:class:`~tritonfast._core.LaneCompletions`, which the event loop watches to serve the
connection's next request. No Python runs for the request between the call and that.

A large body, received into a buffer of its own, goes to the core once all of it has arrived
(the connection waits for it: :meth:`CorePath.lane_of` says whether to).

A request takes the reference path (``app.infer``, ``app.generate_once``), which answers
every request as Triton does, whenever anything about it is not the everyday case: tracing,
header forwarding or an API restriction on, a compressed body or answer, ``Expect``, a small
body still arriving, a body over the body budget, a raw binary body, a JSON header (or
generate body) of ``codec.LARGE_JSON_BYTES`` or more (read on a low-priority thread there,
off the event loop), a connection that closes after the answer, a response cache, or a
request the core's decoder leaves to the reference path (CUDA shared memory, a system region
not registered or too small, classification, parameters it does not know, invalid requests:
their errors are worded there).
"""

from __future__ import annotations

import itertools

import numpy as np

from tritonfast._core import LaneCompletions, OutStream
from tritonfast.api.dataplane import DataPlane
from tritonfast.errors import TritonError
from tritonfast.frontends.http import codec
from tritonfast.frontends.http.answer import response_encoding
from tritonfast.frontends.http.request import Request
from tritonfast.frontends.http.routes import Endpoint, resolve
from tritonfast.runtime.lane import CoreLane

_IDENTITY = (None, "identity")
# The endpoints whose requests the core takes: inference and the generate extension's.
_TAKEN = (Endpoint.INFER, Endpoint.GENERATE, Endpoint.GENERATE_STREAM)


class CorePath:
    """Hands a server's HTTP inference requests to its models' lanes."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane
        self.completions: LaneCompletions = dataplane.lane_completions
        self._tokens = itertools.count(1)

    def submit(self, request: Request, out: OutStream) -> tuple[CoreLane, object, int] | None:
        """Queue ``request`` in its model's lane: the lane, its ticket and the token the
        completions will name; None when the reference path must answer it."""
        body = _arrived_body(request)
        if body is None:
            return None
        direct = request.body  # (its object, where the worker reads large inputs)
        body_object = None if direct is None else direct.object
        routed = self._routed(request)
        if routed is None:
            return None
        lane, endpoint = routed
        if endpoint is not Endpoint.INFER:
            length = len(body)
        else:
            try:
                length = codec.header_length(request.headers.get(codec.HEADER_LENGTH), len(body))
            except TritonError:
                return None
            if length == 0:  # a raw binary body
                return None
        if length >= codec.LARGE_JSON_BYTES:
            # Megabytes of JSON take long to read (or to refuse): the reference path does it
            # on a low-priority thread, where the core would do it on the event loop's.
            return None
        token = next(self._tokens)
        minor = request.version[1]
        try:
            if endpoint is Endpoint.GENERATE:
                ticket = lane.submit_generate_http(body, out, minor, True, token)
            elif endpoint is Endpoint.GENERATE_STREAM:
                # (Events are chunks: HTTP/1.1 only.)
                ticket = lane.submit_generate_events(body, out, token) if minor == 1 else None
            else:
                ticket = lane.submit_http(body, length, out, minor, True, token, body_object)
        except TritonError:  # refused: the reference path words it
            return None
        return None if ticket is None else (lane, ticket, token)

    def lane_of(self, request: Request) -> CoreLane | None:
        """The lane ``request`` goes to once its body has arrived, unless anything about the
        request but its body sends it to the reference path."""
        routed = self._routed(request)
        return None if routed is None else routed[0]

    def _routed(self, request: Request) -> tuple[CoreLane, Endpoint] | None:
        """:meth:`lane_of`, and the request's endpoint."""
        if request.method != "POST" or request.version[0] != 1 or not request.keep_alive:
            return None
        route = resolve(request.path)
        if route is None or route.endpoint not in _TAKEN:
            return None
        headers = request.headers
        if (
            headers.get("Content-Encoding") not in _IDENTITY
            or "Expect" in headers
            or response_encoding(headers.get("Accept-Encoding")) is not None
        ):
            return None
        dataplane = self._dataplane
        if dataplane.tracer.enabled or dataplane.forwards_headers("HTTP"):
            return None
        if route.endpoint is Endpoint.GENERATE_STREAM:
            lane = dataplane.events_lane_for(route.name, route.version)
        else:
            lane = dataplane.lane_for(route.name, route.version)
        return None if lane is None else (lane, route.endpoint)


def _arrived_body(request: Request) -> bytes | np.ndarray | None:
    """The whole body, when it has all arrived: in the parser's buffer (without taking it
    from there), or received into a buffer of its own (a view of it)."""
    length = request.content_length
    direct = request.body
    if direct is not None:
        if not direct.complete() or direct.failure is not None or direct.released:
            return None
        return np.frombuffer(direct.buffer, np.uint8)
    if not length or not request.content.is_eof():
        return None
    # aiohttp's StreamReader: the body's pieces, in order.
    chunks = getattr(request.content, "_buffer", None)
    if not chunks:
        return None
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return bytes(body) if len(body) == length else None
