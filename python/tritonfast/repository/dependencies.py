"""Which models an ensemble is made of, and the order to load models in so that an ensemble
comes after the models of its steps (as Triton's repository manager orders them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from tritonfast.config import load as config_load
from tritonfast.errors import TritonError


def composing_models(model_dir: Path) -> list[str]:
    """The step models named in ``model_dir``'s config when it is an ensemble (else none; a
    config that does not parse names none: its load reports why)."""
    try:
        config = config_load.read_config(model_dir)
    except TritonError:
        return []
    steps = config.ensemble_scheduling.step
    return list(dict.fromkeys(step.model_name for step in steps if step.model_name))


def with_dependencies(names: Iterable[str], found: Mapping[str, Path]) -> list[str]:
    """``names`` and, for each ensemble among them, the models it is made of (recursively),
    each model after the ones it depends on; names not in ``found`` are kept (their load
    reports them missing)."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or name in visiting:
            return  # done, or a cycle (whose load reports it)
        visiting.add(name)
        if name in found:
            for dependency in composing_models(found[name]):
                visit(dependency)
        visiting.discard(name)
        order.append(name)

    for name in names:
        visit(name)
    return order
