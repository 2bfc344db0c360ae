"""The KServe v2 / Triton HTTP endpoint on aiohttp.

Routes answer as Triton's HTTP server does: JSON ``{"error": ...}`` bodies with the status
from :data:`codec.HTTP_STATUS`, ``405 Method Not Allowed`` on a known path with the wrong
method, ``404 Not Found`` for anything else. Handlers reach the server only through the
:class:`~tritonfast.frontends.dataplane.DataPlane`; the wire format lives in ``codec``.

Inference request bodies may be gzip- or deflate-compressed (``Content-Encoding``); the
response is compressed when ``Accept-Encoding`` asks for gzip or deflate. The body is read
into one preallocated buffer, so binary inputs become writable numpy views without a copy.
"""

from __future__ import annotations

import logging
import zlib
from typing import TYPE_CHECKING

from aiohttp import web

from tritonfast.errors import InvalidArgumentError, TritonError, UnsupportedError
from tritonfast.frontends.http import codec

if TYPE_CHECKING:
    from tritonfast.frontends.dataplane import DataPlane

log = logging.getLogger("tritonfast.http")

DATAPLANE: web.AppKey[DataPlane] = web.AppKey("dataplane")
# Triton reads content lengths as int32; bodies up to that size are accepted.
MAX_BODY_BYTES = (1 << 31) - 1

_JSON = {"Content-Type": "application/json"}
_METHOD_NOT_ALLOWED = codec.error_body("Method Not Allowed")
_ZLIB_AUTO = 15 + 32  # zlib or gzip framing, detected from the data (as Triton inflates)
_COMPRESSORS = {"gzip": 16 + 15, "deflate": 15}
_REQUEST_ENCODINGS = frozenset(("identity", "gzip", "deflate"))


def _error(err: TritonError, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=codec.HTTP_STATUS[err.code],
        body=codec.error_body(err.message),
        headers=headers or _JSON,
    )


def _json(value: object) -> web.Response:
    return web.Response(body=codec.dumps(value), headers=_JSON)


def _method_not_allowed() -> web.Response:
    return web.Response(status=405, body=_METHOD_NOT_ALLOWED, headers=_JSON)


# -- health and metadata ----------------------------------------------------------------------
async def server_metadata(request: web.Request) -> web.Response:
    if request.method != "GET":
        return _method_not_allowed()
    return _json(request.app[DATAPLANE].server_metadata())


async def health_live(request: web.Request) -> web.Response:
    if request.method != "GET":
        return _method_not_allowed()
    return web.Response(status=200 if request.app[DATAPLANE].live() else 400)


async def health_ready(request: web.Request) -> web.Response:
    if request.method != "GET":
        return _method_not_allowed()
    return web.Response(status=200 if request.app[DATAPLANE].ready() else 400)


def _model(request: web.Request) -> tuple[str, str]:
    info = request.match_info
    return info["model"], info.get("version", "")


async def model_metadata(request: web.Request) -> web.Response:
    if request.method != "GET":
        return _method_not_allowed()
    try:
        return _json(request.app[DATAPLANE].model_metadata(*_model(request)))
    except TritonError as err:
        return _error(err)


async def model_ready(request: web.Request) -> web.Response:
    if request.method != "GET":
        return _method_not_allowed()
    try:
        ready = request.app[DATAPLANE].model_ready(*_model(request))
    except TritonError as err:
        return _error(err)
    if not ready:
        return _error(InvalidArgumentError("Model version not ready"))
    return web.Response(status=200)


async def model_config(request: web.Request) -> web.Response:
    if request.method != "GET":
        return _method_not_allowed()
    try:
        return _json(request.app[DATAPLANE].model_config_json(*_model(request)))
    except TritonError as err:
        return _error(err)


async def model_statistics(request: web.Request) -> web.Response:
    if request.method != "GET":
        return _method_not_allowed()
    info = request.match_info
    try:
        stats = request.app[DATAPLANE].model_statistics(
            info.get("model", ""), info.get("version", "")
        )
    except TritonError as err:
        return _error(err)
    return _json(stats)


async def not_found(request: web.Request) -> web.Response:
    return web.Response(status=404, body=codec.error_body("Not Found"), headers=_JSON)


# -- inference --------------------------------------------------------------------------------
async def infer(request: web.Request) -> web.Response:
    if request.method != "POST":
        return _method_not_allowed()
    model_name, model_version = _model(request)
    encoding = request.headers.get("Content-Encoding")
    dataplane = request.app[DATAPLANE]
    try:
        # Like Triton, name an unknown model before looking at the body.
        dataplane.model_metadata(model_name, model_version)
        if encoding and encoding not in _REQUEST_ENCODINGS:
            return _error(
                UnsupportedError("Unsupported compression type"),
                {**_JSON, "Accept-Encoding": "gzip, deflate"},
            )
        body = await _read_body(request)
        if encoding and encoding != "identity":
            body = _inflate(body)
        json_length = codec.header_length(request.headers.get(codec.HEADER_LENGTH), len(body))
        infer_request, binary_default = codec.decode_infer_request(
            body, json_length, model_name, model_version
        )
        response = await dataplane.infer(infer_request)
        payload, header_length = codec.encode_infer_response(
            response, infer_request, binary_default
        )
    except TritonError as err:
        return _error(err)
    except Exception as exc:  # a bug, not a client error: answer like Triton, keep the trace
        log.exception("inference request for model '%s' failed", model_name)
        return web.Response(status=500, body=codec.error_body(str(exc)), headers=_JSON)

    if header_length is None:
        headers = {"Content-Type": "application/json"}
    else:
        headers = {
            "Content-Type": "application/octet-stream",
            codec.HEADER_LENGTH: str(header_length),
        }
    encoding = _response_encoding(request.headers.get("Accept-Encoding"))
    if encoding is not None:
        compressor = zlib.compressobj(6, zlib.DEFLATED, _COMPRESSORS[encoding])
        payload = compressor.compress(payload) + compressor.flush()
        headers["Content-Encoding"] = encoding
    return web.Response(body=payload, headers=headers)


async def _read_body(request: web.Request) -> bytearray:
    """The whole request body in one writable buffer, filled as chunks arrive."""
    stream = request.content
    length = request.content_length
    if length is not None:
        if length > MAX_BODY_BYTES:
            raise InvalidArgumentError(f"request body of {length} bytes is too large")
        buf = bytearray(length)
        view = memoryview(buf)
        filled = 0
        while filled < length:
            chunk = await stream.readany()
            if not chunk:
                break
            view[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        if filled != length:  # the client closed early; aiohttp normally raises first
            raise InvalidArgumentError(
                f"unexpected end of request body: got {filled} of {length} bytes"
            )
        return buf
    buf = bytearray()
    while chunk := await stream.readany():
        buf += chunk
        if len(buf) > MAX_BODY_BYTES:
            raise InvalidArgumentError(f"request body larger than {MAX_BODY_BYTES} bytes")
    return buf


def _inflate(body: bytearray) -> bytearray:
    if not body:
        raise InvalidArgumentError("nothing to be decompressed")
    try:
        return bytearray(zlib.decompressobj(_ZLIB_AUTO).decompress(body))
    except zlib.error:
        # Triton keeps what inflated before the error, which leaves unparsable JSON.
        return bytearray()


def _response_encoding(accept: str | None) -> str | None:
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


# -- wiring -----------------------------------------------------------------------------------
def create_app(dataplane: DataPlane) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[DATAPLANE] = dataplane
    add = app.router.add_route
    add("*", "/v2", server_metadata)
    add("*", "/v2/health/live", health_live)
    add("*", "/v2/health/ready", health_ready)
    add("*", "/v2/models/stats", model_statistics)  # before {model} would claim "stats"
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version:[0-9]+}"):
        add("*", prefix, model_metadata)
        add("*", prefix + "/ready", model_ready)
        add("*", prefix + "/config", model_config)
        add("*", prefix + "/infer", infer)
        add("*", prefix + "/stats", model_statistics)
    add("*", "/{tail:.*}", not_found)
    return app


async def start_http_server(dataplane: DataPlane, host: str, port: int) -> web.AppRunner:
    """Start serving on ``host:port``; listening when this returns. Stop with ``cleanup()``."""
    runner = web.AppRunner(
        create_app(dataplane),
        access_log=None,
        auto_decompress=False,  # request bodies are inflated by ``infer`` itself
        handle_signals=False,
        # A client that disconnects cancels its handler, so its queued request is dropped.
        handler_cancellation=True,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
