"""``python -m tritonfast selfcheck tensorrt``: proves the TensorRT backend where it runs.

1. builds a TensorRT engine from a generated ONNX MLP with TensorRT's builder API (one
   optimization profile, batches 1 to 32);
2. writes it as ``model.plan`` into a temporary repository, without config.pbtxt, and starts
   ``tritonfast serve`` on free ports;
3. checks what auto-complete made of the engine, then sends batches of 1, 5 and 32 rows over
   HTTP and gRPC and, when the GPU allows it, through CUDA shared memory (input and output in
   device memory), comparing every answer with onnxruntime running the same ONNX model;
4. prints each step and a verdict; exits 0 only if everything passed.

Needs a GPU, ``tensorrt``, ``cuda-python``, ``onnx``, ``onnxruntime`` and ``tritonclient``.
"""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

FEATURES, HIDDEN, CLASSES = 64, 128, 10
MAX_BATCH = 32


class Check:
    """Runs the steps, printing each with its outcome."""

    def __init__(self) -> None:
        self.failed = 0

    def step(self, what: str, action: Callable[[], Any]) -> Any:
        try:
            result = action()
        except Exception as exc:
            self.failed += 1
            print(f"FAIL  {what}: {type(exc).__name__}: {exc}", flush=True)
            return None
        print(f"ok    {what}" + (f": {result}" if isinstance(result, str) else ""), flush=True)
        return result if result is not None else True


def build_engine(onnx_bytes: bytes) -> bytes:
    """A serialized engine for the MLP: one profile, batches 1..MAX_BATCH (opt 8)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"the ONNX parser refused the model: {errors}")
    config = builder.create_builder_config()
    # TF32 (on by default on Ampere and later) rounds FP32 inputs to 10 mantissa bits: far
    # from onnxruntime's FP32 answers. The check compares exact FP32 arithmetic.
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    profile = builder.create_optimization_profile()
    profile.set_shape("INPUT", (1, FEATURES), (8, FEATURES), (MAX_BATCH, FEATURES))
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT's builder returned no engine")
    return bytes(serialized)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(port: int, server: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
            return f"ready on port {port}"
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not become ready in 120 s")


def run() -> int:
    check = Check()
    print("tritonfast self-check: the TensorRT backend", flush=True)
    for name in ("tensorrt", "onnx", "onnxruntime", "tritonclient.http"):
        check.step(f"import {name}", partial(importlib.import_module, name))
    from tritonfast.memory.cudamemory import cuda_runtime

    gpu = check.step("a GPU through cuda-python", lambda: _require(cuda_runtime()))
    if check.failed or not gpu:
        return _verdict(check)
    from tritonfast.onnxgen import mlp

    model = mlp(FEATURES, HIDDEN, CLASSES, seed=3)
    plan = check.step(
        "build an engine with TensorRT's builder", lambda: build_engine(model.SerializeToString())
    )
    if plan is None:
        return _verdict(check)
    work = Path(tempfile.mkdtemp(prefix="tritonfast-selfcheck-"))
    (work / "mlp_plan" / "1").mkdir(parents=True)
    (work / "mlp_plan" / "1" / "model.plan").write_bytes(plan)
    import onnxruntime

    reference = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    log = (work / "server.log").open("w")
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "tritonfast", "serve", f"--model-repository={work}"),
            *(f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        if check.step("serve model.plan without config.pbtxt", lambda: _wait_ready(http, server)):
            _exercise(check, reference, http, grpc)
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    print(f"server log: {work / 'server.log'}")
    return _verdict(check)


def _require(value: Any) -> str:
    if value is None:
        raise RuntimeError("no usable GPU (cuda-python missing, no driver or no device)")
    return "found"


def _exercise(check: Check, reference: Any, http: int, grpc: int) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")

    def auto_completed() -> str:
        config = client.get_model_config("mlp_plan")
        dims = [(t["name"], t["data_type"], t["dims"]) for t in config["input"] + config["output"]]
        expected = [("INPUT", "TYPE_FP32", [FEATURES]), ("OUTPUT", "TYPE_FP32", [CLASSES])]
        if config["max_batch_size"] != MAX_BATCH or dims != expected:
            raise AssertionError(f"max_batch_size {config['max_batch_size']}, tensors {dims}")
        return f"max_batch_size {MAX_BATCH}, {dims}"

    check.step("auto-complete from the engine", auto_completed)
    rng = np.random.default_rng(0)
    for rows in (1, 5, MAX_BATCH):
        batch = rng.standard_normal((rows, FEATURES), np.float32)
        (want,) = reference.run(None, {"INPUT": batch})

        def over_http(batch: np.ndarray = batch, want: np.ndarray = want) -> str:
            tensor = httpclient.InferInput("INPUT", list(batch.shape), "FP32")
            tensor.set_data_from_numpy(batch)
            got = client.infer("mlp_plan", [tensor]).as_numpy("OUTPUT")
            return _compare(got, want)

        def over_grpc(batch: np.ndarray = batch, want: np.ndarray = want) -> str:
            tensor = grpcclient.InferInput("INPUT", list(batch.shape), "FP32")
            tensor.set_data_from_numpy(batch)
            got = grpc_client.infer("mlp_plan", [tensor]).as_numpy("OUTPUT")
            return _compare(got, want)

        check.step(f"{rows} rows over HTTP against onnxruntime", over_http)
        check.step(f"{rows} rows over gRPC against onnxruntime", over_grpc)
    batch = rng.standard_normal((8, FEATURES), np.float32)
    (want,) = reference.run(None, {"INPUT": batch})
    check.step(
        "8 rows through CUDA shared memory (device to device)",
        lambda: _cuda_shared_memory(grpc_client, batch, want),
    )
    client.close()
    grpc_client.close()


def _cuda_shared_memory(client: Any, batch: np.ndarray, want: np.ndarray) -> str:
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    out_bytes = want.nbytes
    source = cudashm.create_shared_memory_region("selfcheck_in", batch.nbytes, 0)
    target = cudashm.create_shared_memory_region("selfcheck_out", out_bytes, 0)
    try:
        cudashm.set_shared_memory_region(source, [batch])
        client.register_cuda_shared_memory(
            "selfcheck_in", cudashm.get_raw_handle(source), 0, batch.nbytes
        )
        client.register_cuda_shared_memory(
            "selfcheck_out", cudashm.get_raw_handle(target), 0, out_bytes
        )
        tensor = grpcclient.InferInput("INPUT", list(batch.shape), "FP32")
        tensor.set_shared_memory("selfcheck_in", batch.nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT")
        output.set_shared_memory("selfcheck_out", out_bytes)
        client.infer("mlp_plan", [tensor], outputs=[output])
        got = cudashm.get_contents_as_numpy(target, np.float32, list(want.shape))
        return _compare(got, want)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(source)
        cudashm.destroy_shared_memory_region(target)


def _compare(got: np.ndarray, want: np.ndarray) -> str:
    # Relative to the outputs' scale: GPU kernels sum in another order than the CPU's.
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)
    return f"max difference {float(np.max(np.abs(got - want))):.2e}"


def _verdict(check: Check) -> int:
    if check.failed:
        print(f"VERDICT: FAIL ({check.failed} step(s) failed)", flush=True)
        return 1
    print("VERDICT: PASS", flush=True)
    return 0
