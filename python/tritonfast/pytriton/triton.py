"""PyTriton's server API (``pytriton.triton``): :class:`Triton` binds callables and serves them,
configured by :class:`TritonConfig`. Here the server is tritonfast's own, in this process
(:class:`tritonfast.inprocess.Server`): there is no Triton binary to launch and no proxy
between the server and the callables."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tritonfast.callables.errors import PyTritonInvalidOperationError, PyTritonValidationError
from tritonfast.callables.spec import ModelConfig, Tensor
from tritonfast.inprocess import Server

log = logging.getLogger(__name__)

MONITORING_PERIOD_S = 10.0
_MODEL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"

# TritonConfig fields that are tritonfast serve options of the same name.
_SAME_NAME = (
    "log_verbose",
    "exit_timeout_secs",
    "exit_on_error",
    "strict_readiness",
    "allow_http",
    "http_address",
    "http_port",
    "http_header_forward_pattern",
    "allow_grpc",
    "grpc_header_forward_pattern",
    "grpc_use_ssl",
    "grpc_use_ssl_mutual",
    "grpc_address",
    "grpc_port",
    "allow_metrics",
    "allow_gpu_metrics",
    "allow_cpu_metrics",
    "metrics_port",
    "metrics_address",
    "metrics_config",
    "trace_config",
    "cache_config",
    "allow_vertex_ai",
    "vertex_ai_port",
    "vertex_ai_default_model",
)


@dataclasses.dataclass
class TritonConfig:
    """The server's settings, PyTriton's fields (None: the server's default)."""

    model_repository: Path | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_file: Path | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    http_restricted_api: str | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_infer_allocation_pool_size: int | None = None
    grpc_use_ssl: bool | None = None
    grpc_use_ssl_mutual: bool | None = None
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    grpc_infer_response_compression_level: str | None = None
    grpc_keepalive_time: int | None = None
    grpc_keepalive_timeout: int | None = None
    grpc_keepalive_permit_without_calls: bool | None = None
    grpc_http2_max_pings_without_data: int | None = None
    grpc_http2_min_recv_ping_interval_without_data: int | None = None
    grpc_http2_max_ping_strikes: int | None = None
    grpc_restricted_protocol: str | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    allow_sagemaker: bool | None = None
    sagemaker_port: int | None = None
    sagemaker_safe_port_range: str | None = None
    sagemaker_thread_count: int | None = None
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_thread_count: int | None = None
    vertex_ai_default_model: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    buffer_manager_thread_count: int | None = None

    def __post_init__(self) -> None:
        if self.allow_http not in (True, None) and self.allow_grpc not in (True, None):
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        """A config from a dict; values are converted to the fields' types, unknown keys are
        logged and ignored."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in config:
            if name not in fields:
                log.warning(
                    "Ignoring %s=%s as could not find matching config field.", name, config[name]
                )
        return cls(**{n: _cast(fields[n], v) for n, v in config.items() if n in fields})

    @classmethod
    def from_env(cls) -> TritonConfig:
        """A config from ``PYTRITON_TRITON_CONFIG_<FIELD>`` environment variables (lists as
        ``<FIELD>_<index>``)."""
        config: dict[str, Any] = {}
        indexed = re.compile(r"^(.+?)_(\d+)$")
        for name, value in os.environ.items():
            if not name.startswith(ENV_PREFIX):
                continue
            key = name[len(ENV_PREFIX) :].lower()
            match = indexed.match(key)
            if match:
                items = config.setdefault(match.group(1), [])
                index = int(match.group(2))
                items.extend([None] * (index + 1 - len(items)))
                items[index] = value
            else:
                config[key] = value
        return cls.from_dict(config)


def _cast(field: dataclasses.Field[Any], value: Any) -> Any:
    if value is None:
        return None
    text = str(field.type)
    if "list" in text:
        return value.split(",") if isinstance(value, str) else list(value)
    if "bool" in text:
        return (
            value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
        )
    if "int" in text:
        return int(value)
    if "Path" in text:
        return Path(value)
    return value


@dataclasses.dataclass
class TritonLifecyclePolicy:
    launch_triton_on_startup: bool = True
    local_model_store: bool = False


DefaultTritonLifecyclePolicy = TritonLifecyclePolicy()


@dataclasses.dataclass
class TritonSecurityConfig:
    """Accepted for compatibility; tritonfast does not restrict endpoints by token yet, and
    says so in its log when one is configured."""

    access_token: str | None = None
    restricted_endpoints: list[str] | None = None


def _serve_options(config: TritonConfig) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name in _SAME_NAME:
        value = getattr(config, name)
        if value is not None:
            options[name] = value
    if config.id is not None:
        options["server_id"] = config.id
    if config.log_file is not None:
        options["log_file"] = str(config.log_file)
    for name in ("grpc_server_cert", "grpc_server_key", "grpc_root_cert"):
        if getattr(config, name) is not None:
            options[name] = str(getattr(config, name))
    # Models are loaded and unloaded through the repository API (RemoteTriton binds that
    # way), with every model of the repositories loaded at start-up, as PyTriton's Triton runs.
    options["model_control_mode"] = "explicit"
    options["load_model"] = ["*"]
    handled = {*_SAME_NAME, "id", "log_file", "model_repository"}
    handled |= {"grpc_server_cert", "grpc_server_key", "grpc_root_cert"}
    for field in dataclasses.fields(config):
        if field.name not in handled and getattr(config, field.name) is not None:
            log.warning("TritonConfig.%s has no effect in tritonfast", field.name)
    return options


class Triton:
    """Binds callables as models and serves them (PyTriton's ``Triton``)."""

    def __init__(
        self,
        *,
        config: TritonConfig | None = None,
        workspace: str | Path | None = None,
        triton_lifecycle_policy: TritonLifecyclePolicy | None = None,
        security_config: TritonSecurityConfig | None = None,
    ) -> None:
        merged = TritonConfig.from_env()
        if config is not None:  # the given config wins over the environment's
            for field in dataclasses.fields(config):
                value = getattr(config, field.name)
                if value is not None:
                    setattr(merged, field.name, value)
        self.config = merged
        if security_config is not None and security_config.access_token is not None:
            log.warning("TritonSecurityConfig has no effect in tritonfast: endpoints are open")
        repository = [merged.model_repository] if merged.model_repository else []
        self._server = Server(repository, **_serve_options(merged))

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
    ) -> None:
        if not _MODEL_NAME.match(model_name):
            raise PyTritonValidationError(
                "Model name can only contain alphanumeric characters, dots, underscores and dashes"
            )
        if model_version != 1:
            log.warning(
                "model '%s': served as version 1 (model_version=%s)", model_name, model_version
            )
        self._server.bind(model_name, infer_func, inputs, outputs, config, strict)

    def run(self) -> None:
        """Start serving in the background."""
        if self._server.is_alive():
            raise PyTritonInvalidOperationError("Triton is already running")
        self._server.run()

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Serve until interrupted (SIGINT/SIGTERM) or stopped."""
        self._server.serve()

    def stop(self) -> bool:
        self._server.stop()
        return True

    def is_alive(self) -> bool:
        return self._server.is_alive()

    def is_connected(self) -> bool:
        return self._server.is_alive()

    def __enter__(self) -> Triton:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


from tritonfast.pytriton.remote import RemoteTriton  # noqa: E402 - PyTriton's module has it here

__all__ = [
    "DefaultTritonLifecyclePolicy",
    "RemoteTriton",
    "Triton",
    "TritonConfig",
    "TritonLifecyclePolicy",
    "TritonSecurityConfig",
]
