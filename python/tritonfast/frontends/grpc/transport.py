"""Which of grpcio's I/O paths the server's connections take; decided as grpcio starts.

grpcio's core (1.6x and later) accepts a server's connections through its EventEngine, whose
own threads then read and write every socket and pass each finished read to the thread that
waits on the completion queue (ours: :mod:`.core`). On two cores that is one thread wake-up
more per message in each direction, and the EventEngine threads compete with the loop and the
model for CPU. With the ``event_engine_listener`` experiment off, the core takes its older,
still supported path: our completion-queue thread polls the connections itself and reads a
request in the same thread that reports it. grpcio's list of experiments makes some others
depend on that one (``event_engine_callback_cq``, ``event_engine_for_all_other_endpoints``), so
they go off with it, for grpc clients in the server process too. Measured on the identity
model (``bench/README.md``, "gRPC with grpcio's EventEngine listener on and off"): gRPC
concurrency 1 ~8% faster, 4 MiB gRPC ~15% less
server CPU per request, concurrency 16 within this row's run-to-run spread.

The core reads ``GRPC_EXPERIMENTS`` once, as it starts (the first ``import grpc`` of the
process). So :func:`start_grpcio` runs before anything else can import grpc, models included,
and sets the variable only for that moment: processes the server starts later (model
workers, whatever a model runs) inherit the user's environment, not ours. A
``GRPC_EXPERIMENTS`` the user set, even empty, is used as it is. A grpcio release that no
longer has the experiment logs "Unknown experiment: event_engine_listener" once at start and
runs its default; that is the sign to retire this.
"""

from __future__ import annotations

import importlib
import os
import sys

EXPERIMENTS_VARIABLE = "GRPC_EXPERIMENTS"
POLLED_CONNECTIONS = "-event_engine_listener"


def start_grpcio() -> str:
    """Start grpcio's core, with polled connections unless the user chose otherwise or grpcio
    had already started. Returns which: ``"polled"``, ``"user"`` or ``"already started"``."""
    if "grpc" in sys.modules:
        return "already started"
    if EXPERIMENTS_VARIABLE in os.environ:
        importlib.import_module("grpc")
        return "user"
    os.environ[EXPERIMENTS_VARIABLE] = POLLED_CONNECTIONS
    try:
        importlib.import_module("grpc")
    finally:
        del os.environ[EXPERIMENTS_VARIABLE]
    return "polled"
