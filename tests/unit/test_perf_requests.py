"""``tritonfast perf``'s requests: flags read as perf_analyzer reads them, inputs shaped and
filled from the model's metadata and from input-data files, and the bytes on the wire."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.perf import inputs, payloads
from tritonfast.perf.options import OptionError, Range, parse, parse_range, parse_shape
from tritonfast.perf.server import ModelInfo, ServerStats, TensorSpec


def model(max_batch_size: int = 8, **shapes: list[int]) -> ModelInfo:
    specs = [TensorSpec(name, "FP32", shape) for name, shape in shapes.items()]
    return ModelInfo(
        "m", "1", specs, [TensorSpec("OUT", "FP32", [-1])], max_batch_size, False, False
    )


def test_ranges_read_as_perf_analyzer_reads_them():
    assert parse_range("4", integer=True) == Range(4, 4, 1)
    assert list(parse_range("1:16:5", integer=True).levels()) == [1, 6, 11, 16]
    rates = list(parse_range("100.5:200", integer=False).levels())
    assert (len(rates), rates[1], rates[-1]) == (100, 101.5, 199.5)
    open_ended = parse_range("2:0:3", integer=True).levels()
    assert [next(open_ended) for _ in range(4)] == [2, 5, 8, 11]  # until the latency limit
    for bad in ("0", "1:2:0", "a", "1:2:3:4", "1::2"):
        with pytest.raises(OptionError):
            parse_range(bad, integer=True)


def test_shapes_and_option_errors():
    assert parse_shape("IMAGE:3,224,224") == ("IMAGE", [3, 224, 224])
    assert parse_shape("ns:name:4") == ("ns:name", [4])
    for bad in ("IMAGE", ":3", "IMAGE:3,x", "IMAGE:-1"):
        with pytest.raises(OptionError):
            parse_shape(bad)
    options = parse(["-m", "m", "-i", "gRPC", "--request-rate-range", "50:150:50"])
    assert options.protocol == "grpc" and options.url == "localhost:8001"
    assert options.request_rate is not None
    assert list(options.request_rate.levels()) == [50, 100, 150]
    assert options.max_threads == 4  # perf_analyzer's default for request rates
    with pytest.raises(SystemExit):
        parse(["-m", "m", "--concurrency-range", "1:4", "--request-rate-range", "10"])
    with pytest.raises(SystemExit):  # an open-ended range needs a latency limit
        parse(["-m", "m", "--concurrency-range", "1:0"])
    given = ["-m", "m", "--request-parameter", "max_tokens:256:int"]
    given += ["--request-parameter", "greedy:true:bool", "--request-parameter", "tag:a:b:string"]
    parameters = parse(given).request_parameters
    assert parameters == {"max_tokens": 256, "greedy": True, "tag": "a:b"}
    for bad in ("x:1", "x:1:float", "x:maybe:bool", "x:1.5:int"):
        with pytest.raises(SystemExit):
            parse(["-m", "m", "--request-parameter", bad])


def test_shapes_come_from_the_metadata_and_the_shape_flag():
    m = model(INPUT0=[-1, 4], INPUT1=[-1, -1, 2])
    assert inputs.request_shapes(m, 2, {"INPUT1": [3, 2]}) == {
        "INPUT0": [2, 4],
        "INPUT1": [2, 3, 2],
    }
    with pytest.raises(inputs.InputError, match="--shape INPUT1:<dims>"):
        inputs.request_shapes(m, 1, {})
    with pytest.raises(inputs.InputError, match="does not fit"):
        inputs.request_shapes(m, 1, {"INPUT0": [5], "INPUT1": [3, 2]})
    with pytest.raises(inputs.InputError, match="max_batch_size of 8"):
        inputs.request_shapes(m, 9, {"INPUT1": [3, 2]})
    with pytest.raises(inputs.InputError, match="not an input"):
        inputs.request_shapes(m, 1, {"OTHER": [1]})
    unbatched = model(max_batch_size=0, INPUT0=[4])
    assert inputs.request_shapes(unbatched, 1, {}) == {"INPUT0": [4]}
    with pytest.raises(inputs.InputError, match="-b must be 1"):
        inputs.request_shapes(unbatched, 2, {})


def test_generated_data_is_zero_or_random_of_the_right_type():
    specs = [
        TensorSpec("F", "FP16", [-1, 3]),
        TensorSpec("I", "INT8", [-1, 3]),
        TensorSpec("S", "BYTES", [-1, 2]),
    ]
    m = ModelInfo("m", "1", specs, [], 4, False, False)
    shapes = inputs.request_shapes(m, 2, {})
    [zero] = inputs.generated(m, shapes, "zero", 5, None)
    assert [t.shape for t in zero] == [[2, 3], [2, 3], [2, 2]]
    assert zero[0].values.dtype == np.float16 and not zero[0].values.any()
    assert zero[2].values == [b""] * 4
    [random] = inputs.generated(m, shapes, "random", 5, None)
    assert random[1].values.dtype == np.int8 and random[1].values.any()
    assert all(len(s) == 5 for s in random[2].values)
    [fixed] = inputs.generated(m, shapes, "random", 5, "hello")
    assert fixed[2].values == [b"hello"] * 4


def test_input_data_files_give_one_request_per_entry(tmp_path: Path):
    m = model(INPUT0=[-1, 2], INPUT1=[-1, -1])
    raw = np.array([7.5, 8.5], np.float32).tobytes()
    data = tmp_path / "data.json"
    data.write_text(
        json.dumps(
            {
                "data": [
                    {"INPUT0": [1, 2], "INPUT1": {"content": [3, 4, 5], "shape": [3]}},
                    {
                        "INPUT0": {"b64": base64.b64encode(raw).decode()},
                        "INPUT1": {"content": [6], "shape": [1]},
                    },
                ]
            }
        )
    )
    [[first, second]] = inputs.streams(m, 2, {}, str(data), 0, None)
    # One batch's row, repeated for -b 2.
    assert first[0].shape == [2, 2] and first[0].values.tolist() == [[1, 2], [1, 2]]
    assert first[1].shape == [2, 3] and first[1].values.tolist() == [[3, 4, 5], [3, 4, 5]]
    assert second[0].values.tolist() == [[7.5, 8.5], [7.5, 8.5]]
    data.write_text(json.dumps({"data": [{"INPUT0": [1, 2], "INPUT1": [3]}]}))
    with pytest.raises(inputs.InputError, match='"content" and "shape"'):
        inputs.streams(m, 1, {}, str(data), 0, None)
    data.write_text(json.dumps({"data": [{"INPUT0": [1, 2, 3], "INPUT1": [3]}]}))
    with pytest.raises(inputs.InputError, match="has 3 values, the shape \\[1, 2\\] needs 2"):
        inputs.streams(m, 1, {"INPUT1": [1]}, str(data), 0, None)
    data.write_text(json.dumps({"data": [{"INPUT0": [1, 2]}]}))
    with pytest.raises(inputs.InputError, match="entry 0 has no input 'INPUT1'"):
        inputs.streams(m, 1, {"INPUT1": [1]}, str(data), 0, None)


def strings(*items: bytes) -> inputs.Tensor:
    return inputs.Tensor("S", "BYTES", [1, len(items)], list(items))


def test_http_requests_carry_a_binary_extension_body():
    numbers = inputs.Tensor("N", "INT32", [1, 3], np.array([[1, -2, 3]], np.int32))
    request = payloads.http_request("h:1", "my model", "2", [numbers, strings(b"ab", b"")], ["O"])
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/my%20model/versions/2/infer HTTP/1.1"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert int(fields["Content-Length"]) == len(body)
    header_length = int(fields["Inference-Header-Content-Length"])
    header = json.loads(body[:header_length])
    assert header["outputs"] == [{"name": "O", "parameters": {"binary_data": True}}]
    assert [i["parameters"]["binary_data_size"] for i in header["inputs"]] == [12, 10]
    tail = body[header_length:]
    assert np.frombuffer(tail[:12], "<i4").tolist() == [1, -2, 3]
    assert tail[12:] == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0)


def test_grpc_requests_are_model_infer_messages():
    numbers = inputs.Tensor("N", "FP64", [2], np.array([0.5, 1.5]))
    message = pb.ModelInferRequest.FromString(
        payloads.grpc_request("m", "", [numbers, strings(b"x")], ["A", "B"])
    )
    assert message.model_name == "m" and message.model_version == ""
    assert [(i.name, i.datatype, list(i.shape)) for i in message.inputs] == [
        ("N", "FP64", [2]),
        ("S", "BYTES", [1, 1]),
    ]
    assert np.frombuffer(message.raw_input_contents[0], "<f8").tolist() == [0.5, 1.5]
    assert message.raw_input_contents[1] == b"\x01\x00\x00\x00x"
    assert [o.name for o in message.outputs] == ["A", "B"]


def test_server_statistics_subtract_and_average():
    later = ServerStats(success_count=10, success_ns=5_000_000, queue_count=10, queue_ns=1_000_000)
    earlier = ServerStats(success_count=4, success_ns=2_000_000, queue_count=4, queue_ns=400_000)
    window = later - earlier
    assert (window.success_count, window.average_us("success"), window.average_us("queue")) == (
        6,
        500,
        100,
    )
    assert ServerStats().average_us("compute_infer") == 0


def test_sequence_plans_give_each_context_whole_sequences_of_its_own():
    from tritonfast.perf.options import parse
    from tritonfast.perf.plan import plan

    options = parse(
        ["-m", "seq", "-i", "grpc", "--sequence-length", "5", "--sequence-id-range", "100"]
    )
    m = ModelInfo("seq", "1", [TensorSpec("INPUT", "INT32", [-1, 1])], [], 8, False, True)
    streams = inputs.streams(m, 1, {}, "random", 0, None)
    made = plan(options, m, "h:1", streams, concurrency=3)
    assert len(made.scripts) == 3
    seen_ids: set[int] = set()
    for script in made.scripts:
        messages = [pb.ModelInferRequest.FromString(made.payloads[i]) for i in script]
        controls = [
            (
                r.parameters["sequence_id"].int64_param,
                r.parameters["sequence_start"].bool_param,
                r.parameters["sequence_end"].bool_param,
            )
            for r in messages
        ]
        sequences, current = [], []
        for control in controls:
            current.append(control)
            if control[2]:
                sequences.append(current)
                current = []
        assert not current, "a script ends with a sequence's end"
        for sequence in sequences:
            [sequence_id] = {c[0] for c in sequence}
            assert sequence_id >= 100 and sequence_id not in seen_ids
            seen_ids.add(sequence_id)
            assert [c[1] for c in sequence] == [True] + [False] * (len(sequence) - 1)
            assert 4 <= len(sequence) <= 6  # 5, give or take 20%
    ends = {i for script in made.scripts for i in script if i in made.sequence_ends}
    assert ends == set(made.sequence_ends)
    # Too few IDs for the contexts' sequences is said before anything is sent.
    narrow = parse(["-m", "seq", "--sequence-id-range", "1:5"])
    with pytest.raises(inputs.InputError, match="need 12"):
        plan(narrow, m, "h:1", streams, concurrency=3)


def test_decoupled_requests_ask_for_the_empty_final_response():
    from tritonfast.perf.options import parse
    from tritonfast.perf.plan import plan

    m = ModelInfo("d", "1", [TensorSpec("IN", "INT32", [2])], [], 0, True, False)
    streams = inputs.streams(m, 1, {}, "zero", 0, None)
    made = plan(parse(["-m", "d", "-i", "grpc", "--streaming"]), m, "h:1", streams, 1)
    assert made.protocol == "grpc-stream" and made.decoupled
    [payload] = made.payloads
    message = pb.ModelInferRequest.FromString(payload)
    assert message.parameters["triton_enable_empty_final_response"].bool_param


def run_search(flags: list[str], over_from: float) -> list[float]:
    """The levels a search measures when every level from ``over_from`` up is over the
    latency limit."""
    from tritonfast.perf.cli import _Search

    search = _Search(parse(["-m", "m", "-l", "1", *flags]))
    measured = []
    while (level := search.next()) is not None:
        measured.append(level[1])
        search.tell(level[1] >= over_from)
    return measured


def test_a_linear_search_stops_at_the_latency_limit_and_a_binary_one_closes_in_on_it():
    assert run_search(["--concurrency-range", "1:8:3"], over_from=4) == [1, 4]
    assert run_search(["--concurrency-range", "1:8:3"], over_from=100) == [1, 4, 7]
    binary = ["--concurrency-range", "1:32", "--binary-search"]
    assert run_search(binary, over_from=10) == [1, 32, 16, 8, 12, 10, 9]
    assert run_search(binary, over_from=1) == [1]  # even the start is over
    assert run_search(binary, over_from=100) == [1, 32]  # even the end is within
    rates = run_search(["--request-rate-range", "100:200:10", "--binary-search"], over_from=150)
    assert rates[:3] == [100, 200, 150] and max(r for r in rates if r < 150) >= 140
    with pytest.raises(SystemExit):  # a binary search needs an end and a limit
        parse(["-m", "m", "--concurrency-range", "1:8", "--binary-search"])
