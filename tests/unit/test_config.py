"""config.pbtxt parsing, defaults, validation and the JSON form."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2
from tritonfast.config import load
from tritonfast.config.jsonform import config_to_json, json_to_config
from tritonfast.errors import InvalidArgumentError

MODELS = Path(__file__).resolve().parents[1] / "models"
BROKEN = Path(__file__).resolve().parents[1] / "models_broken"


def write_model(tmp_path: Path, name: str, config_text: str, model_file: str = "model.py") -> Path:
    model_dir = tmp_path / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config_text)
    (model_dir / "1" / model_file).write_text("")
    return model_dir


def test_parses_dynamic_batching_and_int64_dims_as_numbers() -> None:
    config = load.read_config(MODELS / "batching")
    assert config.max_batch_size == 16
    assert config.dynamic_batching.max_queue_delay_microseconds == 20000
    as_json = config_to_json(config)
    assert as_json["input"][0]["dims"] == [-1]
    assert as_json["input"][0]["data_type"] == "TYPE_FP32"
    assert as_json["dynamic_batching"]["max_queue_delay_microseconds"] == 20000


def test_syntax_error_names_file_line_and_column() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        load.read_config(BROKEN / "broken_cfg")
    message = info.value.message
    assert "broken_cfg/config.pbtxt" in message
    assert "3:1" in message


def test_name_defaults_to_directory_and_backend_to_python(tmp_path: Path) -> None:
    model_dir = write_model(
        tmp_path, "plain", 'input [ { name: "A" data_type: TYPE_INT8 dims: [1] } ]'
    )
    config = load.read_config(model_dir)
    load.fill_defaults(config, model_dir)
    assert config.name == "plain"
    assert config.backend == "python"


def test_backend_detected_from_onnx_file(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "onnx", "max_batch_size: 2", model_file="model.onnx")
    config = load.read_config(model_dir)
    load.fill_defaults(config, model_dir)
    assert config.backend == "onnxruntime"


def test_the_name_and_backend_are_checked_before_the_versions(tmp_path: Path) -> None:
    # Triton 2.51 refuses these while polling even when the model has no version to load.
    misnamed = write_model(tmp_path, "m", 'name: "other" backend: "python"')
    config = load.read_config(misnamed)
    load.fill_defaults(config, misnamed)
    with pytest.raises(load.PollError, match="unexpected directory name 'm'"):
        load.validate_identity(config, misnamed)
    unknown = write_model(tmp_path, "n", "max_batch_size: 2", model_file="weights.bin")
    config = load.read_config(unknown)
    load.fill_defaults(config, unknown)
    with pytest.raises(load.PollError) as info:
        load.validate_identity(config, unknown)
    assert info.value.message == (
        "Invalid model name: Could not determine backend for model 'n' with no backend in model"
        " configuration. Expected model name of the form 'model.<backend_name>'."
    )


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        (
            'name: "other" backend: "python"',
            InvalidArgumentError,
            "unexpected directory name 'm' for model 'other', directory name must equal model name",
        ),
        (
            'backend: "python" max_batch_size: -1',
            load.PollError,
            "'max_batch_size' must be non-negative value for m",
        ),
        (
            'backend: "python" max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }',
            load.PollError,
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            'backend: "python" max_batch_size: 4 dynamic_batching { preferred_batch_size: [0] }',
            load.PollError,
            "dynamic batching preferred size must be positive for m",
        ),
    ],
)
def test_model_wide_rules_are_checked_as_triton_polls(
    tmp_path: Path, text: str, error: type[InvalidArgumentError], message: str
) -> None:
    model_dir = write_model(tmp_path, "m", text)
    config = load.read_config(model_dir)
    load.fill_defaults(config, model_dir)
    with pytest.raises(error) as info:
        load.validate(config, model_dir)
    assert info.value.message == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("input [ { data_type: TYPE_FP32 dims: [1] } ]", "model input must specify 'name' for m"),
        ('input [ { name: "A" dims: [1] } ]', "model input 'A' must specify 'data_type' for m"),
        (
            'input [ { name: "A" data_type: TYPE_FP32 } ]',
            "model input 'A' must specify 'dims' for m",
        ),
        (
            'max_batch_size: 4 output [ { name: "B" data_type: TYPE_FP32 dims: []'
            " reshape: { shape: [] } } ]",
            "model output 'B' must specify 'dims' for m",
        ),
        (
            'input [ { name: "A" data_type: TYPE_FP32 dims: [0] } ]',
            "model input 'A' dimension must be integer >= 1, or -1 to indicate a variable-size"
            " dimension for m",
        ),
    ],
)
def test_inputs_and_outputs_are_checked_in_tritons_words(
    tmp_path: Path, text: str, message: str
) -> None:
    model_dir = write_model(tmp_path, "m", f'backend: "python" {text}')
    config = load.read_config(model_dir)
    load.fill_defaults(config, model_dir)
    load.validate(config, model_dir)  # nothing model-wide
    with pytest.raises(InvalidArgumentError) as info:
        load.validate_io(config)
    assert info.value.message == message


def test_repeated_tensor_names_are_accepted_as_triton_does(tmp_path: Path) -> None:
    two = 'name: "A" data_type: TYPE_FP32 dims: [1]'
    model_dir = write_model(tmp_path, "m", f'backend: "python" input [ {{ {two} }}, {{ {two} }} ]')
    config = load.read_config(model_dir)
    load.fill_defaults(config, model_dir)
    load.validate(config, model_dir)
    load.validate_io(config)


def test_json_round_trip_preserves_config() -> None:
    config = load.read_config(MODELS / "batching")
    again = json_to_config(config_to_json(config), load.ModelConfig())
    assert again == config


def test_strict_mode_requires_config_file(tmp_path: Path) -> None:
    (tmp_path / "nocfg" / "1").mkdir(parents=True)
    assert load.read_config(tmp_path / "nocfg") == load.ModelConfig()
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        load.read_config(tmp_path / "nocfg", required=True)


RICH_INT64 = """
name: "rich64"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching {
  priority_levels: 2
  default_priority_level: 1
  priority_queue_policy { key: 2 value: { default_timeout_microseconds: 7000 } }
}
instance_group [ { kind: KIND_CPU secondary_devices: [ { kind: KIND_NVDLA device_id: 3 } ] } ]
optimization { cuda { graph_spec [ { input { key: "INPUT0" value: { dim: [ 4 ] } } } ] } }
"""


def test_64_bit_fields_are_numbers_where_triton_makes_them_numbers_and_strings_elsewhere() -> None:
    # As Triton 2.51's config endpoint answered for the same configuration.
    config = text_format.Parse(RICH_INT64, model_config_pb2.ModelConfig())
    load.complete(config)
    as_json = config_to_json(config)
    batching = as_json["dynamic_batching"]
    assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 1)
    assert list(batching["priority_queue_policy"]) == ["2"]  # a JSON key is a string
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 7000
    assert as_json["instance_group"][0]["secondary_devices"][0]["device_id"] == "3"
    graph = as_json["optimization"]["cuda"]["graph_spec"][0]
    assert graph["input"]["INPUT0"]["dim"] == ["4"]
    # Pinned memory is on unless the configuration says otherwise, whatever else it sets.
    assert as_json["optimization"]["input_pinned_memory"] == {"enable": True}
    assert as_json["optimization"]["output_pinned_memory"] == {"enable": True}


def test_a_states_dims_are_numbers_and_its_initial_states_strings() -> None:
    config = load.read_config(MODELS.parent / "models_sequence" / "accumulate_state")
    state = config_to_json(config)["sequence_batching"]["state"][0]
    assert state["dims"] == [1]
    assert state["initial_state"][0]["dims"] == ["1"]  # as Triton 2.51 writes them
