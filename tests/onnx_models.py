"""ONNX models the tests build with ``onnx.helper`` (no downloads), written into a temporary
model repository as Triton expects them (``<repo>/<name>/1/model.onnx``). The MLP and the
writer come from :mod:`tritonfast.onnxgen`; the models here only the tests need.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tritonfast.onnxgen import finish, mlp, write_onnx

__all__ = [
    "accumulator",
    "control_echo",
    "fixed_shape",
    "mixed_types",
    "mlp",
    "reshape_to_four",
    "unknown_operator",
    "with_optional_input",
    "write_onnx",
]


def mixed_types() -> onnx.ModelProto:
    """Several inputs and outputs of several types, batch dimension symbolic:
    INT64_IN [batch, 4] -> INT64_OUT = INT64_IN * 3;
    BOOL_IN [batch, 4] -> BOOL_OUT = not BOOL_IN;
    STR_IN (string) [batch, 2] -> STR_OUT = STR_IN;
    FP16_IN [batch, 3] -> FP16_OUT = FP16_IN + 1 and INT32_OUT = int32(FP16_IN);
    UINT8_IN [batch, 5] -> UINT8_OUT = UINT8_IN."""
    three = numpy_helper.from_array(np.array(3, np.int64), "THREE")
    one = numpy_helper.from_array(np.array(1, np.float16), "ONE")
    nodes = [
        helper.make_node("Mul", ["INT64_IN", "THREE"], ["INT64_OUT"]),
        helper.make_node("Not", ["BOOL_IN"], ["BOOL_OUT"]),
        helper.make_node("Identity", ["STR_IN"], ["STR_OUT"]),
        helper.make_node("Add", ["FP16_IN", "ONE"], ["FP16_OUT"]),
        helper.make_node("Cast", ["FP16_IN"], ["INT32_OUT"], to=TensorProto.INT32),
        helper.make_node("Identity", ["UINT8_IN"], ["UINT8_OUT"]),
    ]

    def value(name: str, elem: int, dims: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["batch", dims])

    graph = helper.make_graph(
        nodes,
        "mixed_types",
        [
            value("INT64_IN", TensorProto.INT64, 4),
            value("BOOL_IN", TensorProto.BOOL, 4),
            value("STR_IN", TensorProto.STRING, 2),
            value("FP16_IN", TensorProto.FLOAT16, 3),
            value("UINT8_IN", TensorProto.UINT8, 5),
        ],
        [
            value("INT64_OUT", TensorProto.INT64, 4),
            value("BOOL_OUT", TensorProto.BOOL, 4),
            value("STR_OUT", TensorProto.STRING, 2),
            value("FP16_OUT", TensorProto.FLOAT16, 3),
            value("INT32_OUT", TensorProto.INT32, 3),
            value("UINT8_OUT", TensorProto.UINT8, 5),
        ],
        initializer=[three, one],
    )
    return finish(graph)


def fixed_shape() -> onnx.ModelProto:
    """No batch dimension: FP32 X [2, 3] -> Y = X + 1 [2, 3] (max_batch_size 0 in Triton)."""
    one = numpy_helper.from_array(np.array(1, np.float32), "ONE")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "ONE"], ["Y"])],
        "fixed_shape",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        initializer=[one],
    )
    return finish(graph)


def with_optional_input() -> onnx.ModelProto:
    """FP32 A [batch, 2] and B [batch, 2], where B is also an initializer (zeros): a graph
    input with a default, which a request may leave out. SUM = A + B."""
    default_b = numpy_helper.from_array(np.zeros((1, 2), np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["SUM"])],
        "optional_input",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, ["batch", 2]),
        ],
        [helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["batch", 2])],
        initializer=[default_b],
    )
    return finish(graph)


def reshape_to_four() -> onnx.ModelProto:
    """FP32 X [batch, n] -> Y = X reshaped to [batch, 2, 2]: ONNX Runtime fails at run time
    unless n is 4."""
    shape = numpy_helper.from_array(np.array([0, 2, 2], np.int64), "SHAPE")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "SHAPE"], ["Y"])],
        "reshape_to_four",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2, 2])],
        initializer=[shape],
    )
    return finish(graph)


def unknown_operator() -> onnx.ModelProto:
    """A graph with an operator no ONNX Runtime has (domain "tritonfast.test")."""
    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["X"], ["Y"], domain="tritonfast.test")],
        "unknown_operator",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("tritonfast.test", 1)],
    )
    model.ir_version = 8
    return model


def control_echo() -> onnx.ModelProto:
    """A sequence model's controls given back: X [batch, 1] FP32 -> X_OUT, START and READY
    [batch, 1] INT32 -> START_OUT and READY_OUT, CORRID [batch, 1] UINT64 -> CORR."""
    pairs = [("X", "X_OUT"), ("START", "START_OUT"), ("READY", "READY_OUT"), ("CORRID", "CORR")]
    types = {"X": TensorProto.FLOAT, "START": TensorProto.INT32, "READY": TensorProto.INT32}

    def value(name: str, elem: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["batch", 1])

    graph = helper.make_graph(
        [helper.make_node("Identity", [a], [b]) for a, b in pairs],
        "control_echo",
        [value(a, types.get(a, TensorProto.UINT64)) for a, _ in pairs],
        [value(b, types.get(a, TensorProto.UINT64)) for a, b in pairs],
    )
    return finish(graph)


def accumulator() -> onnx.ModelProto:
    """A running sum for the sequence batcher's implicit state: X and SUM_IN [batch, 1] FP32
    -> SUM = X + SUM_IN and SUM_OUT = SUM; CORRID [batch, 1] UINT64 (its control) comes back
    as CORR."""
    nodes = [
        helper.make_node("Add", ["X", "SUM_IN"], ["SUM"]),
        helper.make_node("Identity", ["SUM"], ["SUM_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORR"]),
    ]

    def value(name: str, elem: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["batch", 1])

    graph = helper.make_graph(
        nodes,
        "accumulator",
        [
            value("X", TensorProto.FLOAT),
            value("SUM_IN", TensorProto.FLOAT),
            value("CORRID", TensorProto.UINT64),
        ],
        [
            value("SUM", TensorProto.FLOAT),
            value("SUM_OUT", TensorProto.FLOAT),
            value("CORR", TensorProto.UINT64),
        ],
    )
    return finish(graph)
