"""Python model instances in worker processes (TRITONFAST_INSTANCE_MODE "process")."""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, TEST_MODELS, start_server
from tests.waiting import wait_for

WAIT_S = 30.0

MODEL = "proc_identity"


def _inputs(module, f32: np.ndarray, words: list[bytes] | None) -> list:
    tensors = [module.InferInput("F32", list(f32.shape), "FP32")]
    tensors[0].set_data_from_numpy(f32)
    if words is not None:
        text = module.InferInput("STR", [len(words), 1], "BYTES")  # one word per batch row
        text.set_data_from_numpy(np.array(words, dtype=object).reshape(-1, 1))
        tensors.append(text)
    return tensors


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_tensors_travel_to_the_worker_and_back(server, module) -> None:
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        f32 = np.arange(12, dtype=np.float32).reshape(3, 4)
        words = [b"alpha", b"", "\u00e9t\u00e9".encode()]
        result = client.infer(MODEL, _inputs(module, f32, words))
        np.testing.assert_array_equal(result.as_numpy("F32_OUT"), f32 * 2)
        assert result.as_numpy("STR_OUT").reshape(-1).tolist() == words
        pids = result.as_numpy("PID")
        assert pids.shape == (3, 1)
        assert int(pids[0, 0]) not in (os.getpid(), server.proc.pid)
    finally:
        client.close()


def test_large_tensors_grow_the_segments(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        f32 = np.random.default_rng(1).random((2, 1 << 20), dtype=np.float32)  # 8 MiB
        result = client.infer(MODEL, _inputs(grpcclient, f32, None))
        np.testing.assert_array_equal(result.as_numpy("F32_OUT"), f32 * 2)
        small = np.ones((1, 3), dtype=np.float32)
        result = client.infer(MODEL, _inputs(grpcclient, small, None))
        np.testing.assert_array_equal(result.as_numpy("F32_OUT"), small * 2)
    finally:
        client.close()


def test_two_instances_run_in_parallel_processes(server) -> None:
    """Two sleeping requests, the second sent while the first runs: both execute at once,
    in two different worker processes."""
    results: dict[int, tuple[int, np.ndarray]] = {}

    def call(index: int) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            inputs = _inputs(grpcclient, np.zeros((1, 1), np.float32), [b"sleep"])
            result = client.infer(MODEL, inputs)
            results[index] = (int(result.as_numpy("PID")[0, 0]), result.as_numpy("SPAN")[0])
        finally:
            client.close()

    first = threading.Thread(target=call, args=(0,))
    first.start()
    threading.Event().wait(0.05)  # the first is sleeping in one instance now
    call(1)
    first.join(30)
    (pid_a, span_a), (pid_b, span_b) = results[0], results[1]
    assert pid_a != pid_b
    overlap = min(span_a[1], span_b[1]) - max(span_a[0], span_b[0])
    assert overlap > 0, f"executions did not overlap: {span_a} {span_b}"


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_requests_one_at_a_time_keep_to_one_instance(server, module) -> None:
    """A request wakes the idle instance that ran last: lone requests do not go to each
    instance in turn (which would find each one's worker gone cold), but all to one."""
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        inputs = _inputs(module, np.zeros((1, 1), np.float32), None)
        pids = [int(client.infer(MODEL, inputs).as_numpy("PID")[0, 0]) for _ in range(20)]
    finally:
        client.close()
    # (The first may find both instances idle since start-up; after it, one ran last.)
    most = max(pids[1:].count(pid) for pid in set(pids[1:]))
    assert most >= 17, pids


def test_model_exception_is_reported_and_the_worker_keeps_serving(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, _inputs(httpclient, np.zeros((1, 1), np.float32), [b"raise"]))
        message = info.value.message()
        assert "Failed to process the request(s) for model 'proc_identity_0_" in message
        assert "ValueError: asked to raise" in message
        result = client.infer(MODEL, _inputs(httpclient, np.ones((1, 2), np.float32), None))
        np.testing.assert_array_equal(result.as_numpy("F32_OUT"), [[2, 2]])
    finally:
        client.close()


def test_a_model_that_returns_no_response_gets_an_error_not_a_hang(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, _inputs(httpclient, np.zeros((1, 1), np.float32), [b"silent"]))
        assert "returned no response for request" in info.value.message()
        assert "did not use its response sender" in info.value.message()
    finally:
        client.close()


@pytest.mark.parametrize(
    ("word", "code"), [(b"crash", 3), (b"segv", -11), (b"abort", -6)], ids=["exit", "segv", "abort"]
)
def test_a_crashed_worker_fails_its_batch_and_is_restarted(server, word, code) -> None:
    """os._exit, a segfault in native code, abort(): the batch fails with a clear error, the
    server and its other models go on, and the instance starts again for the next batch."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, _inputs(grpcclient, np.zeros((1, 1), np.float32), [word]))
        assert info.value.status() == "StatusCode.INTERNAL"
        assert f"worker process exited (code {code})" in info.value.message()
        other = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        other.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("identity_fp32", [other]).as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
        # Every instance (the crashed one restarted) answers again.
        for _ in range(6):
            result = client.infer(MODEL, _inputs(grpcclient, np.ones((1, 1), np.float32), None))
            np.testing.assert_array_equal(result.as_numpy("F32_OUT"), [[2]])
    finally:
        client.close()


INIT_CRASHER = """
import ctypes
import os
import triton_python_backend_utils as pb_utils

if open(os.path.join(os.path.dirname(__file__), "how")).read().strip() == "import":
    os._exit(5)


class TritonPythonModel:
    def __init__(self):
        if open(os.path.join(os.path.dirname(__file__), "how")).read().strip() == "construct":
            raise RuntimeError("the constructor refuses")

    def initialize(self, args):
        how = open(os.path.join(os.path.dirname(__file__), "how")).read().strip()
        if how == "exit":
            os._exit(4)
        if how == "abort":
            os.abort()
        if how == "segv":
            ctypes.string_at(0)  # reads address 0: SIGSEGV

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""

INIT_CRASHER_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def test_a_model_crashing_on_import_or_in_initialize_fails_its_load_and_a_later_load_brings_it_back(
    tmp_path,
) -> None:
    version = tmp_path / "repo" / "init_crasher" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(INIT_CRASHER)
    (version.parent / "config.pbtxt").write_text(INIT_CRASHER_CONFIG)
    how = version / "how"
    how.write_text("exit")
    server = start_server(
        [tmp_path / "repo", TEST_MODELS],
        tmp_path / "server.log",
        "--model-control-mode=explicit",
        "--load-model=identity_fp32",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    other = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    other.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        # The model names no instance mode: the default (a worker) contains each crash.
        for crash in ("import", "exit", "abort", "segv"):
            how.write_text(crash)
            with pytest.raises(InferenceServerException) as info:
                client.load_model("init_crasher")
            assert "the worker process exited with code" in info.value.message()
            assert client.is_server_live()
            assert not client.is_model_ready("init_crasher")
            answer = client.infer("identity_fp32", [other]).as_numpy("OUTPUT0")
            assert answer.tolist() == [[1.0] * 4]  # the other model is unaffected
        how.write_text("construct")  # an exception, not a crash: the model's own words
        with pytest.raises(InferenceServerException) as info:
            client.load_model("init_crasher")
        assert "Internal: RuntimeError: the constructor refuses" in info.value.message()
        how.write_text("fine")
        client.load_model("init_crasher")
        tensor = httpclient.InferInput("X", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[7.0]], np.float32))
        assert client.infer("init_crasher", [tensor]).as_numpy("Y").tolist() == [[7.0]]
    finally:
        client.close()
        server.stop()


PID_MODEL = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""

PID_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""


@pytest.mark.parametrize("setting", [None, "process", "auto", "thread"])
def test_a_model_naming_no_mode_runs_in_a_worker_unless_the_server_says_otherwise(
    tmp_path, setting
) -> None:
    version = tmp_path / "repo" / "pid" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(PID_MODEL)
    (version.parent / "config.pbtxt").write_text(PID_CONFIG)
    flags = [] if setting is None else [f"--backend-config=python,instance-mode={setting}"]
    server = start_server([tmp_path / "repo"], tmp_path / "server.log", *flags)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        pid = int(client.infer("pid", [tensor]).as_numpy("PID")[0])
        assert (pid == server.proc.pid) == (setting in ("auto", "thread"))
    finally:
        client.close()
        server.stop()


def test_an_unknown_server_wide_mode_keeps_python_models_from_loading(tmp_path) -> None:
    version = tmp_path / "repo" / "pid" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(PID_MODEL)
    (version.parent / "config.pbtxt").write_text(PID_CONFIG)
    server = start_server(
        [tmp_path / "repo"],
        tmp_path / "server.log",
        "--backend-config=python,instance-mode=fork",
        "--exit-on-error=false",
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready("pid")
        client.close()
    finally:
        server.stop()
    assert (
        "--backend-config=python,instance-mode must be one of process, auto, thread, not 'fork'"
        in server.log()
    )


def test_unloading_a_worker_model_is_not_held_up_by_a_client_that_stopped_reading(
    tmp_path,
) -> None:
    """The server stops reading a worker's pipe while a client's stream is full; an unload
    reads on regardless (as Triton buffers), so it ends at once and the stream completes."""
    streaming = ROOT / "tests" / "models_streaming"
    server = start_server(
        [streaming],
        tmp_path / "server.log",
        "--model-control-mode=explicit",
        "--load-model=send_timing_proc",
    )
    client = grpcclient.InferenceServerClient(server.grpc_url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    first, reading = threading.Event(), threading.Event()

    def arrived(result: Any, error: Any) -> None:
        if error is None:
            first.set()
            reading.wait(WAIT_S)  # the client stops reading after the first response
        replies.put((result, error))

    try:
        wait_for(lambda: client.is_model_ready("send_timing_proc"), "the model to load")
        client.start_stream(callback=arrived)
        inputs = []
        for name, value in (("COUNT", 1000), ("PAD_BYTES", 64 * 1024)):
            tensor = grpcclient.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            inputs.append(tensor)
        client.async_stream_infer("send_timing_proc", inputs)
        assert first.wait(WAIT_S)
        started = time.monotonic()
        unloader = threading.Thread(target=client.unload_model, args=("send_timing_proc",))
        unloader.start()
        unloader.join(WAIT_S)
        reading.set()
        assert not unloader.is_alive()
        assert time.monotonic() - started < 10
        # Its requests finished: the client, reading again, gets every response.
        got = [replies.get(timeout=WAIT_S) for _ in range(1001)]
        assert all(error is None for _, error in got)
        assert [int(r.as_numpy("IDX")[0]) for r, _ in got[:1000]] == list(range(1000))
        assert client.is_server_live()
    finally:
        reading.set()
        client.stop_stream(cancel_requests=True)
        client.close()
        server.stop()


STUB_LIKE = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.mark = args["model_repository"] + "/finalized"

    def execute(self, requests):
        argv = np.array([word.encode() for word in sys.argv], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGV", argv)]) for _ in requests]

    def finalize(self):
        with open(self.mark, "w") as mark:
            mark.write("finalized")
"""

STUB_LIKE_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "ARGV" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def test_a_worker_is_what_tritons_stub_is_to_its_model_argv_and_signals(tmp_path) -> None:
    """The model sees ``sys.argv == ['']``, and a SIGTERM sent to the server's whole process
    group (as a shell or a supervisor may send it) still has the model finalized."""
    model = tmp_path / "repo" / "stub_like"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(STUB_LIKE)
    (model / "config.pbtxt").write_text(STUB_LIKE_CONFIG)
    server = start_server([tmp_path / "repo"], tmp_path / "server.log", new_session=True)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        assert client.infer("stub_like", [tensor]).as_numpy("ARGV").tolist() == [b""]
    finally:
        client.close()
        os.killpg(server.proc.pid, signal.SIGTERM)
        assert server.wait_exit(30) == 0
    assert (model / "finalized").read_text() == "finalized"  # args["model_repository"]


FINALIZE_RAISES = """
class TritonPythonModel:
    def execute(self, requests):
        return []

    def finalize(self):
        raise RuntimeError("finalize refuses")
"""


@pytest.mark.parametrize("mode", ["process", "auto"])
def test_a_finalize_that_raises_is_one_log_line_and_the_unload_completes(tmp_path, mode) -> None:
    # As Triton logs it: the model's error, not a traceback of the server's own frames.
    model = tmp_path / "repo" / "fin_raise"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(FINALIZE_RAISES)
    (model / "config.pbtxt").write_text(
        PID_CONFIG
        + f'parameters {{ key: "TRITONFAST_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }}\n'
    )
    server = start_server(
        [tmp_path / "repo"], tmp_path / "server.log", "--model-control-mode=explicit"
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        client.load_model("fin_raise")
        client.unload_model("fin_raise")
        line = re.compile(
            r"finalize failed for instance fin_raise_\w+: RuntimeError: finalize refuses"
        )
        wait_for(lambda: line.search(server.log()), "the finalize error in the log")
        assert "Traceback" not in server.log()
        client.load_model("fin_raise")  # and it loads again
        assert client.is_model_ready("fin_raise")
    finally:
        client.close()
        server.stop()
