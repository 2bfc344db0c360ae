"""Read a model's ``config.pbtxt`` into ``inference.ModelConfig`` and check it.

Parsing uses protobuf's own text-format parser (never a hand-written one); a syntax error
is reported with the file, line and column the parser names.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from tritonfast._proto import model_config_pb2
from tritonfast.config.sequence import complete_sequence_batching, validate_sequence_batching
from tritonfast.errors import InvalidArgumentError

CONFIG_FILE = "config.pbtxt"


class PollError(InvalidArgumentError):
    """A configuration Triton refuses while it polls the repository, before any version is
    loaded (it cannot be read or parsed, or breaks a model-wide rule): the repository index
    lists the model by name only, and a load request gets "failed to poll from model
    repository"."""


ModelConfig = model_config_pb2.ModelConfig
DataType = model_config_pb2.DataType

# Files that identify a backend when config.pbtxt names none (Triton's default file names).
_BACKEND_BY_FILE = (
    ("model.py", "python"),
    ("model.onnx", "onnxruntime"),
    ("model.plan", "tensorrt"),
)


def read_config(model_dir: Path, *, required: bool = False) -> ModelConfig:
    """Parse ``model_dir/config.pbtxt``; an absent file gives an empty config unless required."""
    path = model_dir / CONFIG_FILE
    config = ModelConfig()
    if not path.exists():
        if required:
            raise PollError(f"model configuration file '{path}' does not exist")
        return config
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PollError(f"failed to read '{path}': {exc}") from exc
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        # ParseError text is "LINE:COL : message"; keep it whole and name the file.
        raise PollError(f"failed to parse model configuration '{path}': {exc}") from exc
    return config


def fill_defaults(config: ModelConfig, model_dir: Path) -> None:
    """Defaults Triton applies before validation: the name and the backend."""
    if not config.name:
        config.name = model_dir.name
    if not config.backend and not config.platform:
        for version_dir in _version_dirs(model_dir):
            for file_name, backend in _BACKEND_BY_FILE:
                if (version_dir / (config.default_model_filename or file_name)).exists():
                    config.backend = backend
                    break
            if config.backend:
                break


def validate_identity(config: ModelConfig, model_dir: Path) -> None:
    """The rules Triton checks first while it polls, before it looks for versions (as
    :class:`PollError`): the model's name is its directory's, and a backend is known (named,
    or found from a version's model file by :func:`fill_defaults`)."""
    if config.name != model_dir.name:
        raise PollError(
            f"unexpected directory name '{model_dir.name}' for model '{config.name}',"
            " directory name must equal model name"
        )
    if not config.backend and not config.platform:
        raise PollError(
            f"Invalid model name: Could not determine backend for model '{config.name}' with"
            " no backend in model configuration. Expected model name of the form"
            " 'model.<backend_name>'."
        )


def validate(config: ModelConfig, model_dir: Path) -> None:
    """Reject configurations Triton would reject, with a message that names the problem, as
    :class:`PollError`: Triton checks these model-wide rules while it polls the repository.
    The inputs and outputs are checked apart (:func:`validate_io`): Triton fails the model's
    versions for those."""
    validate_identity(config, model_dir)
    try:
        _validate_model_wide(config, model_dir)
    except InvalidArgumentError as exc:
        raise PollError(exc.message) from exc


def _validate_model_wide(config: ModelConfig, model_dir: Path) -> None:
    if config.max_batch_size < 0:
        raise InvalidArgumentError(f"'max_batch_size' must be non-negative value for {config.name}")
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        # Triton warns and ignores the batcher in this case rather than failing.
        config.ClearField("dynamic_batching")
    for preferred in config.dynamic_batching.preferred_batch_size:
        if preferred < 1:
            raise InvalidArgumentError(
                f"dynamic batching preferred size must be positive for {config.name}"
            )
        if preferred > config.max_batch_size:
            raise InvalidArgumentError(
                f"dynamic batching preferred size must be <= max batch size for {config.name}"
            )
    validate_sequence_batching(config, model_dir)


def validate_io(config: ModelConfig) -> None:
    """The inputs' and outputs' rules, in Triton's words (which fails the model's versions
    with them: "Invalid argument: model input 'X' must specify 'dims' for m"). Names may
    repeat: Triton 2.51 loads such a model."""
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            if not tensor.name:
                raise InvalidArgumentError(f"model {kind} must specify 'name' for {config.name}")
            named = f"model {kind} '{tensor.name}'"
            if tensor.data_type == DataType.TYPE_INVALID:
                raise InvalidArgumentError(f"{named} must specify 'data_type' for {config.name}")
            if not tensor.dims:  # a reshape does not stand in for them
                raise InvalidArgumentError(f"{named} must specify 'dims' for {config.name}")
            for dim in tensor.dims:
                if dim < -1 or dim == 0:
                    raise InvalidArgumentError(
                        f"{named} dimension must be integer >= 1, or -1 to indicate a"
                        f" variable-size dimension for {config.name}"
                    )


def _version_dirs(model_dir: Path) -> list[Path]:
    return sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
        reverse=True,
    )


def complete(
    config: ModelConfig, default_model_filename: str = "", default_cpu_instance_count: int = 1
) -> None:
    """Fill in what Triton's normalisation fills in, so the served config reads the same.

    Runs after validation: version policy (latest 1), named instance groups with a kind (CPU
    for AUTO) and a count (``default_cpu_instance_count`` for a CPU group, else 1), the
    backend's default model file name, the pinned-memory optimisation defaults, a preferred
    batch size equal to max_batch_size when dynamic batching names none, and the sequence
    batcher's defaults.
    """
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("ensemble_scheduling"):
        return  # an ensemble has no instances, model file or batcher of its own
    if not config.instance_group:
        # Named after the model, so its one instance is "<model>_0" (as in Triton).
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_AUTO:
            group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            cpu = group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
            group.count = default_cpu_instance_count if cpu else 1
    if default_model_filename and not config.default_model_filename:
        config.default_model_filename = default_model_filename
    optimization = config.optimization  # each one unset is on, whatever else is set
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    if (
        config.HasField("dynamic_batching")
        and config.max_batch_size > 0
        and not config.dynamic_batching.preferred_batch_size
    ):
        config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    complete_sequence_batching(config)
