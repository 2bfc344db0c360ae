"""Our generated protobuf code is wire-compatible with tritonclient's.

Every message (nested ones and map entries included), enum and service that tritonclient
generated from Triton's protos must exist in ours with identical field names, numbers,
types, labels, referenced type names, oneof membership, map-ness, enum values and RPC
signatures; and messages must survive a serialize/parse round trip in both directions.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest
from google.protobuf import descriptor as d
from google.protobuf import text_format
from tritonfast._proto import grpc_service_pb2, health_pb2, model_config_pb2

tc_service = pytest.importorskip("tritonclient.grpc.service_pb2")
tc_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _health_reference() -> ModuleType:
    try:
        return importlib.import_module("grpc_health.v1.health_pb2")
    except ImportError:
        pytest.skip("grpcio-health-checking is not installed")


PAIRS = [
    pytest.param(tc_config, model_config_pb2, id="model_config"),
    pytest.param(tc_service, grpc_service_pb2, id="grpc_service"),
]


def _walk_messages(top: d.Descriptor) -> Iterator[d.Descriptor]:
    yield top
    for nested in top.nested_types:
        yield from _walk_messages(nested)


def _all_messages(fd: d.FileDescriptor) -> dict[str, d.Descriptor]:
    return {
        m.full_name: m for top in fd.message_types_by_name.values() for m in _walk_messages(top)
    }


def _all_enums(fd: d.FileDescriptor) -> dict[str, d.EnumDescriptor]:
    enums = {e.full_name: e for e in fd.enum_types_by_name.values()}
    for message in _all_messages(fd).values():
        enums.update({e.full_name: e for e in message.enum_types})
    return enums


def _is_repeated(field: d.FieldDescriptor) -> bool:
    # FieldDescriptor.label is deprecated in protobuf 6; is_repeated is missing in 5.x.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == d.FieldDescriptor.LABEL_REPEATED  # pragma: no cover


def _field_signature(field: d.FieldDescriptor) -> dict[str, object]:
    message = field.message_type
    return {
        "number": field.number,
        "type": field.type,
        "repeated": _is_repeated(field),
        "has_presence": field.has_presence,
        "json_name": field.json_name,
        "message_type": message.full_name if message else None,
        "enum_type": field.enum_type.full_name if field.enum_type else None,
        "oneof": field.containing_oneof.name if field.containing_oneof else None,
        "map": bool(message and message.GetOptions().map_entry),
    }


def _check_file(theirs: d.FileDescriptor, ours: d.FileDescriptor) -> int:
    """Assert ``ours`` matches ``theirs``; returns how many items were compared."""
    assert ours.package == theirs.package

    their_msgs, our_msgs = _all_messages(theirs), _all_messages(ours)
    assert sorted(our_msgs) == sorted(their_msgs)
    checked = 0
    for name, their_msg in their_msgs.items():
        our_msg = our_msgs[name]
        assert our_msg.GetOptions().map_entry == their_msg.GetOptions().map_entry, name
        assert sorted(our_msg.fields_by_name) == sorted(their_msg.fields_by_name), name
        for field_name, their_field in their_msg.fields_by_name.items():
            ours_sig = _field_signature(our_msg.fields_by_name[field_name])
            assert ours_sig == _field_signature(their_field), f"{name}.{field_name}"
            checked += 1
        their_oneofs = {o.name: sorted(f.name for f in o.fields) for o in their_msg.oneofs}
        our_oneofs = {o.name: sorted(f.name for f in o.fields) for o in our_msg.oneofs}
        assert our_oneofs == their_oneofs, name

    their_enums, our_enums = _all_enums(theirs), _all_enums(ours)
    assert sorted(our_enums) == sorted(their_enums)
    for name, their_enum in their_enums.items():
        their_values = {v.name: v.number for v in their_enum.values}
        assert {v.name: v.number for v in our_enums[name].values} == their_values, name
        checked += len(their_values)

    assert sorted(ours.services_by_name) == sorted(theirs.services_by_name)
    for name, their_service in theirs.services_by_name.items():
        our_service = ours.services_by_name[name]
        assert our_service.full_name == their_service.full_name
        assert sorted(m.name for m in our_service.methods) == sorted(
            m.name for m in their_service.methods
        )
        for their_method in their_service.methods:
            our_method = our_service.methods_by_name[their_method.name]
            for attr in ("client_streaming", "server_streaming"):
                assert getattr(our_method, attr) == getattr(their_method, attr), their_method
            assert our_method.input_type.full_name == their_method.input_type.full_name
            assert our_method.output_type.full_name == their_method.output_type.full_name
            checked += 1
    return checked


@pytest.mark.parametrize(("theirs", "ours"), PAIRS)
def test_descriptors_match_tritonclient(theirs: ModuleType, ours: ModuleType) -> None:
    assert _check_file(theirs.DESCRIPTOR, ours.DESCRIPTOR) > 20


def test_service_has_every_rpc() -> None:
    methods = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    assert len(methods) == 20
    stream = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[
        "ModelStreamInfer"
    ]
    assert stream.client_streaming and stream.server_streaming


def test_health_matches_grpc_health_v1() -> None:
    reference = _health_reference()
    assert _check_file(reference.DESCRIPTOR, health_pb2.DESCRIPTOR) >= 6
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    assert service.full_name == "grpc.health.v1.Health"
    assert sorted(m.name for m in service.methods) == ["Check", "Watch"]


def test_private_pool_keeps_both_importable() -> None:
    # Both sets of classes are loaded in this process; they are distinct classes over the
    # same wire format.
    assert tc_config.ModelConfig is not model_config_pb2.ModelConfig
    assert tc_config.ModelConfig.DESCRIPTOR.full_name == "inference.ModelConfig"
    assert model_config_pb2.ModelConfig.DESCRIPTOR.full_name == "inference.ModelConfig"


# -- round trips ----------------------------------------------------------------------------

CONFIG_TEXT = """
name: "everything"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "model.py"
max_batch_size: 16
version_policy { specific { versions: [1, 3] } }
input {
  name: "INPUT0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, -1, -1]
  reshape { shape: [3, 224, 224] } allow_ragged_batch: true optional: true
}
input { name: "TEXT" data_type: TYPE_STRING dims: [1] is_shape_tensor: false }
output { name: "OUTPUT0" data_type: TYPE_BF16 dims: [-1] label_filename: "labels.txt" }
batch_input { kind: BATCH_ITEM_SHAPE target_name: "T" data_type: TYPE_INT32 source_input: "INPUT0" }
batch_output { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" }
instance_group {
  name: "g" kind: KIND_GPU count: 2 gpus: [0, 1] profile: "p"
  rate_limiter { resources { name: "R" global: true count: 3 } priority: 2 }
  secondary_devices { kind: KIND_NVDLA device_id: 7 }
  passive: true host_policy: "numa0"
}
dynamic_batching {
  preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100 preserve_ordering: true
  priority_levels: 2 default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 max_queue_size: 9 }
  priority_queue_policy { key: 2 value { allow_timeout_override: true } }
}
optimization {
  graph { level: 1 } priority: PRIORITY_MAX
  cuda {
    graphs: true busy_wait_events: true output_copy_stream: true
    graph_spec {
      batch_size: 4
      input { key: "INPUT0" value { dim: [3, 8] } }
      graph_lower_bound { batch_size: 1 input { key: "INPUT0" value { dim: [3, 1] } } }
    }
  }
  execution_accelerators {
    gpu_execution_accelerator {
      name: "tensorrt" parameters { key: "precision_mode" value: "FP16" }
    }
    cpu_execution_accelerator { name: "openvino" }
  }
  input_pinned_memory { enable: true } output_pinned_memory { enable: false }
  gather_kernel_buffer_threshold: 3 eager_batching: true
}
default_model_filename: "model.onnx"
cc_model_filenames { key: "8.0" value: "a100.plan" }
metric_tags { key: "team" value: "ml" }
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/env.tar.gz" } }
model_warmup {
  name: "w" batch_size: 2 count: 3
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [3, 4, 4] random_data: true } }
}
model_operations { op_library_filename: "libops.so" }
model_transaction_policy { decoupled: true }
model_repository_agents { agents { name: "checksum" parameters { key: "k" value: "v" } } }
response_cache { enable: true }
model_metrics {
  metric_control {
    metric_identifier { family: "nv_inference_first_response_histogram_ms" }
    histogram_options { buckets: [1.0, 10.5] }
  }
}
"""

SEQUENCE_TEXT = """
name: "seq"
sequence_batching {
  max_sequence_idle_microseconds: 1000
  control_input {
    name: "START"
    control { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }
    control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }
    control { kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1] bool_false_true: [false, true] }
  }
  state {
    input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_INT64 dims: [1]
    initial_state { name: "zero" data_type: TYPE_INT64 dims: [1] zero_data: true }
    use_same_buffer_for_input_output: true use_growable_memory: true
  }
  oldest { max_candidate_sequences: 4 preferred_batch_size: [2] max_queue_delay_microseconds: 7 }
  iterative_sequence: true
}
"""

ENSEMBLE_TEXT = """
name: "pipe" platform: "ensemble" max_batch_size: 4
version_policy { latest { num_versions: 2 } }
ensemble_scheduling {
  max_inflight_requests: 8
  step {
    model_name: "a" model_version: -1 model_namespace: "ns"
    input_map { key: "x" value: "y" } output_map { key: "z" value: "w" }
  }
}
"""


def _infer_request_text() -> str:
    return """
model_name: "identity_fp32" model_version: "1" id: "req-7"
parameters { key: "sequence_id" value { uint64_param: 18446744073709551615 } }
parameters { key: "priority" value { int64_param: -3 } }
parameters { key: "flag" value { bool_param: true } }
parameters { key: "ratio" value { double_param: 0.25 } }
parameters { key: "tag" value { string_param: "t\\000x" } }
inputs {
  name: "INPUT0" datatype: "FP32" shape: [2, 2]
  parameters { key: "shared_memory_region" value { string_param: "r" } }
  contents { fp32_contents: [1, 2.5, -3, 4] }
}
inputs {
  name: "INPUT1" datatype: "BYTES" shape: [2] contents { bytes_contents: ["a\\000", "\\377"] }
}
inputs { name: "INPUT2" datatype: "INT64" shape: [1] contents { int64_contents: [-9] } }
inputs { name: "INPUT3" datatype: "UINT64" shape: [1] contents { uint64_contents: [9] } }
inputs { name: "INPUT4" datatype: "UINT8" shape: [1] contents { uint_contents: [200] } }
inputs { name: "INPUT5" datatype: "INT8" shape: [1] contents { int_contents: [-100] } }
inputs { name: "INPUT6" datatype: "BOOL" shape: [1] contents { bool_contents: [true] } }
inputs { name: "INPUT7" datatype: "FP64" shape: [1] contents { fp64_contents: [1e300] } }
inputs { name: "RAW" datatype: "FP16" shape: [1] }
outputs { name: "OUTPUT0" parameters { key: "classification" value { int64_param: 3 } } }
raw_input_contents: "\\000<"
"""


@pytest.mark.parametrize(
    ("theirs_cls", "ours_cls", "text"),
    [
        pytest.param(tc_config.ModelConfig, model_config_pb2.ModelConfig, CONFIG_TEXT, id="config"),
        pytest.param(
            tc_config.ModelConfig, model_config_pb2.ModelConfig, SEQUENCE_TEXT, id="sequence"
        ),
        pytest.param(
            tc_config.ModelConfig, model_config_pb2.ModelConfig, ENSEMBLE_TEXT, id="ensemble"
        ),
        pytest.param(
            tc_service.ModelInferRequest,
            grpc_service_pb2.ModelInferRequest,
            _infer_request_text(),
            id="infer_request",
        ),
    ],
)
def test_round_trip_both_ways(theirs_cls: type, ours_cls: type, text: str) -> None:
    theirs = text_format.Parse(text, theirs_cls())
    ours = text_format.Parse(text, ours_cls())
    assert theirs.ByteSize() > 0

    # Theirs -> ours -> theirs, and ours -> theirs: nothing lost, nothing unknown.
    parsed_ours = ours_cls.FromString(theirs.SerializeToString())
    assert parsed_ours == ours
    assert text_format.MessageToString(parsed_ours) == text_format.MessageToString(theirs)
    assert theirs_cls.FromString(parsed_ours.SerializeToString()) == theirs
    parsed_theirs = theirs_cls.FromString(ours.SerializeToString())
    assert parsed_theirs == theirs
    assert parsed_theirs.SerializeToString(deterministic=True) == ours.SerializeToString(
        deterministic=True
    )


def test_infer_response_round_trip() -> None:
    ours = grpc_service_pb2.ModelInferResponse(model_name="m", model_version="2", id="x")
    out = ours.outputs.add(name="OUTPUT0", datatype="BYTES", shape=[1])
    out.parameters["binary_data_size"].int64_param = 5
    ours.raw_output_contents.append(b"\x01\x00\x00\x00\xff")
    stream = grpc_service_pb2.ModelStreamInferResponse(error_message="", infer_response=ours)
    theirs = tc_service.ModelStreamInferResponse.FromString(stream.SerializeToString())
    assert theirs.infer_response.outputs[0].parameters["binary_data_size"].int64_param == 5
    assert theirs.infer_response.raw_output_contents == [b"\x01\x00\x00\x00\xff"]
    back = grpc_service_pb2.ModelStreamInferResponse.FromString(theirs.SerializeToString())
    assert back == stream
