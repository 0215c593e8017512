"""Scheduled values: a hyperparameter written as a number or as a schedule evaluated at the current step.

Forms accepted wherever a config field is marked ``scheduled``:

* a number: constant;
* ``[start_step, start_value, end_value, end_step]``: linear ramp, held constant outside the interval;
* ``[start_step, start_value, end_value, end_step, "log"]``: geometric (log-linear) ramp, as 3DGS uses
  for its position learning rate;
* ``[[step0, value0], [step1, value1], ...]``: piecewise linear through the points, held outside;
* a piecewise list followed by ``"step"``: piecewise constant (value of the last point reached).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Schedule = Any  # float | list: see module docstring

_MODES = ("linear", "log", "step")


def validate_schedule(value: Schedule) -> None:
    """Raise ValueError naming what is wrong if ``value`` is not a number or a valid schedule."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number or a schedule, got the boolean {value!r}")
    if isinstance(value, (int, float)):
        return
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"expected a number or a schedule list, got {value!r}")
    items = list(value)
    mode = "linear"
    if items and isinstance(items[-1], str):
        mode = items.pop()
        if mode not in _MODES:
            raise ValueError(f"unknown schedule mode {mode!r}; use one of {', '.join(_MODES)}")
    if items and all(isinstance(p, Sequence) and not isinstance(p, str) for p in items):
        points = [list(p) for p in items]
        if any(len(p) != 2 for p in points):
            raise ValueError(f"piecewise schedule points must be [step, value] pairs, got {value!r}")
        steps = [p[0] for p in points]
        if any(b < a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"piecewise schedule steps must be non-decreasing, got {steps}")
        if mode == "log" and any(p[1] <= 0 for p in points):
            raise ValueError("a 'log' schedule needs positive values")
        return
    if mode == "step":
        raise ValueError("mode 'step' applies to piecewise schedules [[step, value], ...]")
    if len(items) != 4 or not all(isinstance(v, (int, float)) for v in items):
        raise ValueError(
            "a ramp schedule is [start_step, start_value, end_value, end_step] "
            f"(optionally followed by 'log'), got {value!r}"
        )
    start_step, start_value, end_value, end_step = items
    if end_step < start_step:
        raise ValueError(f"schedule end_step {end_step} is before start_step {start_step}")
    if mode == "log" and (start_value <= 0 or end_value <= 0):
        raise ValueError("a 'log' schedule needs positive start and end values")


def _interpolate(a: float, b: float, frac: float, mode: str) -> float:
    frac = min(max(frac, 0.0), 1.0)
    if mode == "log":
        return math.exp(math.log(a) + frac * (math.log(b) - math.log(a)))
    return a + frac * (b - a)


def scheduled_value(value: Schedule, step: int) -> float:
    """Evaluate ``value`` (a number or a schedule, see module docstring) at ``step``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    validate_schedule(value)
    items = list(value)
    mode = items.pop() if isinstance(items[-1], str) else "linear"
    if isinstance(items[0], Sequence):
        points = [(float(s), float(v)) for s, v in items]
        if step <= points[0][0]:
            return points[0][1]
        for (s0, v0), (s1, v1) in zip(points, points[1:]):
            if step < s1:
                if mode == "step":
                    return v0
                return _interpolate(v0, v1, (step - s0) / (s1 - s0), mode)
        return points[-1][1]
    start_step, start_value, end_value, end_step = items
    if end_step == start_step:
        return end_value if step >= end_step else start_value
    return _interpolate(start_value, end_value, (step - start_step) / (end_step - start_step), mode)


def is_schedule(value: Any) -> bool:
    """True if ``value`` is a schedule list rather than a plain number."""
    return isinstance(value, Sequence) and not isinstance(value, str)
