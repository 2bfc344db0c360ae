"""``python/tritonfast/_core.pyi`` against the built extension: the names it exports.

``make stubtest`` (part of ``make lint-fast``) checks every signature with mypy's stubtest,
which needs mypy; this test keeps the exported names in step wherever the tests run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tritonfast._core as core

STUB = Path(__file__).resolve().parents[2] / "python" / "tritonfast" / "_core.pyi"


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text(), filename=str(STUB))


def stub_all() -> list[str]:
    for node in stub_tree().body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("the stub has no __all__")


def stub_definitions() -> set[str]:
    names: set[str] = set()
    for node in stub_tree().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_stub_all_lists_exactly_what_the_extension_registers() -> None:
    exported = stub_all()
    assert len(exported) == len(set(exported)), "a name listed twice"
    assert set(exported) == set(core.__all__)


def test_every_exported_name_is_defined_in_the_stub_and_at_runtime() -> None:
    exported = set(stub_all())
    assert exported <= stub_definitions()
    for name in exported:
        assert hasattr(core, name), name
