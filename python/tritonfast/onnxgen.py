"""Small ONNX models built with ``onnx.helper`` (the ``onnx`` package): the TensorRT
self-check builds its engine from one, and the tests and benchmarks serve them.

Weights come from a seeded generator, so a model is the same on every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# An opset every onnxruntime since 1.16 and TensorRT 10 run.
OPSET = 17
IR_VERSION = 8


def _onnx() -> Any:
    import onnx

    return onnx


def finish(graph: Any) -> Any:
    """A checked ``ModelProto`` of ``graph``."""
    onnx = _onnx()
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def write_onnx(repository: Path, name: str, model: Any, config: str | None = None) -> Path:
    """Save ``model`` as ``repository/name/1/model.onnx`` (with ``config`` as its
    config.pbtxt when given); returns the model file's path."""
    version_dir = repository / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / "model.onnx"
    _onnx().save(model, str(path))
    if config is not None:
        (repository / name / "config.pbtxt").write_text(config)
    return path


def mlp(inputs: int = 16, hidden: int = 32, outputs: int = 8, seed: int = 0) -> Any:
    """FP32 INPUT [batch, inputs] -> Relu(INPUT @ W1 + b1) @ W2 + b2 -> OUTPUT [batch, outputs],
    the batch dimension symbolic ("batch")."""
    onnx = _onnx()
    helper, numpy_helper, float32 = onnx.helper, onnx.numpy_helper, onnx.TensorProto.FLOAT
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.standard_normal((inputs, hidden), np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(hidden, np.float32), "B1"),
        numpy_helper.from_array(rng.standard_normal((hidden, outputs), np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal(outputs, np.float32), "B2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["INPUT", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "B1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
        helper.make_node("Add", ["h3", "B2"], ["OUTPUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("INPUT", float32, ["batch", inputs])],
        [helper.make_tensor_value_info("OUTPUT", float32, ["batch", outputs])],
        initializer=weights,
    )
    return finish(graph)
