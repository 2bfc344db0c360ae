"""Generated protobuf and gRPC code for tritonfast's own ``protos/*.proto``.

Regenerate with ``python scripts/gen_protos.py`` (never edit the ``*_pb2*`` files by hand).
The messages live in a private descriptor pool (:mod:`tritonfast._proto._pool`), so they
are distinct classes from tritonclient's wire-identical ones: convert with
``SerializeToString()`` / ``FromString()``.
"""
