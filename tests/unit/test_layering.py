"""The package's layers (docs/architecture.md, "Layers"): each imports only the ones below it,
and no modules import each other in a circle.

Read from the source with ``ast``: every import counts for the layers, those under
``if TYPE_CHECKING:`` too (a lower layer does not even name a higher one's types); for circles,
the imports that run (at module level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "python" / "tritonfast"

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "tritonfast",
            "tritonfast._core",
            "tritonfast._proto",
            "tritonfast.errors",
            "tritonfast.logsettings",
            "tritonfast.custommetrics",
            "tritonfast.onnxgen",
        ),
    ),
    ("data", ("tritonfast.data",)),
    ("config", ("tritonfast.config",)),
    ("memory", ("tritonfast.memory",)),
    ("request path", ("tritonfast.runtime", "tritonfast.tracing", "tritonfast.otel")),
    ("backends", ("tritonfast.backends", "tritonfast.callables")),
    ("repository", ("tritonfast.repository",)),
    ("server API", ("tritonfast.api",)),
    ("frontends", ("tritonfast.frontends", "tritonfast.metrics")),
    (
        "server",
        (
            "tritonfast.server",
            "tritonfast.cli",
            "tritonfast.preflight",
            "tritonfast.inprocess",
            "tritonfast.pytriton",
            "tritonfast.perf",
            "tritonfast.__main__",
        ),
    ),
]


def _layer(module: str) -> int:
    best, found = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found >= 0, f"{module} is in no layer: add it to LAYERS"
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: set[str]) -> list[tuple[str, bool]]:
    """(imported module, whether the import runs) for each tritonfast import in ``tree``."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, runs) for a in node.names if a.name.startswith("tritonfast"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tritonfast"):
            assert node.module is not None
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                name = f"{node.module}.{alias.name}"
                found.append((name if name in modules else node.module, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return found


def _graph() -> dict[str, list[tuple[str, bool]]]:
    paths = [p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts]
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(ast.parse(p.read_text()), modules) for p in paths}


def test_no_layer_imports_a_layer_above_it() -> None:
    upward = []
    for module, imports in sorted(_graph().items()):
        for imported, _ in imports:
            if _layer(imported) > _layer(module):
                below, above = LAYERS[_layer(module)][0], LAYERS[_layer(imported)][0]
                upward.append(f"{module} ({below}) imports {imported} ({above})")
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = _graph()
    edges = {
        m: sorted({i for i, runs in imports if runs and i in graph}) for m, imports in graph.items()
    }
    # Tarjan's strongly connected components: a component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges[module]:
            if imported not in index:
                connect(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            connect(module)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_every_module_is_in_a_layer() -> None:
    for module in _graph():
        _layer(module)
