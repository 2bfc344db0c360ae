"""Where Triton-mode traces are written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tritonfast.tracing import Tracer, parse_trace_config


def test_traces_with_a_log_frequency_but_no_file_are_never_written_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tracer = Tracer(parse_trace_config(["level=TIMESTAMPS", "rate=1", "log-frequency=1"]))
    for _ in range(3):
        trace = tracer.start("m", 1, "r")
        assert trace is not None
        tracer.finish(trace)
    tracer.flush()
    assert os.listdir(tmp_path) == []


def test_numbered_files_follow_the_log_frequency(tmp_path: Path) -> None:
    file = tmp_path / "trace.json"
    tracer = Tracer(
        parse_trace_config(["level=TIMESTAMPS", "rate=1", "log-frequency=2", f"file={file}"])
    )
    for _ in range(4):
        trace = tracer.start("m", 1, "r")
        assert trace is not None
        tracer.finish(trace)
    assert sorted(os.listdir(tmp_path)) == ["trace.json.0", "trace.json.1"]
