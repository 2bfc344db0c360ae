"""Server start-up, broken models, exit-on-error, CLI flags and shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import BROKEN_MODELS, EXAMPLES, ROOT, start_server
from tests.e2e.models_on_disk import Marks, write_model
from tests.waiting import wait_for


def test_startup_prints_model_table_and_addresses(server) -> None:
    log = server.log()
    assert "| Model" in log and "| Version" in log and "| Status" in log
    assert "| add_sub" in log
    assert f"Started HTTPService at 127.0.0.1:{server.http_port}" in log
    assert f"Started GRPCInferenceService at 127.0.0.1:{server.grpc_port}" in log
    assert f"Started Metrics Service at 127.0.0.1:{server.metrics_port}" in log


def test_broken_models_refuse_start_by_default(tmp_path) -> None:
    server = start_server([BROKEN_MODELS], tmp_path / "log", wait_ready=False)
    code = server.wait_exit(60)
    assert code != 0
    log = server.log()
    assert "broken_cfg" in log and "3:1" in log
    assert "init_fail cannot start" in log


@pytest.fixture(scope="module")
def lenient_server(tmp_path_factory):
    running = start_server(
        [BROKEN_MODELS], tmp_path_factory.mktemp("lenient") / "log", "--exit-on-error=false"
    )
    yield running
    assert running.stop() == 0


def test_exit_on_error_false_serves_the_healthy_models(lenient_server) -> None:
    client = httpclient.InferenceServerClient(lenient_server.http_url)
    try:
        assert client.is_server_live()
        assert not client.is_server_ready()  # some models failed
        assert client.is_model_ready("healthy")
        broken = ("broken_cfg", "no_model_py", "init_fail", "bad_mode", "proc_init_fail")
        for name in (*broken, "warmup_fail"):
            assert not client.is_model_ready(name)
        a = np.ones(4, dtype=np.float32)
        inputs = [
            httpclient.InferInput("INPUT0", [4], "FP32"),
            httpclient.InferInput("INPUT1", [4], "FP32"),
        ]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("healthy", inputs).as_numpy("OUTPUT0"), 2 * a)
        with pytest.raises(InferenceServerException) as info:
            client.infer("init_fail", inputs)
        assert info.value.status() == "404"
        assert info.value.message() == (
            "Request for unknown model: 'init_fail' has no available versions"
        )
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("broken_cfg")
        assert info.value.message() == "Request for unknown model: 'broken_cfg' is not found"
    finally:
        client.close()
    log = lenient_server.log()
    assert "model.py" in log  # the missing-file reason names the file
    assert (
        "parameter TRITONFAST_INSTANCE_MODE must be one of process, auto, thread, not 'fork'" in log
    )
    # initialize() failing inside a worker process reports the model's own error.
    assert "Failed to initialize model instance 'proc_init_fail_0'" in log
    assert log.count("init_fail cannot start") >= 2
    assert "failed to warm up model 'warmup_fail' with sample 'missing'" in log
    assert "nope.raw" in log


def test_warmup_runs_before_the_model_is_ready(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), 7, dtype=np.float32))
        zeros, ones = client.infer("warmed", [tensor]).as_numpy("COUNT")[0]
        assert (zeros, ones) == (3, 1)
    finally:
        client.close()


# Marks each execution's start in a file, then runs until the test creates the release file
# (at most 30 s): the test can tell that its requests are running, and keep them running.
HELD_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 4 kind: KIND_CPU } ]
"""
HELD_MODEL = """
import os
import time

import triton_python_backend_utils as pb_utils

STARTED = {started!r}
RELEASE = {release!r}


class TritonPythonModel:
    def execute(self, requests):
        with open(STARTED, "a") as marks:
            marks.write("started\\n")
        deadline = time.monotonic() + 30
        while not os.path.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""


@pytest.mark.parametrize("via", ["http", "grpc-core", "grpc-aio"])
def test_sigterm_finishes_requests_in_flight(tmp_path, via: str) -> None:
    protocol, _, engine = via.partition("-")
    extra = [f"--grpc-engine={engine}"] if engine else []
    started, release = Marks(tmp_path / "started"), tmp_path / "release"
    model = HELD_MODEL.format(started=str(started.path), release=str(release))
    write_model(tmp_path / "repository", "held", HELD_CONFIG, model)
    server = start_server([tmp_path / "repository"], tmp_path / "server.log", *extra)
    client_module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    results: list[object] = []

    def call(value: int) -> None:
        client = client_module.InferenceServerClient(url)
        try:
            tensor = client_module.InferInput("X", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            results.append(client.infer("held", [tensor]).as_numpy("Y"))
        except Exception as error:  # recorded, then asserted below
            results.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=call, args=(value,)) for value in range(3)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: started.count() == 3, "the three requests to run")
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "shutting down" in server.log(), "the server to begin its shutdown")
    finally:
        release.touch()  # the requests end only now, after the shutdown began
    for thread in threads:
        thread.join(30)
    assert server.wait_exit(30) == 0, server.log()
    assert sorted(int(r[0]) for r in results if isinstance(r, np.ndarray)) == [0, 1, 2], results


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m tritonfast ARGS`` for a command that exits by itself."""
    return subprocess.run(
        [sys.executable, "-m", "tritonfast", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_unknown_flag_is_a_clear_error() -> None:
    result = run_cli("serve", "--no-such-flag")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_help_lists_tritonserver_flags() -> None:
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    for flag in (
        "--model-repository",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--allow-grpc",
        "--strict-model-config",
        "--exit-on-error",
        "--log-verbose",
        "--id",
    ):
        assert flag in result.stdout


def test_tritonserver_tuning_flags_are_accepted(tmp_path) -> None:
    server = start_server(
        [EXAMPLES],
        tmp_path / "server.log",
        "--backend-directory=/opt/tritonserver/backends",
        "--pinned-memory-pool-byte-size=0",
        "--cuda-memory-pool-byte-size=0:0",
        "--http-thread-count=4",
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_server_ready()
        client.close()
    finally:
        assert server.stop() == 0
    log = server.log()
    assert "--pinned-memory-pool-byte-size=0 has no effect in tritonfast" in log
    assert "--cuda-memory-pool-byte-size=0:0 has no effect" in log


def test_default_repository_is_the_bundled_examples(tmp_path) -> None:
    server = start_server([], tmp_path / "log", "--allow-grpc=false", "--allow-metrics=false")
    try:
        assert "bundled example repository" in server.log()
        assert str(EXAMPLES.name) in server.log()
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("add_sub")
        assert client.is_model_ready("string_upper")
        assert client.get_server_metadata()["name"] == "triton"
        client.close()
    finally:
        assert server.stop() == 0


def test_server_id_flag_names_the_server(tmp_path) -> None:
    server = start_server([EXAMPLES], tmp_path / "log", "--id=custom-id", "--allow-grpc=false")
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2", timeout=5) as response:
            assert b'"custom-id"' in response.read()
    finally:
        assert server.stop() == 0


def test_server_raises_its_open_descriptor_limit(tmp_path) -> None:
    # Each HTTP connection holds two descriptors (its socket and the writer thread's
    # duplicate), so the server lifts its soft limit to the hard one. Started here with a
    # lowered soft limit (inherited from this process, which keeps room for its own).
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = max(256, len(os.listdir("/proc/self/fd")) + 64)  # room for what we hold
    if hard != resource.RLIM_INFINITY and hard <= lowered:
        pytest.skip(f"hard descriptor limit {hard} leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        server = start_server([EXAMPLES], tmp_path / "server.log")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
        line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        server_soft = line.split()[3]
        expected = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        assert server_soft in (expected, str(1 << 20)), line
    finally:
        assert server.stop() == 0


HUNG_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "%s" } }
instance_group [ { count: 3 kind: KIND_CPU } ]
"""
HUNG_MODEL = """
import threading

import triton_python_backend_utils as pb_utils

RELEASE = threading.Event()


class TritonPythonModel:
    def execute(self, requests):
        with open({marks!r}, "a") as marks:
            marks.write("started\\n")
        RELEASE.wait(60)  # hangs past the exit timeout
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")])
                for r in requests]
"""


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_hung_model_at_shutdown_gets_one_clear_log_line(tmp_path: Path, mode: str) -> None:
    """Three instances hung in ``execute``: the server still exits within the exit timeout
    (one deadline for draining the frontends and stopping every instance), logging one
    clear line and no traceback."""
    marks = Marks(tmp_path / "marks")
    model = HUNG_MODEL.format(marks=str(marks.path))
    write_model(tmp_path / "repository", "hung", HUNG_CONFIG % mode, model)
    server = start_server(
        [tmp_path / "repository"], tmp_path / "server.log", "--exit-timeout-secs=2"
    )
    client = httpclient.InferenceServerClient(server.http_url, concurrency=3, network_timeout=60)
    tensor = httpclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    pending = [client.async_infer("hung", [tensor]) for _ in range(3)]
    wait_for(lambda: marks.count() == 3, "every instance to start its execution")
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.wait_exit(60)
    took = time.monotonic() - signalled
    log = server.log()
    assert "requests were still running when the exit timeout (2 s) ran out" in log
    assert "Traceback" not in log
    assert took < 2 + 3, f"the server took {took:.1f} s to exit"
    del pending
    client.close()
