"""What the fault-injection tests (``tests/e2e/test_faults_*.py``) share: how hard they push,
and a census of what the server holds (descriptors, processes, memory), to check it stays flat.

``FAULT_SCALE`` (an environment variable, 1 by default) multiplies every fault count: CI runs
the short version; ``FAULT_SCALE=20`` is the long one bench/README.md reports. Each test
prints what it measured as one ``FAULT`` line (``pytest -s`` shows them).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCALE = max(1, int(os.environ.get("FAULT_SCALE", "1")))


def report(test: str, **figures: object) -> None:
    """One line of what a fault test measured."""
    print(f"FAULT {test} (scale {SCALE}): " + ", ".join(f"{k} {v}" for k, v in figures.items()))


@dataclass(frozen=True)
class Census:
    """What a server process holds at one moment."""

    descriptors: int
    processes: int  # its descendants: the fork server and the workers
    rss_mib: float

    def __str__(self) -> str:
        return (
            f"{self.descriptors:+d} descriptors, {self.processes:+d} processes,"
            f" {self.rss_mib:+.1f} MiB"
        )

    def grew_by(self, before: Census) -> Census:
        return Census(
            self.descriptors - before.descriptors,
            self.processes - before.processes,
            self.rss_mib - before.rss_mib,
        )


def census(pid: int) -> Census:
    return Census(len(os.listdir(f"/proc/{pid}/fd")), len(descendants(pid)), rss_mib(pid))


def settled_growth(
    pid: int, before: Census, within: Callable[[Census], bool], timeout: float = 10
) -> Census:
    """What the server holds more than ``before`` once that is ``within`` bounds: a census
    may catch a worker starting (its pipe and channel open at both ends for a moment), which
    settles; a leak does not, and the last census comes back for the test to fail on."""
    deadline = time.monotonic() + timeout
    while True:
        grew = census(pid).grew_by(before)
        if within(grew) or time.monotonic() >= deadline:
            return grew
        time.sleep(0.01)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def server_sockets(pid: int, port: int) -> int:
    """The TCP connections the server holds on ``port`` (listening socket excluded), in any
    state: a connection whose client left but whose request was never answered stays here
    (CLOSE-WAIT)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] != "0A" and fields[9] in inodes:  # 0A: LISTEN
                count += 1
    return count


class Calls:
    """Calls running at once, each on a thread of its own (a client waiting for its answer)."""

    def __init__(self, calls: list[Callable[[], Any]]) -> None:
        self._results: list[Any] = [None] * len(calls)
        self._threads = [
            threading.Thread(target=self._run, args=(i, call), daemon=True)
            for i, call in enumerate(calls)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int, call: Callable[[], Any]) -> None:
        try:
            self._results[index] = call()
        except Exception as exc:
            self._results[index] = exc

    def results(self, timeout: float) -> list[Any]:
        """Each call's result, or the exception it raised, once all are over; fails if some
        call is still waiting after ``timeout`` seconds (an answer never came)."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        waiting = sum(thread.is_alive() for thread in self._threads)
        assert not waiting, f"{waiting} of {len(self._threads)} calls got no answer in {timeout} s"
        return self._results
