"""A PyTriton ``TritonConfig`` for tests: every endpoint on a free loopback port."""

from __future__ import annotations

from tritonfast.pytriton.triton import TritonConfig

from tests.conftest import free_ports


def loopback_config() -> TritonConfig:
    """HTTP, gRPC and metrics on free ports of 127.0.0.1 (read them back from the config)."""
    http, grpc, metrics = free_ports(3)
    return TritonConfig(
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        metrics_address="127.0.0.1",
    )
