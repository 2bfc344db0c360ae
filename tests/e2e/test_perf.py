"""``tritonfast perf`` against the real server: perf_analyzer's report, CSV and profile export,
the counts the server saw, request rates kept, and clear errors for what cannot be measured."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.e2e.models_on_disk import write_model

# Short windows and a loose stability rule: the tests check what is measured and reported, not
# how steady the shared CI machine is.
QUICK = ["-p", "300", "-s", "1000"]
CSV_COLUMNS = [
    "Concurrency",
    "Inferences/Second",
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
]


def perf(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tritonfast", "perf", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def url(server, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


def successes(server, model: str) -> int:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"]
    finally:
        client.close()
    return sum(entry["inference_stats"]["success"]["count"] for entry in stats)


def figure(report: str, label: str) -> list[int]:
    """Every integer figure after ``label:`` in the report, level by level."""
    return [int(m) for m in re.findall(rf"{re.escape(label)}: (\d+)", report)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_concurrency_range_is_measured_and_reported(server, tmp_path: Path, protocol: str):
    before = successes(server, "add_sub")
    table = tmp_path / "perf.csv"
    done = perf(
        "-m", "add_sub", "-i", protocol, "-u", url(server, protocol),
        "--concurrency-range", "1:3:2", "-f", str(table), *QUICK,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = done.stdout
    assert "*** Measurement Settings ***" in report
    assert "Request concurrency: 1" in report and "Request concurrency: 3" in report
    time_label = "Avg gRPC time" if protocol == "grpc" else "Avg HTTP time"
    assert report.count(time_label) == 2
    assert re.search(r"Concurrency: 3, throughput: [\d.]+ infer/sec, latency \d+ usec", report)
    # Every request the report counts was answered with success by the server, and the server
    # says so too (it also saw those sent between windows).
    counted = figure(report, "Request count")
    served = figure(report, "Successful request count")
    assert len(counted) == 2 and all(count > 0 for count in counted)
    assert successes(server, "add_sub") - before >= sum(counted)
    assert all(abs(s - c) <= 3 + c // 20 for s, c in zip(served, counted, strict=True))

    with table.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == CSV_COLUMNS
    assert sorted(int(row[0]) for row in rows[1:]) == [1, 3]
    throughputs = [float(row[1]) for row in rows[1:]]
    assert throughputs == sorted(throughputs) and throughputs[0] > 0
    for row in rows[1:]:
        p50, p90, p95, p99 = map(int, row[9:13])
        assert 0 < p50 <= p90 <= p95 <= p99


def test_a_batch_size_multiplies_the_inferences(server):
    done = perf(
        "-m", "identity_fp32", "-u", server.http_url, "-b", "4", "--shape", "INPUT0:8", *QUICK
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [requests] = figure(done.stdout, "Successful request count")
    [inferences] = figure(done.stdout, "Inference count")
    assert requests > 0 and inferences == 4 * requests
    [client_requests] = figure(done.stdout, "Request count")
    throughput = float(re.search(r"Throughput: ([\d.]+) infer/sec", done.stdout).group(1))
    # Throughput counts inferences: four per request.
    assert throughput > 2 * client_requests / 3.0


@pytest.mark.parametrize("distribution", ["constant", "poisson"])
def test_a_request_rate_is_kept(server, distribution: str):
    done = perf(
        "-m", "add_sub", "-u", server.http_url, "--request-rate-range", "200",
        "--request-distribution", distribution, "-p", "1000", "-s", "1000",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Request Rate: 200 inference requests per second" in done.stdout
    kind = "poisson" if distribution == "poisson" else "uniform"
    assert f"Using {kind} distribution on request generation" in done.stdout
    throughput = float(re.search(r"Throughput: ([\d.]+) infer/sec", done.stdout).group(1))
    assert 160 <= throughput <= 240, done.stdout


def test_input_data_from_a_file_and_the_profile_export(server, tmp_path: Path):
    data = tmp_path / "data.json"
    data.write_text(
        json.dumps(
            {
                "data": [
                    {"INPUT0": {"content": ["alpha", "beta"], "shape": [2]}},
                    {"INPUT0": {"content": ["gamma"], "shape": [1]}},
                ]
            }
        )
    )
    export = tmp_path / "profile.json"
    done = perf(
        "-m", "identity_bytes", "-u", server.http_url, "--input-data", str(data),
        "--profile-export-file", str(export), "-v", *QUICK,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"Pass \[1\] throughput: [\d.]+ infer/sec\. Avg latency: \d+ usec", done.stdout
    )
    profile = json.loads(export.read_text())
    [experiment] = profile["experiments"]
    assert experiment["experiment"] == {"mode": "concurrency", "value": 1}
    boundaries = experiment["window_boundaries"]
    assert boundaries == sorted(boundaries) and len(boundaries) >= 6
    requests = experiment["requests"]
    assert len(requests) > 0
    for request in requests:
        [answered] = request["response_timestamps"]
        # A window holds the requests answered within it (some were sent before it began).
        assert request["timestamp"] <= answered
        assert request["request_inputs"]["INPUT0"] in (["alpha", "beta"], "gamma")
        assert boundaries[0] <= answered <= boundaries[-1]


def test_a_failing_model_fails_the_run_with_the_servers_words(server):
    done = perf("-m", "raiser", "-u", server.http_url, *QUICK)
    assert done.returncode == 1
    assert "requests failed" in done.stderr and "HTTP 500" in done.stderr, done.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unknown_model_is_named_in_the_error(server, protocol: str):
    done = perf("-m", "no_such_model", "-i", protocol, "-u", url(server, protocol))
    assert done.returncode == 1
    assert "no_such_model" in done.stderr and "error:" in done.stderr, done.stderr


def test_a_variable_shape_needs_a_shape_flag(server):
    done = perf("-m", "identity_fp32", "-u", server.http_url)
    assert done.returncode == 1
    assert "--shape INPUT0:<dims>" in done.stderr, done.stderr


def test_what_is_not_implemented_is_refused_by_name(server):
    done = perf("-m", "add_sub", "-u", server.http_url, "--fixed-schedule")
    assert done.returncode == 2
    assert "--fixed-schedule is not supported by tritonfast perf yet" in done.stderr


def test_a_server_that_is_not_there(tmp_path: Path):
    from tests.conftest import free_ports

    [port] = free_ports(1)
    done = perf("-m", "add_sub", "-u", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert f"cannot reach 127.0.0.1:{port}" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def stateful_server(tmp_path_factory):
    """A server of a sequence model, a decoupled model and one that wants a parameter."""
    from tests.conftest import ROOT, start_server

    repository = tmp_path_factory.mktemp("perf_models")
    for source in ("models_sequence/simple_sequence", "models_streaming/repeat_py"):
        shutil.copytree(ROOT / "tests" / source, repository / Path(source).name)
    write_model(repository, "needs_parameter", NEEDS_PARAMETER_CONFIG, NEEDS_PARAMETER_MODEL)
    running = start_server([repository], repository.parent / "server.log")
    yield running
    assert running.stop() == 0, running.log()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequences_run_whole_per_context(stateful_server, protocol: str):
    server = stateful_server
    before = successes(server, "simple_sequence")
    done = perf(
        "-m", "simple_sequence", "-i", protocol, "-u", url(server, protocol),
        "--concurrency-range", "3", "--sequence-length", "4", *QUICK,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [requests] = figure(done.stdout, "Request count")
    [sequences] = [int(m) for m in re.findall(r"Sequence count: (\d+) \(", done.stdout)]
    # Lengths of 4 give or take 20%: 3 to 5 requests a sequence.
    assert requests / 5 - 3 <= sequences <= requests / 3 + 3, done.stdout
    assert successes(server, "simple_sequence") - before >= requests


def test_a_decoupled_model_is_measured_on_streams(stateful_server, tmp_path: Path):
    server = stateful_server
    table = tmp_path / "perf.csv"
    done = perf(
        "-m", "repeat_py", "-i", "grpc", "-u", server.grpc_url, "--streaming",
        "--shape", "IN:3", "--concurrency-range", "2", "-f", str(table), *QUICK,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Detected decoupled model, using the first response for measuring latency" in done.stdout
    requests = float(re.search(r"    Throughput: ([\d.]+) infer/sec", done.stdout).group(1))
    responses = float(re.search(r"Response Throughput: ([\d.]+)", done.stdout).group(1))
    assert responses == pytest.approx(3 * requests, rel=0.01), done.stdout  # three per request
    with table.open() as f:
        header = next(csv.reader(f))
    assert header[:3] == ["Concurrency", "Inferences/Second", "Response Throughput"]


def test_what_a_model_needs_is_said(stateful_server):
    server = stateful_server
    done = perf("-m", "repeat_py", "-u", server.http_url, "--shape", "IN:3")
    assert done.returncode == 1
    assert "is decoupled: measure it on gRPC streams (-i grpc --streaming)" in done.stderr
    done = perf("-m", "repeat_py", "-u", server.http_url, "--streaming")
    assert done.returncode == 2 and "--streaming needs -i grpc" in done.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory_carries_the_tensors(server, protocol: str):
    done = perf(
        "-m", "add_sub", "-i", protocol, "-u", url(server, protocol),
        "--shared-memory", "system", "--output-shared-memory-size", "16", *QUICK,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert figure(done.stdout, "Successful request count")[0] > 0
    # The regions are gone from the server and from the machine once the run ends.
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.get_system_shared_memory_status() == []
    finally:
        client.close()
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith("tritonfast_perf_")]


def test_an_output_region_too_small_fails_with_the_servers_words(server):
    done = perf(
        "-m", "add_sub", "-u", server.http_url, "--shared-memory", "system",
        "--output-shared-memory-size", "8", *QUICK,
    )  # fmt: skip
    assert done.returncode == 1
    # Triton answers this with INTERNAL (HTTP 500) and these words too.
    assert "requests failed: HTTP 500" in done.stderr, done.stderr
    assert "(8 bytes) should be at least 16 bytes to hold the results" in done.stderr


def test_cuda_shared_memory_needs_a_gpu(server):
    if shutil.which("nvidia-smi") is None:
        pytest.skip("CUDA shared memory needs a GPU")
    done = perf("-m", "add_sub", "-u", server.http_url, "--shared-memory", "cuda", *QUICK)
    assert done.returncode == 0, done.stderr


NEEDS_PARAMETER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Fails every request whose parameters are not max_tokens=256 and greedy=true.
NEEDS_PARAMETER_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            given = json.loads(request.parameters())
            if given.get("max_tokens") != 256 or given.get("greedy") is not True:
                answers.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(given))))
                continue
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor)]))
        return answers
"""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_parameters_reach_the_model(stateful_server, protocol: str):
    server = stateful_server
    wanted = [
        "--request-parameter",
        "max_tokens:256:int",
        "--request-parameter",
        "greedy:true:bool",
    ]
    done = perf(
        "-m", "needs_parameter", "-i", protocol, "-u", url(server, protocol), *wanted, *QUICK
    )
    assert done.returncode == 0, done.stderr
    without = perf("-m", "needs_parameter", "-i", protocol, "-u", url(server, protocol), *QUICK)
    assert without.returncode == 1 and "requests failed" in without.stderr


def test_an_open_ended_range_stops_at_the_latency_limit(server):
    done = perf(
        "-m", "add_sub", "-u", server.http_url, "--concurrency-range", "1:0:2", "-l", "1", *QUICK
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Measured latency went over the set limit of 1 msec" in done.stderr
    levels = re.findall(r"^Concurrency: (\d+), throughput", done.stdout, re.MULTILINE)
    assert len(levels) >= 2 and levels[:2] == ["1", "3"], done.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequences_at_a_request_rate_one_request_at_a_time(stateful_server, protocol: str):
    server = stateful_server
    done = perf(
        "-m", "simple_sequence", "-i", protocol, "-u", url(server, protocol),
        "--request-rate-range", "200", "--num-of-sequences", "3", "--serial-sequences",
        "--sequence-length", "4", "-p", "1000", "-s", "1000",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Request Rate: 200 inference requests per second" in done.stdout
    [requests] = figure(done.stdout, "Request count")
    [sequences] = [int(m) for m in re.findall(r"Sequence count: (\d+) \(", done.stdout)]
    assert requests / 5 - 3 <= sequences <= requests / 3 + 3, done.stdout
