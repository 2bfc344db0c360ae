"""The Vertex AI endpoint (Triton's ``--allow-vertex-ai``): a second HTTP port whose two routes
Vertex AI names through the environment.

- ``AIP_HEALTH_ROUTE``: the server's readiness, as ``/v2/health/ready``.
- ``AIP_PREDICT_ROUTE`` (POST): a KServe v2 inference request for the default model (the
  ``--vertex-ai-default-model``, or the repository's only model). The header
  ``X-Vertex-Ai-Triton-Redirect: <path>`` sends it to any other endpoint of the server instead
  (``v2/models/<m>/infer``, ``v2/health/ready``, ...). Binary tensors come with the content type
  ``application/vnd.vertex-ai-triton.binary+json;json-header-size=<N>``.

Any other path is refused with 400.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from tritonfast.errors import InvalidArgumentError
from tritonfast.frontends.http import codec
from tritonfast.frontends.http.answer import Answer, json_answer
from tritonfast.frontends.http.app import dispatcher
from tritonfast.frontends.http.connection import HttpServer
from tritonfast.frontends.http.request import Request

if TYPE_CHECKING:
    from tritonfast.api.dataplane import DataPlane

REDIRECT_HEADER = "X-Vertex-Ai-Triton-Redirect"
BINARY_CONTENT_TYPE = "application/vnd.vertex-ai-triton.binary+json"
DEFAULT_PORT = 8080


def routes_from_environment() -> tuple[str, str]:
    """(predict route, health route) from ``AIP_PREDICT_ROUTE`` / ``AIP_HEALTH_ROUTE``;
    refused with Triton's words when one is missing."""
    predict = os.environ.get("AIP_PREDICT_ROUTE")
    if not predict:
        raise InvalidArgumentError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")
    health = os.environ.get("AIP_HEALTH_ROUTE")
    if not health:
        raise InvalidArgumentError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")
    return predict, health


def default_port() -> int:
    """``AIP_HTTP_PORT``, else 8080, as Triton chooses the port without ``--vertex-ai-port``."""
    return int(os.environ.get("AIP_HTTP_PORT") or DEFAULT_PORT)


def default_model(dataplane: DataPlane, named: str) -> str:
    """The model predictions go to: ``named``, or the only model being served."""
    if named:
        return named
    models = [entry["name"] for entry in dataplane.repository_index()]
    if len(models) != 1:
        raise InvalidArgumentError(
            "Expect the model repository contains only a single model if default model is not"
            " specified"
        )
    return models[0]


def vertex_dispatcher(
    dataplane: DataPlane, predict_route: str, health_route: str, model: str
) -> Callable[[Request], Awaitable[Answer]]:
    serve = dispatcher(dataplane)
    refused = json_answer(codec.error_body("Not Found: unknown Vertex AI route"), 400)

    async def handle(request: Request) -> Answer:
        if request.path == health_route:
            request.path = "/v2/health/ready"
            request.method = "GET"
            return await serve(request)
        if request.path != predict_route or request.method != "POST":
            return refused
        redirect = request.headers.get(REDIRECT_HEADER)
        request.path = "/" + redirect.lstrip("/") if redirect else f"/v2/models/{model}/infer"
        content_type = request.headers.get("Content-Type", "")
        if content_type.startswith(BINARY_CONTENT_TYPE):
            headers = CIMultiDict(request.headers)
            for part in content_type.split(";")[1:]:
                key, _, value = part.strip().partition("=")
                if key == "json-header-size":
                    headers[codec.HEADER_LENGTH] = value
            request.headers = headers
        return await serve(request)

    return handle


async def start_vertex_server(
    dataplane: DataPlane, host: str, port: int, default: str
) -> tuple[HttpServer, str]:
    """Serve the Vertex AI routes on ``host:port``; returns the server and the default model."""
    predict, health = routes_from_environment()
    model = default_model(dataplane, default)
    server = HttpServer(vertex_dispatcher(dataplane, predict, health, model), dataplane.body_budget)
    await server.start(host, port)
    return server, model
