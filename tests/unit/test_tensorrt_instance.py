"""The TensorRT instance's own bookkeeping (docs/tensorrt.md): how a batch's rows are laid
into the engine's buffers, the profile chosen, outputs split per request or copied into CUDA
shared-memory windows, per-request failures.

No machine this runs on has a GPU or TensorRT, so both sides are simulated in host memory: the
"device" is numpy memory behind real addresses (every copy is a ``memmove``), and the "engine"
doubles its input. What runs for real is the instance's code between them; the self-check
(``python -m tritonfast selfcheck tensorrt``) runs it against TensorRT on a GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2 as mc
from tritonfast.backends.base import PhaseClock
from tritonfast.backends.tensorrt.device import Stream
from tritonfast.backends.tensorrt.engineio import EngineIO, EngineTensor, Profile
from tritonfast.backends.tensorrt.instance import TensorRTInstance
from tritonfast.data.types import InferRequest, InputTensor, RequestedOutput
from tritonfast.errors import TritonError


class SimulatedCuda:
    """cuda-python's runtime calls the backend makes, over host memory."""

    class cudaError_t:
        cudaSuccess = 0

    class cudaMemcpyKind:
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2
        cudaMemcpyDefault = 4

    def __init__(self) -> None:
        self.allocations: dict[int, np.ndarray] = {}
        self.copies: list[tuple[int, int, int]] = []

    def cudaSetDevice(self, device: int) -> tuple[int]:
        return (0,)

    def cudaStreamCreate(self) -> tuple[int, int]:
        return (0, 7)

    def cudaStreamSynchronize(self, stream: int) -> tuple[int]:
        return (0,)

    def cudaStreamDestroy(self, stream: int) -> tuple[int]:
        return (0,)

    def cudaMalloc(self, nbytes: int) -> tuple[int, int]:
        memory = np.zeros(nbytes, np.uint8)
        self.allocations[memory.ctypes.data] = memory
        return (0, memory.ctypes.data)

    def cudaFree(self, address: int) -> tuple[int]:
        del self.allocations[address]
        return (0,)

    def cudaMemcpyAsync(
        self, destination: int, source: int, count: int, kind: int, stream: int
    ) -> tuple[int]:
        ctypes.memmove(destination, source, count)
        self.copies.append((destination, source, count))
        return (0,)


class SimulatedContext:
    """An execution context for an engine OUTPUT = 2 * INPUT, [N, 4] FP32."""

    def __init__(self) -> None:
        self.active_optimization_profile = 0
        self.profiles_set: list[int] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}

    def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
        self.profiles_set.append(profile)
        return True

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes["INPUT"]

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream: int) -> bool:
        count = int(np.prod(self.shapes["INPUT"]))
        source = (ctypes.c_float * count).from_address(self.addresses["INPUT"])
        target = (ctypes.c_float * count).from_address(self.addresses["OUTPUT"])
        np.frombuffer(target, np.float32)[:] = 2 * np.frombuffer(source, np.float32)
        return True


class SimulatedEngine:
    def __init__(self) -> None:
        self.context = SimulatedContext()

    def create_execution_context(self) -> SimulatedContext:
        return self.context


ENGINE_IO = EngineIO(
    (
        EngineTensor(
            "INPUT",
            True,
            "FLOAT",
            (-1, 4),
            (Profile((1, 4), (2, 4), (4, 4)), Profile((4, 4), (16, 4), (16, 4))),
        ),
        EngineTensor("OUTPUT", False, "FLOAT", (-1, 4)),
    ),
    profile_count=2,
)
CONFIG = """
name: "double" max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class Window:
    """A CUDA shared-memory window as the backend sees one: an address and a size."""

    def __init__(self, nbytes: int) -> None:
        self.memory = np.zeros(nbytes, np.uint8)
        self.address = self.memory.ctypes.data
        self.nbytes = nbytes


def make_instance(config_text: str = CONFIG) -> tuple[TensorRTInstance, SimulatedEngine]:
    config = text_format.Parse(config_text, mc.ModelConfig())
    engine = SimulatedEngine()
    stream = Stream(SimulatedCuda(), 0)
    return TensorRTInstance(engine, ENGINE_IO, config, "double_0_0", stream, []), engine


def request(rows: np.ndarray | Window, shape: tuple[int, ...] | None = None, **kw: Any) -> Any:
    data: Any = rows
    shape = shape if shape is not None else tuple(np.shape(rows))
    return InferRequest("double", inputs=[InputTensor("INPUT", "FP32", shape, data)], **kw)


def values(rows: int, start: float) -> np.ndarray:
    return np.arange(start, start + rows * 4, dtype=np.float32).reshape(rows, 4)


def test_a_batch_is_one_run_and_each_request_gets_its_rows() -> None:
    instance, engine = make_instance()
    inputs = [values(1, 0), values(3, 100), values(2, 200)]
    results = instance.execute([request(x) for x in inputs], PhaseClock())
    assert engine.context.shapes["INPUT"] == (6, 4)
    for x, result in zip(inputs, results or [], strict=True):
        (output,) = result.outputs
        np.testing.assert_array_equal(output.data, 2 * x)
        assert output.shape == x.shape


def test_the_profile_nearest_the_batch_is_selected_once() -> None:
    instance, engine = make_instance()
    instance.execute([request(values(2, 0))], PhaseClock())
    instance.execute([request(values(2, 0))], PhaseClock())
    assert engine.context.profiles_set == []  # profile 0, the context's own
    instance.execute([request(values(12, 0))], PhaseClock())
    assert engine.context.profiles_set == [1]


def test_device_inputs_and_outputs_go_device_to_device() -> None:
    instance, _ = make_instance()
    x = values(3, 5)
    source = Window(x.nbytes)
    source.memory[:] = x.view(np.uint8).ravel()
    target = Window(x.nbytes)
    on_device = request(source, shape=(3, 4), outputs=[RequestedOutput("OUTPUT")])
    on_device.device_outputs = {"OUTPUT": target}
    on_host = request(values(1, 50))
    results = instance.execute([on_device, on_host], PhaseClock()) or []
    np.testing.assert_array_equal(target.memory.view(np.float32).reshape(3, 4), 2 * x)
    (written,) = results[0].outputs
    assert written.in_shared_memory and written.shape == (3, 4)
    np.testing.assert_array_equal(results[1].outputs[0].data, 2 * values(1, 50))


def test_a_too_small_output_window_fails_its_request_only() -> None:
    instance, _ = make_instance()
    small = request(values(2, 0), outputs=[RequestedOutput("OUTPUT")])
    small.device_outputs = {"OUTPUT": Window(8)}
    results = instance.execute([small, request(values(1, 9))], PhaseClock()) or []
    assert isinstance(results[0], TritonError)
    assert results[0].message == (
        "shared memory size specified with the request for output 'OUTPUT' (8 bytes) should be"
        " at least 32 bytes to hold the results"
    )
    np.testing.assert_array_equal(results[1].outputs[0].data, 2 * values(1, 9))


def test_reshape_gives_the_engine_its_shape_and_the_client_its_own() -> None:
    config = CONFIG.replace(
        "dims: [ 4 ] } ]\noutput", "dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]\noutput"
    ).replace(
        'name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ]',
        'name: "OUTPUT" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] }',
    )
    instance, engine = make_instance(config)
    x = values(2, 1).reshape(2, 2, 2)
    (result,) = instance.execute([request(x)], PhaseClock()) or []
    assert engine.context.shapes["INPUT"] == (2, 4)
    assert result.outputs[0].shape == (2, 2, 2)
    np.testing.assert_array_equal(result.outputs[0].data, 2 * x)


def test_requests_that_do_not_fill_the_batch_shape_fail_before_any_copy() -> None:
    instance, _ = make_instance()
    odd = request(np.zeros((1, 3), np.float32), shape=(1, 4))  # 12 bytes, not 16
    results = instance.execute([request(values(1, 0)), odd], PhaseClock()) or []
    assert all(isinstance(r, TritonError) for r in results)
    assert "do not hold [2,4]" in results[0].message


@pytest.mark.parametrize("rows", [17])
def test_a_batch_no_profile_holds_is_refused(rows: int) -> None:
    instance, _ = make_instance()
    (result,) = instance.execute([request(values(rows, 0))], PhaseClock()) or []
    assert isinstance(result, TritonError)
    assert result.message == (
        "no optimization profile of 'double' (instance 'double_0_0') holds the batch's input"
        " shapes: 'INPUT' [17,4]"
    )
