"""Triton's HTTP paths, resolved by splitting the path rather than by a regex router.

The inference route is the hot path: one ``str.split`` and a few comparisons find the handler,
the model and the version. Paths resolve as Triton's server resolves them: a known path with
the wrong method is ``405``, anything else ``404``.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class Endpoint(Enum):
    SERVER_METADATA = ("GET", "")
    HEALTH_LIVE = ("GET", "live")
    HEALTH_READY = ("GET", "ready")
    MODEL_METADATA = ("GET", "metadata")
    MODEL_READY = ("GET", "model-ready")
    MODEL_CONFIG = ("GET", "config")
    MODEL_STATISTICS = ("GET", "stats")
    INFER = ("POST", "infer")

    @property
    def method(self) -> str:
        return self.value[0]


class Route(NamedTuple):
    endpoint: Endpoint
    model: str = ""  # "" on server-wide endpoints (and statistics of every model)
    version: str = ""  # "" selects the model's default version


# The last path segment after /v2/models/{model}[/versions/{version}].
_MODEL_ACTIONS = {
    "ready": Endpoint.MODEL_READY,
    "config": Endpoint.MODEL_CONFIG,
    "infer": Endpoint.INFER,
    "stats": Endpoint.MODEL_STATISTICS,
}
_HEALTH = {"live": Endpoint.HEALTH_LIVE, "ready": Endpoint.HEALTH_READY}


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
    return None
