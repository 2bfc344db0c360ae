"""grpcio's I/O path is chosen before grpcio starts (``tritonfast.frontends.grpc.transport``).

Each case runs in a fresh interpreter: the choice only means something before the process's
first ``import grpc``, and it changes the process environment.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os, sys
{before}
import tritonfast.frontends.grpc.servicer
print(repr(os.environ.get("GRPC_EXPERIMENTS")))
"""


def _experiments_after_import(before: str = "", **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environment.update(env)
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]


def test_a_fresh_process_polls_connections_on_the_completion_queue_thread() -> None:
    assert _experiments_after_import() == repr("-event_engine_listener")


@pytest.mark.parametrize("chosen", ["", "-event_engine_client", "event_engine_listener"])
def test_the_users_own_grpc_experiments_are_kept(chosen: str) -> None:
    assert _experiments_after_import(GRPC_EXPERIMENTS=chosen) == repr(chosen)


def test_a_process_that_already_started_grpc_keeps_its_default() -> None:
    # Setting the variable now would not reach grpcio's core; it must not pretend to.
    assert _experiments_after_import(before="import grpc") == repr(None)
