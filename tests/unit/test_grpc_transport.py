"""grpcio's I/O path is chosen as grpcio starts (``tritonfast.frontends.grpc.transport``).

Each case runs in a fresh interpreter: the choice only means something at the process's first
``import grpc``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHOICE = """
import os
{before}
from tritonfast.frontends.grpc.transport import start_grpcio
print(start_grpcio(), repr(os.environ.get("GRPC_EXPERIMENTS")))
"""

# A grpcio server in this process answers 2000 calls of 100 kB from a child process; prints the
# share of this process's CPU time that grpcio's EventEngine threads used.
EVENT_ENGINE_SHARE = """
import os, subprocess, sys
from concurrent import futures
{start}
import grpc

def ticks():
    per_thread = {{}}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{{tid}}/comm") as f:
            name = f.read().strip()
        with open(f"/proc/self/task/{{tid}}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        per_thread[tid] = (name, int(fields[11]) + int(fields[12]))
    return per_thread

echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("E", {{"M": echo}}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
before = ticks()
client = (
    "import grpc; call = grpc.insecure_channel('127.0.0.1:%d').unary_unary('/E/M')\\n"
    "for _ in range(2000): call(bytes(100000))" % port
)
subprocess.run([sys.executable, "-c", client], check=True, env={{"PATH": os.environ["PATH"]}})
after = ticks()
used = {{t: after[t][1] - before.get(t, ("", 0))[1] for t in after}}
engine = sum(n for t, n in used.items() if after[t][0] == "event_engine")
print(engine / max(1, sum(used.values())))
"""


def _run(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environment.update(env)
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]


def test_a_fresh_process_starts_grpcio_with_polled_connections_and_leaves_no_trace() -> None:
    # The variable is gone again: processes the server starts later inherit nothing of ours.
    assert _run(CHOICE.format(before="")) == "polled None"


@pytest.mark.parametrize("chosen", ["", "-event_engine_client", "event_engine_listener"])
def test_the_users_own_grpc_experiments_are_used_as_they_are(chosen: str) -> None:
    assert _run(CHOICE.format(before=""), GRPC_EXPERIMENTS=chosen) == f"user {chosen!r}"


def test_a_process_that_already_started_grpcio_keeps_its_default() -> None:
    # Setting the variable now would not reach grpcio's core; it must not pretend to.
    assert _run(CHOICE.format(before="import grpc")) == "already started None"


def test_grpcio_core_takes_the_choice_its_event_engine_threads_stop_reading() -> None:
    start = "from tritonfast.frontends.grpc.transport import start_grpcio; start_grpcio()"
    polled = float(_run(EVENT_ENGINE_SHARE.format(start=start)))
    default = float(_run(EVENT_ENGINE_SHARE.format(start="")))
    # Measured here: ~0.23 by default, 0.0 polled (CPU ticks are 10 ms, so allow a few).
    assert default > 0.08, default
    assert polled < default / 3, (polled, default)
