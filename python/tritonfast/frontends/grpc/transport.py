"""Which of grpcio's I/O paths our server's connections take; decided before grpcio starts.

grpcio's core (1.6x and later) accepts a server's connections through its EventEngine, whose
own threads then read and write every socket and pass each finished read to the thread that
waits on the completion queue (ours: :mod:`.core`). On two cores that is one thread wake-up
more per message in each direction, and the EventEngine threads compete with the loop and the
model for CPU. With the ``event_engine_listener`` experiment off, the core takes its older,
still supported path: our completion-queue thread polls the connections itself and reads a
request in the same thread that reports it. Measured on the identity model (``bench/README.md``,
"Session 11"): gRPC concurrency 1 ~5% faster, 4 MiB gRPC ~15% less server CPU per request,
concurrency 16 unchanged within noise.

The core reads ``GRPC_EXPERIMENTS`` once, when it starts (at the first ``import grpc`` of the
process), so :func:`prefer_polled_connections` runs when this package is imported, before any
of our modules imports grpc. A ``GRPC_EXPERIMENTS`` the user set, even empty, is left as it is;
so is a process that had already imported grpc (an embedding application), which keeps
grpcio's default. A grpcio release that no longer has the experiment logs "Unknown experiment:
event_engine_listener" once at start and runs its default; that is the sign to retire this.
"""

from __future__ import annotations

import os
import sys

EXPERIMENTS_VARIABLE = "GRPC_EXPERIMENTS"
POLLED_CONNECTIONS = "-event_engine_listener"


def prefer_polled_connections() -> bool:
    """Turn grpcio's EventEngine listener off for this process if that can still take effect
    and the user has not chosen; says whether it did."""
    if "grpc" in sys.modules or EXPERIMENTS_VARIABLE in os.environ:
        return False
    os.environ[EXPERIMENTS_VARIABLE] = POLLED_CONNECTIONS
    return True
