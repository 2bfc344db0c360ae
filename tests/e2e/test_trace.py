"""The trace extension and Triton-mode trace files."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, ROOT, RunningServer, start_server

DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}
COMPUTE_ORDER = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


def add_sub(client: Any, module: Any, request_id: str = "") -> None:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
        tensors.append(tensor)
    client.infer("add_sub", tensors, request_id=request_id)


def start_traced(tmp_path: Path, *trace_config: str) -> RunningServer:
    """A server on the example models with these ``--trace-config`` values."""
    flags = [f"--trace-config={value}" for value in trace_config]
    return start_server([EXAMPLES], tmp_path / "server.log", *flags)


def traces(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Trace id -> {"model": head event, "stamps": [(name, ns)]}."""
    by_id: dict[int, dict[str, Any]] = {}
    for event in events:
        entry = by_id.setdefault(event["id"], {"stamps": []})
        if "timestamps" in event:
            entry["stamps"] += [(t["name"], t["ns"]) for t in event["timestamps"]]
        else:
            entry["model"] = event
    return by_id


def test_settings_defaults_and_errors(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.get_trace_settings() == DEFAULTS
        assert client.get_trace_settings(model_name="add_sub") == DEFAULTS
        for settings, status, message in (
            ({"trace_file": "/tmp/t.json"}, "501", "can not be updated through network"),
            ({"trace_level": ["OFF", "TIMESTAMPS"]}, "400", "only one trace level 'OFF'"),
            ({"trace_rate": "abc"}, "400", "Unable to parse 'trace_rate', got: abc"),
            ({"trace_count": "-2"}, "400", "Expecting value >= -1, got:-2"),
            ({"trace_level": ["TIMESTAMPS"]}, "400", "trace file name is not given"),
        ):
            with pytest.raises(InferenceServerException, match=message) as info:
                client.update_trace_settings(settings=settings)
            assert info.value.status() == status
        with pytest.raises(InferenceServerException, match="unknown model : nosuch"):
            client.get_trace_settings(model_name="nosuch")
    finally:
        client.close()


def test_traces_cover_every_stage(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_traced(
        tmp_path,
        f"triton,file={trace_file}",
        "level=TIMESTAMPS",
        "rate=1",
        "triton,log-frequency=1",
    )
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        settings = http.get_trace_settings()
        assert settings["trace_level"] == ["TIMESTAMPS"]
        assert settings["trace_file"] == str(trace_file)
        add_sub(http, httpclient, request_id="via-http")
        add_sub(grpc, grpcclient)
        deadline = time.monotonic() + 10
        while len(list(tmp_path.glob("trace.json.*"))) < 2:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        events = []
        for path in sorted(tmp_path.glob("trace.json.*")):
            events += json.loads(path.read_text())
        found = traces(events)
        assert len(found) == 2
        by_protocol = {}
        for trace in found.values():
            assert trace["model"]["model_name"] == "add_sub"
            assert trace["model"]["model_version"] == 1
            names = [name for name, _ in trace["stamps"]]
            protocol = "HTTP" if "HTTP_RECV_START" in names else "GRPC"
            by_protocol[protocol] = trace
            stamps = dict(trace["stamps"])
            ordered = [stamps[name] for name in COMPUTE_ORDER]
            assert ordered == sorted(ordered), trace["stamps"]
            assert stamps[f"{protocol}_SEND_END"] >= stamps["REQUEST_END"]
        assert by_protocol["HTTP"]["model"]["request_id"] == "via-http"
        assert "request_id" not in by_protocol["GRPC"]["model"]
        assert by_protocol["HTTP"]["stamps"][0][0] == "HTTP_RECV_START"
        # A model's own rate wins until it is reset to the global one.
        changed = http.update_trace_settings(model_name="add_sub", settings={"trace_rate": "5"})
        assert changed["trace_rate"] == "5"
        assert http.get_trace_settings()["trace_rate"] == "1"
        reset = grpc.update_trace_settings(
            model_name="add_sub", settings={"trace_rate": None}, as_json=True
        )
        assert reset["settings"]["trace_rate"]["value"] == ["1"]
    finally:
        http.close()
        grpc.close()
        assert server.stop() == 0


def test_without_log_frequency_the_file_is_written_at_shutdown(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_traced(
        tmp_path,
        f"triton,file={trace_file}",
        "level=TIMESTAMPS",
        "rate=2",
        "count=2",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for _ in range(8):  # one in two traced, at most two in all
            add_sub(client, httpclient)
        assert not trace_file.exists()
    finally:
        client.close()
        assert server.stop() == 0
    assert len(traces(json.loads(trace_file.read_text()))) == 2


def test_tensors_level_records_inputs_and_outputs(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_traced(
        tmp_path,
        f"triton,file={trace_file}",
        "level=TENSORS",
        "rate=1",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        add_sub(client, httpclient)
    finally:
        client.close()
        assert server.stop() == 0
    events = json.loads(trace_file.read_text())
    tensors = {(e["activity"], e["tensor"]["name"]): e["tensor"] for e in events if "tensor" in e}
    assert tensors[("TENSOR_QUEUE_INPUT", "INPUT0")] == {
        "name": "INPUT0",
        "data": "1,1,1,1",
        "shape": "4",
        "dtype": "FP32",
    }
    assert tensors[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == "2,2,2,2"
    assert ("TENSOR_BACKEND_OUTPUT", "OUTPUT1") in tensors
    assert not any("timestamps" in e for e in events)  # TIMESTAMPS was not asked for


def test_opentelemetry_export(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the opentelemetry extra is not installed")
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    received: list[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{collector.server_port}/v1/traces"
    server = start_traced(
        tmp_path,
        "mode=opentelemetry",
        f"opentelemetry,url={url}",
        "opentelemetry,resource=deployment=test",
        "level=TIMESTAMPS",
        "rate=1",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        add_sub(client, httpclient, request_id="otel-1")
    finally:
        client.close()
        assert server.stop() == 0, server.log()  # shutdown sends the batched spans
        collector.shutdown()
        collector.server_close()
    spans = []
    resources = []
    for body in received:
        message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in message.resource_spans:
            resources.append(
                {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            )
            for scope in resource_spans.scope_spans:
                spans.extend(scope.spans)
    assert len(spans) == 1
    span = spans[0]
    assert span.name == "InferRequest"
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["triton.model_name"].string_value == "add_sub"
    assert attributes["triton.request_id"].string_value == "otel-1"
    events = [event.name for event in span.events]
    assert events[0] == "HTTP_RECV_START"
    assert {"REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END"} <= set(events)
    assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    assert resources[0]["deployment"] == "test"
    assert resources[0]["service.name"] == "triton-inference-server"


def test_an_ensembles_steps_and_bls_calls_are_traced_as_its_children(tmp_path: Path) -> None:
    """As Triton 2.51 writes them (checked side by side): each step's trace head names the
    ensemble request's trace as ``parent_id``; a BLS call made with ``trace=request.trace()``
    does the same for the calling request's."""
    trace_file = tmp_path / "trace.json"
    flags = [f"--trace-config={v}" for v in (f"triton,file={trace_file}", "level=TIMESTAMPS")]
    server = start_server(
        [ROOT / "tests" / "models_ensemble", ROOT / "tests" / "models_streaming"],
        tmp_path / "server.log",
        *flags,
        "--trace-config=rate=1",
        pythonpath=(ROOT / "tests" / "plugins",),
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        values = httpclient.InferInput("IN", [1, 2], "INT32")
        values.set_data_from_numpy(np.array([[1, 2]], dtype=np.int32))
        client.infer("ens_batched", [values], request_id="ens")
        count = httpclient.InferInput("IN", [1], "INT32")
        count.set_data_from_numpy(np.array([2], dtype=np.int32))
        client.infer("bls_decoupled", [count], request_id="bls")
        client.infer("bls_decoupled_proc", [count], request_id="bls_proc")  # from a worker
    finally:
        client.close()
        assert server.stop() == 0
    heads = [e for e in json.loads(trace_file.read_text()) if "model_name" in e]
    ensemble = next(h for h in heads if h["model_name"] == "ens_batched")
    assert "parent_id" not in ensemble
    steps = [h for h in heads if h["model_name"] == "add_one"]
    assert len(steps) == 2 and all(h["parent_id"] == ensemble["id"] for h in steps)
    callers = [h for h in heads if h["model_name"] in ("bls_decoupled", "bls_decoupled_proc")]
    callees = [h for h in heads if h["model_name"] == "square_int32"]
    assert len(callers) == 2
    assert sorted(h["parent_id"] for h in callees) == sorted(h["id"] for h in callers)
