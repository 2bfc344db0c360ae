"""The ``tensorrt`` backend: ``model.plan`` engines run through the ``tensorrt`` Python API on
the GPU, device memory and streams through cuda-python (see docs/tensorrt.md)."""
