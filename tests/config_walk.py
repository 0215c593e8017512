"""Every config dataclass of the package, and every place in its source that compares a config value against a fixed
set or bound (for tests/config/test_declarations.py)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lift3d.config import ExperimentConfig
from lift3d.registry import find, registered_names
from tests.conftest import REPO

PACKAGE = REPO / "lift3d"


def _is_dataclass_type(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def config_schemas() -> dict[type, str]:
    """Every config dataclass -> the key path of one place it is used: the experiment's, each registered part's
    ``Config`` (under its registered name), the dataclasses nested in them and the dataclass bases they extend."""
    found: dict[type, str] = {}

    def walk(schema: type, path: str) -> None:
        if schema in found:
            return
        found[schema] = path
        for base in schema.__mro__[1:]:
            if _is_dataclass_type(base) and base.__module__.startswith("lift3d"):
                walk(base, path)
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            if _is_dataclass_type(hints.get(f.name)):
                walk(hints[f.name], f"{path}.{f.name}" if path else f.name)

    walk(ExperimentConfig, "")
    for name in registered_names():
        schema = getattr(find(name), "Config", None)
        if _is_dataclass_type(schema) and schema.__module__.startswith("lift3d."):  # not parts other tests register
            walk(schema, name)
    return found


# ----------------------------------------------------------------------------------- comparisons in the source
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


@dataclass
class Comparison:
    """``module:line``: ``attribute`` of a config (``receiver``) compared with a constant (``kind``: bound or choice)."""

    path: Path
    line: int
    receiver: str
    attribute: str
    kind: str
    text: str
    owner: str | None  # the class whose method holds it (resolves self.cfg)

    def __str__(self) -> str:
        return f"{self.path.relative_to(PACKAGE.parent)}:{self.line}: {self.text}"


def _constant(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    return None


def _constant_set(node: ast.AST, module_constants: dict[str, list]) -> list | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        values = [_constant(e) for e in node.elts]
        return values if values and all(v is not None for v in values) else None
    if isinstance(node, ast.Name):
        return module_constants.get(node.id)
    return None


def _module_constants(tree: ast.Module) -> dict[str, list]:
    """Module-level names bound to a tuple, list or set of constants (``MODES = ("a", "b")``)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = _constant_set(node.value, {})
            if values:
                out[node.targets[0].id] = values
    return out


def _unwrapped(node: ast.AST) -> ast.AST:
    """``x`` of ``str(x)``, ``int(x)``, ``float(x)`` and ``x.lower()`` / ``x.strip()`` (any nesting)."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "int", "float") \
                and len(node.args) == 1:
            node = node.args[0]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("lower", "strip") \
                and not node.args:
            node = node.func.value
        else:
            return node


class _Finder(ast.NodeVisitor):
    """Comparisons of ``cfg.NAME``, ``self.cfg.NAME``, ``config.NAME``, ``c.NAME`` (a local bound to a config, or a
    parameter annotated with a config class or named cfg / c / config) and of locals bound to such an attribute."""

    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path, self.constants = path, _module_constants(tree)
        self.found: list[Comparison] = []
        self.scopes: list[tuple[set[str], dict[str, ast.Attribute]]] = [(set(), {})]
        self.classes: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        configs: set[str] = set()
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            annotation = ast.unparse(arg.annotation) if arg.annotation else ""
            if arg.arg in ("cfg", "config", "c") or annotation.endswith(("Config", "Options", "Loss")):
                configs.add(arg.arg)
        aliases: dict[str, ast.Attribute] = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                value, target = _unwrapped(sub.value), sub.targets[0].id
                if isinstance(value, ast.Attribute) and value.attr != "cfg" and self._is_config(value.value, configs):
                    aliases[target] = value  # a config's value (or a sub-config: then a config too)
                if self._is_config(value, configs):
                    configs.add(target)
        self.scopes.append((configs, aliases))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _is_config(self, node: ast.AST, configs: set[str] | None = None) -> bool:
        configs = self.scopes[-1][0] if configs is None else configs
        if isinstance(node, ast.Name):
            return node.id in ("cfg", "config") or node.id in configs
        if isinstance(node, ast.Attribute):
            return node.attr == "cfg" or self._is_config(node.value, configs)
        return False

    def _config_attribute(self, node: ast.AST) -> ast.Attribute | None:
        node = _unwrapped(node)
        if isinstance(node, ast.Attribute) and self._is_config(node.value):
            return node
        if isinstance(node, ast.Name):
            return self.scopes[-1][1].get(node.id)
        return None

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides, sides[1:]):
            for side, other, flipped in ((left, right, False), (right, left, True)):
                attribute = self._config_attribute(side)
                if attribute is None:
                    continue
                constant = _constant(other)
                if isinstance(op, ORDERING) and isinstance(constant, (int, float)):
                    kind = "bound"
                elif (isinstance(op, (ast.In, ast.NotIn)) and not flipped and _constant_set(other, self.constants)
                      or isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(constant, str) and constant):
                    kind = "choice"
                else:
                    continue
                self.found.append(Comparison(self.path, node.lineno, ast.unparse(attribute.value), attribute.attr, kind,
                                             ast.unparse(node), self.classes[-1] if self.classes else None))
        self.generic_visit(node)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def comparisons() -> Iterator[Comparison]:
    """Every comparison of a config value against a constant in the package's source."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        finder = _Finder(path, tree)
        finder.visit(tree)
        yield from finder.found


def candidate_schemas(comparison: Comparison, schemas: dict[type, str]) -> list[type]:
    """The config dataclasses ``comparison`` may read its attribute from: the ``Config`` of the class it sits in (for
    ``self.cfg.NAME`` and its sub-configs), else those its module defines or imports, else any that has the field."""
    having = [s for s in schemas if comparison.attribute in {f.name for f in dataclasses.fields(s)}]
    module = importlib.import_module(module_name(comparison.path))
    owner = getattr(module, comparison.owner, None) if comparison.owner else None
    chain = comparison.receiver.split(".")
    if chain[:2] == ["self", "cfg"] and _is_dataclass_type(getattr(owner, "Config", None)):
        schema: Any = owner.Config
        for name in chain[2:]:
            schema = typing.get_type_hints(schema).get(name)
        if _is_dataclass_type(schema) and schema in having:
            return [schema]
    local = [s for s in having if any(value is s for value in vars(module).values())]
    return local or having
