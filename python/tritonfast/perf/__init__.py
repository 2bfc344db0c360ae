"""``tritonfast perf``: a load generator that takes perf_analyzer's flags and prints its report.

The requests are prepared once in Python (:mod:`.inputs`, :mod:`.payloads`); the load itself
runs on the Rust core's threads (``tritonfast._core.LoadRun``), and Python only reads the
answered requests' timestamps once per measurement window (:mod:`.measure`).
"""

from tritonfast.perf.cli import main

__all__ = ["main"]
