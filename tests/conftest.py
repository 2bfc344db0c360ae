"""Shared fixtures: a real tritonfast server process on free ports."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "python" / "tritonfast" / "examples" / "models"
TEST_MODELS = ROOT / "tests" / "models"
BROKEN_MODELS = ROOT / "tests" / "models_broken"


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports. The sockets stay open until all are picked, so the
    kernel cannot hand out one port twice."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class RunningServer:
    proc: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    log_file: IO[str]

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_exit(self, timeout: float = 60) -> int:
        """Wait for a server that exits by itself (e.g. refusing to start)."""
        try:
            return self.proc.wait(timeout)
        finally:
            self.log_file.close()

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.log_file.close()


PORT_TAKEN = "address already in use"


def start_server(
    repositories: list[Path],
    log_path: Path,
    *extra: str,
    wait_ready: bool = True,
    pythonpath: tuple[Path, ...] = (),
    new_session: bool = False,
    launcher: tuple[str, ...] = (),
) -> RunningServer:
    """Start ``python -m tritonfast serve`` and wait (bounded) until it answers /v2/health/live.
    ``pythonpath``: folders the server's interpreter finds modules in first. ``new_session``:
    the server leads a process group of its own (with its workers), which a test may signal.
    ``launcher``: a command that sets something up and then execs the server's command line,
    given as its arguments (so that the server keeps the launcher's process id).

    A free port can still be taken by some other socket between picking it and the server
    binding it; a server that exits for that reason is started again on fresh ports."""
    for attempt in range(3):
        server = _launch(repositories, log_path, extra, pythonpath, new_session, launcher)
        if not wait_ready:
            return server
        try:
            _wait_live(server)
            return server
        except _ExitedEarly as exited:
            if PORT_TAKEN not in exited.log or attempt == 2:
                raise RuntimeError(
                    f"server exited with {server.proc.returncode}:\n{exited.log}"
                ) from None
    raise AssertionError("unreachable")


class _ExitedEarly(Exception):
    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


def _launch(
    repositories: list[Path],
    log_path: Path,
    extra: tuple[str, ...],
    pythonpath: tuple[Path, ...],
    new_session: bool,
    launcher: tuple[str, ...] = (),
) -> RunningServer:
    http, grpc, metrics = free_ports(3)
    cmd = [*launcher, sys.executable, "-m", "tritonfast", "serve"]
    for repo in repositories:
        cmd += ["--model-repository", str(repo)]
    cmd += [
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        # Options for every server the suite starts (e.g. to run it on another request path).
        *shlex.split(os.environ.get("TRITONFAST_TEST_SERVER_OPTIONS", "")),
        *extra,
    ]
    env = os.environ.copy()
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(
            [*map(str, pythonpath), *filter(None, [env.get("PYTHONPATH")])]
        )
    log_file = log_path.open("w")
    proc = subprocess.Popen(
        cmd,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=new_session,
    )
    return RunningServer(proc, http, grpc, metrics, log_path, log_file)


def _wait_live(server: RunningServer) -> None:
    deadline = time.monotonic() + 60
    while True:
        if server.proc.poll() is not None:
            server.log_file.close()
            raise _ExitedEarly(server.log())
        try:
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=1):
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"server did not come up:\n{server.log()}") from None
            time.sleep(0.05)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    running = start_server([EXAMPLES, TEST_MODELS], log_path)
    yield running
    code = running.stop()
    assert code == 0, f"server exited with {code}:\n{running.log()}"
