"""Keyword arguments of the Python API as the config overrides the CLI takes (``key=value`` dotlist items)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def override_value(value: Any) -> str:
    """A Python value as the right-hand side of a dotlist override (strings quoted so any characters survive)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


def as_overrides(settings: Mapping[str, Any] | None = None, extra: Iterable[str] = ()) -> list[str]:
    """``{"trainer.max_steps": 100}`` (or ``trainer__max_steps=100``: ``__`` stands for a dot) -> ``["trainer.max_steps=100"]``,
    then the ``key=value`` strings of ``extra`` as given."""
    items = [f"{key.replace('__', '.')}={override_value(value)}" for key, value in (settings or {}).items()]
    return items + [str(item) for item in extra]


def gpu_ids(gpus: Iterable[int] | str | None) -> list[int] | None:
    """GPU ids from ``[0, 1]`` or ``"0,1"`` (None: the recipe's own devices); anything else is a ``ConfigError``."""
    if gpus is None:
        return None
    from lift3d.config import ConfigError

    try:
        ids = [int(part) for part in gpus.split(",") if part.strip()] if isinstance(gpus, str) else [int(g) for g in gpus]
    except (TypeError, ValueError):
        raise ConfigError(f"--gpus takes comma-separated GPU ids such as 0,1; got '{gpus}'") from None
    if not ids:
        raise ConfigError("--gpus got no GPU ids")
    return ids


def devices_overrides(ids: list[int] | None) -> list[str]:
    """Overrides that train on the GPUs ``ids``; none for None."""
    return [] if ids is None else [f"trainer.devices=[{','.join(map(str, ids))}]", "trainer.accelerator=gpu"]
