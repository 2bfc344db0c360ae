"""The start-up sweep of files left by server processes that are gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tritonfast.memory import leftovers


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def test_sweep_removes_what_dead_processes_left_and_keeps_the_rest(tmp_path: Path) -> None:
    shm, temp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    temp.mkdir()
    dead, alive = _dead_pid(), os.getpid()
    stale = [
        shm / f"tritonfast-in-3-{dead}-0",
        shm / f"tritonfast-cancel-0-{dead}-12",
        shm / f"tritonfast-out-{alive}-3-1-{dead}-4",  # a worker that died
        shm / f"tritonfast-body-{dead}-5",
    ]
    kept = [
        shm / f"tritonfast-in-3-{alive}-0",
        shm / f"tritonfast-body-{alive}-5",
        shm / "tritonfast-in-not-ours",
        shm / f"someone-else-{dead}-0",
    ]
    for path in stale + kept:
        path.write_bytes(b"x")
    stale_dirs = [temp / f"tritonfast-model-{dead}-abc", temp / f"tritonfast-bound-{dead}-x"]
    kept_dirs = [temp / f"tritonfast-model-{alive}-abc", temp / f"tritonfast-selfcheck-{dead}"]
    for directory in stale_dirs + kept_dirs:
        (directory / "m" / "1").mkdir(parents=True)
    assert leftovers.sweep(shm, temp) == len(stale) + len(stale_dirs)
    assert not any(path.exists() for path in stale + stale_dirs)
    assert all(path.exists() for path in kept + kept_dirs)


def test_temporary_directories_name_their_process() -> None:
    assert leftovers.temp_dir_prefix("model") == f"tritonfast-model-{os.getpid()}-"
