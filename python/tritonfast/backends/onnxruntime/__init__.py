"""The ``onnxruntime`` backend: ``model.onnx`` files served through ONNX Runtime, as Triton's
ONNX Runtime backend serves them (see docs/onnxruntime.md)."""
