"""``lift3d.train(recipe, ...)``: any recipe (a name of ``lift3d/configs`` or a YAML path) trained as ``lift3d train``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from lift3d.api.overrides import as_overrides, devices_overrides, gpu_ids
from lift3d.api.run import Run


def recipe_path(recipe: str | Path) -> Path:
    """A recipe name (``gaussian-sds-analytic``) or a YAML path, as the YAML path."""
    from lift3d.recipes import recipe_config, recipe_names

    text = str(recipe)
    if not text.endswith((".yaml", ".yml")) and text in recipe_names():
        return recipe_config(text)
    return Path(text).expanduser()


def train(recipe: str | Path, *, gpus: Iterable[int] | str | None = None, nodes: int | None = None,
          overrides: Sequence[str] = (),
          resume: str | Path | None = None, callbacks: Callable[..., Any] | None = None, **settings: Any) -> Run:
    """Train ``recipe`` (a recipe name or a YAML file) with config overrides (``settings`` by dotted key, or
    ``key=value`` strings in ``overrides``); ``resume``: a checkpoint to continue from. Returns the run."""
    from lift3d.config import load_config
    from lift3d.runs.runner import run_experiment

    path = recipe_path(recipe)
    extra = [*devices_overrides(gpu_ids(gpus), nodes), *as_overrides(settings, overrides)]
    if resume is not None:
        extra.append(f"resume={resume}")
    cfg = load_config(path, overrides=extra)
    return Run(run_experiment("train", cfg, [path], extra, callbacks=callbacks))
