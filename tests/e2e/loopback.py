"""Servers started inside the test process (``tritonfast.Server``, the PyTriton layer's
``Triton``): every endpoint on a free port of 127.0.0.1."""

from __future__ import annotations

from typing import Any

from tests.conftest import free_ports


def loopback_options() -> dict[str, Any]:
    """Ports and addresses for ``Server(**...)`` or ``TritonConfig(**...)``."""
    http, grpc, metrics = free_ports(3)
    return {
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "http_address": "127.0.0.1",
        "grpc_address": "127.0.0.1",
        "metrics_address": "127.0.0.1",
    }
