"""PyTriton programs (tests/pytriton_programs) run with only their imports rewritten: each
server runs as its own process on free ports (PyTriton's PYTRITON_TRITON_CONFIG_* variables),
its client in another, which must finish with "ok". With PYTRITON_PYTHON set to a Python that
has nvidia-pytriton, the unchanged programs run under PyTriton as well."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_ports

PROGRAMS = ROOT / "tests" / "pytriton_programs"
NAMES = ["add_sub", "optional", "identity", "multiple_models", "params", "vertex_ai", "remote_mode"]
PYTRITON_PYTHON = os.environ.get("PYTRITON_PYTHON", "")


def rewritten(source: Path, target: Path) -> Path:
    text = re.sub(r"(from|import) pytriton\.", r"\1 tritonfast.pytriton.", source.read_text())
    target.write_text(text)
    return target


def run_pair(
    python: str,
    server: Path,
    client: Path,
    log: Path,
    clean_exit: bool = True,
    remote: Path | None = None,
) -> None:
    """Run ``server`` (and ``remote``, a process binding to it), then ``client``."""
    http, grpc, metrics, vertex = free_ports(4)
    env = {
        **os.environ,
        "PYTRITON_TRITON_CONFIG_HTTP_PORT": str(http),
        "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(grpc),
        "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(metrics),
        "PYTRITON_TRITON_CONFIG_VERTEX_AI_PORT": str(vertex),
        "URL": f"http://127.0.0.1:{http}",
        "VERTEX_URL": f"http://127.0.0.1:{vertex}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with log.open("w") as output:
        process = subprocess.Popen(
            [python, str(server)], stdout=output, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
        helper = None
        if remote is not None:
            helper = subprocess.Popen(
                [python, str(remote)], stdout=output, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )
        try:
            answer = subprocess.run(
                [python, str(client)],
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
                timeout=180,
            )
        finally:
            if helper is not None:
                helper.send_signal(signal.SIGINT)
                try:
                    helper_code = helper.wait(60)
                except subprocess.TimeoutExpired:
                    helper.kill()
                    helper_code = helper.wait()
            process.send_signal(signal.SIGINT)  # Ctrl-C, which both servers take as stop
            try:
                code = process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
    assert answer.returncode == 0 and answer.stdout.strip().endswith("ok"), (
        f"client: {answer.stdout}{answer.stderr}\nserver log:\n{log.read_text()}"
    )
    if clean_exit:
        assert code == 0, f"server exited with {code}:\n{log.read_text()}"
        if helper is not None:
            assert helper_code == 0, f"the remote exited with {helper_code}:\n{log.read_text()}"


@pytest.mark.parametrize("name", NAMES)
def test_pytriton_program_runs_with_its_imports_rewritten(name: str, tmp_path: Path) -> None:
    server = rewritten(PROGRAMS / f"{name}_server.py", tmp_path / "server.py")
    client = rewritten(PROGRAMS / f"{name}_client.py", tmp_path / "client.py")
    remote = None
    if (PROGRAMS / f"{name}_remote.py").exists():
        remote = rewritten(PROGRAMS / f"{name}_remote.py", tmp_path / "remote.py")
    run_pair(sys.executable, server, client, tmp_path / "server.log", remote=remote)


# PyTriton 0.7.0's remote mode needs the access token its server generates, which a separate
# program cannot know: that pair runs under tritonfast only.
@pytest.mark.skipif(not PYTRITON_PYTHON, reason="PYTRITON_PYTHON (a Python with PyTriton) not set")
@pytest.mark.parametrize("name", [n for n in NAMES if n != "remote_mode"])
def test_the_same_program_runs_under_pytriton(name: str, tmp_path: Path) -> None:
    run_pair(
        PYTRITON_PYTHON,
        PROGRAMS / f"{name}_server.py",
        PROGRAMS / f"{name}_client.py",
        tmp_path / "server.log",
        clean_exit=False,  # PyTriton's exit status after Ctrl-C is not ours to check
    )
