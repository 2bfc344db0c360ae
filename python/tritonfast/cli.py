"""Command line: ``tritonfast serve`` with ``tritonserver``'s flags where they apply, and
``tritonfast selfcheck``."""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonfast import __version__

EXAMPLE_REPOSITORY = Path(__file__).parent / "examples" / "models"

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


# tritonserver flags that tune Triton's C++ internals (memory pools, thread counts, backend
# and agent directories, response cache, rate limiter): accepted so that existing launch
# commands work unchanged, reported at start-up, and otherwise without effect here.
IGNORED_FLAGS = (
    "--backend-directory",
    "--repoagent-directory",
    "--pinned-memory-pool-byte-size",
    "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size",
    "--min-supported-compute-capability",
    "--buffer-manager-thread-count",
    "--model-load-thread-count",
    "--model-load-retry-count",
    "--model-namespacing",
    "--http-thread-count",
    "--grpc-infer-allocation-pool-size",
    "--grpc-keepalive-time",
    "--grpc-keepalive-timeout",
    "--metrics-interval-ms",
    "--rate-limit",
    "--rate-limit-resource",
    "--cache-directory",
    "--host-policy",
    "--vertex-ai-thread-count",
)


class _Ignored(argparse.Action):
    """Collects an ignored tritonserver flag with its value."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: str | None = None) -> None:
        namespace.ignored_flags = [*namespace.ignored_flags, f"{option}={values}"]


def _flag_bool(text: str) -> bool:
    """tritonserver spells booleans ``--flag=true|false`` (and 1/0)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


@dataclass
class ServeOptions:
    model_repositories: list[Path] = field(default_factory=list)
    using_example_repository: bool = False
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    http_address: str = "0.0.0.0"
    grpc_address: str = "0.0.0.0"
    grpc_engine: str = "core"
    metrics_address: str = "0.0.0.0"
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_config: list[str] = field(default_factory=list)
    cache_config: list[str] = field(default_factory=list)
    response_cache_byte_size: int | None = None
    strict_model_config: bool = False
    model_control_mode: str = "none"
    load_model: list[str] = field(default_factory=list)
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: int = 30
    log_verbose: int = 0
    log_format: str = "default"
    trace_config: list[str] = field(default_factory=list)
    backend_config: list[str] = field(default_factory=list)
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    http_restricted_api: list[str] = field(default_factory=list)
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    http_tls_cert: str = ""
    http_tls_key: str = ""
    request_body_budget_bytes: int = 1 << 32
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    # Vertex AI (None: from the environment, as Triton decides: AIP_MODE, AIP_HTTP_PORT)
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_default_model: str = ""
    dynamo: bool = False
    dynamo_route: bool = False
    dynamo_namespace: str = "tritonfast"
    ignored_flags: list[str] = field(default_factory=list)
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    server_id: str = "triton"

    def endpoints(self) -> list[Endpoint]:
        """The endpoints the server listens on: HTTP, gRPC and metrics, those allowed."""
        every = (
            (self.allow_http, Endpoint("HTTP", self.http_address, self.http_port, "--http-port")),
            (self.allow_grpc, Endpoint("gRPC", self.grpc_address, self.grpc_port, "--grpc-port")),
            (
                self.allow_metrics,
                Endpoint("metrics", self.metrics_address, self.metrics_port, "--metrics-port"),
            ),
        )
        return [endpoint for allowed, endpoint in every if allowed]


@dataclass(frozen=True)
class Endpoint:
    """One listening endpoint of the server, as the command line sets it."""

    service: str  # "HTTP", "gRPC" or "metrics"
    address: str
    port: int
    flag: str  # the flag that sets its port


class _HelpFormatter(argparse.HelpFormatter):
    """Each flag's help ends with its default, when it has one worth showing and the help
    does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            text
            and "default" not in text
            and default not in (None, "", [], argparse.SUPPRESS)
            and action.option_strings
        ):
            shown = str(default).lower() if isinstance(default, bool) else "%(default)s"
            text += f" (default: {shown})"
        return text


SELFCHECKS = ("tensorrt",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonfast",
        description="A Triton-compatible inference server. Flags follow tritonserver's;"
        " `tritonfast serve --help` lists them.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tritonfast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="serve a model repository over HTTP and gRPC (the command when none is given)",
        description="Serve a model repository over HTTP, gRPC and a metrics endpoint."
        " Flags follow tritonserver's.",
        formatter_class=_HelpFormatter,
    )
    serve.add_argument("--version", action="version", version=f"tritonfast {__version__}")
    # (`perf` takes perf_analyzer's flags and is dispatched before this parser: listed for help.)
    sub.add_parser(
        "perf",
        help="measure a server (tritonfast or Triton) under load, with perf_analyzer's flags and"
        " report: `tritonfast perf --help`",
        add_help=False,
    )
    selfcheck = sub.add_parser(
        "selfcheck",
        help="check that an optional backend works where the server runs (tensorrt: needs a GPU)",
        description="Build a small model for the backend, serve it and check its answers.",
    )
    selfcheck.add_argument("backend", choices=SELFCHECKS)
    for add_flags in (
        _repositories_and_models,
        _endpoints,
        _cache_and_metrics,
        _backends_and_headers,
        _security,
        _vertex_ai,
        _dynamo,
        _lifecycle_and_logging,
    ):
        add_flags(serve)
    ignored = serve.add_argument_group(
        "tritonserver flags accepted without effect (tuning of Triton's C++ internals)"
    )
    for flag in IGNORED_FLAGS:
        ignored.add_argument(flag, action=_Ignored, dest="ignored_flags", metavar="VALUE")
    serve.set_defaults(ignored_flags=[])
    return parser


# Boolean flags take tritonserver's spellings (true/false/1/0/...), or nothing for true.
_BOOL: dict[str, Any] = {"type": _flag_bool, "nargs": "?", "const": True, "metavar": "BOOL"}


def _repositories_and_models(serve: argparse.ArgumentParser) -> None:
    """Where the models are, and how they load."""
    group = serve.add_argument_group("models")
    group.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repositories",
        action="append",
        type=Path,
        metavar="PATH",
        help="model repository path (repeatable); default: the bundled example repository",
    )
    group.add_argument(
        "--strict-model-config",
        default=False,
        help="require a complete config.pbtxt (no auto-complete)",
        **_BOOL,
    )
    group.add_argument(
        "--disable-auto-complete-config",
        dest="strict_model_config",
        action="store_true",
        help="same as --strict-model-config=true",
    )
    group.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        default="none",
        help="none: load everything at start-up; explicit: the repository API loads and"
        " unloads; poll: reload what changes on disk",
    )
    group.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-control-mode=explicit: load this model at start-up (repeatable;"
        " '*' loads all)",
    )
    group.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="with --model-control-mode=poll: how often the repository is scanned for changes",
    )
    group.add_argument(
        "--strict-readiness",
        default=True,
        help="ready only while every model meant to serve is ready (default true)",
        **_BOOL,
    )
    group.add_argument(
        "--exit-on-error",
        default=True,
        help="refuse to start when a model fails to load (default true)",
        **_BOOL,
    )


def _endpoints(serve: argparse.ArgumentParser) -> None:
    """The HTTP, gRPC and metrics endpoints."""
    group = serve.add_argument_group("endpoints")
    for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        service = "HTTP" if name == "http" else "gRPC" if name == "grpc" else "metrics"
        group.add_argument(
            f"--{name}-port",
            type=int,
            default=port,
            metavar="PORT",
            help=f"the {service} endpoint's port",
        )
        group.add_argument(
            f"--{name}-address",
            default="0.0.0.0",
            metavar="ADDRESS",
            help=f"the address the {service} endpoint listens on",
        )
    group.add_argument(
        "--grpc-engine",
        choices=("core", "aio"),
        default="core",
        help="tritonfast only. core: serve gRPC on grpcio's core with our own call handling"
        " (the fast default); aio: grpc.aio's server",
    )
    group.add_argument("--allow-http", default=True, help="serve HTTP", **_BOOL)
    group.add_argument("--allow-grpc", default=True, help="serve gRPC", **_BOOL)
    group.add_argument(
        "--allow-metrics", default=True, help="serve /metrics on the metrics port", **_BOOL
    )
    group.add_argument(
        "--allow-cpu-metrics", default=True, help="export the nv_cpu_* gauges", **_BOOL
    )


def _cache_and_metrics(serve: argparse.ArgumentParser) -> None:
    """The response cache and the metrics."""
    group = serve.add_argument_group("response cache and metrics")
    group.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES",
        help="a response cache of BYTES for the models whose config enables response_cache",
    )
    group.add_argument(
        "--response-cache-byte-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="tritonserver's older spelling of --cache-config local,size=BYTES",
    )
    group.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="summary_latencies=true adds latency summaries; summary_quantiles=0.5:0.05,..."
        " chooses their quantiles (repeatable)",
    )
    group.add_argument(
        "--allow-gpu-metrics",
        default=True,
        help="export nv_gpu_* metrics when NVML (nvidia-ml-py) and a GPU are present",
        **_BOOL,
    )


def _lifecycle_and_logging(serve: argparse.ArgumentParser) -> None:
    """Shutdown, logging and tracing."""
    group = serve.add_argument_group("shutdown, logging, tracing")
    group.add_argument(
        "--exit-timeout-secs",
        type=int,
        default=30,
        metavar="SECONDS",
        help="on shutdown (or unload), how long requests in flight may take before they are"
        " answered UNAVAILABLE",
    )
    group.add_argument(
        "--log-verbose",
        type=int,
        default=0,
        metavar="LEVEL",
        help="verbose log messages: 0 none, 1 and up more of them",
    )
    group.add_argument(
        "--log-format",
        choices=("default", "ISO8601"),
        default="default",
        help="the log lines' timestamp format",
    )
    group.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[triton,]KEY=VALUE",
        help="request tracing: file=PATH, level=TIMESTAMPS|TENSORS|OFF, rate=N, count=N,"
        " log-frequency=N (repeatable)",
    )
    group.add_argument(
        "--log-file", default="", metavar="PATH", help="write the log here instead of stderr"
    )
    group.add_argument("--log-info", default=True, help="log INFO messages", **_BOOL)
    group.add_argument("--log-warning", default=True, help="log WARNING messages", **_BOOL)
    group.add_argument("--log-error", default=True, help="log ERROR messages", **_BOOL)
    group.add_argument(
        "--id",
        dest="server_id",
        default="triton",
        metavar="NAME",
        help="the server's name in its metadata (GET /v2)",
    )


def _backends_and_headers(serve: argparse.ArgumentParser) -> None:
    """Backend settings, and headers passed on to requests."""
    group = serve.add_argument_group("backends and forwarded headers")
    group.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[BACKEND,]KEY=VALUE",
        help="a backend's setting, e.g. onnxruntime,default-max-batch-size=8 (without"
        " BACKEND: for every backend; repeatable)",
    )
    group.add_argument(
        "--http-header-forward-pattern",
        default="",
        metavar="REGEX",
        help="HTTP headers whose names match become parameters of the inference request",
    )
    group.add_argument(
        "--grpc-header-forward-pattern",
        default="",
        metavar="REGEX",
        help="gRPC metadata whose keys match become parameters of the inference request",
    )


def _security(serve: argparse.ArgumentParser) -> None:
    """TLS, restricted APIs and the request body budget."""
    group = serve.add_argument_group("security")
    group.add_argument(
        "--grpc-use-ssl",
        default=False,
        help="serve gRPC over TLS",
        **_BOOL,
    )
    group.add_argument(
        "--grpc-use-ssl-mutual",
        default=False,
        help="serve gRPC over TLS and require client certificates signed by --grpc-root-cert",
        **_BOOL,
    )
    group.add_argument(
        "--grpc-server-cert", default="", metavar="PEM", help="the gRPC server's certificate"
    )
    group.add_argument(
        "--grpc-server-key", default="", metavar="PEM", help="that certificate's private key"
    )
    group.add_argument(
        "--grpc-root-cert",
        default="",
        metavar="PEM",
        help="the certificate authority client certificates must be signed by",
    )
    group.add_argument(
        "--http-tls-cert",
        default="",
        metavar="PEM",
        help="tritonfast only: serve HTTP as HTTPS with this certificate (and --http-tls-key)",
    )
    group.add_argument(
        "--http-tls-key", default="", metavar="PEM", help="--http-tls-cert's private key"
    )
    group.add_argument(
        "--request-body-budget-bytes",
        type=int,
        default=1 << 32,
        metavar="BYTES",
        help="tritonfast only: large request bodies (256 KiB and up, HTTP and gRPC) being"
        " received or in use may hold this much memory between them; a body past it gets"
        " HTTP 503 or gRPC UNAVAILABLE (default 4 GiB)",
    )
    group.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="answer these API groups only with header KEY: VALUE (repeatable)",
    )
    group.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="answer these API groups only with metadata triton-grpc-protocol-KEY: VALUE",
    )


def _dynamo(serve: argparse.ArgumentParser) -> None:
    """Joining an NVIDIA Dynamo deployment (frontends/dynamo)."""
    group = serve.add_argument_group("NVIDIA Dynamo")
    group.add_argument(
        "--dynamo",
        default=False,
        help="tritonfast only. Join a Dynamo deployment as a worker: every READY model is"
        " announced to Dynamo's discovery (DYN_DISCOVERY_BACKEND, DYN_REQUEST_PLANE and the"
        " variables they read) and served to its frontends and routers",
        **_BOOL,
    )
    group.add_argument(
        "--dynamo-route",
        default=False,
        help="tritonfast only. Serve no models of its own but those the Dynamo workers of the"
        " namespace announce (--dynamo), forwarding each request to one of them: the whole"
        " KServe HTTP and gRPC protocol in front of a Dynamo deployment",
        **_BOOL,
    )
    group.add_argument(
        "--dynamo-namespace",
        default="tritonfast",
        metavar="NAMESPACE",
        help="tritonfast only. The Dynamo namespace the models are announced in (their"
        " endpoints: NAMESPACE.<--id>.<model>)",
    )


def _vertex_ai(serve: argparse.ArgumentParser) -> None:
    """Google Vertex AI's routes."""
    group = serve.add_argument_group("Vertex AI")
    group.add_argument(
        "--allow-vertex-ai",
        default=None,
        help="serve the Vertex AI routes (AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE) on their own port;"
        " default: true when AIP_MODE=PREDICTION",
        **_BOOL,
    )
    group.add_argument(
        "--vertex-ai-port",
        type=int,
        default=None,
        metavar="PORT",
        help="default: AIP_HTTP_PORT, else 8080",
    )
    group.add_argument(
        "--vertex-ai-default-model",
        default="",
        metavar="MODEL",
        help="the model the predict route serves (needed when the repository holds several)",
    )


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)


def parse_serve_args(argv: list[str]) -> ServeOptions:
    """Parse a command line. ``serve`` may be left out, as with ``tritonserver``. A flag
    ``serve`` does not know is reported with ``serve``'s usage."""
    parser = build_parser()
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    elif (argv and not argv[0].startswith("-")) or argv[:1] in (["-h"], ["--help"]):
        parser.parse_args(argv)  # another command, or the overview: argparse answers
    args = subcommand(parser, "serve").parse_args(argv)
    values = vars(args)
    repositories = values.pop("model_repositories") or []
    options = ServeOptions(**values)
    if options.dynamo_route:
        _as_route(parser, options, repositories)
    elif repositories:
        options.model_repositories = repositories
    else:
        options.model_repositories = [EXAMPLE_REPOSITORY]
        options.using_example_repository = True
    return options


def _as_route(
    parser: argparse.ArgumentParser, options: ServeOptions, repositories: list[Path]
) -> None:
    """A Dynamo route loads, through the repository API, only what the workers announce: it
    takes no repository of its own, and its models are loaded and unloaded explicitly."""
    serve = subcommand(parser, "serve")
    if options.dynamo:
        serve.error("--dynamo-route and --dynamo exclude each other: a route serves no models")
    if repositories:
        serve.error(
            "--dynamo-route serves the models of Dynamo workers: give no --model-repository"
        )
    route_repository = Path(tempfile.mkdtemp(prefix="tritonfast-route-"))
    options.model_repositories = [route_repository]
    options.model_control_mode = "explicit"
