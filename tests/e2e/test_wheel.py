"""The built wheel (``make wheel``, dist/) installs into a fresh virtual environment of each
CPython from 3.10 to 3.13 found here (``python3.X`` on PATH, or a pyenv version), whose PATH
holds no Rust toolchain, and the server it installs serves the bundled examples to the real
tritonclient, and its ``tritonfast perf`` measures them. CI builds the wheel before the
tests; elsewhere, without one in dist/, the test says so and skips, as it does for a Python
version that is not installed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ROOT, free_ports
from tests.waiting import wait_for

DIST = ROOT / "dist"


def _the_wheel() -> Path:
    wheels = sorted(DIST.glob("tritonfast-*-abi3-*manylinux*.whl"))
    if not wheels:
        pytest.skip("no wheel in dist/: `make wheel` builds it (make ci does)")
    return wheels[-1]


def _interpreter(minor: int) -> str:
    """A CPython 3.``minor`` that runs here, or a skip."""
    candidates = [shutil.which(f"python3.{minor}")]
    if shutil.which("pyenv"):
        listed = subprocess.run(
            ["pyenv", "versions", "--bare"], capture_output=True, text=True, check=False
        ).stdout.split()
        for version in listed:
            if version.startswith(f"3.{minor}.") and version.replace(".", "").isdigit():
                prefix = subprocess.run(
                    ["pyenv", "prefix", version], capture_output=True, text=True, check=False
                ).stdout.strip()
                candidates.append(str(Path(prefix) / "bin" / f"python3.{minor}"))
    for candidate in candidates:
        if candidate is None:
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv; print(sys.version_info[1])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == str(minor):
            return candidate
    pytest.skip(f"no Python 3.{minor} here")


def _ready(client: httpclient.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_ready())
    except Exception:  # not listening yet
        return False


@pytest.mark.parametrize("minor", [10, 11, 12, 13], ids=lambda m: f"3.{m}")
def test_the_wheel_installs_and_serves_without_rust(tmp_path: Path, minor: int) -> None:
    wheel = _the_wheel()
    environment = tmp_path / "venv"
    subprocess.run([_interpreter(minor), "-m", "venv", str(environment)], check=True)
    python = environment / "bin" / "python"
    # No cargo, no rustc: only the new environment and the system's own programs.
    path = f"{environment / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    env = {**os.environ, "PATH": path, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--only-binary=:all:", str(wheel)],
        env=env,
        check=True,
        timeout=600,
    )
    installed = time.monotonic()
    http, grpc, metrics = free_ports(3)
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [
            str(python),
            "-m",
            "tritonfast",
            "serve",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
        ],
        env=env,
        cwd=tmp_path,  # not the checkout: the installed package must be the one imported
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    try:
        wait_for(lambda: server.poll() is not None or _ready(client), "the server to be ready")
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        ready = time.monotonic()
        values = np.arange(4, dtype=np.float32)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = httpclient.InferInput(name, [4], "FP32")
            tensor.set_data_from_numpy(values)
            inputs.append(tensor)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * values)
        where = subprocess.run(
            [str(python), "-c", "import tritonfast, sys; print(tritonfast.__file__)"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert where.startswith(str(environment)), where
        # The load generator comes with the wheel too (its engine is in the same extension).
        measured = subprocess.run(
            [
                *(str(python), "-m", "tritonfast", "perf", "-m", "add_sub"),
                *("-u", f"127.0.0.1:{http}", "--request-count", "50"),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert measured.returncode == 0, measured.stderr
        assert "Concurrency: 1, throughput:" in measured.stdout, measured.stdout
    finally:
        client.close()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
        log.close()
    assert code == 0, (tmp_path / "server.log").read_text()
    print(  # what the closing figures quote: -s shows it
        f"\nwheel {wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB; pip install"
        f" {installed - started:.1f} s, then ready in {ready - installed:.1f} s"
        f" (Python 3.{minor})",
        file=sys.stderr,
    )
