"""An ensemble's graph, from its ``ensemble_scheduling`` section, and Triton's checks of it.

Each step names a model (and a version, -1 for the model's own policy), maps the model's inputs
to ensemble tensors (``input_map { key: model input, value: ensemble tensor }``) and its outputs
to ensemble tensors (``output_map { key: model output, value: ensemble tensor }``). The
ensemble's inputs exist from the start; a step runs once every tensor it consumes exists, so
independent steps run at the same time.

Checked in two stages, as Triton does, with its messages:

- :func:`plan_of`, from the ensemble's config alone: steps present and complete, no instance
  groups, every tensor produced once, every ensemble input used, every ensemble output written,
  no tensor produced and never used. (Steps in a cycle leave an output unwritten or a tensor
  unused, which is how Triton reports them too.)
- :func:`check_composing`, once the step models are loaded: the maps name real inputs and
  outputs, every required input of a step model is mapped, each tensor has one datatype, and
  no step model batches less than the ensemble does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tritonfast._proto.model_config_pb2 import DataType, ModelConfig
from tritonfast.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    model_name: str
    model_version: str  # "" for the model's own version policy
    # (model input, ensemble tensor)
    inputs: tuple[tuple[str, str], ...]
    # (model output, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    steps: tuple[Step, ...]
    inputs: frozenset[str]
    outputs: tuple[str, ...]

    def ready(self, available: set[str], started: set[int]) -> list[Step]:
        """The steps not yet started whose inputs all exist."""
        return [
            step
            for step in self.steps
            if step.index not in started and all(tensor in available for _, tensor in step.inputs)
        ]

    def needed_for(self, outputs: list[str]) -> set[int]:
        """The steps that ``outputs`` depend on (the others need not run)."""
        producer = {tensor: step for step in self.steps for _, tensor in step.outputs}
        needed: set[int] = set()
        wanted = list(outputs)
        while wanted:
            step = producer.get(wanted.pop())
            if step is not None and step.index not in needed:
                needed.add(step.index)
                wanted.extend(tensor for _, tensor in step.inputs)
        return needed

    def models(self) -> list[str]:
        """The step models, each once, in step order."""
        return list(dict.fromkeys(step.model_name for step in self.steps))


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == "ensemble" or config.HasField("ensemble_scheduling")


def plan_of(config: ModelConfig) -> EnsemblePlan:
    """The graph of ``config``, checked on its own (InvalidArgumentError otherwise)."""
    name = config.name
    if not config.HasField("ensemble_scheduling"):
        raise InvalidArgumentError(
            f"ensemble scheduling must be set for ensemble {name} whose platform is ensemble"
        )
    if config.backend:
        raise InvalidArgumentError(
            f"Ensemble model '{name}' must have platform type 'ensemble' and empty backend type"
        )
    if config.instance_group:
        raise InvalidArgumentError(f"instance group should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise InvalidArgumentError(f"model_warmup can not be specified for ensemble '{name}'")
    scheduling = config.ensemble_scheduling
    if not scheduling.step:
        raise InvalidArgumentError(f"must specify 'step' for ensemble '{name}'")
    inputs = frozenset(tensor.name for tensor in config.input)
    outputs = tuple(tensor.name for tensor in config.output)
    steps = []
    produced: set[str] = set()
    consumed: set[str] = set()
    for index, spec in enumerate(scheduling.step):
        for field, given in (
            ("model_name", bool(spec.model_name)),
            ("input_map", bool(spec.input_map)),
            ("output_map", bool(spec.output_map)),
        ):
            if not given:
                raise InvalidArgumentError(
                    f"must specify '{field}' in step {index} of ensemble '{name}'"
                )
        for tensor in spec.output_map.values():
            if tensor in produced:
                raise InvalidArgumentError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for"
                    f" ensemble '{name}' step {index}"
                )
            produced.add(tensor)
        consumed.update(spec.input_map.values())
        # Only -1 means the model's own policy: a step without a version asks for version 0.
        version = "" if spec.model_version == -1 else str(spec.model_version)
        steps.append(
            Step(
                index,
                spec.model_name,
                version,
                tuple(sorted(spec.input_map.items())),
                tuple(sorted(spec.output_map.items())),
            )
        )
    plan = EnsemblePlan(name, tuple(steps), inputs, outputs)
    for tensor in config.input:
        if tensor.name not in consumed:
            # (sic: Triton's message has a stray quote after the name)
            raise InvalidArgumentError(
                f"ensemble input '{tensor.name}' for ensemble {name}' is not used"
            )
    written = _reachable(plan)
    for tensor in outputs:
        if tensor not in written:
            message = f"output '{tensor}' for ensemble '{name}' is not written"
            missing = _unconnected_input(plan, tensor, written)
            if missing is not None:
                message += f": at least one of its depending tensors, '{missing}', is not connected"
            raise InvalidArgumentError(message)
    for tensor in sorted((produced | consumed) - inputs):
        if tensor not in written or (tensor not in consumed and tensor not in outputs):
            raise InvalidArgumentError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")
    return plan


def _unconnected_input(plan: EnsemblePlan, tensor: str, written: set[str]) -> str | None:
    """An input that keeps the step producing ``tensor`` from running (None when no step
    produces it)."""
    for step in plan.steps:
        if any(produced == tensor for _, produced in step.outputs):
            for _, needed in step.inputs:
                if needed not in written:
                    return needed
    return None


def _reachable(plan: EnsemblePlan) -> set[str]:
    """The tensors an execution can produce (walking the graph as one would)."""
    available = set(plan.inputs)
    started: set[int] = set()
    while ready := plan.ready(available, started):
        for step in ready:
            started.add(step.index)
            available.update(tensor for _, tensor in step.outputs)
    return available


def check_composing(
    plan: EnsemblePlan, config: ModelConfig, models: Mapping[str, ModelConfig]
) -> None:
    """Check ``plan`` against its loaded step models' configs (``models`` by name)."""
    name = plan.name
    datatypes: dict[str, tuple[int, str]] = {
        tensor.name: (tensor.data_type, name) for tensor in (*config.input, *config.output)
    }

    def agree(tensor: str, datatype: int, model: str) -> None:
        known = datatypes.setdefault(tensor, (datatype, model))
        if known[0] != datatype:
            raise InvalidArgumentError(
                f"in ensemble {name}, ensemble tensor {tensor}: inconsistent data type:"
                f" {DataType.Name(known[0])} is inferred from model {known[1]} while"
                f" {DataType.Name(datatype)} is inferred from model {model}"
            )

    for step in plan.steps:
        model = models[step.model_name]
        batch = model.max_batch_size
        if batch > 0 and config.max_batch_size > batch:
            raise InvalidArgumentError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it"
                f" contains model {step.model_name} which only allows maximum batch size to"
                f" be {batch}"
            )
        model_inputs = {tensor.name: tensor for tensor in model.input}
        model_outputs = {tensor.name: tensor for tensor in model.output}
        mapped = {model_input for model_input, _ in step.inputs}
        for model_input, tensor in step.inputs:
            if model_input not in model_inputs:
                raise InvalidArgumentError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing"
                    f" input {model_input} in model {step.model_name}"
                )
            agree(tensor, model_inputs[model_input].data_type, step.model_name)
        for model_output, tensor in step.outputs:
            if model_output not in model_outputs:
                raise InvalidArgumentError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing"
                    f" output {model_output} in model {step.model_name}"
                )
            agree(tensor, model_outputs[model_output].data_type, step.model_name)
        for model_input, tensor_spec in model_inputs.items():
            if model_input not in mapped and not tensor_spec.optional:
                raise InvalidArgumentError(
                    f"in ensemble {name}, input {model_input} in model {step.model_name} is not"
                    " mapped to any ensemble tensors"
                )
