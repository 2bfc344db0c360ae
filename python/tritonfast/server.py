"""Start-up and shutdown: load the repository, start the frontends, stop on a signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tritonfast import __version__, preflight
from tritonfast.api.dataplane import DataPlane
from tritonfast.api.serverhandle import ServerHandle
from tritonfast.backends.registry import BackendSettings
from tritonfast.cli import ServeOptions
from tritonfast.errors import InvalidArgumentError, TritonError
from tritonfast.frontends import restricted
from tritonfast.logsettings import LogSettings, ServerLog
from tritonfast.memory import leftovers, memtrim
from tritonfast.memory.allocator import keep_large_buffers
from tritonfast.memory.bodybudget import BodyBudget
from tritonfast.metrics import MetricsConfig, parse_metrics_config
from tritonfast.repository.control import POLL, ModelControl
from tritonfast.repository.manager import READY, ModelEntry, ModelRepository
from tritonfast.runtime import handle
from tritonfast.runtime.cache import ResponseCache, parse_cache_config
from tritonfast.tracing import Tracer, parse_trace_config

log = logging.getLogger("tritonfast")


def server_log(options: ServeOptions) -> ServerLog:
    """The log as the command line sets it up (changeable later by the logging extension)."""
    return ServerLog(
        LogSettings(
            log_file=options.log_file,
            log_info=options.log_info,
            log_warning=options.log_warning,
            log_error=options.log_error,
            log_verbose_level=max(options.log_verbose, 0),
            log_format=options.log_format,
        )
    )


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Rows in tritonserver's boxed layout."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(row: tuple[str, ...]) -> str:
        return "|" + "|".join(f" {cell:<{w}} " for cell, w in zip(row, widths, strict=True)) + "|"

    return "\n".join([line, fmt(header), line, *(fmt(r) for r in rows), line])


def options_table(options: ServeOptions, settings: _Settings) -> str:
    """What the server runs with, printed before any model loads (as tritonserver prints its
    options): the repositories, how models load and run, the cache and the endpoints."""
    from tritonfast.backends.python.process import DEFAULT_MODE, MODE_SETTING

    rows = [("server_id", options.server_id), ("server_version", __version__)]
    rows += [
        (f"model_repository_path[{index}]", str(path))
        for index, path in enumerate(options.model_repositories)
    ]
    python_mode = settings.backends.for_backend("python").get(MODE_SETTING, DEFAULT_MODE)
    rows += [
        ("model_control_mode", f"MODE_{options.model_control_mode.upper()}"),
        ("strict_model_config", str(int(options.strict_model_config))),
        ("strict_readiness", str(int(options.strict_readiness))),
        ("exit_timeout", str(options.exit_timeout_secs)),
        ("python_instance_mode", python_mode),
        ("cache_enabled", str(int(bool(settings.cache_size)))),
    ]
    allowed = {e.service: f"{e.address}:{e.port}" for e in options.endpoints()}
    for service in ("HTTP", "gRPC", "metrics"):
        rows.append((f"{service.lower()}_endpoint", allowed.get(service, "off")))
    return table(("Option", "Value"), rows)


def model_table(entries: list[ModelEntry]) -> str:
    """The start-up table of models, in tritonserver's layout: a row per version (those that
    failed too), its status on one line (the first of a multi-line error, such as a Python
    traceback; the log holds all of it)."""
    rows = []
    for entry in entries:
        versions: list[int | None] = [*sorted(entry.versions or entry.listed_versions)] or [None]
        reason = entry.reason.strip().splitlines()[0] if entry.reason.strip() else ""
        status = f"{entry.state}: {reason}" if reason else entry.state
        for version in versions:
            rows.append((entry.name, "" if version is None else str(version), status))
    return table(("Model", "Version", "Status"), rows)


class Lifecycle(Protocol):
    """How a server run from a program (tritonfast.inprocess) is told to stop and tells when
    it is ready; a server run from the command line stops on SIGINT/SIGTERM instead."""

    # Objects the program bound for its models, by the key their configs name (Backend.bound).
    bound: Mapping[str, object]

    def started(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None: ...
    def ready(self, control: ModelControl) -> None: ...


async def serve(
    options: ServeOptions, server_log: ServerLog | None = None, lifecycle: Lifecycle | None = None
) -> int:
    loop = asyncio.get_running_loop()
    stop_event = _stop_event(loop, lifecycle)
    _announce(options)
    try:
        settings = _Settings.of(options)
        preflight.check(options)
    except TritonError as exc:
        log.error("%s", exc.message)
        return 1
    print(options_table(options, settings), flush=True)
    # Segments and temporary directories of servers that were killed before they could.
    await asyncio.to_thread(leftovers.sweep)
    control, dataplane = _build(
        options, settings, loop, server_log, lifecycle.bound if lifecycle else None
    )
    repository = control.repository
    # Models may call the server (BLS) from their first request, even from initialize().
    server = ServerHandle(dataplane, loop)
    repository.server = server
    handle.install(server)
    try:
        return await _serve_models(options, lifecycle, stop_event, control, dataplane, settings)
    finally:
        handle.uninstall(server)


async def _serve_models(
    options: ServeOptions,
    lifecycle: Lifecycle | None,
    stop_event: asyncio.Event,
    control: ModelControl,
    dataplane: DataPlane,
    settings: _Settings,
) -> int:
    """Load the models, start the frontends, serve until stopped, and stop; the exit code."""
    repository = control.repository
    if not await _load_models(options, control):
        await asyncio.to_thread(repository.stop, options.exit_timeout_secs)
        return 1
    stoppers: list[Any] = []
    try:
        await _start_frontends(options, settings, dataplane, stoppers)
    except (TritonError, OSError) as exc:
        log.error("failed to start a frontend: %s", getattr(exc, "message", exc))
        await _stop(stoppers, repository, options)
        return 1
    # Everything made while starting (modules, protobuf descriptors, models) lives as long as
    # the server: out of the collector's sight, a full collection under load takes a few ms
    # instead of ~30, and no longer stalls the event loop long enough to look like a slow model.
    gc.collect()
    gc.freeze()
    if dataplane.ready():
        print(f"tritonfast {__version__} ready", flush=True)
    else:  # --exit-on-error=false with models that failed, or --strict-readiness
        print(
            f"tritonfast {__version__} serving, but not ready: not every model loaded (see the"
            " table above); /v2/health/ready answers 400 until they do",
            flush=True,
        )
    if lifecycle is not None:
        lifecycle.ready(control)
    poller = asyncio.ensure_future(control.poll_forever()) if control.mode == POLL else None

    await stop_event.wait()
    log.info("shutting down")
    if poller is not None:
        poller.cancel()
    dataplane.shutting_down()
    await control.drain()  # a load or unload in progress finishes before models stop
    await _stop(stoppers, repository, options)
    dataplane.bulk_work.close()
    control.remove_uploads()
    settings.tracer.flush()
    return 0


def _stop_event(loop: asyncio.AbstractEventLoop, lifecycle: Lifecycle | None) -> asyncio.Event:
    """What stops the server: SIGINT and SIGTERM, or the embedding program's lifecycle. Set up
    first: a signal that arrives while models load or frontends start still means a clean
    shutdown (exit 0) once start-up is done, never the default kill."""
    stop_event = asyncio.Event()
    if lifecycle is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop_event.set)
    else:
        lifecycle.started(loop, stop_event)
    return stop_event


def _announce(options: ServeOptions) -> None:
    """What the command line means that the user should know before anything loads."""
    if options.using_example_repository:
        endpoints = ", ".join(f"{e.service} on {e.address}:{e.port}" for e in options.endpoints())
        print(
            f"No --model-repository given: serving the bundled example repository"
            f" {options.model_repositories[0]} ({endpoints}; `tritonfast serve --help` lists"
            " the options)",
            flush=True,
        )
    for flag in options.ignored_flags:
        log.warning("%s has no effect in tritonfast (it tunes Triton's C++ internals)", flag)


@dataclass(frozen=True)
class _Settings:
    """The options that need parsing, parsed (a TritonError for one that does not parse)."""

    metrics: MetricsConfig
    tracer: Tracer
    cache_size: int | None
    backends: BackendSettings
    http_restrictions: dict[str, restricted.Restriction]
    grpc_restrictions: dict[str, restricted.Restriction]

    @classmethod
    def of(cls, options: ServeOptions) -> _Settings:
        cache_size = parse_cache_config(options.cache_config)
        if cache_size is None and options.response_cache_byte_size:
            cache_size = options.response_cache_byte_size
        return cls(
            metrics=parse_metrics_config(options.metrics_config),
            tracer=Tracer(parse_trace_config(options.trace_config)),
            cache_size=cache_size,
            backends=BackendSettings(options.backend_config),
            http_restrictions=restricted.parse(
                options.http_restricted_api, "--http-restricted-api"
            ),
            grpc_restrictions=restricted.parse(
                options.grpc_restricted_protocol, "--grpc-restricted-protocol"
            ),
        )


def _build(
    options: ServeOptions,
    settings: _Settings,
    loop: asyncio.AbstractEventLoop,
    server_log: ServerLog | None,
    bound: Mapping[str, object] | None,
) -> tuple[ModelControl, DataPlane]:
    """The repository, its model control and the data plane over them."""
    repository = ModelRepository(
        options.model_repositories,
        loop,
        strict_config=options.strict_model_config,
        latency_summaries=settings.metrics.summary_latencies,
        histogram_latencies=settings.metrics.histogram_latencies,
        response_cache=None if not settings.cache_size else ResponseCache(settings.cache_size),
        backend_settings=settings.backends,
        bound=bound,
    )
    control = ModelControl(
        repository,
        options.model_control_mode,
        load_models=options.load_model,
        poll_secs=options.repository_poll_secs,
        exit_timeout=options.exit_timeout_secs,
    )
    dataplane = DataPlane(
        control,
        server_id=options.server_id,
        strict_readiness=options.strict_readiness,
        server_log=server_log,
        tracer=settings.tracer,
        http_header_forward_pattern=options.http_header_forward_pattern,
        grpc_header_forward_pattern=options.grpc_header_forward_pattern,
        body_budget=BodyBudget(options.request_body_budget_bytes),
    )
    return control, dataplane


async def _load_models(options: ServeOptions, control: ModelControl) -> bool:
    """Load the start-up models and print their table; False when the server must not start
    (the repository cannot be read, or a model failed with --exit-on-error)."""
    try:
        entries = await asyncio.to_thread(control.startup)
    except Exception as exc:
        log.error("failed to load the model repository: %s", exc)
        return False
    entries = [e for e in entries if not e.missing_step]  # its ensemble's row says why
    print(model_table(entries), flush=True)
    failed = [e for e in entries if e.state != READY]
    if failed and options.exit_on_error:
        log.error(
            "exiting: %d model(s) failed to load (use --exit-on-error=false to serve the rest)",
            len(failed),
        )
        return False
    return True


async def _start_frontends(
    options: ServeOptions, settings: _Settings, dataplane: DataPlane, stoppers: list[Any]
) -> None:
    """Start every frontend the options allow; each adds what stops it to ``stoppers``."""
    memtrim.start()
    if options.allow_grpc:
        await _start_grpc(options, settings, dataplane, stoppers)
    if options.allow_http:
        await _start_http(options, settings, dataplane, stoppers)
    allow_vertex_ai = options.allow_vertex_ai
    if allow_vertex_ai is None:
        allow_vertex_ai = os.environ.get("AIP_MODE") == "PREDICTION"
    if allow_vertex_ai:
        await _start_vertex_ai(options, dataplane, stoppers)
    if options.allow_metrics:
        await _start_metrics(options, settings, dataplane, stoppers)
    if options.dynamo:
        await _start_dynamo(options, dataplane, stoppers)
    if options.dynamo_route:
        await _start_dynamo_route(options, dataplane, stoppers)


async def _start_dynamo_route(
    options: ServeOptions, dataplane: DataPlane, stoppers: list[Any]
) -> None:
    from tritonfast.frontends.dynamo.route import DynamoRoute

    [repository] = options.model_repositories  # the route's own, empty one (cli._as_route)
    route = DynamoRoute(dataplane, repository, options.dynamo_namespace, options.server_id)
    await route.start()
    stoppers.append(route.stop)


async def _start_dynamo(options: ServeOptions, dataplane: DataPlane, stoppers: list[Any]) -> None:
    from tritonfast.frontends.dynamo.worker import DynamoWorker

    worker = DynamoWorker(dataplane, options.dynamo_namespace, options.server_id)
    dataplane.watch_models(worker.changed)
    await worker.start()
    stoppers.append(worker.stop)


async def _start_grpc(
    options: ServeOptions, settings: _Settings, dataplane: DataPlane, stoppers: list[Any]
) -> None:
    from tritonfast.frontends.grpc.servicer import start_grpc_server, tls_credentials

    credentials = None
    if options.grpc_use_ssl or options.grpc_use_ssl_mutual:
        credentials = tls_credentials(
            options.grpc_server_cert,
            options.grpc_server_key,
            options.grpc_root_cert,
            options.grpc_use_ssl_mutual,
        )
    grpc_server = await start_grpc_server(
        dataplane,
        options.grpc_address,
        options.grpc_port,
        options.grpc_engine,
        settings.grpc_restrictions,
        credentials,
    )
    stoppers.append(lambda: grpc_server.stop(options.exit_timeout_secs))
    over = " (TLS)" if credentials is not None else ""
    print(
        f"Started GRPCInferenceService at {options.grpc_address}:{options.grpc_port}{over}",
        flush=True,
    )


async def _start_http(
    options: ServeOptions, settings: _Settings, dataplane: DataPlane, stoppers: list[Any]
) -> None:
    from tritonfast.frontends.http.app import start_http_server

    tls = None
    if options.http_tls_cert or options.http_tls_key:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            tls.load_cert_chain(options.http_tls_cert, options.http_tls_key or None)
        except (OSError, ssl.SSLError) as error:
            raise InvalidArgumentError(
                f"cannot use --http-tls-cert '{options.http_tls_cert}': {error}"
            ) from None
    http_server = await start_http_server(
        dataplane, options.http_address, options.http_port, settings.http_restrictions, tls
    )
    stoppers.append(http_server.close)
    over = " (HTTPS)" if tls is not None else ""
    print(f"Started HTTPService at {options.http_address}:{options.http_port}{over}", flush=True)


async def _start_vertex_ai(
    options: ServeOptions, dataplane: DataPlane, stoppers: list[Any]
) -> None:
    from tritonfast.frontends.http import vertexai

    port = options.vertex_ai_port or vertexai.default_port()
    vertex_server, model = await vertexai.start_vertex_server(
        dataplane, options.http_address, port, options.vertex_ai_default_model
    )
    stoppers.append(vertex_server.close)
    print(
        f"Started Vertex AI HTTPService at {options.http_address}:{port} (default model '{model}')",
        flush=True,
    )


async def _start_metrics(
    options: ServeOptions, settings: _Settings, dataplane: DataPlane, stoppers: list[Any]
) -> None:
    from tritonfast.metrics import metrics_registry, start_metrics_server

    registry = metrics_registry(
        dataplane.repository,
        dataplane.custom_metrics,
        cpu=options.allow_cpu_metrics,
        gpu=options.allow_gpu_metrics,
        config=settings.metrics,
    )
    metrics_runner = await start_metrics_server(
        registry, options.metrics_address, options.metrics_port
    )
    stoppers.append(metrics_runner.cleanup)
    print(
        f"Started Metrics Service at {options.metrics_address}:{options.metrics_port}",
        flush=True,
    )


async def _stop(stoppers: list[Any], repository: ModelRepository, options: ServeOptions) -> None:

    async def stop_one(stop: Any) -> None:
        try:
            await asyncio.wait_for(stop(), timeout=options.exit_timeout_secs)
        except asyncio.TimeoutError:  # a hung model: one clear line, not a traceback
            log.warning(
                "requests were still running when the exit timeout (%d s) ran out; their"
                " connections are closed",
                options.exit_timeout_secs,
            )
        except Exception:
            log.exception("error while stopping a frontend")

    # All frontends drain at once: none goes on taking work while another finishes its own.
    # Then the models get what is left of the same exit timeout, not a timeout of their own.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.exit_timeout_secs
    await asyncio.gather(*(stop_one(stop) for stop in stoppers))
    await asyncio.to_thread(repository.stop, max(0.0, deadline - loop.time()))


def run(options: ServeOptions, lifecycle: Lifecycle | None = None) -> int:
    try:
        log_ = server_log(options)
    except OSError as exc:
        print(f"error: cannot open the log file: {exc}", file=sys.stderr)
        return 1
    keep_large_buffers()
    _allow_more_descriptors()
    if options.allow_grpc:
        # Before the models load: a model.py that imports grpc would otherwise start grpcio first.
        from tritonfast.frontends.grpc.transport import start_grpcio

        log.debug("grpcio started (connections: %s)", start_grpcio())
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # uvloop is optional (e.g. Windows)
        runner = asyncio.run
    try:
        return int(runner(serve(options, log_, lifecycle)))
    finally:
        log_.close()


def _allow_more_descriptors() -> None:
    """Raise the soft limit on open descriptors to the hard one: each HTTP connection holds
    two (its socket, and the duplicate the core's writer thread sends through), and the
    usual soft limit of 1024 would otherwise cap clients at about 500."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError):  # a system that refuses: keep what we have
        log.debug("cannot raise the open-descriptor limit", exc_info=True)
