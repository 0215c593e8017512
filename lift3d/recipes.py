"""Recipe configs ship inside the package (``lift3d/configs``; ``configs/`` in the repo links there): their names,
their files, and what each needs to run (``lift3d train --list``)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# system parts that load a pretrained model unless their type is one of WEIGHT_FREE
MODEL_PARTS = ("guidance", "text_guidance", "generator", "editor")
WEIGHT_FREE = ("", "analytic", "analytic-multiview", "analytic-edit")
CPU_SUFFIXES = ("-analytic", "-cpu", "-sample")  # recipes made to run on a CPU


def recipe_names() -> list[str]:
    """Names of the recipe configs that ship with lift3d."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def recipe_config(name: str) -> Path:
    """Path of ``configs/<name>.yaml``; an unknown name lists the recipes (and the closest names)."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        names = recipe_names()
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise FileNotFoundError(f"no recipe '{name}'{hint}; recipes: {', '.join(names) or '(none)'}")
    return path


@dataclass(frozen=True)
class RecipeNeeds:
    """What a recipe needs to run: a CUDA GPU or not, and the model weights it loads."""

    device: str  # "CPU", "CUDA GPU" or "CPU or CUDA GPU"
    weights: tuple[str, ...]  # the pretrained models it loads (hub ids, or what to give); () for none


@cache
def _merged(path: Path) -> dict[str, Any]:
    """A recipe YAML with its ``base:`` chain merged (later layers win), as plain data: no schema, no
    interpolation, no plugin imports (``lift3d train --list`` reads every recipe, and at once)."""
    import yaml

    node = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    bases = node.pop("base", None)
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else list(bases or []):
        merged = _merge(merged, _merged((path.parent / str(base)).resolve()))
    return _merge(merged, node)


def _merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(under)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def needs_of(name: str, config: dict[str, Any]) -> RecipeNeeds:
    """What recipe ``name`` (its merged config) needs: the models its guidance, text guidance, generator or editor
    load, and a CUDA GPU with them, unless it is a CPU variant (``-analytic``, ``-cpu``, ``-sample``). One place for
    the rule, so a method table can feed it later."""
    system = config.get("system") or {}
    weights = []
    for part in MODEL_PARTS:
        kind = str(system.get(f"{part}_type") or "")
        if kind in WEIGHT_FREE:
            continue
        settings = system.get(part) if isinstance(system.get(part), dict) else {}
        if "pretrained_model_name_or_path" not in settings:
            weights.append(f"{kind}'s default weights")
        elif settings["pretrained_model_name_or_path"]:
            weights.append(str(settings["pretrained_model_name_or_path"]))
        else:  # a model with no public diffusers release (MVDream): the user converts it once
            weights.append(f"a converted {kind} model folder (system.{part}.pretrained_model_name_or_path=...)")
    if name.endswith(CPU_SUFFIXES):
        device = "CPU"
    else:
        device = "CUDA GPU" if weights else "CPU or CUDA GPU"
    return RecipeNeeds(device, tuple(weights))


def recipe_needs(name: str) -> RecipeNeeds:
    """What the shipped recipe ``name`` needs to run (``needs_of`` on its config)."""
    return needs_of(name, _merged(recipe_config(name)))


def recipe_table() -> list[str]:
    """``lift3d train --list``: one line per recipe with what it needs."""
    names = recipe_names()
    width = max((len(n) for n in names), default=0)
    lines = []
    for name in names:
        needs = recipe_needs(name)
        lines.append(f"  {name:{width}s}  {needs.device:15s}  {', '.join(needs.weights) or 'no weights'}")
    return lines
