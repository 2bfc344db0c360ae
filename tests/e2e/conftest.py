"""Fixtures shared by the end-to-end tests (the ``server`` fixture is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.corepair import MODEL_INFER, Connection


@pytest.fixture(scope="module")
def grpc_client(server: Any) -> Iterator[grpcclient.InferenceServerClient]:
    """One tritonclient gRPC client for a test module, on the session's server."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def connections(servers: tuple[Any, ...]) -> Iterator[tuple[Connection, Connection]]:
    """A keep-alive HTTP connection to each of a module's ``servers`` (see tests/e2e/corepair)."""
    pair = (Connection(servers[0].http_port), Connection(servers[1].http_port))
    yield pair
    for connection in pair:
        connection.close()


@pytest.fixture(scope="module")
def grpc_calls(servers: tuple[Any, ...]) -> Iterator[tuple[Any, Any]]:
    """A raw ``ModelInfer`` call on each of a module's ``servers``."""
    channels = [grpc.insecure_channel(s.grpc_url) for s in servers]
    calls = tuple(
        c.unary_unary(MODEL_INFER, request_serializer=None, response_deserializer=None)
        for c in channels
    )
    yield calls
    for channel in channels:
        channel.close()
