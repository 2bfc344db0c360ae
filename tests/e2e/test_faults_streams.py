"""Fault injection on streams: clients that leave a stream half-way (gRPC ``ModelStreamInfer``
and HTTP Server-Sent Events), and gRPC clients that never read (many requests to a
single-response model, one request of many responses to a decoupled one). The server's
descriptors, processes and memory stay flat, and what an unread stream holds is bounded."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import TEST_MODELS, RunningServer, start_server
from tests.e2e.faults import SCALE, census, report, rss_mib
from tests.e2e.test_streaming import (
    PLUGINS,
    STREAMING_MODELS,
    ChunkedReader,
    http_post,
    int32_input,
    sse_events,
)
from tests.waiting import wait_for

WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        [TEST_MODELS, STREAMING_MODELS],
        tmp_path_factory.mktemp("faults") / "server.log",
        pythonpath=(PLUGINS,),  # the backend repeat_int32 names
    )
    yield running
    assert running.stop() == 0, running.log()


def _leave_a_grpc_stream(server: RunningServer, model: str) -> None:
    """Start a long stream of responses, take the first, and go away."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    first: queue.Queue[Any] = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: first.put((result, error)))
        client.async_stream_infer(
            model, [int32_input(list(range(500)))], parameters={"delay_ms": 2}
        )
        _, error = first.get(timeout=WAIT_S)
        assert error is None, error
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _leave_an_event_stream(server: RunningServer, model: str) -> None:
    body = {"IN": list(range(500)), "delay_ms": 2}
    with http_post(server, f"/v2/models/{model}/generate_stream", body) as sock:
        reader = ChunkedReader(sock)
        assert reader.head()[0] == 200
        assert next(sse_events(reader))["IDX"] == 0


def _served(server: RunningServer, model: str) -> bool:
    """A whole short stream comes back."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue[Any] = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, [int32_input([1, 2, 3])])
        results = [got.get(timeout=WAIT_S) for _ in range(3)]
        return all(error is None for _, error in results)
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model", ["repeat_int32", "repeat_proc"])
def test_streams_left_half_way_leave_nothing_behind(server, model) -> None:
    for _ in range(3):  # what the first streams start (threads, buffers) stays
        _leave_a_grpc_stream(server, model)
        _leave_an_event_stream(server, model)
    before = census(server.proc.pid)
    for _ in range(15 * SCALE):
        _leave_a_grpc_stream(server, model)
        _leave_an_event_stream(server, model)
    assert _served(server, model)

    def settled() -> bool:
        grew = census(server.proc.pid).grew_by(before)
        return grew.descriptors <= 2 and grew.processes <= 0

    wait_for(settled, "the abandoned streams' descriptors to be released")
    grew = census(server.proc.pid).grew_by(before)
    report(f"streams left half-way, {model}", grpc=15 * SCALE, sse=15 * SCALE, server=grew)
    assert grew.rss_mib < 24, grew


# The single-response model the unread stream goes to, and what each request carries.
IDENTITY = "identity_fp32"
ELEMENTS = 16 * 1024  # 64 KiB of FP32 a request, and as much a reply
# What a stream may answer before it stops reading a client that takes nothing: the requests
# in flight (STREAM_WINDOW), the replies waiting for the writer (OUT_AHEAD), and what the
# transport had taken in already.
ANSWERED_BOUND = 256 + 16 + 64


def _executed(server: RunningServer) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(IDENTITY, as_json=True)
        return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))
    finally:
        client.close()


def test_a_stream_whose_client_never_reads_holds_a_bounded_number_of_replies(server) -> None:
    count = 3000 * SCALE  # 190 MiB of replies, if the server answered them all
    payload = np.arange(ELEMENTS, dtype=np.float32).tobytes()
    sent = threading.Semaphore(0)

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        for index in range(count):
            request = service_pb2.ModelInferRequest(model_name=IDENTITY, id=str(index))
            request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, ELEMENTS])
            request.raw_input_contents.append(payload)
            yield request
            sent.release()

    channel = grpc.insecure_channel(
        server.grpc_url, options=[("grpc.max_receive_message_length", -1)]
    )
    try:
        executed_before = _executed(server)
        rss_before = rss_mib(server.proc.pid)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        replies = stub.ModelStreamInfer(requests())
        wait_for(lambda: _executed(server) - executed_before >= 16, "the stream to start")
        # For a while the client only sends: the server answers what is in flight and then
        # reads no more, so what it holds stays bounded however much more is sent.
        peak_rss = 0.0
        watch_until = time.monotonic() + 3
        while time.monotonic() < watch_until:
            answered = _executed(server) - executed_before
            assert answered <= ANSWERED_BOUND, answered
            peak_rss = max(peak_rss, rss_mib(server.proc.pid))
            sent.acquire(timeout=0.1)  # paced by the client's sends, or 0.1 s without any
        report(
            "stream never read",
            sent=count,
            answered_while_unread=answered,
            peak_rss_mib=f"{peak_rss - rss_before:+.1f}",
        )
        assert peak_rss - rss_before < 64, (rss_before, peak_rss)
        # Reading now, the client gets every reply, in order.
        for index, reply in enumerate(replies):
            assert not reply.error_message, reply.error_message
            assert reply.infer_response.id == str(index)
            if index == count - 1:
                break
    finally:
        channel.close()


# A decoupled model's request on a stream that is never read: its responses, each serialized
# by the core and queued on the call by the core's reader thread, wait for room there.
UNREAD_RESPONSES = 200_000


def _assert_held_bounded(
    server: RunningServer, rss_before: float, what: str, bound_mib: float = 10
) -> None:
    """For 3 s while its client reads nothing, the model sends for as long as there is room,
    then its sends wait: what the server holds stays bounded (held all, the responses would
    take about 20 MiB as gRPC replies, 10 as events)."""
    peak_rss = 0.0
    watch_until = time.monotonic() + 3
    while time.monotonic() < watch_until:  # (a watch: RSS sampled every 50 ms)
        peak_rss = max(peak_rss, rss_mib(server.proc.pid))
        time.sleep(0.05)
    report(what, responses=UNREAD_RESPONSES, peak_rss_mib=f"{peak_rss - rss_before:+.1f}")
    assert peak_rss - rss_before < bound_mib, (rss_before, peak_rss)


def test_a_decoupled_stream_never_read_holds_a_bounded_number_of_responses(server) -> None:
    request = service_pb2.ModelInferRequest(model_name="repeat_proc", id="unread")
    request.inputs.add(name="IN", datatype="INT32", shape=[UNREAD_RESPONSES])
    request.raw_input_contents.append(np.arange(UNREAD_RESPONSES, dtype=np.int32).tobytes())
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=None,
            response_deserializer=None,
        )
        rss_before = rss_mib(server.proc.pid)
        replies = call(iter([request.SerializeToString()]))
        _assert_held_bounded(server, rss_before, "decoupled stream never read")
        # Reading now, the client gets every response, in order, and the last says so.
        count = 0
        last = service_pb2.ModelStreamInferResponse()
        for reply in replies:
            count += 1
            if count % 10_000 == 0 or count == UNREAD_RESPONSES:
                last = service_pb2.ModelStreamInferResponse.FromString(reply)
                assert not last.error_message, last.error_message
                index = np.frombuffer(last.infer_response.raw_output_contents[1], np.int32)
                assert index[0] == count - 1
            if count == UNREAD_RESPONSES:
                break
        assert count == UNREAD_RESPONSES
    finally:
        channel.close()


def test_a_generate_stream_never_read_holds_a_bounded_number_of_events(server) -> None:
    """The same through ``generate_stream``, whose events the core's reader thread writes on
    the connection: it waits while a bounded amount is unsent."""
    body = json.dumps({"IN": list(range(UNREAD_RESPONSES))}).encode()
    sock = http_post(server, "/v2/models/repeat_proc/generate_stream", body)
    try:
        # Counted from the answer's first bytes: the body's JSON, decoded into a list of
        # Python integers, is a passing peak of its own.
        received = bytearray(sock.recv(16))
        _assert_held_bounded(server, rss_mib(server.proc.pid), "generate_stream never read", 6)
        # Reading now, the client gets every event, in order, and the body's end.
        while not received.endswith(b"\r\n0\r\n\r\n"):
            data = sock.recv(1 << 20)
            assert data, "the server closed the connection"
            received += data
        assert received.startswith(b"HTTP/1.1 200 ")
        assert received.count(b"data: ") == UNREAD_RESPONSES
        last = received[received.rindex(b"data: ") + len(b"data: ") :].split(b"\n\n")[0]
        assert json.loads(last)["IDX"] == UNREAD_RESPONSES - 1
    finally:
        sock.close()
