"""Load for stateful and streaming models (bench/models_stateful), against any Triton-compatible
server. Every answer is checked; a wrong one fails the run.

Rows (``ROWS``, space-separated; all by default):

- ``seq``: ``sequence_sum`` (direct strategy, 4 slots), 16 concurrent sequences of 100
  requests each over gRPC (``sequence_id``/``sequence_start``/``sequence_end``), one client
  per sequence sending its requests one after another, from the core's own load generator
  (``closedloop.py``; Python clients would bound the row themselves), each sequence over and
  over for ``DUR`` seconds (6). First, one sequence from tritonclient must get every running
  sum right; the server's success count must match the requests answered. Reports requests/s.
- ``stream``: ``stream_repeat`` (decoupled, 4 instances), 4 gRPC streams at once
  (``start_stream`` + ``async_stream_infer``), each sending 5 requests one after another, each
  answered by N = 1000 one-element responses 0 .. N-1 in order. Reports responses/s and the
  median time to first response. (tritonclient's stream callbacks cost ~0.2 ms of CPU per
  response, and all four streams share one GIL: the clients bound the row.)
- ``streamcore``: the same model and streams (4 at once, each request N = 1000), sent by the
  core's own load generator (``closedloop.py``, no GIL: the clients do not bound the row)
  for ``DUR`` seconds, after one stream from tritonclient got every response right; every
  request must end with its 1000 responses. Reports responses/s and the median time from a
  request's sending to its first response (under that load, as the server gives it).
- ``streampaced``: ``streamcore``'s streams to ``stream_paced``, which sends each of its
  PACED = 100 responses 0.5 ms after the previous one, as a generator that takes time per
  token does: about 8k responses/s in all, a load both servers carry with room to spare, so
  that the median time to a first response compares the servers at the same rate (in
  ``streamcore`` each runs as fast as it can, and the faster one has more responses in
  flight when a request comes).
- ``sse``: the same model and load through ``POST /v2/models/stream_repeat/generate_stream``
  (Server-Sent Events over HTTP/1.1), one connection per stream.
- ``ssecore``: ``sse``'s requests sent by the core's load generator (4 connections, for
  ``DUR`` seconds, each event counted as a response and the first event as the first
  response) after one request from http.client got every event right.
- ``first``: the time to a first response with nothing else running: one gRPC stream, then
  one Server-Sent Events connection, each sending LONE requests of one response (N = 1) one
  after another. Reports requests/s and each one's median time to its first response.
- ``firstcore``: ``first``'s requests from the core's load generator (DUR / 2 seconds on
  each), without the Python clients' own time.

With ``SERVER_PGID`` set (bench/e2e/peer_ab.sh sets it), each row also reports the server's
CPU time per request or response, from /proc for that process group.

    usage: stateful.py HTTP_HOSTPORT GRPC_HOSTPORT [MODEL] [LABEL]
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from closedloop import LoadFailed, closed_loop
from tritonclient.utils import InferenceServerException
from tritonfast.perf import payloads
from tritonfast.perf.inputs import Tensor

SEQUENCES, STEPS = 16, 100
STREAMS, REQUESTS, RESPONSES = 4, 5, 1000
PACED = 100
LONE = 200
TIMEOUT_S = 120


class Failed(Exception):
    pass


# -- server CPU -------------------------------------------------------------------------------
def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every process in process group ``pgid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def measured(run: Callable[[], tuple[int, dict[str, float]]]) -> tuple[float, dict[str, float]]:
    """Run a load; (units per second, its figures plus server µs per unit when known). A run
    whose figures hold ``seconds`` timed its units itself (and its server CPU, if known)."""
    pgid = int(os.environ.get("SERVER_PGID", "0"))
    cpu_before = group_cpu_s(pgid) if pgid else 0.0
    started = time.perf_counter()
    units, figures = run()
    if "seconds" in figures:
        return units / figures.pop("seconds"), figures
    wall = time.perf_counter() - started
    if pgid:
        figures["server_us_per_unit"] = (group_cpu_s(pgid) - cpu_before) * 1e6 / units
    return units / wall, figures


# -- seq ----------------------------------------------------------------------------------------
def sequence_value(sequence_id: int, step: int) -> int:
    return (sequence_id * 7 + step) % 13 - 6


def sequence_request(sequence_id: int, step: int) -> bytes:
    """Step ``step`` of sequence ``sequence_id`` as a serialized ``ModelInferRequest``."""
    value = np.array([[sequence_value(sequence_id, step)]], dtype=np.int32)
    flags = {"sequence_start": step == 0, "sequence_end": step == STEPS - 1}
    return payloads.grpc_request(
        "sequence_sum",
        "",
        [Tensor("INPUT", "INT32", [1, 1], value)],
        ["SUM"],
        {"sequence_id": sequence_id, **flags},
    )


def sequence_successes(client: grpcclient.InferenceServerClient) -> int:
    stats = client.get_inference_statistics("sequence_sum").model_stats
    return sum(s.inference_stats.success.count for s in stats)


def sequences(grpc_url: str) -> tuple[int, dict[str, float]]:
    check_sequence(grpc_url, 999)
    ids = range(1000, 1000 + SEQUENCES)
    requests = [sequence_request(i, step) for i in ids for step in range(STEPS)]
    scripts = [list(range(k * STEPS, (k + 1) * STEPS)) for k in range(SEQUENCES)]
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        before = sequence_successes(client)
        try:
            load = closed_loop(
                "grpc",
                grpc_url,
                requests,
                SEQUENCES,
                float(os.environ.get("DUR", "6")),
                connections=4,
                pgid=int(os.environ.get("SERVER_PGID", "0")),
                scripts=scripts,
            )
        except LoadFailed as failure:
            raise Failed(str(failure)) from None
        served = sequence_successes(client) - before
    finally:
        client.close()
    if served != load.answered:
        raise Failed(f"the server counted {served} successes for {load.answered} answers")
    figures = {"seconds": load.seconds, "p50_ms": load.p50_us / 1000}
    if load.server_cpu_s:
        figures["server_us_per_unit"] = load.server_cpu_s * 1e6 / load.requests
    return load.requests, figures


def check_sequence(grpc_url: str, sequence_id: int) -> None:
    """One sequence of STEPS requests from tritonclient, every running sum checked (Failed
    otherwise)."""
    client = grpcclient.InferenceServerClient(grpc_url)
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    total = 0
    try:
        for step in range(STEPS):
            value = sequence_value(sequence_id, step)
            total += value
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            result = client.infer(
                "sequence_sum",
                [tensor],
                sequence_id=sequence_id,
                sequence_start=step == 0,
                sequence_end=step == STEPS - 1,
                client_timeout=TIMEOUT_S,
            )
            got = int(result.as_numpy("SUM").reshape(-1)[0])
            if got != total:
                raise Failed(f"sequence {sequence_id} step {step}: sum {got}, not {total}")
    except InferenceServerException as exc:
        raise Failed(f"sequence {sequence_id}: {exc}") from None
    finally:
        client.close()


# -- stream ---------------------------------------------------------------------------------------
def one_grpc_stream(grpc_url: str, index: int) -> tuple[list[float], str]:
    """One stream's requests, one after another: (times to first response, error or "")."""
    first: list[float] = []
    client = grpcclient.InferenceServerClient(grpc_url)
    replies: queue.Queue[tuple[object, object, float]] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: replies.put((result, error, time.perf_counter()))
    )
    tensor = grpcclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([RESPONSES], dtype=np.int32))
    try:
        for request in range(REQUESTS):
            sent = time.perf_counter()
            client.async_stream_infer("stream_repeat", [tensor], request_id=f"{index}-{request}")
            for expected in range(RESPONSES):
                result, error, arrived = replies.get(timeout=TIMEOUT_S)
                if error is not None:
                    return first, str(error)
                if expected == 0:
                    first.append(arrived - sent)
                got = int(result.as_numpy("OUT")[0])  # type: ignore[attr-defined]
                if got != expected:
                    return first, f"stream {index}: response {expected} carried {got}"
    except Exception as exc:
        return first, str(exc)
    finally:
        client.stop_stream()
        client.close()
    return first, ""


def grpc_streams(grpc_url: str) -> tuple[int, dict[str, float]]:
    """The streams as threads of this process (tritonclient's stream callbacks all share its
    GIL)."""
    first: list[float] = []
    errors: list[str] = []

    def one(index: int) -> None:
        times, error = one_grpc_stream(grpc_url, index)
        first.extend(times)
        if error:
            errors.append(error)

    run_all(one, errors)
    return STREAMS * REQUESTS * RESPONSES, {"first_response_p50_ms": median_ms(first)}


def stream_payload(model: str = "stream_repeat", responses: int = RESPONSES) -> bytes:
    """A ``model`` request for ``responses`` responses, asking for the empty final
    response that says a decoupled request is complete."""
    count = np.array([responses], dtype=np.int32)
    return payloads.grpc_request(
        model,
        "",
        [Tensor("N", "INT32", [1], count)],
        ["OUT"],
        {"triton_enable_empty_final_response": True},
    )


def core_streams(grpc_url: str) -> tuple[int, dict[str, float]]:
    """STREAMS streams from the core's load generator; one from tritonclient checked first."""
    _, error = one_grpc_stream(grpc_url, 0)
    if error:
        raise Failed(error)
    return from_load_generator("grpc-stream", grpc_url, stream_payload())


def paced_streams(grpc_url: str) -> tuple[int, dict[str, float]]:
    """STREAMS streams of ``stream_paced`` requests from the core's load generator."""
    return from_load_generator(
        "grpc-stream", grpc_url, stream_payload("stream_paced", PACED), PACED
    )


def from_load_generator(
    protocol: str, address: str, payload: bytes, responses: int = RESPONSES
) -> tuple[int, dict[str, float]]:
    """STREAMS clients of the core's load generator sending ``payload`` (a request for
    ``responses`` responses) for DUR seconds; every request must get all of them."""
    try:
        load = closed_loop(
            protocol,
            address,
            payload,
            STREAMS,
            float(os.environ.get("DUR", "6")),
            pgid=int(os.environ.get("SERVER_PGID", "0")),
            decoupled=protocol == "grpc-stream",
        )
    except LoadFailed as failure:
        raise Failed(str(failure)) from None
    if load.responses != load.requests * responses:
        raise Failed(f"{load.responses} responses to {load.requests} requests of {responses}")
    figures = {"seconds": load.seconds, "first_response_p50_ms": load.first_p50_us / 1000}
    if load.server_cpu_s:
        figures["server_us_per_unit"] = load.server_cpu_s * 1e6 / load.responses
    return load.responses, figures


# -- sse ------------------------------------------------------------------------------------------
SSE_PATH = "/v2/models/stream_repeat/generate_stream"


def sse_request(connection: http.client.HTTPConnection, index: int) -> float:
    """One ``generate_stream`` request for RESPONSES events, each checked; the seconds to
    its first event."""
    sent = time.perf_counter()
    connection.request("POST", SSE_PATH, json.dumps({"N": RESPONSES}))
    reply = connection.getresponse()
    if reply.status != 200:
        raise Failed(f"generate_stream answered {reply.status}: {reply.read()!r}")
    first, expected = 0.0, 0
    for line in reply:
        if not line.startswith(b"data:"):
            continue
        if expected == 0:
            first = time.perf_counter() - sent
        event = json.loads(line[5:])
        if event.get("OUT") != expected:
            raise Failed(f"stream {index}: event {expected} was {event}")
        expected += 1
    if expected != RESPONSES:
        raise Failed(f"stream {index}: {expected} events, not {RESPONSES}")
    return first


def sse_streams(http_url: str) -> tuple[int, dict[str, float]]:
    host, port = http_url.rsplit(":", 1)
    first: list[float] = []
    errors: list[str] = []

    def one(index: int) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        try:
            for _ in range(REQUESTS):
                first.append(sse_request(connection, index))
        except Exception as exc:
            errors.append(str(exc))
        finally:
            connection.close()

    run_all(one, errors)
    return STREAMS * REQUESTS * RESPONSES, {"first_response_p50_ms": median_ms(first)}


def core_sse(http_url: str) -> tuple[int, dict[str, float]]:
    """STREAMS connections of the core's load generator, each sending ``generate_stream``
    requests one after another (every event counted as a response); one request from
    http.client checked first."""
    host, port = http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        sse_request(connection, 0)
    finally:
        connection.close()
    body = json.dumps({"N": RESPONSES}).encode()
    head = (
        f"POST {SSE_PATH} HTTP/1.1\r\nHost: {http_url}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return from_load_generator("http", http_url, head.encode() + body)


# -- first ----------------------------------------------------------------------------------------
def core_lone(http_url: str, grpc_url: str) -> tuple[int, dict[str, float]]:
    """``first``'s lone requests (N = 1, one at a time) from the core's load generator: one
    gRPC stream, then one HTTP connection (``generate_stream``), DUR / 2 seconds each; the
    time to the first response without a Python client's own time in it."""
    seconds = float(os.environ.get("DUR", "6")) / 2
    try:
        grpc = closed_loop(
            "grpc-stream", grpc_url, stream_payload(responses=1), 1, seconds, decoupled=True
        )
        body = json.dumps({"N": 1}).encode()
        head = (
            f"POST {SSE_PATH} HTTP/1.1\r\nHost: {http_url}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sse = closed_loop("http", http_url, head.encode() + body, 1, seconds)
    except LoadFailed as failure:
        raise Failed(str(failure)) from None
    return grpc.requests + sse.requests, {
        "seconds": grpc.seconds + sse.seconds,
        "grpc_first_response_p50_ms": grpc.first_p50_us / 1000,
        "sse_first_response_p50_ms": sse.first_p50_us / 1000,
    }


def lone_requests(http_url: str, grpc_url: str) -> tuple[int, dict[str, float]]:
    """LONE one-response requests on one gRPC stream, then on one SSE connection."""
    grpc_first: list[float] = []
    client = grpcclient.InferenceServerClient(grpc_url)
    replies: queue.Queue[tuple[object, object, float]] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: replies.put((result, error, time.perf_counter()))
    )
    tensor = grpcclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    try:
        for request in range(LONE):
            sent = time.perf_counter()
            client.async_stream_infer("stream_repeat", [tensor], request_id=f"lone-{request}")
            result, error, arrived = replies.get(timeout=TIMEOUT_S)
            if error is not None:
                raise Failed(str(error))
            if int(result.as_numpy("OUT")[0]) != 0:  # type: ignore[attr-defined]
                raise Failed(f"lone request {request}: a wrong response")
            grpc_first.append(arrived - sent)
    finally:
        client.stop_stream()
        client.close()
    host, port = http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    sse_first: list[float] = []
    try:
        for request in range(LONE):
            sent = time.perf_counter()
            connection.request("POST", "/v2/models/stream_repeat/generate_stream", '{"N": 1}')
            reply = connection.getresponse()
            events = []
            for line in reply:
                if line.startswith(b"data:"):
                    if not events:
                        sse_first.append(time.perf_counter() - sent)
                    events.append(line)
            if reply.status != 200 or len(events) != 1 or json.loads(events[0][5:])["OUT"] != 0:
                raise Failed(f"lone SSE request {request}: {reply.status} {events!r}")
    finally:
        connection.close()
    return 2 * LONE, {
        "grpc_first_response_p50_ms": median_ms(grpc_first),
        "sse_first_response_p50_ms": median_ms(sse_first),
    }


def run_all(one: Callable[[int], None], errors: list[str], count: int = STREAMS) -> None:
    """``one(0)`` .. ``one(count - 1)`` on threads of their own; the first error fails."""
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise Failed(errors[0])


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    http_url, grpc_url = sys.argv[1], sys.argv[2]
    label = sys.argv[4] if len(sys.argv) > 4 else ""
    loads = {
        "seq": (lambda: sequences(grpc_url), "requests/s"),
        "stream": (lambda: grpc_streams(grpc_url), "responses/s"),
        "streamcore": (lambda: core_streams(grpc_url), "responses/s"),
        "streampaced": (lambda: paced_streams(grpc_url), "responses/s"),
        "ssecore": (lambda: core_sse(http_url), "responses/s"),
        "sse": (lambda: sse_streams(http_url), "responses/s"),
        "first": (lambda: lone_requests(http_url, grpc_url), "requests/s"),
        "firstcore": (lambda: core_lone(http_url, grpc_url), "requests/s"),
    }
    rows = "seq stream streamcore streampaced sse ssecore first firstcore"
    for row in os.environ.get("ROWS", rows).split():
        run, unit = loads[row]
        try:
            rate, figures = measured(run)
        except Failed as failure:
            print(f"{label} {row} FAILED {failure}", flush=True)
            continue
        extra = " ".join(f"{name} {value:.2f}" for name, value in figures.items())
        print(f"{label} {row} {unit} {rate:.0f} {extra}".strip(), flush=True)


if __name__ == "__main__":
    main()
