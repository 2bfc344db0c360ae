"""Triton's HTTP paths, resolved by splitting the path rather than by a regex router.

The inference route is the hot path: one ``str.split`` and a few comparisons find the handler,
the model and the version. Paths resolve as Triton's server resolves them: a known path with
the wrong method is ``405``, anything else ``404``.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class Endpoint(Enum):
    SERVER_METADATA = (("GET",), "")
    HEALTH_LIVE = (("GET",), "live")
    HEALTH_READY = (("GET",), "ready")
    MODEL_METADATA = (("GET",), "metadata")
    MODEL_READY = (("GET",), "model-ready")
    MODEL_CONFIG = (("GET",), "config")
    MODEL_STATISTICS = (("GET",), "stats")
    INFER = (("POST",), "infer")
    GENERATE = (("POST",), "generate")
    GENERATE_STREAM = (("POST",), "generate_stream")
    LOGGING = (("GET", "POST"), "logging")
    TRACE_SETTING = (("GET", "POST"), "trace/setting")
    MODEL_TRACE_SETTING = (("GET", "POST"), "models/trace/setting")
    REPOSITORY_INDEX = (("POST",), "repository/index")
    REPOSITORY_LOAD = (("POST",), "repository/load")
    REPOSITORY_UNLOAD = (("POST",), "repository/unload")
    SYSTEM_SHM_STATUS = (("GET",), "systemsharedmemory/status")
    SYSTEM_SHM_REGISTER = (("POST",), "systemsharedmemory/register")
    SYSTEM_SHM_UNREGISTER = (("POST",), "systemsharedmemory/unregister")
    CUDA_SHM_STATUS = (("GET",), "cudasharedmemory/status")
    CUDA_SHM_REGISTER = (("POST",), "cudasharedmemory/register")
    CUDA_SHM_UNREGISTER = (("POST",), "cudasharedmemory/unregister")

    def allows(self, method: str) -> bool:
        return method in self.value[0]

    @property
    def api_group(self) -> str:
        """The group ``--http-restricted-api`` restricts it by (Triton's)."""
        return _API_GROUPS[self]


_API_GROUPS = {
    Endpoint.SERVER_METADATA: "metadata",
    Endpoint.MODEL_METADATA: "metadata",
    Endpoint.HEALTH_LIVE: "health",
    Endpoint.HEALTH_READY: "health",
    Endpoint.MODEL_READY: "health",
    Endpoint.MODEL_CONFIG: "model-config",
    Endpoint.MODEL_STATISTICS: "statistics",
    Endpoint.INFER: "inference",
    Endpoint.GENERATE: "inference",
    Endpoint.GENERATE_STREAM: "inference",
    Endpoint.LOGGING: "logging",
    Endpoint.TRACE_SETTING: "trace",
    Endpoint.MODEL_TRACE_SETTING: "trace",
    Endpoint.REPOSITORY_INDEX: "model-repository",
    Endpoint.REPOSITORY_LOAD: "model-repository",
    Endpoint.REPOSITORY_UNLOAD: "model-repository",
    Endpoint.SYSTEM_SHM_STATUS: "shared-memory",
    Endpoint.SYSTEM_SHM_REGISTER: "shared-memory",
    Endpoint.SYSTEM_SHM_UNREGISTER: "shared-memory",
    Endpoint.CUDA_SHM_STATUS: "shared-memory",
    Endpoint.CUDA_SHM_REGISTER: "shared-memory",
    Endpoint.CUDA_SHM_UNREGISTER: "shared-memory",
}


class Route(NamedTuple):
    endpoint: Endpoint
    # The model, or the shared-memory region, the path names; "" on server-wide endpoints
    # (and statistics of every model, status or unregistering of every region).
    name: str = ""
    version: str = ""  # "" selects the model's default version


# The last path segment after /v2/models/{model}[/versions/{version}].
_MODEL_ACTIONS = {
    "ready": Endpoint.MODEL_READY,
    "config": Endpoint.MODEL_CONFIG,
    "infer": Endpoint.INFER,
    "generate": Endpoint.GENERATE,
    "generate_stream": Endpoint.GENERATE_STREAM,
    "stats": Endpoint.MODEL_STATISTICS,
}
_HEALTH = {"live": Endpoint.HEALTH_LIVE, "ready": Endpoint.HEALTH_READY}
# /v2/repository/models/{model}/{action}
_REPOSITORY_ACTIONS = {"load": Endpoint.REPOSITORY_LOAD, "unload": Endpoint.REPOSITORY_UNLOAD}
# /v2/{kind}[/region/{name}]/{action}
_SHARED_MEMORY = {
    (kind, endpoint.value[1].rpartition("/")[2]): endpoint
    for endpoint in Endpoint
    for kind in ("systemsharedmemory", "cudasharedmemory")
    if endpoint.value[1].startswith(kind + "/")
}


def resolve(path: str) -> Route | None:
    """The endpoint ``path`` names, with its model and version; None if it names none."""
    parts = path.split("/")
    count = len(parts)
    if count < 2 or parts[0] or parts[1] != "v2":
        return None
    if count == 2:
        return Route(Endpoint.SERVER_METADATA)
    section = parts[2]
    if section == "health":
        endpoint = _HEALTH.get(parts[3]) if count == 4 else None
        return Route(endpoint) if endpoint is not None else None
    if section == "logging":
        return Route(Endpoint.LOGGING) if count == 3 else None
    if section == "trace":
        return Route(Endpoint.TRACE_SETTING) if count == 4 and parts[3] == "setting" else None
    if section == "repository":
        if count == 4 and parts[3] == "index":
            return Route(Endpoint.REPOSITORY_INDEX)
        if count == 6 and parts[3] == "models" and parts[4]:
            endpoint = _REPOSITORY_ACTIONS.get(parts[5])
            return Route(endpoint, parts[4]) if endpoint is not None else None
        return None
    if section in ("systemsharedmemory", "cudasharedmemory"):
        region = ""
        if count == 6 and parts[3] == "region" and parts[4]:
            region = parts[4]
        elif count != 4:
            return None
        endpoint = _SHARED_MEMORY.get((section, parts[-1]))
        return Route(endpoint, region) if endpoint is not None else None
    if section != "models" or count < 4 or not parts[3]:
        return None
    if count == 4:
        if parts[3] == "stats":  # statistics of every model, not a model named "stats"
            return Route(Endpoint.MODEL_STATISTICS)
        return Route(Endpoint.MODEL_METADATA, parts[3])
    model = parts[3]
    version = ""
    rest = 4
    if parts[4] == "versions" and count >= 6:
        version = parts[5]
        if not (version.isascii() and version.isdigit()):
            return None
        rest = 6
    if count == rest:
        return Route(Endpoint.MODEL_METADATA, model, version)
    if count == rest + 1:
        endpoint = _MODEL_ACTIONS.get(parts[rest])
        if endpoint is not None:
            return Route(endpoint, model, version)
    if count == rest + 2 and parts[rest] == "trace" and parts[rest + 1] == "setting":
        return Route(Endpoint.MODEL_TRACE_SETTING, model, version)
    return None
