"""Sequence batching end to end: the real server and tritonclient over real sockets.

Covers what Triton's sequence example clients check (``simple_grpc_sequence_stream_infer_client``,
``simple_http_sequence_sync_infer_client`` and its gRPC twin) on our equivalents of its
example models (tests/models_sequence), implicit state, Triton's error texts and codes, the
backlog and the idle rule on a one-slot model, statistics, config checks at load, and unloading
a model whose sequence never ends.

A ``probe`` model written here (tmp repository) reports what each execution handed the model:
its position in the batch, the batch size, and what the null requests looked like.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, RunningServer, start_server
from tests.waiting import wait_for

SEQUENCE_MODELS = ROOT / "tests" / "models_sequence"
WAIT_S = 30.0
VALUES = [11, 7, 5, 3, 2, 0, 1]  # Triton's example clients' values
INITIAL_SUM = 1000  # accumulate_state's initial_state file (INT32 1000)

PROBE_CONFIG = """
name: "probe"
backend: "python"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 20000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_INT64 dims: [ 9 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

PROBE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        ready = [int(value(r, "READY")[0][0]) for r in requests]
        nulls = [r for r, on in zip(requests, ready) if not on]
        null_corrids = sum(int(value(r, "CORRID")[0][0]) for r in nulls)
        null_flags = sum(int(value(r, "START")[0][0]) + int(value(r, "END")[0][0]) for r in nulls)
        null_inputs = sum(int(np.abs(value(r, "INPUT")).sum()) for r in nulls)
        responses = []
        for position, request in enumerate(requests):
            seen = [
                position,
                len(requests),
                len(nulls),
                null_corrids,
                null_flags,
                null_inputs,
                int(value(request, "START")[0][0]),
                int(value(request, "END")[0][0]),
                int(value(request, "CORRID")[0][0]),
            ]
            array = np.array([seen], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", array)]))
        return responses
"""


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    extra = tmp_path_factory.mktemp("probe_repository")
    (extra / "probe" / "1").mkdir(parents=True)
    (extra / "probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (extra / "probe" / "1" / "model.py").write_text(PROBE_MODEL)
    server = start_server(
        [SEQUENCE_MODELS, extra], tmp_path_factory.mktemp("sequences") / "server.log"
    )
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def http(seq_server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(seq_server.http_url)
    yield client
    client.close()


@pytest.fixture
def grpc(seq_server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(seq_server.grpc_url)
    yield client
    client.close()


def client_for(server: RunningServer, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def module_of(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def value_input(module: Any, value: int, batched: bool = True) -> Any:
    """INPUT holding ``value``: ``[1, 1]`` for a batching model, ``[1]`` otherwise."""
    shape = [1, 1] if batched else [1]
    tensor = module.InferInput("INPUT", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    return tensor


def output_names(result: Any) -> list[str]:
    response = result.get_response()
    if isinstance(response, dict):
        return [output["name"] for output in response["outputs"]]
    return [output.name for output in response.outputs]


def one_stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    stats = client.get_inference_statistics(model)["model_stats"]
    assert len(stats) == 1
    return stats[0]


def start_flag_error(corrid: object, model: str) -> str:
    return (
        f"inference request for sequence {corrid} to model '{model}' must specify the START"
        " flag on the first request of the sequence"
    )


def assert_invalid(error: InferenceServerException, protocol: str, message: str) -> None:
    assert error.message() == message
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert error.status() == expected


# -- Triton's example clients ---------------------------------------------------------------------
def example_sequences(dyna: bool) -> list[tuple[str, int | str, list[int]]]:
    """(model, sequence ID, values) of the three sequences Triton's example clients send."""
    int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
    string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    string_id = "1002" if dyna else str(uuid.uuid4())
    negated = [-value for value in VALUES]
    return [
        (int_model, 1000, [0, *VALUES]),
        (int_model, 1001, [100, *negated]),
        (string_model, string_id, [20, *negated]),
    ]


def example_expectations(dyna: bool, string_id: int | str, string_results: list[int]) -> list:
    """What the example clients expect for each of the three sequences (their logic: START
    adds 1 on the non-dyna models; the dyna models add the correlation ID on END; the string
    dyna model accumulates)."""
    expected: list[list[int]] = [[], [], []]
    for i in range(len(VALUES) + 1):
        seq0 = 1 if i == 0 else VALUES[i - 1]
        seq1 = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            seq2 = 20 if dyna else 21
        elif dyna:
            seq2 = -VALUES[i - 1] + string_results[i - 1]
        else:
            seq2 = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:
            seq0 += 1000
            seq1 += 1001
            seq2 += int(string_id)
        expected[0].append(seq0)
        expected[1].append(seq1)
        expected[2].append(seq2)
    return expected


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
def test_grpc_stream_sequence_client(grpc: grpcclient.InferenceServerClient, dyna: bool) -> None:
    """simple_grpc_sequence_stream_infer_client.py: three sequences on one stream."""
    sequences = example_sequences(dyna)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        for model, sequence_id, values in sequences:
            for count, value in enumerate(values, start=1):
                grpc.async_stream_infer(
                    model,
                    [value_input(grpcclient, value)],
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{sequence_id}_{count}",
                    sequence_id=sequence_id,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
        received = [replies.get(timeout=WAIT_S) for _ in range(3 * (len(VALUES) + 1))]
    finally:
        grpc.stop_stream()
    assert [error for _, error in received if error is not None] == []
    ids: dict[str, list[str]] = {str(sequence_id): [] for _, sequence_id, _ in sequences}
    results: dict[str, list[int]] = {str(sequence_id): [] for _, sequence_id, _ in sequences}
    for result, _ in received:
        request_id = result.get_response().id
        this_id = request_id.rsplit("_", 1)[0]
        ids[this_id].append(request_id)
        results[this_id].append(int(result.as_numpy("OUTPUT")[0][0]))
    for _, sequence_id, values in sequences:
        # Each sequence's responses came back in its order.
        assert ids[str(sequence_id)] == [f"{sequence_id}_{n}" for n in range(1, len(values) + 1)]
    string_id = sequences[2][1]
    got = [results[str(sequence_id)] for _, sequence_id, _ in sequences]
    assert got == example_expectations(dyna, string_id, got[2])
    if dyna:
        assert got == [
            [1, 11, 7, 5, 3, 2, 0, 1001],
            [101, -11, -7, -5, -3, -2, 0, 1000],
            [20, 9, 2, -3, -6, -8, -8, 993],
        ]
    else:
        assert got == [
            [1, 11, 7, 5, 3, 2, 0, 1],
            [101, -11, -7, -5, -3, -2, 0, -1],
            [21, -11, -7, -5, -3, -2, 0, -1],
        ]


@pytest.mark.parametrize("order", ["sequential", "interleaved"])
@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sync_sequence_client(
    seq_server: RunningServer, protocol: str, dyna: bool, order: str
) -> None:
    """simple_{http,grpc}_sequence_sync_infer_client.py: one infer() at a time, one whole
    sequence after another as the clients do, or interleaved (three sequences live at once)."""
    module = module_of(protocol)
    client = client_for(seq_server, protocol)
    sequences = example_sequences(dyna)
    results: list[list[int]] = [[], [], []]

    def send(index: int, count: int) -> None:
        model, sequence_id, values = sequences[index]
        result = client.infer(
            model,
            [value_input(module, values[count])],
            outputs=[module.InferRequestedOutput("OUTPUT")],
            sequence_id=sequence_id,
            sequence_start=count == 0,
            sequence_end=count == len(values) - 1,
        )
        results[index].append(int(result.as_numpy("OUTPUT")[0][0]))

    try:
        steps = len(VALUES) + 1
        if order == "sequential":
            plan = [(index, count) for index in range(3) for count in range(steps)]
        else:
            plan = [(index, count) for count in range(steps) for index in range(3)]
        for index, count in plan:
            send(index, count)
    finally:
        client.close()
    assert results == example_expectations(dyna, sequences[2][1], results[2])


@pytest.mark.parametrize(
    ("model", "sequences"),
    [("simple_sequence", 11), ("simple_dyna_sequence", 6)],
    ids=["backlog", "oldest"],
)
def test_concurrent_sequences_each_get_their_own_results(
    seq_server: RunningServer, model: str, sequences: int
) -> None:
    """Sequences from several threads at once. simple_sequence has 8 slots, so 3 sequences
    wait in the backlog until others end; simple_dyna_sequence (oldest strategy, two
    instances) fails an execution whose batch holds two requests of one sequence."""
    dyna = model == "simple_dyna_sequence"
    outputs: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    together = threading.Barrier(sequences)

    def run(sequence_id: int) -> None:
        client = httpclient.InferenceServerClient(seq_server.http_url)
        values = [sequence_id % 50, *range(1, 7)]
        got = []
        try:
            together.wait(WAIT_S)
            for count, value in enumerate(values):
                result = client.infer(
                    model,
                    [value_input(httpclient, value)],
                    sequence_id=sequence_id,
                    sequence_start=count == 0,
                    sequence_end=count == len(values) - 1,
                )
                got.append(int(result.as_numpy("OUTPUT")[0][0]))
            outputs[sequence_id] = got
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            client.close()

    ids = [3000 + n for n in range(sequences)]
    threads = [threading.Thread(target=run, args=(sequence_id,)) for sequence_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    for sequence_id in ids:
        expected = [sequence_id % 50 + 1, 1, 2, 3, 4, 5, 6 + (sequence_id if dyna else 0)]
        assert outputs[sequence_id] == expected


# -- direct batches as the model sees them --------------------------------------------------------
def test_direct_batches_pad_empty_slots_with_null_requests(
    http: httpclient.InferenceServerClient,
) -> None:
    """Batch position = slot; slots below the highest one with work get a null request
    (READY, START and END false, CORRID 0, zero inputs) whose response goes nowhere and which
    the statistics do not count."""
    before = one_stats(http, "probe")

    def probe(sequence_id: int, value: int, start: bool = False, end: bool = False) -> list[int]:
        result = http.infer(
            "probe",
            [value_input(httpclient, value)],
            sequence_id=sequence_id,
            sequence_start=start,
            sequence_end=end,
        )
        return [int(x) for x in result.as_numpy("SEEN")[0]]

    # SEEN: position, batch size, nulls, null CORRID sum, null START+END sum, null |INPUT| sum,
    # START, END, CORRID.
    assert probe(71, 5, start=True) == [0, 1, 0, 0, 0, 0, 1, 0, 71]
    assert probe(72, 6, start=True) == [1, 2, 1, 0, 0, 0, 1, 0, 72]
    assert probe(73, 7, start=True) == [2, 3, 2, 0, 0, 0, 1, 0, 73]
    assert probe(73, 8) == [2, 3, 2, 0, 0, 0, 0, 0, 73]
    assert probe(71, 9, end=True) == [0, 1, 0, 0, 0, 0, 0, 1, 71]
    # Slot 0 is free now: it is padded all the same, below slot 2.
    assert probe(73, 10, end=True) == [2, 3, 2, 0, 0, 0, 0, 1, 73]
    assert probe(72, 11) == [1, 2, 1, 0, 0, 0, 0, 0, 72]
    # A new sequence takes the lowest free slot.
    assert probe(74, 12, start=True, end=True) == [0, 1, 0, 0, 0, 0, 1, 1, 74]
    assert probe(72, 13, end=True) == [1, 2, 1, 0, 0, 0, 0, 1, 72]

    after = one_stats(http, "probe")
    real = 9
    assert after["inference_count"] - before["inference_count"] == real
    assert after["execution_count"] - before["execution_count"] == real
    success = after["inference_stats"]["success"]["count"]
    assert success - before["inference_stats"]["success"]["count"] == real
    fail = after["inference_stats"]["fail"]["count"]
    assert fail == before["inference_stats"]["fail"]["count"]


# -- implicit state -------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_state_is_a_running_sum_from_the_initial_state(
    seq_server: RunningServer, protocol: str
) -> None:
    module = module_of(protocol)
    client = client_for(seq_server, protocol)
    sequence_id = 800 if protocol == "http" else "state-grpc"
    try:

        def add(value: int, requested: bool = False, **flags: bool) -> int:
            outputs = [module.InferRequestedOutput("SUM")] if requested else None
            result = client.infer(
                "accumulate_state",
                [value_input(module, value)],
                outputs=outputs,
                sequence_id=sequence_id,
                **{f"sequence_{name}": on for name, on in flags.items()},
            )
            # The state output is the server's: never in a response.
            assert output_names(result) == ["SUM"]
            assert result.as_numpy("SUM_OUT") is None
            return int(result.as_numpy("SUM")[0][0])

        assert add(5, start=True) == INITIAL_SUM + 5
        assert add(3) == INITIAL_SUM + 8
        assert add(-2, requested=True) == INITIAL_SUM + 6
        assert add(10, end=True) == INITIAL_SUM + 16
        # After its END the ID starts a new sequence, from the initial state again.
        assert add(1, start=True) == INITIAL_SUM + 1
        assert add(1) == INITIAL_SUM + 2
        # START for a live sequence resets its state (Triton: the slot's state is reset).
        assert add(7, start=True) == INITIAL_SUM + 7
        assert add(2, end=True) == INITIAL_SUM + 9
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requesting_the_state_output_is_refused(seq_server: RunningServer, protocol: str) -> None:
    """SUM_OUT is no output of the model (Triton's message for an unknown output)."""
    module = module_of(protocol)
    client = client_for(seq_server, protocol)
    try:
        with pytest.raises(InferenceServerException) as error:
            client.infer(
                "accumulate_state",
                [value_input(module, 1)],
                outputs=[module.InferRequestedOutput("SUM_OUT")],
                sequence_id=801,
                sequence_start=True,
                sequence_end=True,
            )
        assert_invalid(
            error.value,
            protocol,
            "unexpected inference output 'SUM_OUT' for model 'accumulate_state'",
        )
    finally:
        client.close()


def test_concurrent_sequences_keep_separate_states(
    seq_server: RunningServer, http: httpclient.InferenceServerClient
) -> None:
    """accumulate_state has 2 instances x 4 slots: 10 sequences at once fill every slot (with
    null entries in between) and 2 wait in the backlog; each keeps its own sum."""
    before = one_stats(http, "accumulate_state")
    sums: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    ids = list(range(900, 910))

    def values_of(sequence_id: int) -> list[int]:
        return [sequence_id % 7 + n for n in range(6)]

    together = threading.Barrier(len(ids))

    def run(sequence_id: int) -> None:
        client = grpcclient.InferenceServerClient(seq_server.grpc_url)
        values = values_of(sequence_id)
        got = []
        try:
            together.wait(WAIT_S)
            for count, value in enumerate(values):
                result = client.infer(
                    "accumulate_state",
                    [value_input(grpcclient, value)],
                    sequence_id=sequence_id,
                    sequence_start=count == 0,
                    sequence_end=count == len(values) - 1,
                )
                got.append(int(result.as_numpy("SUM")[0][0]))
            sums[sequence_id] = got
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(sequence_id,)) for sequence_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    for sequence_id in ids:
        assert sums[sequence_id] == list(INITIAL_SUM + np.cumsum(values_of(sequence_id)))
    after = one_stats(http, "accumulate_state")
    requests = 6 * len(ids)
    assert after["inference_count"] - before["inference_count"] == requests
    success = after["inference_stats"]["success"]["count"]
    assert success - before["inference_stats"]["success"]["count"] == requests
    executions = after["execution_count"] - before["execution_count"]
    assert 0 < executions <= requests


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_errors_have_tritons_texts_and_codes(seq_server: RunningServer, protocol: str) -> None:
    module = module_of(protocol)
    client = client_for(seq_server, protocol)
    model = "accumulate_state"

    def refused(message: str, value: Any = None, **options: Any) -> None:
        with pytest.raises(InferenceServerException) as error:
            client.infer(model, [value if value is not None else value_input(module, 1)], **options)
        assert_invalid(error.value, protocol, message)

    try:
        no_id = (
            f"inference request to model '{model}' must specify a non-zero or non-empty"
            " correlation ID"
        )
        refused(no_id)
        refused(no_id, sequence_start=True, sequence_end=True)
        refused(no_id, sequence_id="", sequence_start=True)
        refused(start_flag_error(424242, model), sequence_id=424242)
        refused(start_flag_error(424242, model), sequence_id=424242, sequence_end=True)
        refused(start_flag_error("no-such-seq", model), sequence_id="no-such-seq")
        pair = module.InferInput("INPUT", [2, 1], "INT32")
        pair.set_data_from_numpy(np.ones((2, 1), dtype=np.int32))
        refused(
            f"inference request to model '{model}' must specify batch-size 1 due to requirements"
            " of sequence batcher",
            pair,
            sequence_id=424243,
            sequence_start=True,
        )
        # The refused START did not start a sequence.
        refused(start_flag_error(424243, model), sequence_id=424243, sequence_end=True)
        # An ended sequence is unknown again.
        client.infer(
            model,
            [value_input(module, 1)],
            sequence_id=424244,
            sequence_start=True,
            sequence_end=True,
        )
        refused(start_flag_error(424244, model), sequence_id=424244)
        # The server serves on: a whole sequence after the refusals.
        sums = [
            int(
                client.infer(
                    model,
                    [value_input(module, value)],
                    sequence_id=424245,
                    sequence_start=index == 0,
                    sequence_end=index == 2,
                ).as_numpy("SUM")[0][0]
            )
            for index, value in enumerate([1, 2, 3])
        ]
        assert sums == [INITIAL_SUM + 1, INITIAL_SUM + 3, INITIAL_SUM + 6]
        assert client.is_model_ready(model) and client.is_server_live()
    finally:
        client.close()


def post_infer(server: RunningServer, model: str, parameters: dict[str, Any]) -> tuple[int, str]:
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1], "data": [1]}],
        "parameters": parameters,
    }
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"sequence_id": -5}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": True}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": 2**64 + 5, "sequence_start": True}, "Unable to parse 'sequence_id'"),
        ({"sequence_id": 5, "sequence_start": 1}, "Unable to parse 'sequence_start'"),
        ({"sequence_id": 5, "sequence_end": "yes"}, "Unable to parse 'sequence_end'"),
    ],
    ids=["negative-id", "float-id", "bool-id", "id-above-uint64", "int-start", "string-end"],
)
def test_http_sequence_parameters_of_the_wrong_type(
    seq_server: RunningServer, parameters: dict[str, Any], message: str
) -> None:
    status, body = post_infer(seq_server, "short_idle", parameters)
    # TritonJson's type errors are INTERNAL in Triton, hence 500.
    assert status == 500
    assert json.loads(body)["error"].startswith(message + ": attempt to access JSON non-")


def test_grpc_stream_errors_leave_the_stream_serving(
    grpc: grpcclient.InferenceServerClient,
) -> None:
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        send = grpc.async_stream_infer
        send("simple_sequence", [value_input(grpcclient, 1)], request_id="no-start", sequence_id=41)
        send("simple_sequence", [value_input(grpcclient, 1)], request_id="no-id")
        for count, value in enumerate([4, 5, 6]):
            send(
                "simple_sequence",
                [value_input(grpcclient, value)],
                request_id=f"ok-{count}",
                sequence_id=41,
                sequence_start=count == 0,
                sequence_end=count == 2,
            )
        received = [replies.get(timeout=WAIT_S) for _ in range(5)]
    finally:
        grpc.stop_stream()
    errors = [error.message() for _, error in received if error is not None]
    assert sorted(errors) == sorted(
        [
            start_flag_error(41, "simple_sequence"),
            "inference request to model 'simple_sequence' must specify a non-zero or non-empty"
            " correlation ID",
        ]
    )
    results = [(r.get_response().id, int(r.as_numpy("OUTPUT")[0][0])) for r, e in received if r]
    assert results == [("ok-0", 5), ("ok-1", 5), ("ok-2", 6)]


# -- one slot: CORRID, the backlog and the idle rule ---------------------------------------------
@pytest.mark.parametrize(
    ("protocol", "sequence_id", "seen"),
    [
        ("http", 1, 1),
        ("grpc", 12345, 12345),
        ("http", 2**63 - 1, 2**63 - 1),
        # Triton copies the uint64 ID's bytes into the INT64 CORRID.
        ("http", 2**63 + 5, -(2**63) + 5),
        ("http", 2**64 - 1, -1),
        # gRPC carries int64: a negative ID wraps to uint64 and back.
        ("grpc", -5, -5),
    ],
)
def test_corrid_control_holds_the_sequence_id(
    seq_server: RunningServer, protocol: str, sequence_id: int, seen: int
) -> None:
    module = module_of(protocol)
    client = client_for(seq_server, protocol)
    try:
        for count in range(3):
            result = client.infer(
                "short_idle",
                [value_input(module, count, batched=False)],
                sequence_id=sequence_id,
                sequence_start=count == 0,
                sequence_end=count == 2,
            )
            corrid = result.as_numpy("CORRID_SEEN")
            assert corrid.dtype == np.int64 and corrid.tolist() == [seen]
    finally:
        client.close()


class AsyncStart:
    """A request (a START unless told) sent with gRPC async_infer: when and how it was
    answered."""

    def __init__(
        self,
        client: grpcclient.InferenceServerClient,
        sequence_id: int,
        model: str = "short_idle",
        value: int = 0,
        start: bool = True,
    ) -> None:
        self.replies: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
        self.context = client.async_infer(
            model,
            [value_input(grpcclient, value, batched=model != "short_idle")],
            callback=lambda result, error: self.replies.put((time.monotonic(), result, error)),
            sequence_id=sequence_id,
            sequence_start=start,
        )

    def answered(self) -> bool:
        return not self.replies.empty()

    def reply(self) -> tuple[float, Any]:
        at, result, error = self.replies.get(timeout=WAIT_S)
        assert error is None, (error.status(), error.message())
        return at, result


def pending(server: RunningServer, model: str) -> int:
    """The model's nv_inference_pending_request_count (requests waiting to run)."""
    url = f"http://{server.metrics_url}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT_S) as reply:
        text = reply.read().decode()
    prefix = f'nv_inference_pending_request_count{{model="{model}",version="1"}} '
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return int(float(line[len(prefix) :]))


def wait_pending(server: RunningServer, model: str, count: int) -> None:
    wait_for(lambda: pending(server, model) == count, f"{count} pending on {model}", WAIT_S)


def short_idle(client: Any, sequence_id: int, **flags: bool) -> int:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    result = client.infer(
        "short_idle",
        [value_input(module, 1, batched=False)],
        sequence_id=sequence_id,
        **{f"sequence_{name}": on for name, on in flags.items()},
    )
    return int(result.as_numpy("CORRID_SEEN")[0])


def test_backlog_start_waits_for_the_slot_to_free(
    seq_server: RunningServer,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    first, second = 6001, 6002
    assert short_idle(http, first, start=True) == first
    waiting = AsyncStart(grpc, second)  # one slot: it waits in the backlog
    wait_pending(seq_server, "short_idle", 1)
    for _ in range(3):
        assert short_idle(http, first) == first
        assert not waiting.answered(), "a backlog sequence ran while the slot was held"
    assert pending(seq_server, "short_idle") == 1
    end_sent = time.monotonic()
    assert short_idle(http, first, end=True) == first
    answered_at, result = waiting.reply()
    assert answered_at >= end_sent
    assert result.as_numpy("CORRID_SEEN").tolist() == [second]
    assert short_idle(http, second, end=True) == second


def test_backlog_sequences_take_freed_slots_in_arrival_order(
    seq_server: RunningServer,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    """simple_sequence has 8 slots: with 8 sequences live, two more wait; each takes the next
    slot freed by an END, the older one first."""
    held = list(range(5100, 5108))

    def send(sequence_id: int, value: int, **flags: bool) -> int:
        result = http.infer(
            "simple_sequence",
            [value_input(httpclient, value)],
            sequence_id=sequence_id,
            **{f"sequence_{name}": on for name, on in flags.items()},
        )
        return int(result.as_numpy("OUTPUT")[0][0])

    for sequence_id in held:
        assert send(sequence_id, 0, start=True) == 1
    older = AsyncStart(grpc, 5110, "simple_sequence", value=10)
    wait_pending(seq_server, "simple_sequence", 1)
    newer = AsyncStart(grpc, 5111, "simple_sequence", value=20)
    wait_pending(seq_server, "simple_sequence", 2)
    for sequence_id in held:  # the live sequences go on
        assert send(sequence_id, 2) == 2
    assert not older.answered() and not newer.answered()
    ended = time.monotonic()
    assert send(held[3], 3, end=True) == 3
    answered_at, result = older.reply()
    assert answered_at >= ended and int(result.as_numpy("OUTPUT")[0][0]) == 11
    assert send(5110, 4) == 4  # it holds a slot now
    assert not newer.answered() and pending(seq_server, "simple_sequence") == 1
    ended = time.monotonic()
    assert send(held[6], 3, end=True) == 3
    answered_at, result = newer.reply()
    assert answered_at >= ended and int(result.as_numpy("OUTPUT")[0][0]) == 21
    for sequence_id in [*held[:3], *held[4:6], held[7], 5110, 5111]:
        assert send(sequence_id, 5, end=True) == 5
    assert pending(seq_server, "simple_sequence") == 0


def test_an_idle_sequence_gives_its_slot_to_the_backlog(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    idle, waiting_id = 6101, 6102
    assert short_idle(http, idle, start=True) == idle
    started = time.monotonic()
    waiting = AsyncStart(grpc, waiting_id)
    answered_at, result = waiting.reply()  # once the first sequence idled 300 ms
    assert result.as_numpy("CORRID_SEEN").tolist() == [waiting_id]
    assert answered_at - started >= 0.2, "the slot was handed over before the sequence idled"
    # The idled sequence is gone: its next request needs START, in Triton's words.
    for client, protocol in ((http, "http"), (grpc, "grpc")):
        with pytest.raises(InferenceServerException) as error:
            short_idle(client, idle)
        assert_invalid(error.value, protocol, start_flag_error(idle, "short_idle"))
    assert short_idle(http, waiting_id, end=True) == waiting_id
    # A START with the idled ID starts a new sequence.
    assert short_idle(grpc, idle, start=True, end=True) == idle


def test_a_cancelled_backlog_request_cancels_its_sequence(
    seq_server: RunningServer,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    holder, cancelled = 6301, 6302
    assert short_idle(http, holder, start=True) == holder
    start = AsyncStart(grpc, cancelled)  # one slot: it waits in the backlog
    wait_pending(seq_server, "short_idle", 1)
    start.context.cancel()
    _, _, error = start.replies.get(timeout=WAIT_S)
    assert error is not None  # the client gave up on it
    wait_pending(seq_server, "short_idle", 0)
    follow = AsyncStart(grpc, cancelled, start=False)  # still taken into the backlog
    wait_pending(seq_server, "short_idle", 1)
    try:
        assert short_idle(http, holder, end=True) == holder
        _, result, error = follow.replies.get(timeout=WAIT_S)
        # Triton: the backlog sequence holding a cancelled request is cancelled as a whole
        # when it would take the slot, and its ID is unknown afterwards.
        assert result is None and error is not None, "ran as a sequence without its START"
        with pytest.raises(InferenceServerException) as refused:
            short_idle(http, cancelled)
        assert refused.value.message() == start_flag_error(cancelled, "short_idle")
    finally:
        with contextlib.suppress(InferenceServerException):  # leave the slot free
            short_idle(http, cancelled, end=True)
        wait_pending(seq_server, "short_idle", 0)


def test_a_backlog_sequence_is_dropped_when_a_requests_timeout_passes(
    seq_server: RunningServer,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    """Triton: a request's timeout bounds how long its sequence may wait in the backlog; past
    it the sequence's requests fail UNAVAILABLE and its ID needs a START again. (The holder's
    idle limit, 300 ms, is longer than the 100 ms timeout.)"""
    holder, waiting_id = 6401, 6402
    assert short_idle(http, holder, start=True) == holder
    replies: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    sent = time.monotonic()
    grpc.async_infer(
        "short_idle",
        [value_input(grpcclient, 0, batched=False)],
        callback=lambda result, error: replies.put((time.monotonic(), result, error)),
        sequence_id=waiting_id,
        sequence_start=True,
        timeout=100_000,  # microseconds
    )
    try:
        at, result, error = replies.get(timeout=WAIT_S)
        assert result is None and error is not None
        assert error.status() == "StatusCode.UNAVAILABLE"
        assert error.message() == "timeout of the corresponding sequence has been expired"
        assert at - sent >= 0.1
        assert short_idle(http, holder) == holder  # the holder keeps its slot
        with pytest.raises(InferenceServerException) as refused:
            short_idle(http, waiting_id)
        assert refused.value.message() == start_flag_error(waiting_id, "short_idle")
    finally:
        with contextlib.suppress(InferenceServerException):  # leave the slot free
            short_idle(http, holder, end=True)
        wait_pending(seq_server, "short_idle", 0)


# -- statistics -----------------------------------------------------------------------------------
def test_statistics_count_the_requests_sent(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """Null entries run with the real requests but are not counted."""
    before = one_stats(http, "simple_sequence")
    sent = 0
    for sequence_id in (5001, 5002, 5003):  # three slots, then only the last one works
        http.infer(
            "simple_sequence",
            [value_input(httpclient, 1)],
            sequence_id=sequence_id,
            sequence_start=True,
        )
        sent += 1
    for count in range(4):
        http.infer(
            "simple_sequence",
            [value_input(httpclient, 1)],
            sequence_id=5003,
            sequence_end=count == 3,
        )
        sent += 1
    for sequence_id in (5001, 5002):
        grpc.infer(
            "simple_sequence",
            [value_input(grpcclient, 1)],
            sequence_id=sequence_id,
            sequence_end=True,
        )
        sent += 1
    after = one_stats(http, "simple_sequence")
    assert after["inference_count"] - before["inference_count"] == sent
    assert after["execution_count"] - before["execution_count"] == sent  # one at a time
    for kind in ("success", "queue", "compute_infer"):
        delta = after["inference_stats"][kind]["count"] - before["inference_stats"][kind]["count"]
        assert delta == sent, kind
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    over_grpc = grpc.get_inference_statistics("simple_sequence", as_json=True)["model_stats"][0]
    assert int(over_grpc["inference_count"]) == after["inference_count"]


# -- loading and unloading ------------------------------------------------------------------------
def variant(
    repository: Path, source: str, name: str, edit: Callable[[str], str]
) -> tuple[str, Path]:
    """A copy of a tests/models_sequence model named ``name``, its config edited."""
    target = repository / name
    shutil.copytree(SEQUENCE_MODELS / source, target)
    config = (target / "config.pbtxt").read_text()
    assert f'name: "{source}"' in config
    config = config.replace(f'name: "{source}"', f'name: "{name}"')
    edited = edit(config)
    assert edited != config or name == "short_state", "the edit changed nothing"
    (target / "config.pbtxt").write_text(edited)
    return name, target


BROKEN = {
    "two_starts": (
        "simple_sequence",
        lambda c: c.replace("kind: CONTROL_SEQUENCE_READY", "kind: CONTROL_SEQUENCE_START"),
        "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for two_starts",
    ),
    "corrid_flags": (
        "short_idle",
        lambda c: c.replace(
            "data_type: TYPE_INT64 }", "data_type: TYPE_INT64 int32_false_true: [ 0, 1 ] }"
        ),
        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or"
        " 'bool_false_true' for CONTROL_SEQUENCE_CORRID for corrid_flags",
    ),
    "corrid_float": (
        "short_idle",
        lambda c: c.replace("data_type: TYPE_INT64 }", "data_type: TYPE_FP32 }"),
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for corrid_float. Allowed"
        " data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
    ),
    "one_name_two_kinds": (
        "simple_sequence",
        lambda c: c.replace('name: "READY"', 'name: "START"'),
        "sequence batching control tensor 'START' is specified for multiple control kinds for"
        " one_name_two_kinds",
    ),
    "ready_without_values": (
        "simple_sequence",
        lambda c: c.replace(
            "kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ]",
            "kind: CONTROL_SEQUENCE_READY",
        ),
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or"
        " 'bool_false_true' for CONTROL_SEQUENCE_READY for ready_without_values",
    ),
    "three_values": (
        "simple_sequence",
        lambda c: c.replace(
            "CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ]",
            "CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1, 1 ]",
        ),
        "sequence batching control 'int32_false_true' must have exactly 2 entries for"
        " CONTROL_SEQUENCE_READY for three_values",
    ),
    "short_state": (
        "accumulate_state",
        lambda c: c,  # its initial_state file is cut to 2 bytes below
        "initial_state setting expects 4 bytes, but the data provided from start_atonly has 2"
        " bytes.",
    ),
    "state_type": (
        "accumulate_state",
        lambda c: c.replace(
            "initial_state: { data_type: TYPE_INT32", "initial_state: { data_type: TYPE_INT64"
        ),
        "The data type used for 'initial_state' field of state 'SUM_IN' does not match the state"
        " data type.",
    ),
    "oldest_too_big": (
        "simple_dyna_sequence",
        lambda c: c.replace("max_queue_delay_microseconds: 10000", "preferred_batch_size: [ 16 ]"),
        "sequence batching preferred batch size must be <= max batch size for oldest_too_big",
    ),
}


STATE_ERRORS = {"short_state", "state_type"}


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("sequence_repository")
    shutil.copytree(SEQUENCE_MODELS / "short_idle", repository / "short_idle")
    for name, (source, edit, _) in BROKEN.items():
        variant(repository, source, name, edit)
    (repository / "short_state" / "initial_state" / "start_at").write_bytes(b"\xe8\x03")
    server = start_server(
        [repository],
        tmp_path_factory.mktemp("explicit_sequences") / "server.log",
        "--model-control-mode=explicit",
        "--load-model=short_idle",
    )
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_sequence_config_is_refused_at_load(
    explicit_server: RunningServer, name: str
) -> None:
    message = BROKEN[name][2]
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        with pytest.raises(InferenceServerException) as error:
            client.load_model(name)
        row = {r["name"]: r for r in client.get_model_repository_index()}[name]
        if name in STATE_ERRORS:  # Triton fails the model's versions with these
            assert error.value.status() == "400"
            assert error.value.message() == (
                f"load failed for model '{name}': version 1 is at UNAVAILABLE state:"
                f" Invalid argument: {message};\n"
            )
            assert row == {
                "name": name,
                "version": "1",
                "state": "UNAVAILABLE",
                "reason": f"Invalid argument: {message}",
            }
        else:  # and refuses the others while it polls the repository
            assert error.value.status() == "500"
            assert error.value.message() == (
                f"failed to load '{name}', failed to poll from model repository: {message}"
            )
            assert row == {"name": name}
        assert not client.is_model_ready(name)
        assert message in explicit_server.log()
        assert client.is_model_ready("short_idle")  # nothing else disturbed
    finally:
        client.close()


def test_unloading_waits_for_a_sequence_that_never_ends(explicit_server: RunningServer) -> None:
    """The sequence holds the slot until the idle rule releases it; a backlog sequence waiting
    for the slot still runs; then the unload completes and the model is gone."""
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    grpc = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    try:
        http.load_model("short_idle")
        assert short_idle(http, 7701, start=True) == 7701  # never ends
        waiting = AsyncStart(grpc, 7702)  # in the backlog behind it, never ends either
        wait_pending(explicit_server, "short_idle", 1)
        started = time.monotonic()
        http.unload_model("short_idle")
        took = time.monotonic() - started
        answered_at, result = waiting.reply()
        assert result.as_numpy("CORRID_SEEN").tolist() == [7702]
        assert answered_at - started >= 0.2  # after 7701 idled out
        assert took >= 0.2  # the unload waited for the sequences
        wait_for(lambda: not http.is_model_ready("short_idle"), "the unload", timeout=WAIT_S)
        row = {r["name"]: r for r in http.get_model_repository_index()}["short_idle"]
        assert row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded"
        with pytest.raises(InferenceServerException):
            short_idle(http, 7703, start=True, end=True)
        # Loaded again, it starts with free slots.
        http.load_model("short_idle")
        assert short_idle(grpc, 7701, start=True, end=True) == 7701
    finally:
        http.close()
        grpc.close()
