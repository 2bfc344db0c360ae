"""Fault injection: a flood of sequences that never end, more than the model has slots for,
with requests of unknown sequences mixed in. Every request is answered (the backlog takes the
slots that idle sequences leave), and the server's descriptors, processes and memory stay
flat."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.e2e.faults import SCALE, Calls, census, report
from tests.e2e.models_on_disk import write_model

SLOTS = 8
IDLE_US = 200_000

CONFIG = f"""
backend: "python"
max_batch_size: {SLOTS}
sequence_batching {{
  max_sequence_idle_microseconds: {IDLE_US}
  control_input [ {{
    name: "CORRID"
    control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ]
  }} ]
}}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "CORRID_SEEN" data_type: TYPE_UINT64 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("CORRID_SEEN", corrid)]))
        return answers
"""


def _x() -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    return [x]


def _unended_sequence(server, sequence_id: int, requests: int = 3):
    """START and more requests of one sequence, never its END; the IDs the model saw."""

    def run() -> list[int]:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            return [
                int(
                    client.infer(
                        "sequence",
                        _x(),
                        sequence_id=sequence_id,
                        sequence_start=index == 0,
                        client_timeout=60,
                    ).as_numpy("CORRID_SEEN")[0, 0]
                )
                for index in range(requests)
            ]
        finally:
            client.close()

    return run


def _unknown_sequence(server, sequence_id: int):
    """A request of a sequence that never started: refused at once."""

    def run() -> str:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            client.infer("sequence", _x(), sequence_id=sequence_id, client_timeout=60)
        except InferenceServerException as refused:
            return refused.message()
        finally:
            client.close()
        raise AssertionError("a request of an unknown sequence was served")

    return run


def _flood(server, count: int, first_id: int) -> None:
    """``count`` sequences at once, each started and never ended, and a quarter as many
    requests of sequences that never started; checks every answer."""
    calls = [_unended_sequence(server, first_id + i) for i in range(count)]
    calls += [_unknown_sequence(server, 1_000_000 + first_id + i) for i in range(count // 4)]
    results = Calls(calls).results(60)
    for sequence_id, seen in enumerate(results[:count], start=first_id):
        assert seen == [sequence_id] * 3, seen
    for refused in results[count:]:
        assert "must specify the START flag" in refused, refused


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_flood_of_sequences_that_never_end_is_answered_and_leaves_nothing(tmp_path, mode) -> None:
    repository = tmp_path / "models"
    config = CONFIG + (
        f'parameters {{ key: "TRITONFAST_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }}'
    )
    write_model(repository, "sequence", config, MODEL)
    server = start_server([repository], tmp_path / "server.log")
    try:
        flood = 6 * SLOTS * SCALE
        _flood(server, flood, first_id=1)  # what a flood starts (threads, buffers) stays
        before = census(server.proc.pid)
        _flood(server, flood, first_id=1 + flood)
        grew = census(server.proc.pid).grew_by(before)
        report(f"sequence flood, {mode} mode", sequences=flood, unknown=flood // 4, server=grew)
        assert grew.descriptors <= 2, grew
        assert grew.processes <= 0, grew
        assert grew.rss_mib < 16, grew
        # Every slot is free again: a new sequence runs at once.
        assert _unended_sequence(server, 99, requests=1)() == [99]
    finally:
        assert server.stop() == 0, server.log()
