"""The KServe v2 / Triton HTTP endpoint (connections: :mod:`.connection`, on aiohttp's parser).

Routes answer as Triton's HTTP server does: JSON ``{"error": ...}`` bodies with the status
from :data:`codec.HTTP_STATUS`, ``405 Method Not Allowed`` on a known path with the wrong
method, ``404 Not Found`` for anything else. Handlers reach the server only through the
:class:`~tritonfast.api.dataplane.DataPlane`; the wire format lives in ``codec``.

The generate extension's endpoints (:mod:`.generate`) answer with one JSON object, or with
Server-Sent Events written as the model's responses come.

Inference request bodies may be gzip- or deflate-compressed (``Content-Encoding``); the
response is compressed when ``Accept-Encoding`` asks for gzip or deflate. The body is read
into one preallocated buffer (a recycled pool buffer when large), so binary inputs become
numpy views without another copy; large binary outputs are written to the socket straight
from the model's arrays (see :class:`~.answer.Answer`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from tritonfast._core import EventWriter, Inflater
from tritonfast.data.types import InferRequest
from tritonfast.errors import InvalidArgumentError, TritonError, UnsupportedError
from tritonfast.frontends.http import codec, generate, rawrequest
from tritonfast.frontends.http.answer import JSON, Answer, json_answer, response_encoding
from tritonfast.frontends.http.connection import HttpServer
from tritonfast.frontends.http.corepath import CorePath
from tritonfast.frontends.http.request import MAX_BODY_BYTES, Request
from tritonfast.frontends.http.routes import Endpoint, resolve
from tritonfast.frontends.restricted import Restriction, http_refusal
from tritonfast.memory.bodybudget import COUNTED_BYTES, BodyBudget
from tritonfast.memory.bufferpool import pooled_memory
from tritonfast.runtime.responses import Result

if TYPE_CHECKING:
    from tritonfast.api.dataplane import DataPlane

log = logging.getLogger("tritonfast.http")

_BINARY = "application/octet-stream"
_COMPRESSORS = {"gzip": 16 + 15, "deflate": 15}
_REQUEST_ENCODINGS = frozenset(("identity", "gzip", "deflate"))
# A request body: small ones in a bytearray, large ones in a pool buffer.
Body = bytearray | memoryview
# How Triton names this endpoint when it refuses a decoupled model.
HTTP_ENDPOINT = "HTTP end point"
# From this size on, request bodies are read into pool buffers.
LARGE_BYTES = 1 << 16
# A compressed body inflates this much at a time (counted against the body budget as it grows).
INFLATE_STEP_BYTES = 1 << 24


def _error(err: TritonError, extra: str = "") -> Answer:
    return json_answer(codec.error_body(err.message), codec.HTTP_STATUS[err.code], extra)


def _json(value: object) -> Answer:
    return json_answer(codec.dumps(value))


def _json_or_error(answer: Callable[..., object], *args: str) -> Answer:
    """``answer(*args)`` as a JSON body, or the TritonError it raised."""
    try:
        return _json(answer(*args))
    except TritonError as err:
        return _error(err)


# -- health and metadata ----------------------------------------------------------------------
# Each handler takes the request, the data plane and the route's model and version.
async def server_metadata(
    request: Request, dataplane: DataPlane, model: str, version: str
) -> Answer:
    return _json(dataplane.server_metadata())


async def health_live(request: Request, dataplane: DataPlane, model: str, version: str) -> Answer:
    return Answer(200 if dataplane.live() else 400)


async def health_ready(request: Request, dataplane: DataPlane, model: str, version: str) -> Answer:
    return Answer(200 if dataplane.ready() else 400)


async def model_metadata(
    request: Request, dataplane: DataPlane, model: str, version: str
) -> Answer:
    return _json_or_error(dataplane.model_metadata, model, version)


async def model_ready(request: Request, dataplane: DataPlane, model: str, version: str) -> Answer:
    try:
        ready = dataplane.model_ready(model, version)
    except TritonError as err:
        return _error(err)
    if not ready:
        return _error(InvalidArgumentError("Model version not ready"))
    return Answer(200)


async def model_config(request: Request, dataplane: DataPlane, model: str, version: str) -> Answer:
    return _json_or_error(dataplane.model_config_json, model, version)


async def model_statistics(
    request: Request, dataplane: DataPlane, model: str, version: str
) -> Answer:
    return _json_or_error(dataplane.model_statistics, model, version)


# -- logging and trace settings ----------------------------------------------------------------
async def _settings(
    request: Request,
    read: Callable[[], dict[str, Any]],
    decode: Callable[[bytes | bytearray | memoryview], dict[str, Any]],
    change: Callable[[dict[str, Any]], dict[str, Any]],
) -> Answer:
    """GET: the settings; POST: change some, answer with all."""
    try:
        if request.method == "GET":
            return _json(read())
        return _json(change(decode(await _read_body(request))))
    except TritonError as err:
        return _error(err)


async def logging_settings(request: Request, dataplane: DataPlane, _: str, __: str) -> Answer:
    return await _settings(
        request, dataplane.log_settings, codec.decode_log_settings, dataplane.update_log_settings
    )


async def trace_setting(request: Request, dataplane: DataPlane, model: str, _: str) -> Answer:
    """The global trace settings, or the model's."""
    return await _settings(
        request,
        functools.partial(dataplane.trace_settings, model),
        codec.decode_trace_settings,
        functools.partial(dataplane.update_trace_settings, model=model),
    )


# -- the model repository ---------------------------------------------------------------------
# These handlers get the model named in the path (or "") and ignore the version.
async def repository_index(request: Request, dataplane: DataPlane, _: str, __: str) -> Answer:
    try:
        ready_only = codec.decode_index_request(await _read_body(request))
        return _json(dataplane.repository_index(ready_only))
    except TritonError as err:
        return _error(err)


async def _ok_or_error(work: Awaitable[object]) -> Answer:
    """An empty 200 once ``work`` is done, or the TritonError it raised."""
    try:
        await work
    except TritonError as err:
        return _error(err)
    return Answer(200)


async def repository_load(request: Request, dataplane: DataPlane, model: str, _: str) -> Answer:
    async def load() -> None:
        parameters = codec.decode_load_request(await _read_body(request))
        await dataplane.load_model(model, parameters)

    return await _ok_or_error(load())


async def repository_unload(request: Request, dataplane: DataPlane, model: str, _: str) -> Answer:
    async def unload() -> None:
        unload_dependents = codec.decode_unload_request(await _read_body(request))
        await dataplane.unload_model(model, unload_dependents)

    return await _ok_or_error(unload())


# -- shared memory ----------------------------------------------------------------------------
# These handlers get the region name (possibly "") where the others get the model.
async def system_shm_status(request: Request, dataplane: DataPlane, region: str, _: str) -> Answer:
    return _json_or_error(dataplane.system_shared_memory_status, region)


async def cuda_shm_status(request: Request, dataplane: DataPlane, region: str, _: str) -> Answer:
    return _json_or_error(dataplane.cuda_shared_memory_status, region)


def _region_to_register(region: str, kind: str) -> str:
    if not region:
        raise InvalidArgumentError(
            f"'region name' is necessary to register {kind} shared memory region"
        )
    return region


async def system_shm_register(
    request: Request, dataplane: DataPlane, region: str, _: str
) -> Answer:
    async def register() -> None:
        name = _region_to_register(region, "system")
        key, offset, byte_size = codec.decode_system_register(await _read_body(request))
        dataplane.register_system_shared_memory(name, key, offset, byte_size)

    return await _ok_or_error(register())


async def cuda_shm_register(request: Request, dataplane: DataPlane, region: str, _: str) -> Answer:
    async def register() -> None:
        name = _region_to_register(region, "cuda")
        raw_handle, device_id, byte_size = codec.decode_cuda_register(await _read_body(request))
        dataplane.register_cuda_shared_memory(name, raw_handle, device_id, byte_size)

    return await _ok_or_error(register())


async def system_shm_unregister(
    request: Request, dataplane: DataPlane, region: str, _: str
) -> Answer:
    dataplane.unregister_system_shared_memory(region)
    return Answer(200)


async def cuda_shm_unregister(
    request: Request, dataplane: DataPlane, region: str, _: str
) -> Answer:
    dataplane.unregister_cuda_shared_memory(region)
    return Answer(200)


# -- inference --------------------------------------------------------------------------------
async def infer(
    request: Request, dataplane: DataPlane, model_name: str, model_version: str
) -> Answer:
    tracing = dataplane.tracer.enabled  # clock reads only when a request may be traced
    received_start = perf_counter_ns() if tracing else 0
    encoding = request.headers.get("Content-Encoding")
    if encoding and encoding not in _REQUEST_ENCODINGS:
        try:
            dataplane.require_model(model_name, model_version)  # an unknown model comes first
        except TritonError as err:
            return _error(err)
        return _error(
            UnsupportedError("Unsupported compression type"), "Accept-Encoding: gzip, deflate\r\n"
        )
    inflated = 0  # bytes of an inflated body counted against the body budget
    try:
        try:
            body = await _read_body(request)
            received = ("HTTP", received_start, perf_counter_ns()) if tracing else None
            if encoding and encoding != "identity":
                body, inflated = await _inflated(body, dataplane)
            declared = request.headers.get(codec.HEADER_LENGTH)
            length = codec.header_length(declared, len(body))
            if length == 0 and declared is not None:  # raw: the body is the model's one input
                config = dataplane.model_config(model_name, model_version)
                infer_request = rawrequest.decode(body, config, model_name, model_version)
                binary_default = True
            elif length >= codec.LARGE_JSON_BYTES:
                # Parsing (or refusing) megabytes of JSON takes long: on a low-priority thread
                # (api.bulkwork) the loop keeps answering other clients.
                infer_request, binary_default = await dataplane.bulk_work.run(
                    codec.decode_infer_request, body, length, model_name, model_version
                )
            else:
                infer_request, binary_default = codec.decode_infer_request(
                    body, length, model_name, model_version
                )
            if dataplane.forwards_headers("HTTP"):
                dataplane.forward_headers("HTTP", infer_request, request.headers.items())
        except TritonError:
            # Like Triton, name an unknown (or decoupled) model before what is wrong with the
            # body. (On the good path the data plane's own look-up reports it.)
            dataplane.require_model(model_name, model_version, HTTP_ENDPOINT)
            raise
        response = await dataplane.infer(infer_request, received, endpoint=HTTP_ENDPOINT)
        header, buffers = codec.encode_infer_response_parts(response, infer_request, binary_default)
    except TritonError as err:
        return _error(err)
    except Exception as exc:  # a bug, not a client error: answer like Triton, keep the trace
        log.exception("inference request for model '%s' failed", model_name)
        return json_answer(codec.error_body(str(exc)), 500)
    finally:
        if inflated:
            dataplane.body_budget.give(inflated)
    return _traced(dataplane, infer_request, _respond(request, header, buffers))


# -- the generate extension ---------------------------------------------------------------------
async def _generate_request(
    request: Request, dataplane: DataPlane, model_name: str, model_version: str
) -> InferRequest:
    metadata = dataplane.model_metadata(model_name, model_version)  # an unknown model first
    encoding = request.headers.get("Content-Encoding")
    if encoding and encoding != "identity":
        raise UnsupportedError("Unsupported content-encoding, only 'identity' is supported.")
    body = await _read_body(request)
    return generate.decode_request(body, model_name, model_version, metadata)


async def generate_once(
    request: Request, dataplane: DataPlane, model_name: str, model_version: str
) -> Answer:
    """``generate``: the model's one response as a flat JSON object."""
    status = 200
    results: list[Result] = []
    try:
        infer_request = await _generate_request(request, dataplane, model_name, model_version)
        async for item in dataplane.stream(infer_request):
            if not results and isinstance(item.result, TritonError):
                status = generate.ERROR_RESPONSE_STATUS
            if item.result is not None:
                results.append(item.result)
    except TritonError as err:
        return _error(err)
    if len(results) != 1:
        # The status is the first response's, as in Triton.
        return json_answer(generate.error_body(generate.NOT_ONE_RESPONSE), status)
    (result,) = results
    if isinstance(result, TritonError):
        return json_answer(generate.error_body(result), generate.ERROR_RESPONSE_STATUS)
    return _traced(dataplane, infer_request, json_answer(generate.encode_response(result)))


async def generate_stream(
    request: Request, dataplane: DataPlane, model_name: str, model_version: str
) -> Answer:
    """``generate_stream``: each response as a Server-Sent Event, as it comes. The status is
    the first response's; a later error response is an event with an ``error`` member. (A
    request to a decoupled model on the core's lane whose body the core decodes never comes
    here: the connection hands it to the core whole, see corepath.) A decoupled model on the
    core's lane has its events written by the core, on the thread that reads its responses
    (``_core.EventWriter``), when the connection allows: the answer's head goes out with the
    first event, and the event loop hears only of the end (then writes the body's last
    chunk), or of a first response the writer declines."""
    writer = None
    try:
        infer_request = await _generate_request(request, dataplane, model_name, model_version)
        if request.out is not None and not dataplane.tracer.enabled:
            writer = infer_request.event_writer = EventWriter(request.out)
        items = dataplane.stream(infer_request)
        first = await anext(items)
        if writer is not None and writer.started:  # every event is out: this is the end
            stream = _events(items, done=first.final)
            answer = Answer(200, (), generate.EVENT_STREAM, stream=stream, written=True)
            return _traced(dataplane, infer_request, answer)
    except TritonError as err:
        return _error(err)
    status = generate.ERROR_RESPONSE_STATUS if isinstance(first.result, TritonError) else 200
    parts = [] if first.result is None else [generate.result_event(first.result)]
    answer = Answer(status, parts, generate.EVENT_STREAM, stream=_events(items, done=first.final))
    return _traced(dataplane, infer_request, answer)


async def _events(items: AsyncGenerator[Any, None], *, done: bool = False) -> AsyncIterator[bytes]:
    """The events of the responses still to come from ``items`` (none when ``done``);
    closing it cancels the request (the client went away)."""
    try:
        if not done:
            async for item in items:
                if item.result is not None:
                    yield generate.result_event(item.result)
    finally:
        await items.aclose()


def _traced(dataplane: DataPlane, infer_request: InferRequest, answer: Answer) -> Answer:
    """``answer``, finishing the request's trace once it is sent, when it is traced."""
    if infer_request.trace is None:
        return answer
    send_start = perf_counter_ns()

    def sent() -> None:
        dataplane.trace_sent(infer_request, "HTTP", send_start, perf_counter_ns())

    return answer._replace(sent=sent)


def _respond(request: Request, header: bytes, buffers: list[Any]) -> Answer:
    """The inference response: JSON, or JSON and binary outputs (compressed if asked). Large
    outputs go to the socket straight from the model's arrays."""
    if not buffers:
        content_type, extra = JSON, ""
    else:
        content_type, extra = _BINARY, f"{codec.HEADER_LENGTH}: {len(header)}\r\n"
    encoding = response_encoding(request.headers.get("Accept-Encoding"))
    if encoding is None:
        return Answer(200, [header, *buffers], content_type, extra)
    compressor = zlib.compressobj(6, zlib.DEFLATED, _COMPRESSORS[encoding])
    payload = compressor.compress(b"".join([header, *buffers])) + compressor.flush()
    return Answer(200, (payload,), content_type, f"{extra}Content-Encoding: {encoding}\r\n")


async def _read_body(request: Request) -> Body:
    """The whole request body in one writable buffer, filled as chunks arrive."""
    if request.body is not None:  # received straight into its buffer by the connection
        await request.body.done
        return request.body.buffer
    stream = request.content
    length = request.content_length
    if length is not None:
        if length > MAX_BODY_BYTES:
            raise InvalidArgumentError(f"request body of {length} bytes is too large")
        buf: Body = bytearray(length) if length < LARGE_BYTES else pooled_memory(length)
        view = memoryview(buf)
        filled = 0
        while filled < length:
            chunk, _ = await stream.readchunk()  # one received piece, never a joined copy
            if not chunk:
                break
            if not request.count_body(filled + len(chunk)):
                await _drop_rest(request, length)
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
        if not request.count_body(len(buf)):
            await _drop_rest(request, len(buf))
    return buf


async def _drop_rest(request: Request, size: int) -> NoReturn:
    """A body (of ``size`` bytes, or so far) past the server's body budget: read and drop the
    rest of it, so that the client, still sending, gets its answer rather than a reset
    connection; then refuse it with 503. A body without a length is dropped only up to the
    largest one accepted."""
    refusal = request.budget.refusal(size)
    request.release()
    dropped = 0
    while chunk := await request.content.readany():
        dropped += len(chunk)
        if dropped > MAX_BODY_BYTES:
            break
    raise refusal


def _inflate(body: Body, budget: BodyBudget) -> tuple[Body, int]:
    """A compressed body inflated, up to MAX_BODY_BYTES (a body that inflates past that is
    refused: a small bomb must not take gigabytes), and the bytes counted for it against the
    server's ``budget`` (given back by the caller once the request is done; a body that
    inflates past the budget is refused with 503). Runs on a worker thread (see
    :func:`_inflated`); each step runs in the Rust core without the GIL (zlib's own steps
    would take the GIL back thousands of times for a large body, each time stalling the loop)."""
    if not body:
        raise InvalidArgumentError("nothing to be decompressed")
    inflater = Inflater(np.frombuffer(body, np.uint8))
    counted = size = 0
    try:
        while inflater.state == "running":
            size = inflater.step(min(INFLATE_STEP_BYTES, MAX_BODY_BYTES + 1 - size))
            if size > MAX_BODY_BYTES:
                raise InvalidArgumentError(
                    f"decompressed request body is larger than {MAX_BODY_BYTES} bytes"
                )
            if size >= COUNTED_BYTES:
                if not budget.take(size - counted):
                    raise budget.refusal(size)
                counted = size
        if inflater.state == "corrupt":
            # Triton keeps what inflated before the error, which leaves unparsable JSON.
            budget.give(counted)
            return bytearray(), 0
        # Ended, or the input stopped early: what inflated is kept, as Triton does.
        return np.asarray(inflater.take()).data, counted
    except BaseException:
        budget.give(counted)
        raise


async def _inflated(body: Body, dataplane: DataPlane) -> tuple[Body, int]:
    """:func:`_inflate` on a low-priority thread (:mod:`tritonfast.api.bulkwork`; it
    inflates without the GIL: other clients go on). If the request is cancelled
    meanwhile (its client left), the thread still finishes, and what it counted against the
    budget is given back then."""
    budget = dataplane.body_budget
    inflating = asyncio.ensure_future(dataplane.bulk_work.run(_inflate, body, budget))
    try:
        return await asyncio.shield(inflating)
    except asyncio.CancelledError:
        inflating.add_done_callback(functools.partial(_give_back_inflated, budget))
        raise


def _give_back_inflated(budget: BodyBudget, inflating: asyncio.Future[tuple[Body, int]]) -> None:
    if not inflating.cancelled() and inflating.exception() is None:
        budget.give(inflating.result()[1])


# -- wiring -----------------------------------------------------------------------------------
Handler = Callable[[Request, "DataPlane", str, str], Awaitable[Answer]]
HANDLERS: dict[Endpoint, Handler] = {
    Endpoint.SERVER_METADATA: server_metadata,
    Endpoint.HEALTH_LIVE: health_live,
    Endpoint.HEALTH_READY: health_ready,
    Endpoint.MODEL_METADATA: model_metadata,
    Endpoint.MODEL_READY: model_ready,
    Endpoint.MODEL_CONFIG: model_config,
    Endpoint.MODEL_STATISTICS: model_statistics,
    Endpoint.INFER: infer,
    Endpoint.GENERATE: generate_once,
    Endpoint.GENERATE_STREAM: generate_stream,
    Endpoint.LOGGING: logging_settings,
    Endpoint.TRACE_SETTING: trace_setting,
    Endpoint.MODEL_TRACE_SETTING: trace_setting,
    Endpoint.REPOSITORY_INDEX: repository_index,
    Endpoint.REPOSITORY_LOAD: repository_load,
    Endpoint.REPOSITORY_UNLOAD: repository_unload,
    Endpoint.SYSTEM_SHM_STATUS: system_shm_status,
    Endpoint.SYSTEM_SHM_REGISTER: system_shm_register,
    Endpoint.SYSTEM_SHM_UNREGISTER: system_shm_unregister,
    Endpoint.CUDA_SHM_STATUS: cuda_shm_status,
    Endpoint.CUDA_SHM_REGISTER: cuda_shm_register,
    Endpoint.CUDA_SHM_UNREGISTER: cuda_shm_unregister,
}
_NOT_FOUND = json_answer(codec.error_body("Not Found"), 404)
_METHOD_NOT_ALLOWED = json_answer(codec.error_body("Method Not Allowed"), 405)


def dispatcher(
    dataplane: DataPlane, restrictions: Mapping[str, Restriction] | None = None
) -> Callable[[Request], Awaitable[Answer]]:
    """The one request handler of the server: resolve the path, check the method (and the
    header of a restricted API group), call."""
    guards = {
        group: (r, Answer(403, (codec.error_body(http_refusal(r)),), "text/plain"))
        for group, r in (restrictions or {}).items()
    }

    async def handle(request: Request) -> Answer:
        route = resolve(request.path)
        if route is None:
            return _NOT_FOUND
        endpoint = route.endpoint
        if not endpoint.allows(request.method):
            return _METHOD_NOT_ALLOWED
        if guards:
            guard = guards.get(endpoint.api_group)
            if guard is not None and request.headers.get(guard[0].key) != guard[0].value:
                return guard[1]  # as Triton answers (403, text/plain)
        return await HANDLERS[endpoint](request, dataplane, route.name, route.version)

    return handle


async def start_http_server(
    dataplane: DataPlane,
    host: str,
    port: int,
    restrictions: Mapping[str, Restriction] | None = None,
    tls: ssl.SSLContext | None = None,
) -> HttpServer:
    """Start serving on ``host:port`` (HTTPS with ``tls``); listening when this returns.
    Stop with ``close()``."""
    # Inference requests go to the core whole unless an API restriction must be checked
    # on them first.
    core_path = None
    if not restrictions or "inference" not in restrictions:
        core_path = CorePath(dataplane)
    server = HttpServer(
        dispatcher(dataplane, restrictions), dataplane.body_budget, core_path=core_path
    )
    await server.start(host, port, tls)
    return server
