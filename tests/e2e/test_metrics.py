"""Prometheus metrics on the metrics port: Triton's names, and numbers that match the requests.

The session's server is shared, so every check compares two scrapes around the requests it
sends (models used here get no other traffic while a test runs).
"""

from __future__ import annotations

import http.client
import queue
import re
import shutil
import threading
import time
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, ROOT, start_server

Sample = tuple[str, frozenset[tuple[str, str]]]
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(server: Any) -> tuple[str, dict[Sample, float]]:
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples: dict[Sample, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = _LINE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name, labels, value = match.groups()
        key = (name, frozenset(_LABEL.findall(labels or "")))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    return text, samples


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def add_sub_inputs(module: Any, batch: int = 0) -> list[Any]:
    shape = [4] if not batch else [batch, 4]
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, shape, "FP32")
        tensor.set_data_from_numpy(np.ones(shape, dtype=np.float32))
        tensors.append(tensor)
    return tensors


COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def test_families_and_help_texts_are_tritons(server: Any) -> None:
    text, samples = scrape(server)
    for name in (*COUNTERS, "nv_inference_request_failure"):
        assert f"# TYPE {name} counter\n" in text
    for name in (
        "nv_inference_pending_request_count",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
        "nv_pinned_memory_pool_total_bytes",
        "nv_pinned_memory_pool_used_bytes",
    ):
        assert f"# TYPE {name} gauge\n" in text
    assert (
        "# HELP nv_inference_count Number of inferences performed (does not include cached"
        " requests)\n" in text
    )
    for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED"):
        assert (
            "nv_inference_request_failure",
            frozenset({("model", "add_sub"), ("version", "1"), ("reason", reason)}),
        ) in samples
    assert 0.0 <= value(samples, "nv_cpu_utilization") <= 1.0
    total = value(samples, "nv_cpu_memory_total_bytes")
    assert 0 < value(samples, "nv_cpu_memory_used_bytes") < total
    # No pinned pool here: both zero, as a Triton without CUDA exports them.
    assert value(samples, "nv_pinned_memory_pool_total_bytes") == 0
    assert value(samples, "nv_pinned_memory_pool_used_bytes") == 0


def test_counters_match_the_requests_sent(server: Any) -> None:
    _, before = scrape(server)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for _ in range(3):
            http.infer("add_sub", add_sub_inputs(httpclient))
        for _ in range(2):
            grpc.infer("add_sub", add_sub_inputs(grpcclient))
        # A batched model: batch sizes add up in nv_inference_count.
        batch = np.ones((3, 4), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [3, 4], "FP32")
        tensor.set_data_from_numpy(batch)
        grpc.infer("identity_fp32", [tensor])
        # A bad request never reaches the model: Triton counts it nowhere.
        with pytest.raises(InferenceServerException):
            http.infer("add_sub", add_sub_inputs(httpclient)[:1])
    finally:
        http.close()
        grpc.close()
    _, after = scrape(server)

    def delta(name: str, model: str) -> float:
        labels = {"model": model, "version": "1"}
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("nv_inference_request_success", "add_sub") == 5
    assert delta("nv_inference_count", "add_sub") == 5
    assert delta("nv_inference_exec_count", "add_sub") == 5
    assert delta("nv_inference_request_success", "identity_fp32") == 1
    assert delta("nv_inference_count", "identity_fp32") == 3
    assert delta("nv_inference_exec_count", "identity_fp32") == 1
    for name in COUNTERS[3:]:
        assert delta(name, "add_sub") >= 0
    assert delta("nv_inference_request_duration_us", "add_sub") > 0
    assert delta("nv_inference_request_duration_us", "add_sub") >= delta(
        "nv_inference_compute_infer_duration_us", "add_sub"
    )
    for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED"):
        labels = {"model": "add_sub", "version": "1", "reason": reason}
        assert value(after, "nv_inference_request_failure", **labels) == value(
            before, "nv_inference_request_failure", **labels
        )


def test_model_errors_count_as_backend_failures(server: Any) -> None:
    labels = {"model": "raiser", "version": "1", "reason": "BACKEND"}
    _, before = scrape(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        for _ in range(2):
            with pytest.raises(InferenceServerException, match="raiser always fails"):
                client.infer("raiser", [tensor])
    finally:
        client.close()
    _, after = scrape(server)
    failures = value(after, "nv_inference_request_failure", **labels)
    assert failures - value(before, "nv_inference_request_failure", **labels) == 2
    success = {"model": "raiser", "version": "1"}
    assert value(after, "nv_inference_request_success", **success) == value(
        before, "nv_inference_request_success", **success
    )


def test_pending_requests_are_a_gauge(server: Any) -> None:
    # sleeper: 4 instances, 0.5 s per execution; 8 requests at once leave 4 waiting.
    def one() -> None:
        local = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            tensor = grpcclient.InferInput("X", [1], "INT32")
            tensor.set_data_from_numpy(np.zeros(1, dtype=np.int32))
            local.infer("sleeper", [tensor])
        finally:
            local.close()

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    seen = 0.0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and seen < 1:
        _, samples = scrape(server)
        seen = value(samples, "nv_inference_pending_request_count", model="sleeper", version="1")
        time.sleep(0.02)
    for thread in threads:
        thread.join(30)
    assert seen >= 1
    _, samples = scrape(server)
    assert value(samples, "nv_inference_pending_request_count", model="sleeper", version="1") == 0


@pytest.mark.parametrize("model", ["custom_metrics", "custom_metrics_proc"])
def test_custom_metrics_from_a_model(server: Any, model: str) -> None:
    # custom_metrics_proc runs in two worker processes: their series add up.
    client = httpclient.InferenceServerClient(server.http_url)
    labels = {"model": model, "version": "1"}
    try:
        _, before = scrape(server)
        seen = []
        for number in (0.25, 2.0, 20.0, 1.0):
            tensor = httpclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.array([number], dtype=np.float32))
            seen.append(float(client.infer(model, [tensor]).as_numpy("SEEN")[0]))
    finally:
        client.close()
    text, after = scrape(server)
    previous = before.get(("tf_test_requests", frozenset(labels.items())), 0.0)
    # The counter's value() as the model read it: the count over both workers, as /metrics.
    assert seen == [previous + 1, previous + 2, previous + 3, previous + 4]
    assert "# HELP tf_test_requests Requests seen by the model\n" in text
    assert "# TYPE tf_test_requests counter\n" in text
    assert "# TYPE tf_test_values histogram\n" in text
    assert value(after, "tf_test_requests", **labels) - previous == 4
    if model == "custom_metrics":  # a gauge of two workers shows one of their values
        assert value(after, "tf_test_last_value", **labels) == 1.0
    buckets = {
        le: value(after, "tf_test_values_bucket", **labels, le=le)
        for le in ("0.5", "1", "10", "+Inf")
    }
    assert buckets["+Inf"] == value(after, "tf_test_values_count", **labels)
    assert buckets["0.5"] <= buckets["1"] <= buckets["10"] <= buckets["+Inf"]
    count_before = before.get(("tf_test_values_count", frozenset(labels.items())), 0.0)
    assert value(after, "tf_test_values_count", **labels) - count_before == 4
    assert f'tf_test_values_bucket{{model="{model}",version="1",le="0.5"}}' in text


def test_latency_summaries_when_configured(server: Any, tmp_path: Any) -> None:
    _, default = scrape(server)
    assert not any(name.endswith("_summary_us_count") for name, _ in default)
    summarized = start_server(
        [EXAMPLES], tmp_path / "server.log", "--metrics-config=summary_latencies=true"
    )
    client = httpclient.InferenceServerClient(summarized.http_url)
    try:
        for _ in range(5):
            client.infer("add_sub", add_sub_inputs(httpclient))
        text, samples = scrape(summarized)
    finally:
        client.close()
        assert summarized.stop() == 0
    labels = {"model": "add_sub", "version": "1"}
    for name in (
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
    ):
        assert f"# TYPE {name} summary\n" in text
        assert value(samples, name + "_count", **labels) == 5
        quantiles = [value(samples, name, **labels, quantile=q) for q in QUANTILES]
        assert quantiles == sorted(quantiles)
        assert quantiles[-1] <= value(samples, name + "_sum", **labels)
    request_median = value(samples, "nv_inference_request_summary_us", **labels, quantile="0.5")
    assert request_median > 0
    idle = value(
        samples,
        "nv_inference_request_summary_us",
        model="string_upper",
        version="1",
        quantile="0.5",
    )
    assert idle != idle  # NaN: no request in the window
    assert 'nv_inference_request_summary_us{model="add_sub",version="1",quantile="0.5"}' in text


def test_first_response_histograms_for_decoupled_models(server: Any, tmp_path: Any) -> None:
    """``histogram_latencies=true``: nv_inference_first_response_histogram_ms for decoupled
    models only, with Triton's default buckets or the model's ``model_metrics`` override;
    ``generate_stream``'s requests, whose events the core writes, count too. The time is the
    first response's, not the last's (a gRPC stream's replies the core queues on the call)."""
    _, default = scrape(server)
    assert not any(name.startswith(FIRST_RESPONSE) for name, _ in default)
    repository = tmp_path / "models"
    for name in ("repeat_py", "repeat_buckets"):
        shutil.copytree(STREAMING / "repeat_py", repository / name)
    shutil.copytree(STREAMING / "repeat_example", repository / "repeat_example")
    with (repository / "repeat_buckets" / "config.pbtxt").open("a") as config:
        config.write(
            "model_metrics { metric_control: [ { metric_identifier: { family:"
            f' "{FIRST_RESPONSE}" }} histogram_options: {{ buckets: [ 0.5, 2.5 ] }} }} ] }}\n'
        )
    histograms = start_server(
        [EXAMPLES, repository], tmp_path / "server.log", "--metrics-config=histogram_latencies=true"
    )
    client = grpcclient.InferenceServerClient(histograms.grpc_url)
    try:
        done: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: done.put(error))
        for model in ("repeat_py", "repeat_py", "repeat_py", "repeat_buckets"):
            values = grpcclient.InferInput("IN", [2], "INT32")
            values.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
            client.async_stream_infer(model, [values])
        # Two responses, the second 500 ms after the first.
        inputs = [
            grpcclient.InferInput("IN", [2], "INT32"),
            grpcclient.InferInput("DELAY", [2], "UINT32"),
            grpcclient.InferInput("WAIT", [1], "UINT32"),
        ]
        for tensor, data in zip(inputs, ([1, 2], [0, 500], [0]), strict=True):
            tensor.set_data_from_numpy(np.array(data, dtype=tensor.datatype().lower()))
        client.async_stream_infer("repeat_example", inputs)
        assert [done.get(timeout=30) for _ in range(10)] == [None] * 10
        client.stop_stream()
        host, port = histograms.http_url.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("POST", "/v2/models/repeat_py/generate_stream", b'{"IN": [1, 2]}')
        events = connection.getresponse().read()
        connection.close()
        assert events.count(b"data: ") == 2
        text, samples = scrape(histograms)
    finally:
        client.close()
        assert histograms.stop() == 0
    assert f"# TYPE {FIRST_RESPONSE} histogram\n" in text
    labels = {"model": "repeat_py", "version": "1"}
    assert value(samples, FIRST_RESPONSE + "_count", **labels) == 4
    assert value(samples, FIRST_RESPONSE + "_sum", **labels) > 0
    buckets = [
        value(samples, FIRST_RESPONSE + "_bucket", **labels, le=le)
        for le in ("100", "500", "2000", "5000", "+Inf")
    ]
    assert buckets == sorted(buckets) and buckets[-1] == 4
    custom = {"model": "repeat_buckets", "version": "1"}
    assert value(samples, FIRST_RESPONSE + "_bucket", **custom, le="+Inf") == 1
    assert (FIRST_RESPONSE + "_bucket", frozenset({**custom, "le": "2.5"}.items())) in samples
    paced = {"model": "repeat_example", "version": "1"}
    assert value(samples, FIRST_RESPONSE + "_count", **paced) == 1
    assert value(samples, FIRST_RESPONSE + "_sum", **paced) < 250
    assert not any(
        name.startswith(FIRST_RESPONSE) and ("model", "add_sub") in labels_
        for name, labels_ in samples
    )


FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
STREAMING = ROOT / "tests" / "models_streaming"


QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")


def test_gpu_metrics_follow_the_hardware(server: Any) -> None:
    text, _ = scrape(server)
    try:
        import pynvml

        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
    except Exception:  # no NVML package, driver or device
        has_gpu = False
    assert ("# TYPE nv_gpu_utilization gauge\n" in text) == has_gpu
    assert ("# TYPE nv_gpu_memory_used_bytes gauge\n" in text) == has_gpu
