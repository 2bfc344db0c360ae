"""Stateful models on the core's path (a lane whose batches come from the sequence batcher,
``rust/src/lane/source.rs``, with the control inputs and null requests the core writes,
``rust/src/lane/sequence.rs``, and the implicit states it keeps, ``rust/src/lane/state.rs``)
against the reference scheduler: generated scripts of
sequences (started, continued, restarted and ended; integer and string correlation IDs; HTTP
JSON, HTTP binary and gRPC; refused requests in between) sent one request at a time over real
sockets to a server whose core runs them and to one with
``--backend-config=python,core-path=off`` get the same status, headers and bytes. The probe
models (tests/models_sequence_probe) answer with what they were handed: each request's
controls, correlation ID and parameters, its implicit states, and its batch's size and null
requests."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._proto import grpc_service_pb2 as pb

from tests.conftest import ROOT, RunningServer
from tests.e2e.corepair import Connection, grpc_answer, server_pair

PROBE_MODELS = ROOT / "tests" / "models_sequence_probe"
# Each model, with how many sequences it holds at once (slots over all instances) and
# whether it batches.
MODELS = {"seq_probe": (3, True), "seq_probe_text": (4, False), "seq_probe_state": (3, True)}
# Correlation IDs no script used before: every script ends the sequences it starts, and the
# servers keep nothing of them afterwards.
_fresh_ids = itertools.count(1)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    logs = tmp_path_factory.mktemp("core_sequences")
    yield from server_pair([PROBE_MODELS], logs)


# -- one request -----------------------------------------------------------------------------
Step = dict[str, Any]


def http_request(model: str, step: Step) -> tuple[str, bytes, dict[str, str]]:
    values = np.asarray(step["values"], dtype=np.int32)
    entry: dict[str, Any] = {"name": "IN", "datatype": "INT32", "shape": list(values.shape)}
    tail = b""
    if step["protocol"] == "binary":
        tail = values.tobytes()
        entry["parameters"] = {"binary_data_size": len(tail)}
    else:
        entry["data"] = values.reshape(-1).tolist()
    inputs = [entry]
    if step.get("text") is not None:
        inputs.append(
            {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [step["text"]]}
        )
    doc: dict[str, Any] = {"inputs": inputs}
    if step.get("id"):
        doc["id"] = step["id"]
    parameters = dict(step.get("extra", {}))
    if step["sequence_id"] is not None:
        parameters["sequence_id"] = step["sequence_id"]
    for flag in ("sequence_start", "sequence_end"):
        if step[flag] or step["explicit_flags"]:
            parameters[flag] = step[flag]
    if parameters:
        doc["parameters"] = parameters
    header = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if tail:
        headers = {"Inference-Header-Content-Length": str(len(header))}
    return f"/v2/models/{model}/infer", header + tail, headers


def grpc_request(model: str, step: Step) -> bytes:
    values = np.asarray(step["values"], dtype=np.int32)
    message = pb.ModelInferRequest(model_name=model)
    if step.get("id"):
        message.id = step["id"]
    message.inputs.add(name="IN", datatype="INT32", shape=list(values.shape))
    message.raw_input_contents.append(values.tobytes())
    if step.get("text") is not None:
        message.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
        text = step["text"].encode()
        message.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
    sequence_id = step["sequence_id"]
    if isinstance(sequence_id, str):
        message.parameters["sequence_id"].string_param = sequence_id
    elif sequence_id is not None:
        message.parameters["sequence_id"].int64_param = sequence_id
    for flag in ("sequence_start", "sequence_end"):
        if step[flag] or step["explicit_flags"]:
            message.parameters[flag].bool_param = step[flag]
    for key, value in step.get("extra", {}).items():
        message.parameters[key].string_param = value
    return message.SerializeToString()


def plain_step(
    sequence_id: int, start: bool, end: bool, values: list[int], protocol: str = "json"
) -> Step:
    """A request of one row of ``values``, its flags only where set."""
    return {
        "protocol": protocol,
        "values": [values],
        "sequence_id": sequence_id,
        "sequence_start": start,
        "sequence_end": end,
        "explicit_flags": False,
    }


# -- scripts ---------------------------------------------------------------------------------
@st.composite
def steps(draw: Any, model: str, sequence_id: Any, start: bool, end: bool) -> Step:
    _, batches = MODELS[model]
    columns = draw(st.integers(1, 3))
    # Now and then a batch of two, which sequence batching refuses (never an END: its
    # sequence would hold its slot for good).
    rows = draw(st.integers(1, 2)) if batches and not end and draw(st.integers(0, 9)) == 0 else 1
    shape = [rows, columns] if batches else [columns]
    count = int(np.prod(shape))
    values = draw(st.lists(st.integers(-50, 50), min_size=count, max_size=count))
    step: Step = {
        "protocol": draw(st.sampled_from(["json", "binary", "grpc"])),
        "values": np.array(values).reshape(shape).tolist(),
        "sequence_id": sequence_id,
        "sequence_start": start,
        "sequence_end": end,
        "explicit_flags": draw(st.booleans()),
    }
    if draw(st.booleans()):
        step["id"] = draw(st.sampled_from(["r1", "seq-é"]))
    if model == "seq_probe" and draw(st.integers(0, 3)) == 0:
        step["text"] = draw(st.sampled_from(["", "abc"]))
    if draw(st.integers(0, 9)) == 0:
        step["extra"] = {"custom": "x"}  # the reference path decodes it
    return step


@st.composite
def scripts(draw: Any) -> tuple[str, list[Step]]:
    """A model, and requests for it: up to as many sequences as it has slots, their steps
    interleaved (the first of each flagged START, the last END, now and then a START again
    in between), with refused requests mixed in."""
    model = draw(st.sampled_from(sorted(MODELS)))
    slots, _ = MODELS[model]
    lengths = draw(st.lists(st.integers(1, 4), min_size=1, max_size=slots))
    ids: list[Any] = []
    for _ in lengths:
        number = next(_fresh_ids)
        ids.append(str(number) if draw(st.booleans()) else number)
        if draw(st.integers(0, 5)) == 0:
            ids[-1] = f"seq{number}"  # not a number: 0 in an integer CORRID
    order = draw(st.permutations([i for i, n in enumerate(lengths) for _ in range(n)]))
    taken = [0] * len(lengths)
    script = []
    for index in order:
        start = taken[index] == 0 or draw(st.integers(0, 15)) == 0
        taken[index] += 1
        end = taken[index] == lengths[index]
        script.append(draw(steps(model, ids[index], start, end)))
        refused = draw(st.integers(0, 6))
        if refused == 0:  # a sequence never started
            script.append(draw(steps(model, f"none{next(_fresh_ids)}", False, False)))
        elif refused == 1:  # no correlation ID
            script.append(draw(steps(model, None, draw(st.booleans()), False)))
    return model, script


def answers(
    connection: Connection, call: Any, model: str, script: list[Step]
) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for step in script:
        if step["protocol"] == "grpc":
            out.append(grpc_answer(call, grpc_request(model, step)))
        else:
            out.append(connection.ask(*http_request(model, step)))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(scripts())
def test_the_core_runs_sequences_as_the_reference_scheduler(
    connections: tuple[Connection, Connection],
    grpc_calls: tuple[Any, Any],
    script: tuple[str, list[Step]],
) -> None:
    model, steps_ = script
    core = answers(connections[0], grpc_calls[0], model, steps_)
    reference = answers(connections[1], grpc_calls[1], model, steps_)
    assert core == reference


def test_null_requests_fill_the_slots_below_a_busy_one(
    connections: tuple[Connection, Connection], grpc_calls: tuple[Any, Any]
) -> None:
    """Three sequences take slots 0, 1 and 2; once the first two ended, the third's requests
    run in batches of three, two of them null requests shaped like it, with READY false (the
    probe's BATCH output), on both paths alike."""
    first, second, third = (next(_fresh_ids) for _ in range(3))
    step = plain_step
    script = [
        step(first, True, False, [1]),
        step(second, True, False, [2]),
        step(third, True, False, [3, 4]),
        step(first, False, True, [5]),
        step(second, False, True, [6]),
        step(third, False, False, [7, 8]),
        step(third, False, True, [9, 10]),
    ]
    core = answers(connections[0], grpc_calls[0], "seq_probe", script)
    assert core == answers(connections[1], grpc_calls[1], "seq_probe", script)
    batch = json.loads(core[5][2])["outputs"][1]
    assert batch["name"] == "BATCH"
    # 3 requests, 2 of them null, each with 2 zero elements of IN and nothing else set.
    assert batch["data"] == [3, 2, 4]


def test_the_core_keeps_implicit_states(
    connections: tuple[Connection, Connection], grpc_calls: tuple[Any, Any]
) -> None:
    """seq_probe_state's states: HISTORY grows by each request's sum, LAST is the previous
    request's text; a request that returns no state outputs (a sum that is a multiple of 5)
    or fails (a 7) leaves them as they were; START starts again from the initial states; a
    null request gets the initial states; the state outputs never reach the client."""
    first, second = next(_fresh_ids), next(_fresh_ids)
    step = plain_step
    script = [
        step(first, True, False, [1, 2], "json"),
        step(first, False, False, [4], "binary"),
        step(first, False, False, [2, 3], "grpc"),  # sums to 5: no state outputs
        step(first, False, False, [7], "json"),  # fails
        step(second, True, False, [1], "json"),  # slot 1: a batch of two, slot 0 null
        step(first, False, False, [1], "grpc"),
        step(first, True, False, [9], "json"),  # START again: the initial states
        step(first, False, True, [1], "json"),
        step(second, False, True, [3], "binary"),
    ]
    core = answers(connections[0], grpc_calls[0], "seq_probe_state", script)
    assert core == answers(connections[1], grpc_calls[1], "seq_probe_state", script)

    def seen(answer: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        if len(answer) == 2:  # a gRPC answer: ("ok", reply)
            assert answer[0] == "ok", answer
            response = pb.ModelInferResponse.FromString(answer[1])
            assert [o.name for o in response.outputs] == ["BATCH", "SEEN"]
            got = json.loads(response.raw_output_contents[1][4:])
            return got["history"], got["last"], None
        status, _, body = answer
        assert status.endswith(b" 200 OK"), answer
        doc = json.loads(body)
        assert [o["name"] for o in doc["outputs"]] == ["BATCH", "SEEN"]
        got = json.loads(doc["outputs"][1]["data"][0])
        return got["history"], got["last"], doc["outputs"][0]["data"]

    assert seen(core[0])[:2] == ([[0]], [""])
    assert seen(core[1])[:2] == ([[0, 3]], ["1 2"])
    assert seen(core[2])[:2] == ([[0, 3, 4]], ["4"])
    assert not core[3][0].endswith(b" 200 OK")  # the 7
    assert seen(core[4]) == ([[0]], [""], [2, 0, 0])  # slot 0's null request: initial states
    assert seen(core[5])[:2] == ([[0, 3, 4]], ["4"])
    assert seen(core[6])[:2] == ([[0]], [""])
    assert seen(core[7])[:2] == ([[0, 9]], ["9"])
    assert seen(core[8])[:2] == ([[0, 1]], ["1"])


def test_concurrent_sequences_keep_their_sums(servers: tuple[RunningServer, ...]) -> None:
    """Sequences from many clients at once, more than the model has slots, over gRPC through
    the core: every request runs in its sequence's order (the probe echoes its input; the
    client sums them), none is lost, and the statistics count each once."""
    core = servers[0]
    sequences, length = 10, 12
    errors: list[str] = []

    def one(sequence_id: int) -> None:
        client = grpcclient.InferenceServerClient(core.grpc_url)
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        try:
            for step in range(length):
                tensor.set_data_from_numpy(np.array([[sequence_id * 100 + step]], np.int32))
                result = client.infer(
                    "seq_probe",
                    [tensor],
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == length - 1,
                )
                controls = result.as_numpy("CONTROLS").reshape(-1).tolist()
                echoed = int(result.as_numpy("ECHO").reshape(-1)[0])
                expected = [int(step == 0), int(step == length - 1), 1, sequence_id]
                if controls != expected or echoed != sequence_id * 100 + step:
                    errors.append(f"{sequence_id}/{step}: {controls} {echoed}")
        except Exception as exc:
            errors.append(f"{sequence_id}: {exc}")
        finally:
            client.close()

    client = grpcclient.InferenceServerClient(core.grpc_url)
    try:
        before = client.get_inference_statistics("seq_probe", as_json=True)
        ids = [next(_fresh_ids) for _ in range(sequences)]
        threads = [threading.Thread(target=one, args=(i,)) for i in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = client.get_inference_statistics("seq_probe", as_json=True)
    finally:
        client.close()
    assert errors == []

    def successes(stats: dict[str, Any]) -> int:
        return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))

    assert successes(after) - successes(before) == sequences * length
