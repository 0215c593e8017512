"""Choices and bounds declared on config fields, where the field is written, and the one check of them.

``choice("mse", "smooth_l1")`` and ``bounded(0.1, above=0, below=1)`` make dataclass fields whose metadata says what
values the field takes; ``check_config`` (``config.schema``) checks every declared field of a whole experiment when it
loads, so a value out of range is a ``ConfigError`` naming the key before anything is built. Declarations live in the
field's metadata because OmegaConf 2.3's structured configs refuse ``typing.Literal`` annotations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DECLARED = "declared"  # the metadata key of a field's Choices or Bounds
STEPS = "steps"  # the metadata key of a field that counts training steps: how a larger batch rescales it (STEP_KINDS)
# what a field marked with step_count holds: "count" a step number or interval (divided by the batch factor); "pairs"
# [[step, value], ...] (the steps divided); "milestones" [step, ...]; "optimizer-groups" an optimizer's parameter groups
# (each lr schedule's steps divided); "scheduler-args" a torch LR scheduler's arguments (its step counts divided);
# "kept" counts steps but stays per step (a host-sync cadence, a debugging aid). ``scheduled`` fields need no mark:
# their schedules' steps are always rescaled.
STEP_KINDS = ("count", "pairs", "milestones", "optimizer-groups", "scheduler-args", "kept")


def _show(value: Any) -> str:
    """A value as the user would write it in an override."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return "null" if value is None else str(value)


def _quoted(value: Any) -> str:
    return repr(value) if isinstance(value, str) else _show(value)


@dataclass(frozen=True)
class Choices:
    """A field that takes one of a fixed set of values (each element, for a list field). ``among`` is the set or a
    function that returns it (for sets that grow with the package, such as the capture formats); ``fold_case`` accepts
    any case (``enabled: true`` from YAML arrives in a ``str`` field as ``True``)."""

    among: tuple | Callable[[], Sequence[Any]]
    fold_case: bool = False
    example: Any = None

    def values(self) -> tuple:
        return tuple(self.among() if callable(self.among) else self.among)

    def accepts(self, value: Any) -> bool:
        allowed = self.values()
        if self.fold_case and isinstance(value, str):
            return value.strip().lower() in {str(a).lower() for a in allowed}
        return value in allowed and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed))

    def describe(self) -> str:
        return "one of " + ", ".join(_show(v) for v in self.values())

    def sample(self) -> Any:
        return self.example if self.example is not None else self.values()[0]


@dataclass(frozen=True)
class Bounds:
    """A number within bounds: ``low <= x``, ``above < x``, ``x <= high``, ``x < below`` (any of them), or one of
    ``allowed`` (special values outside them, such as -1 for "all"). ``multiple_of``: a whole multiple of it (a VAE's
    factor). ``lengths``: a list field's allowed lengths."""

    low: float | None = None
    above: float | None = None
    high: float | None = None
    below: float | None = None
    allowed: tuple = ()
    example: Any = None
    lengths: tuple = ()
    multiple_of: int | None = None

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if value in self.allowed:
            return True
        if isinstance(value, float) and math.isnan(value):
            return False
        return ((self.low is None or value >= self.low) and (self.above is None or value > self.above)
                and (self.high is None or value <= self.high) and (self.below is None or value < self.below)
                and (self.multiple_of is None or value % self.multiple_of == 0))

    def describe(self) -> str:
        parts = [f"{op} {_show(limit)}" for op, limit in ((">=", self.low), (">", self.above), ("<=", self.high),
                                                          ("<", self.below)) if limit is not None]
        if self.multiple_of is not None:
            parts.append(f"a multiple of {self.multiple_of}")
        also = f" (or {', '.join(map(_show, self.allowed))})" if self.allowed else ""
        return "a number " + " and ".join(parts) + also

    def sample(self) -> Any:
        if self.example is not None:
            return self.example
        for limit in (self.low, self.high):
            if limit is not None:
                return limit
        if self.above is not None and self.below is not None:
            return (self.above + self.below) / 2
        if self.above is not None or self.below is not None:
            return self.above + 1 if self.above is not None else self.below - 1
        return 0


Declaration = Choices | Bounds


def _field(default: Any, declaration: Declaration, metadata: dict | None = None, **kwargs: Any) -> Any:
    metadata = {DECLARED: declaration, **(metadata or {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


def choice(default: Any, *others: Any, among: Sequence[Any] | Callable[[], Sequence[Any]] | None = None,
           fold_case: bool = False, example: Any = None, **kwargs: Any) -> Any:
    """A dataclass field taking ``default`` or one of ``others`` (or one of ``among``: a sequence, or a function
    returning one). A list default makes a list field whose every element must be a choice; a None default an
    optional one. The first choice is the example an error gives, unless ``example`` is set."""
    if among is None:
        among = (*(default if isinstance(default, list) else [default]), *others)
        among = tuple(v for v in among if v is not None)
    if not callable(among):
        among = tuple(among)
    return _field(default, Choices(among, fold_case, example), **kwargs)


def bounded(default: Any, *, low: float | None = None, above: float | None = None, high: float | None = None,
            below: float | None = None, allowed: Sequence[Any] = (), example: Any = None, lengths: Sequence[int] = (),
            multiple_of: int | None = None, **kwargs: Any) -> Any:
    """A dataclass field holding a number ``>= low``, ``> above``, ``<= high``, ``< below`` (those given), or one of
    ``allowed`` (and a whole multiple of ``multiple_of``); a list default (or value) has every element checked, and its
    length must be one of ``lengths`` when given. None always passes (an optional field)."""
    if example is None and (isinstance(default, (int, float)) and not isinstance(default, bool) or default):
        example = default  # a number, or a non-empty list
    return _field(default, Bounds(low, above, high, below, tuple(allowed), example, tuple(lengths), multiple_of), **kwargs)


def step_count(default: Any, *, kind: str = "count", low: float | None = 0, **bounds: Any) -> Any:
    """A field that counts training steps (``kind``: one of ``STEP_KINDS``), ``bounded`` like any number (a list
    default: each element; a dict default: unbounded). ``lift3d.runs.rescale`` divides every such field by the batch
    factor when several GPUs (or a larger batch) train one recipe, so the run keeps the recipe's result."""
    if kind not in STEP_KINDS:
        raise ValueError(f"step_count kind must be one of {', '.join(STEP_KINDS)}, got {kind!r}")
    metadata = {STEPS: kind, **bounds.pop("metadata", {})}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata, **bounds)
    if kind in ("pairs",):
        return field(default_factory=lambda: [list(p) for p in default], metadata=metadata, **bounds)
    return bounded(default, low=low, metadata=metadata, **bounds)


def step_kind(schema: type, name: str) -> str | None:
    """How field ``name`` of dataclass ``schema`` counts steps (``STEP_KINDS``; None: it does not), its own mark or
    that of the nearest base class that declares the field."""
    for klass in schema.__mro__:
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and STEPS in declared.metadata:
            return declared.metadata[STEPS]
    return None


def declared_bounds(**bounds: Any) -> Bounds | None:
    """The Bounds of keyword arguments ``low/above/high/below/allowed/example`` (None when none is given)."""
    return Bounds(**bounds) if any(v not in (None, ()) for v in bounds.values()) else None


def schedule_values(value: Any) -> list[Any]:
    """The values (not the steps) of a number or a schedule (``lift3d.schedule``'s forms)."""
    if not isinstance(value, (list, tuple)):
        return [value]
    items = [v for v in value if not isinstance(v, str)]
    if items and all(isinstance(p, (list, tuple)) for p in items):
        return [p[1] for p in items if len(p) == 2]
    return list(items[1:3]) if len(items) == 4 else []


def declaration_of(schema: type, name: str) -> Declaration | None:
    """The declaration of field ``name`` of dataclass ``schema``: its own, else that of the nearest base class that
    declares the field (a subclass that only changes a default keeps the base's choices or bounds)."""
    for klass in schema.__mro__:
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and DECLARED in declared.metadata:
            return declared.metadata[DECLARED]
    return None


def check_message(key: str, declaration: Declaration, value: Any, where: str, scheduled: bool = False) -> str | None:
    """The one-line error for ``key`` = ``value`` (written in ``where``), or None when the value is fine. A list value
    has each element checked, a schedule (``scheduled``) each of its values."""
    if value is None:
        return None
    if scheduled and isinstance(value, (list, tuple)):
        items, qualifier = schedule_values(value), " at every point of its schedule"
    elif isinstance(value, (list, tuple)):
        items, qualifier = list(value), " (each element)"
    else:
        items, qualifier = [value], ""
    lengths = getattr(declaration, "lengths", ())
    if lengths and qualifier == " (each element)" and len(items) not in lengths:
        counts = " or ".join(map(str, lengths))
        sample = declaration.sample()
        sample = sample if isinstance(sample, list) else [sample] * max(lengths)
        return (f"{key} must be a list of {counts} values, each {declaration.describe()}; got {_show(value)} "
                f"(in {where}): e.g. {key}={_show(sample)}")
    bad = [item for item in items if item is not None and not declaration.accepts(item)]
    if not bad:
        return None
    shown = _quoted(bad[0]) if len(items) == 1 and not qualifier else f"{_quoted(bad[0])} in {_show(value)}"
    sample = declaration.sample()
    if qualifier == " (each element)" and not isinstance(sample, list):
        sample = [sample] * max(getattr(declaration, "lengths", ()) or (1,))
    example = _show(sample)
    return f"{key} must be {declaration.describe()}{qualifier}; got {shown} (in {where}): e.g. {key}={example}"
