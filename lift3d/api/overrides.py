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
    """GPU ids from ``[0, 1]``, ``"0,1"`` or ``"all"`` (every GPU torch sees; None: the recipe's own devices); anything
    else is a ``ConfigError``."""
    if gpus is None:
        return None
    from lift3d.config import ConfigError

    if isinstance(gpus, str) and gpus.strip().lower() == "all":
        return all_gpus()

    try:
        ids = [int(part) for part in gpus.split(",") if part.strip()] if isinstance(gpus, str) else [int(g) for g in gpus]
    except (TypeError, ValueError):
        raise ConfigError(f"--gpus takes comma-separated GPU ids such as 0,1; got '{gpus}'") from None
    if not ids:
        raise ConfigError("--gpus got no GPU ids")
    return ids


def all_gpus() -> list[int]:
    """The ids of every CUDA GPU torch sees (``--gpus all``); none is a ConfigError."""
    import torch

    from lift3d.config import ConfigError

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError("--gpus all: torch sees no CUDA GPU here: drop --gpus to train on the CPU")
    return list(range(count))


def devices_overrides(gpus: list[int] | None, nodes: int | None = None) -> list[str]:
    """Overrides that train on the GPUs ``gpus`` of each of ``nodes`` machines (--gpus, --nodes); none for None."""
    from lift3d.config import ConfigError

    overrides = [f"trainer.devices=[{','.join(map(str, gpus))}]", "trainer.accelerator=gpu"] if gpus is not None else []
    if nodes is not None:
        if nodes < 1:
            raise ConfigError(f"--nodes takes the number of machines (1 or more), got {nodes}")
        overrides.append(f"trainer.num_nodes={nodes}")
    return overrides

