"""The package's imports form a DAG that only looks down the layers (the order below is CONTRIBUTING.md's).

Every ``import`` in every module counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import
that runs upward is still a dependency upward.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "lift3d"

# lowest first; a module may import its own layer and any layer listed before it, never one after it
LAYERS: list[list[str]] = [
    ["lift3d", "config", "metrics"],  # shared: the root modules (registry, cameras, ...), config/ and metrics/
    ["data"],
    ["fields"],
    ["meshes"],
    ["render"],
    ["gaussians"],
    ["guidance"],
    ["generators"],
    ["export"],
    ["systems"],
    ["runs"],
    ["viewer"],
    ["api"],
    ["app"],
    ["commands"],
    ["cli", "__main__", "facade"],  # facade: the package's __init__ (lift3d.reconstruct, ...: names imported on first use)
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its body."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.add(target)
    return found


def layer_of(module: str) -> str:
    """The layer a module belongs to: its top folder under ``lift3d``, or ``lift3d`` for a root module."""
    parts = module.split(".")
    if len(parts) == 1:
        return "facade"
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return parts[1] if parts[1] in RANK else "lift3d"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def test_every_folder_has_a_layer():
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert [f for f in folders if f not in RANK] == []


def test_no_import_runs_up_the_layers(graph):
    upward = sorted(
        f"{source} -> {target} ({layer_of(source)} imports {layer_of(target)})"
        for source, targets in graph.items()
        for target in targets
        if RANK[layer_of(target)] > RANK[layer_of(source)]
    )
    assert upward == []


def test_imports_have_no_cycles(graph):
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_the_check_sees_a_cycle_and_an_upward_import(tmp_path):
    """The walker itself: a toy package with a cycle and a lazy upward import is caught."""
    (tmp_path / "lift3d" / "render").mkdir(parents=True)
    (tmp_path / "lift3d" / "__init__.py").write_text("")
    (tmp_path / "lift3d" / "render" / "__init__.py").write_text("")
    (tmp_path / "lift3d" / "render" / "a.py").write_text("from lift3d.render import b\n")
    (tmp_path / "lift3d" / "render" / "b.py").write_text("def f():\n    from . import a\n    import lift3d.systems.x\n")
    (tmp_path / "lift3d" / "systems").mkdir()
    (tmp_path / "lift3d" / "systems" / "__init__.py").write_text("")
    (tmp_path / "lift3d" / "systems" / "x.py").write_text("")
    known = {}
    for path in (tmp_path / "lift3d").rglob("*.py"):
        parts = path.relative_to(tmp_path).with_suffix("").parts
        known[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    b = imported_modules("lift3d.render.b", known["lift3d.render.b"], known)
    assert b == {"lift3d.render.a", "lift3d.systems.x"}
    assert imported_modules("lift3d.render.a", known["lift3d.render.a"], known) == {"lift3d.render.b"}


def test_no_module_is_over_400_lines():
    """Files stay small enough to read in one sitting (CONTRIBUTING.md): split by responsibility past 400 lines."""
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}
