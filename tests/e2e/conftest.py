"""Fixtures shared by the end-to-end tests (the ``server`` fixture is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient


@pytest.fixture(scope="module")
def grpc_client(server: Any) -> Iterator[grpcclient.InferenceServerClient]:
    """One tritonclient gRPC client for a test module, on the session's server."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()
