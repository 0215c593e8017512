"""Every config key with its one-line description, read from the comment beside its field in the dataclass source: the
generated config reference (docs) and its completeness test read the same descriptions the source shows."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeyDoc:
    """One config key: its dotted path, type, default and the comment that describes it."""

    key: str  # e.g. "trainer.max_steps" or "system.densify.refine_every"
    type: str  # the annotation, as written
    default: str  # the default value, as Python writes it ("" when it has none)
    description: str  # the comment beside (or just above) the field; "" when there is none
    owner: str  # the dataclass that declares it


@functools.cache
def field_comments(schema: type) -> dict[str, str]:
    """``field name -> comment`` of a dataclass: the comment at the end of the field's line, else the comment lines
    right above it. Fields inherited from a base dataclass come from the base's source."""
    comments: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        comments.update(_comments_in(source, {f.name for f in dataclasses.fields(klass)}))
    return comments


def _comments_in(source: str, names: set[str]) -> dict[str, str]:
    """The comments of the fields ``names`` in a class's source: on the field's own lines, else the comment-only lines
    right above it."""
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names):
            continue
        own = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        found[node.target.id] = " ".join(own or above)
    return found


def describe(schema: type, prefix: str = "") -> Iterator[KeyDoc]:
    """Every key of ``schema`` (nested dataclasses expanded) with its description."""
    hints = typing.get_type_hints(schema)
    comments = field_comments(schema)
    for f in dataclasses.fields(schema):
        annotation = hints.get(f.name, Any)
        key = f"{prefix}{f.name}"
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            yield KeyDoc(key, annotation.__name__, "", comments.get(f.name, ""), schema.__qualname__)
            yield from describe(annotation, f"{key}.")
            continue
        yield KeyDoc(key, _type_name(annotation), _default(f), comments.get(f.name, ""), schema.__qualname__)


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return repr(f.default_factory())  # type: ignore[misc]
    return ""


def part_schemas() -> dict[str, type]:
    """``registered name -> Config dataclass`` of every configurable part (built-ins and plugins)."""
    from lift3d.registry import find, registered_names

    schemas = {}
    for name in registered_names():
        schema = getattr(find(name), "Config", None)
        if schema is not None and dataclasses.is_dataclass(schema):
            schemas[name] = schema
    return schemas
