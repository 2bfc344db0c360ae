"""Which gRPC engine serves: the ``core`` engine (:mod:`.core`), which drives grpcio's private
Cython layer, or grpc.aio, grpcio's public asyncio server.

The ``core`` engine depends on internals grpcio does not promise to keep
(``grpc._cython.cygrpc``), so the package pins grpcio to the minor versions it is tested with,
and the server checks at start-up that everything :mod:`.core` uses is there. If something is
missing (a grpcio outside the pinned range, installed anyway), it logs one warning and serves
gRPC with grpc.aio instead: slower, but the same service.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

log = logging.getLogger("tritonfast.grpc")

# What .core uses of grpc._cython.cygrpc (dotted: attributes of attributes).
CORE_REQUIREMENTS = (
    "CompletionQueue.poll",
    "CompletionQueue.shutdown",
    "CompletionType.queue_shutdown",
    "CompletionType.queue_timeout",
    "ReceiveCloseOnServerOperation",
    "ReceiveMessageOperation",
    "SendInitialMetadataOperation",
    "SendMessageOperation",
    "SendStatusFromServerOperation",
    "Server.add_http2_port",
    "Server.cancel_all_calls",
    "Server.destroy",
    "Server.register_completion_queue",
    "Server.request_call",
    "Server.shutdown",
    "Server.start",
    "StatusCode.cancelled",
    "StatusCode.ok",
    "StatusCode.unimplemented",
    "StatusCode.unknown",
)


def core_problem() -> str | None:
    """Why the ``core`` engine cannot run on the installed grpcio, or None if it can."""
    try:
        cygrpc = importlib.import_module("grpc._cython.cygrpc")
    except ImportError as error:
        return f"grpc._cython.cygrpc cannot be imported ({error})"
    missing = [name for name in CORE_REQUIREMENTS if not _has(cygrpc, name)]
    if missing:
        return f"grpc._cython.cygrpc lacks {', '.join(missing)}"
    return None


def choose(requested: str) -> str:
    """The engine to serve with: ``requested``, unless it is ``core`` and cannot run."""
    if requested != "core":
        return requested
    problem = core_problem()
    if problem is None:
        return "core"
    import grpc

    log.warning(
        "the 'core' gRPC engine cannot run on grpcio %s: %s; serving gRPC with grpc.aio",
        grpc.__version__,
        problem,
    )
    return "aio"


def _has(root: Any, dotted: str) -> bool:
    target = root
    for part in dotted.split("."):
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return True
