"""The gRPC frontend: ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health``.

Every RPC decodes its request with :mod:`.codec`, calls one :class:`DataPlane` method, and
encodes the result; a :class:`~tritonfast.errors.TritonError` becomes the gRPC status that
Triton sends for its code (``codec.GRPC_STATUS``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast._proto import grpc_service_pb2_grpc as pb_grpc
from tritonfast._proto import health_pb2, health_pb2_grpc
from tritonfast.errors import InvalidArgumentError, TritonError, UnsupportedError
from tritonfast.frontends.grpc import codec, engine
from tritonfast.frontends.grpc.stream import StreamSession
from tritonfast.frontends.restricted import (
    GRPC_GROUPS,
    GRPC_HEADER_PREFIX,
    Restriction,
    grpc_refusal,
)
from tritonfast.memory.bodybudget import COUNTED_BYTES, BodyBudget

if TYPE_CHECKING:
    from tritonfast.api.dataplane import DataPlane
    from tritonfast.frontends.grpc.core import CoreServer

# No practical limit on message size: tensors of several hundred MiB must pass.
MAX_MESSAGE_BYTES = 2**31 - 1

SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Fail loudly if the port is taken rather than sharing it with another process.
    ("grpc.so_reuseport", 0),
]

# How Triton names this RPC when it refuses a decoupled model.
MODEL_INFER_ENDPOINT = "ModelInfer RPC"
MODEL_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
# What Triton answers while it stops (UNAVAILABLE), by method; the other calls are served.
_STOPPING_INFERENCE = (
    "[request id: <id_unknown>] Server is stopping, scheduler for model has stopped accepting"
    " new inference requests"
)
DRAINING_REFUSALS = {
    MODEL_INFER_PATH: _STOPPING_INFERENCE,
    "/inference.GRPCInferenceService/ModelStreamInfer": _STOPPING_INFERENCE,
    "/inference.GRPCInferenceService/ServerLive": "Server exiting",
    "/inference.GRPCInferenceService/ServerReady": "Server exiting",
}

Request = TypeVar("Request")
Reply = TypeVar("Reply")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Reply]]


def _triton_errors(method: Handler[Request, Reply]) -> Handler[Request, Reply]:
    """Answer a TritonError raised by ``method`` with its gRPC status and message."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Reply:
        try:
            return await method(self, request, context)
        except TritonError as error:
            await context.abort(codec.grpc_status(error), error.message)
            raise AssertionError("unreachable: abort() raises") from error

    return wrapper


def _not_implemented(rpc: str) -> Callable[..., Awaitable[Any]]:
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f"the {rpc} RPC is not implemented by tritonfast yet"
        )

    handler.__name__ = rpc
    return handler


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    # -- health -------------------------------------------------------------------------------
    @_triton_errors
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    @_triton_errors
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    @_triton_errors
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(
            ready=self._dataplane.model_ready(request.name, request.version)
        )

    # -- metadata and configuration -------------------------------------------------------------
    @_triton_errors
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return codec.encode_server_metadata(self._dataplane.server_metadata())

    @_triton_errors
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        metadata = self._dataplane.model_metadata(request.name, request.version)
        return codec.encode_model_metadata(metadata)

    @_triton_errors
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        reply = pb.ModelConfigResponse()
        reply.config.CopyFrom(self._dataplane.model_config(request.name, request.version))
        return reply

    # -- statistics -----------------------------------------------------------------------------
    @_triton_errors
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        stats = self._dataplane.model_statistics(request.name, request.version)
        return codec.encode_statistics(stats)

    # -- trace settings -------------------------------------------------------------------------
    @_triton_errors
    async def TraceSetting(
        self, request: pb.TraceSettingRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceSettingResponse:
        model = request.model_name
        if request.settings:
            changes = codec.decode_trace_settings(request.settings)
            settings = self._dataplane.update_trace_settings(changes, model)
        else:
            settings = self._dataplane.trace_settings(model)
        return codec.encode_trace_settings(settings)

    # -- logging --------------------------------------------------------------------------------
    @_triton_errors
    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.LogSettingsResponse:
        changes = codec.decode_log_settings(request.settings)
        settings = (
            self._dataplane.update_log_settings(changes)
            if changes
            else self._dataplane.log_settings()
        )
        return codec.encode_log_settings(settings)

    # -- the model repository -------------------------------------------------------------------
    @_triton_errors
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            raise UnsupportedError("'repository_name' specification is not supported")
        rows = self._dataplane.repository_index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows]
        )

    @_triton_errors
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        parameters = codec.decode_load_parameters(request.parameters)
        await self._dataplane.load_model(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    @_triton_errors
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        dependents = codec.decode_unload_dependents(request.parameters)
        await self._dataplane.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory --------------------------------------------------------------------------
    @_triton_errors
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryStatusResponse:
        reply = pb.SystemSharedMemoryStatusResponse()
        for region in self._dataplane.system_shared_memory_status(request.name):
            reply.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return reply

    @_triton_errors
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._dataplane.register_system_shared_memory(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_triton_errors
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._dataplane.unregister_system_shared_memory(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_triton_errors
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryStatusResponse:
        reply = pb.CudaSharedMemoryStatusResponse()
        for region in self._dataplane.cuda_shared_memory_status(request.name):
            reply.regions[region["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return reply

    @_triton_errors
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self._dataplane.register_cuda_shared_memory(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @_triton_errors
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._dataplane.unregister_cuda_shared_memory(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- inference ------------------------------------------------------------------------------
    @_triton_errors
    async def ModelInfer(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Registered without (de)serializers: tensors stay out of protobuf (see codec)."""
        received = None
        if self._dataplane.tracer.enabled:  # the message was read before we were called
            now = perf_counter_ns()
            received = ("GRPC", now, now)
        request, raw_inputs = codec.parse_infer_request(data)
        try:
            infer_request = codec.decode_infer_request(request, raw_inputs)
        except InvalidArgumentError:
            # Triton looks the model up before it examines the tensors: an unknown model, or
            # a decoupled one, is reported as such even when the request is malformed too.
            self._dataplane.require_model(
                request.model_name, request.model_version, MODEL_INFER_ENDPOINT
            )
            raise
        if self._dataplane.forwards_headers("GRPC"):
            self._dataplane.forward_headers(
                "GRPC", infer_request, context.invocation_metadata() or ()
            )
        response = await self._dataplane.infer(
            infer_request, received, endpoint=MODEL_INFER_ENDPOINT
        )
        requested = [o.name for o in request.outputs] if request.outputs else None
        if infer_request.trace is None:
            return codec.serialize_infer_response(response, requested, request.id)
        send_start = perf_counter_ns()
        reply = codec.serialize_infer_response(response, requested, request.id)
        self._dataplane.trace_sent(infer_request, "GRPC", send_start, perf_counter_ns())
        return reply

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request's responses as they come (see :mod:`.stream`)."""
        # (The core engine's context has the call's writer; grpc.aio's has none.)
        session = StreamSession(self._dataplane, request_iterator, getattr(context, "writer", None))
        # The call may end while its engine waits to write a reply, outside the generators:
        # its done callback is what cancels the requests still running then.
        context.add_done_callback(lambda _: session.cancel())
        replies = session.replies()
        assert isinstance(replies, AsyncGenerator)
        try:
            async for reply in replies:
                yield reply
        finally:
            await replies.aclose()


class HealthServicer(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health/Check`` answers SERVING while the server is ready (as Triton)."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = health_pb2.HealthCheckResponse
        return status(status=status.SERVING if self._dataplane.ready() else status.NOT_SERVING)

    Watch = _not_implemented("Health/Watch")


class _HandlerCapture:
    """Stands in for a server to collect the generated code's method handlers."""

    handlers: dict[str, grpc.RpcMethodHandler]

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.service = service
        self.handlers = dict(handlers)


def _guarded(handler: grpc.RpcMethodHandler, restriction: Restriction) -> grpc.RpcMethodHandler:
    """``handler`` answering only calls whose metadata carries the restriction's header (as
    Triton's --grpc-restricted-protocol, UNAVAILABLE otherwise)."""
    key = GRPC_HEADER_PREFIX + restriction.key
    message = grpc_refusal(restriction)

    async def refuse_unless_allowed(context: grpc.aio.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata() or ())
        if metadata.get(key) != restriction.value:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    if handler.stream_stream is not None:
        streaming = handler.stream_stream

        async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await refuse_unless_allowed(context)
            async for reply in streaming(requests, context):
                yield reply

        return handler._replace(stream_stream=stream_stream)
    unary = handler.unary_unary

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse_unless_allowed(context)
        return await unary(request, context)

    return handler._replace(unary_unary=unary_unary)


def _budgeted(handler: grpc.RpcMethodHandler, budget: BodyBudget) -> grpc.RpcMethodHandler:
    """(grpc.aio) ``handler`` (ModelInfer's) counting a large message against the server's
    body budget while its request runs, UNAVAILABLE past it, as the core engine does when a
    message arrives (:mod:`.core`). Streams count their messages themselves (:mod:`.stream`)."""
    unary = handler.unary_unary

    async def unary_unary(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        size = len(data)
        if size < COUNTED_BYTES:
            return await unary(data, context)
        if not budget.take(size):
            await context.abort(grpc.StatusCode.UNAVAILABLE, budget.refusal(size).message)
        try:
            return await unary(data, context)
        finally:
            budget.give(size)

    return handler._replace(unary_unary=unary_unary)


def _stream_reply_bytes(reply: pb.ModelStreamInferResponse | bytes) -> bytes:
    """A stream's reply as sent: serialized here, or already by the core."""
    return reply if type(reply) is bytes else reply.SerializeToString()  # type: ignore[union-attr]


def _method_handlers(
    dataplane: DataPlane, restrictions: Mapping[str, Restriction] | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """Path -> handler of both services, from the generated code, except that ModelInfer
    takes and returns raw bytes; a restricted group's methods are guarded."""
    servicer = InferenceServicer(dataplane)
    inference = _HandlerCapture()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, inference)
    inference.handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(servicer.ModelInfer)
    # The stream reads raw messages: one that does not parse fails alone (see .stream).
    inference.handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        servicer.ModelStreamInfer,
        response_serializer=_stream_reply_bytes,
    )
    health = _HandlerCapture()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(dataplane), health)
    handlers = {}
    for capture in (inference, health):
        for name, handler in capture.handlers.items():
            restriction = (restrictions or {}).get(GRPC_GROUPS.get(name, ""))
            if restriction is not None:
                handler = _guarded(handler, restriction)
            handlers[f"/{capture.service}/{name}"] = handler
    return handlers


def _address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{host}:{port}"


async def start_grpc_server(
    dataplane: DataPlane,
    host: str,
    port: int,
    engine_name: str = "core",
    restrictions: Mapping[str, Restriction] | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> CoreServer | grpc.aio.Server:
    """Start serving both services on ``host:port``; returns once it is listening.

    ``engine``: ``core`` (:mod:`.core`, the default; grpc.aio when the installed grpcio cannot
    run it, see :mod:`.engine`) or ``aio`` (grpc.aio). With ``credentials``, over TLS. Stop
    the server with ``await server.stop(grace)``.
    """
    handlers = _method_handlers(dataplane, restrictions)
    server: CoreServer | grpc.aio.Server
    if engine.choose(engine_name) == "aio":
        handlers[MODEL_INFER_PATH] = _budgeted(handlers[MODEL_INFER_PATH], dataplane.body_budget)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        server.add_generic_rpc_handlers((_PathHandler(handlers),))
    else:
        from tritonfast.frontends.grpc.core import CoreServer, Method
        from tritonfast.frontends.grpc.corepath import GrpcCorePath

        methods = {path: Method.of(handler) for path, handler in handlers.items()}
        # ModelInfer calls go to the core whole unless an API restriction must be checked
        # on them first.
        if not restrictions or GRPC_GROUPS.get("ModelInfer", "") not in restrictions:
            methods[MODEL_INFER_PATH] = dataclasses.replace(
                methods[MODEL_INFER_PATH], whole=GrpcCorePath(dataplane)
            )
        server = CoreServer(
            asyncio.get_running_loop(),
            methods,
            SERVER_OPTIONS,
            dataplane.body_budget,
            DRAINING_REFUSALS,
        )
    address = _address(host, port)
    try:
        if credentials is not None:
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as error:
        raise OSError(f"gRPC server cannot listen on {address}: {error}") from error
    if bound == 0:
        raise OSError(f"gRPC server cannot listen on {address}")
    if isinstance(server, grpc.aio.Server):
        await server.start()
    else:
        server.start()
    return server


class _PathHandler(grpc.GenericRpcHandler):
    """grpc.aio's lookup of a method handler by its path."""

    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._handlers = handlers

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(details.method)  # type: ignore[attr-defined]


def tls_credentials(cert: str, key: str, root: str, mutual: bool) -> grpc.ServerCredentials:
    """Triton's --grpc-use-ssl(-mutual) credentials from PEM files: the server's certificate
    and key, and (mutual) the root certificate client certificates must be signed by."""
    try:
        chain = [(Path(key).read_bytes(), Path(cert).read_bytes())]
        roots = Path(root).read_bytes() if root else None
    except OSError as error:
        raise InvalidArgumentError(f"cannot read a gRPC TLS file: {error}") from None
    if mutual and roots is None:
        raise InvalidArgumentError("--grpc-use-ssl-mutual needs --grpc-root-cert")
    return grpc.ssl_server_credentials(chain, root_certificates=roots, require_client_auth=mutual)
