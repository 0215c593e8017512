"""The capture-format and export-format tables as the CLI's help and ``lift3d info`` show them, read without
importing torch.

``lift3d --help``, ``lift3d reconstruct --help`` and ``lift3d info`` answer at once: the modules that hold those
tables import torch (seconds), so their literal records are read from the modules' source (``ast``) instead. A
record that is not written as literals there is read by importing the table after all (correct, only slower);
``tests/test_cli_startup.py`` checks that both readings agree.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


class _NotLiteral(Exception):
    """A table entry written as code rather than literals: the table is imported instead."""


def _literal(node: ast.expr | None, default: object = None) -> object:
    if node is None:
        return default
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _NotLiteral(ast.dump(node)) from None


def _assignment(tree: ast.Module, name: str) -> ast.expr | None:
    """The value assigned to module-level ``name`` (plain or annotated assignment), or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value
    return None


def _capture_records() -> list[tuple[int, str, str, bool]]:
    """(priority, name, description, posed) of every ``FORMAT = CaptureFormat(...)`` in ``lift3d/data/formats``."""
    records = []
    for path in sorted((PACKAGE / "data" / "formats").glob("*.py")):
        call = _assignment(ast.parse(path.read_text(encoding="utf-8")), "FORMAT")
        if call is None:
            continue
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "register_format":
            call = call.args[0] if len(call.args) == 1 else None  # FORMAT = register_format(CaptureFormat(...))
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "CaptureFormat"):
            raise _NotLiteral(path.name)
        fields = {kw.arg: kw.value for kw in call.keywords}
        if call.args or None in fields:
            raise _NotLiteral(path.name)
        read = fields.get("read")
        posed = read is not None and not (isinstance(read, ast.Constant) and read.value is None)
        records.append((int(_literal(fields.get("priority"), 100)), str(_literal(fields.get("name"))),
                        str(_literal(fields.get("description"))), posed))
    return sorted(records)


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", or " + items[-1]


def plugins_installed() -> bool:
    """Whether a package adds modules through the ``lift3d.modules`` entry point: then the tables are imported (they
    hold the plugins' entries too), not read from lift3d's own source."""
    import importlib.metadata

    from lift3d.registry import ENTRY_POINT_GROUP

    return bool(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def capture_format_lists() -> tuple[str, str]:
    """(the posed formats, the formats that need structure from motion) for a sentence, as
    ``lift3d.data.formats.posed_list()`` and ``unposed_list()`` say them (imported where plugins add formats)."""
    if plugins_installed():
        from lift3d.data import formats

        return formats.posed_list(), formats.unposed_list()
    return _declared_capture_format_lists()


@cache
def _declared_capture_format_lists() -> tuple[str, str]:
    try:
        records = _capture_records()
        return (_or_list([r[2] for r in records if r[3]]), _or_list([r[2] for r in records if not r[3]]))
    except (_NotLiteral, OSError, SyntaxError, IndexError):
        from lift3d.data import formats

        return formats.posed_list(), formats.unposed_list()


def _export_declarations(tree: ast.Module) -> list[ast.Call]:
    """The ``@export_format(...)`` decorators of a module, in order."""
    return [decorator for node in tree.body if isinstance(node, ast.FunctionDef) for decorator in node.decorator_list
            if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name) and decorator.func.id == "export_format"]


def export_formats() -> tuple[dict[str, tuple[str, str]], dict[str, Callable[[], None]]]:
    """The export formats (name -> (the ``ExportSources`` field it writes from, what it is)) and their tool checks
    (name -> the check raising ``WriterUnavailable`` where its writer is missing): the ``@export_format`` declarations
    of ``lift3d.export.formats``, or the imported table where plugins add formats."""
    return _imported_export_formats() if plugins_installed() else _declared_export_formats()


def _imported_export_formats() -> tuple[dict[str, tuple[str, str]], dict[str, Callable[[], None]]]:
    from lift3d.export.formats import export_table

    records = export_table()
    return ({name: (r.source, r.description) for name, r in records.items()},
            {name: r.check_tool for name, r in records.items() if r.check_tool is not None})


@cache
def _declared_export_formats() -> tuple[dict[str, tuple[str, str]], dict[str, Callable[[], None]]]:
    from lift3d import aftercare

    try:
        tree = ast.parse((PACKAGE / "export" / "formats.py").read_text(encoding="utf-8"))
        table, needs = {}, {}
        for call in _export_declarations(tree):
            name, source, description = (str(_literal(arg)) for arg in call.args[:3])
            table[name] = (source, description)
            check = next((kw.value for kw in call.keywords if kw.arg == "check_tool"), None)
            if check is not None:
                if not isinstance(check, ast.Name) or not callable(getattr(aftercare, check.id, None)):
                    raise _NotLiteral(ast.dump(check))
                needs[name] = getattr(aftercare, check.id)
        if not table:
            raise _NotLiteral("no @export_format declarations")
        return table, needs
    except (_NotLiteral, OSError, SyntaxError, ValueError):
        return _imported_export_formats()


def export_format_status() -> dict[str, str]:
    """Every export format: "ok" or what its writer is missing and how to install it (as
    ``lift3d.export.formats.format_status``)."""
    from lift3d.aftercare import WriterUnavailable

    table, needs = export_formats()
    status = {}
    for name in table:
        try:
            needs.get(name, lambda: None)()
            status[name] = "ok"
        except WriterUnavailable as error:
            status[name] = str(error)
    return status


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
