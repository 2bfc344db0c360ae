"""TensorRT models (model.plan): what a machine without a GPU or TensorRT answers, and, where
both exist, the self-check (a generated engine served and compared with onnxruntime over HTTP,
gRPC and CUDA shared memory)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonfast.memory import cudamemory

from tests.conftest import RunningServer, start_server

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_GPU = cudamemory.cuda_runtime() is not None

CPU_GROUP = """
platform: "tensorrt_plan"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def plan_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("plans")
    (repo / "engine" / "1").mkdir(parents=True)  # a plan file and no config.pbtxt
    (repo / "engine" / "1" / "model.plan").write_bytes(b"not an engine either way")
    (repo / "on_cpu" / "1").mkdir(parents=True)
    (repo / "on_cpu" / "1" / "model.plan").write_bytes(b"never read")
    (repo / "on_cpu" / "config.pbtxt").write_text(CPU_GROUP)
    server = start_server(
        [repo], tmp_path_factory.mktemp("plan_log") / "server.log", "--exit-on-error=false"
    )
    yield server
    assert server.stop() == 0, server.log()


def reasons(server: RunningServer) -> dict[str, tuple[str, str]]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return {
            m["name"]: (m["state"], m.get("reason", ""))
            for m in client.get_model_repository_index()
        }
    finally:
        client.close()


def test_a_plan_on_a_cpu_instance_group_is_refused_as_triton_refuses_it(
    plan_server: RunningServer,
) -> None:
    assert reasons(plan_server)["on_cpu"] == (
        "UNAVAILABLE",
        "unable to load model 'on_cpu', TensorRT backend supports only GPU device",
    )


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here")
def test_without_tensorrt_a_plan_is_unavailable_with_how_to_install_it(
    plan_server: RunningServer,
) -> None:
    state, reason = reasons(plan_server)["engine"]
    assert state == "UNAVAILABLE"
    assert reason.startswith("Unavailable: the tensorrt backend needs the 'tensorrt' package")
    assert reason.endswith("install it with: pip install 'tensorrt>=10,<11' 'cuda-python>=12,<13'")


@pytest.mark.skipif(not (HAS_TENSORRT and HAS_GPU), reason="needs a GPU and TensorRT")
def test_the_self_check_passes(tmp_path: Path) -> None:
    from tritonfast.backends.tensorrt import selfcheck

    assert selfcheck.run() == 0
