"""An ensemble's graph, from its ``ensemble_scheduling`` section: which steps consume and
produce which ensemble tensors, checked at load.

Each step names a model (and a version, -1 for the model's policy), maps the model's inputs
to ensemble tensors (``input_map { key: model input, value: ensemble tensor }``) and its
outputs to ensemble tensors (``output_map { key: model output, value: ensemble tensor }``).
The ensemble's own inputs are the tensors that exist from the start; a step runs once every
tensor it consumes exists, so independent steps run at the same time.

Refused at load (the texts follow Triton's): no steps, a step without a model, a tensor
consumed that no step produces and that is no ensemble input, a tensor produced twice (or an
ensemble input produced by a step), an ensemble output that no step produces, steps that
depend on each other in a cycle, and a step that can never run.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonfast._proto.model_config_pb2 import ModelConfig
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


def plan_of(config: ModelConfig) -> EnsemblePlan:
    """The checked graph of ``config`` (InvalidArgumentError with the reason otherwise)."""
    name = config.name
    scheduling = config.ensemble_scheduling
    if not config.HasField("ensemble_scheduling") or not scheduling.step:
        raise InvalidArgumentError(f"must specify one or more 'step's for ensemble {name}")
    inputs = frozenset(tensor.name for tensor in config.input)
    outputs = tuple(tensor.name for tensor in config.output)
    steps = []
    producer: dict[str, int] = {}
    for index, spec in enumerate(scheduling.step):
        if not spec.model_name:
            raise InvalidArgumentError(
                f"must specify 'model_name' in step {index} of ensemble {name}"
            )
        if not spec.input_map or not spec.output_map:
            raise InvalidArgumentError(
                f"must specify 'input_map' and 'output_map' in step {index} of ensemble {name}"
            )
        for tensor in spec.output_map.values():
            if tensor in inputs or tensor in producer:
                raise InvalidArgumentError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for"
                    f" ensemble {name} step {index}"
                )
            producer[tensor] = index
        version = "" if spec.model_version < 0 else str(spec.model_version)
        steps.append(
            Step(
                index,
                spec.model_name,
                version,
                tuple(sorted(spec.input_map.items())),
                tuple(sorted(spec.output_map.items())),
            )
        )
    for step in steps:
        for _, tensor in step.inputs:
            if tensor not in inputs and tensor not in producer:
                raise InvalidArgumentError(
                    f"ensemble tensor '{tensor}' is used as input of step {step.index} of"
                    f" ensemble {name}, but no step produces it and it is no ensemble input"
                )
    for tensor in outputs:
        if tensor not in producer:
            raise InvalidArgumentError(
                f"ensemble output '{tensor}' of ensemble {name} is not produced by any step"
            )
    plan = EnsemblePlan(name, tuple(steps), inputs, outputs)
    _check_every_step_runs(plan)
    return plan


def _check_every_step_runs(plan: EnsemblePlan) -> None:
    """Walk the graph as an execution would: what never becomes ready is part of a cycle."""
    available = set(plan.inputs)
    started: set[int] = set()
    while ready := plan.ready(available, started):
        for step in ready:
            started.add(step.index)
            available.update(tensor for _, tensor in step.outputs)
    stuck = [step.index for step in plan.steps if step.index not in started]
    if stuck:
        raise InvalidArgumentError(
            f"circular dependency among the steps {stuck} of ensemble {plan.name}: their"
            " inputs are produced only by each other"
        )
