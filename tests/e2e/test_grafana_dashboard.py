"""The Grafana dashboard (deploy/grafana/tritonfast.json): a well-formed dashboard whose every
query names metrics and labels the server exports, checked against a real server's /metrics
after one request of each kind the panels show (plain, decoupled, cached, failed)."""

from __future__ import annotations

import json
import queue
import re
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, RunningServer, start_server
from tests.e2e.test_metrics import scrape

DASHBOARD = ROOT / "deploy" / "grafana" / "tritonfast.json"
# A metric name in a PromQL expression (every family the server exports starts with nv_).
_METRIC = re.compile(r"\b(nv_[a-z0-9_]+)")
# The labels a query groups or filters by: "by (a, b)" and "{a=~...}".
_BY = re.compile(r"by \(([^)]*)\)")
_SELECTOR = re.compile(r"\{([^}]*)\}")
_MATCHER = re.compile(r"([a-z_]+)\s*=~?")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries() -> list[str]:
    return [
        target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])
    ]


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    panels = board["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {variable["name"] for variable in board["templating"]["list"]}
    assert variables == {"datasource", "model"}
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], f"{panel['title']} queries nothing"
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server with a cached model, a plain one, a decoupled one and one that fails."""
    repository = tmp_path_factory.mktemp("dashboard_repository")
    shutil.copytree(ROOT / "tests" / "models" / "identity_fp32", repository / "cached")
    with (repository / "cached" / "config.pbtxt").open("a") as config:
        config.write("response_cache { enable: true }\n")
    shutil.copytree(ROOT / "tests" / "models" / "identity_fp32", repository / "identity_fp32")
    shutil.copytree(ROOT / "tests" / "models" / "raiser", repository / "raiser")
    shutil.copytree(
        ROOT / "tests" / "models_streaming" / "square_int32", repository / "square_int32"
    )
    server = start_server(
        [repository],
        tmp_path_factory.mktemp("dashboard") / "server.log",
        "--cache-config=local,size=1048576",
        "--metrics-config=histogram_latencies=true",
    )
    yield server
    assert server.stop() == 0, server.log()


def _one_of_each(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        values = np.ones((1, 4), np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(values)
        for model in ("identity_fp32", "cached", "cached"):  # a miss, then a hit
            client.infer(model, [tensor])
        one = httpclient.InferInput("INPUT0", [1], "FP32")
        one.set_data_from_numpy(np.ones(1, np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("raiser", [one])
    finally:
        client.close()
    stream = grpcclient.InferenceServerClient(server.grpc_url)
    replies: queue.Queue[Any] = queue.Queue()
    try:
        stream.start_stream(callback=lambda result, error: replies.put(error))
        count = grpcclient.InferInput("IN", [1], "INT32")
        count.set_data_from_numpy(np.array([2], np.int32))
        stream.async_stream_infer("square_int32", [count])
        assert [replies.get(timeout=30) for _ in range(2)] == [None, None]
        stream.stop_stream()
    finally:
        stream.close()


def test_every_metric_and_label_the_dashboard_queries_is_exported(served) -> None:
    _one_of_each(served)
    _, samples = scrape(served)
    exported: dict[str, set[str]] = {}
    for name, labels in samples:
        exported.setdefault(name, set()).update(label for label, _ in labels)
    for expr in queries():
        labels = {
            label.strip()
            for group in _BY.findall(expr)
            for label in group.split(",")
            if label.strip() not in ("", "le")
        }
        for selector in _SELECTOR.findall(expr):
            labels.update(_MATCHER.findall(selector))
        for metric in _METRIC.findall(expr):
            assert metric in exported, f"{metric} (queried by {expr!r}) is not on /metrics"
            assert labels <= exported[metric], (expr, metric, labels - exported[metric])
