"""The ``core`` gRPC engine depends on grpcio internals; when the installed grpcio lacks one
of them the server warns once and serves gRPC with grpc.aio (frontends/grpc/engine.py).

The incompatible grpcio is made real, not mocked: a ``sitecustomize`` module on the server's
``PYTHONPATH`` removes one thing the engine needs from ``grpc._cython.cygrpc`` as the server's
interpreter starts."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonfast.frontends.grpc import engine

from tests.conftest import EXAMPLES, RunningServer, start_server

WITHOUT_CLOSE_OPERATION = """
from grpc._cython import cygrpc

del cygrpc.ReceiveCloseOnServerOperation
"""


def test_the_installed_grpcio_runs_the_core_engine() -> None:
    assert engine.core_problem() is None
    assert engine.choose("core") == "core"
    assert engine.choose("aio") == "aio"


@pytest.fixture(scope="module")
def fallback_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(WITHOUT_CLOSE_OPERATION)
    server = start_server([EXAMPLES], site / "server.log", pythonpath=(site,))
    yield server
    assert server.stop() == 0, server.log()


def test_a_grpcio_without_the_engines_needs_falls_back_to_aio(
    fallback_server: RunningServer,
) -> None:
    client = grpcclient.InferenceServerClient(fallback_server.grpc_url)
    try:
        a = grpcclient.InferInput("INPUT0", [4], "FP32")
        a.set_data_from_numpy(np.arange(4, dtype=np.float32))
        b = grpcclient.InferInput("INPUT1", [4], "FP32")
        b.set_data_from_numpy(np.ones(4, dtype=np.float32))
        result = client.infer("add_sub", [a, b])
        assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0, 3.0, 4.0]
    finally:
        client.close()
    log = fallback_server.log()
    warning = "the 'core' gRPC engine cannot run on grpcio"
    assert log.count(warning) == 1, log
    assert "lacks ReceiveCloseOnServerOperation; serving gRPC with grpc.aio" in log
