"""The same result, sooner: a recipe trained on several processes (GPUs, machines) with its step counts rescaled.

A recipe's step counts are written for its own batch on one GPU (``data.batch_size`` views a step, B0). N processes
with B views each take N x B views a step, so every value that counts steps (each field marked ``step_count`` or
``scheduled`` where it is declared: ``trainer.max_steps``, validation and checkpoint intervals, the densification and
SH-degree schedules, learning-rate schedules, ...) is divided by the factor k = N x B / B0: the run sees as many views
as the recipe and ends k times sooner. One function walks the whole experiment config (``rescale_config``), so a new
field is rescaled the day it is marked.

Learning rates follow Adam's square-root scaling rule (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
Gradient Algorithms"; gsplat's multi-GPU example does the same): a step whose gradient averages k times the views is k
times less noisy, so lr x sqrt(k), eps / sqrt(k) and betas 1 - k (1 - beta) (the moments' memory kept in views, not
steps) follow the one-view trajectory with k times fewer steps. Densification needs nothing: its statistics are per
view and summed over the ranks, and the rescaled ``refine_every`` gathers as many views between refines as before.

A key the user gives (an override; its parent or a child of it) keeps its value; a key whose value is an interpolation
of another (``${trainer.max_steps}``) follows it. A run that rescales writes its total batch to
``trainer.schedule_batch``, so its parsed.yaml is not rescaled again; a resumed run keeps its step counts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lift3d.config import ExperimentConfig
from lift3d.config.declarations import step_kind
from lift3d.registry import find
from lift3d.runs.world import training_processes, views_per_step

log = logging.getLogger("lift3d")
Path_ = tuple[str, ...]  # a config key as its parts (a part may hold dots: optimizer groups such as gaussians.means)
ADAM_FAMILY = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "SparseAdam")
SCHEDULER_STEP_ARGS = ("step_size", "T_max", "T_0", "total_iters", "total_steps", "milestones")  # torch LR schedulers


@dataclass
class Rescaling:
    """What a run on ``processes`` x ``views`` changed against its recipe's ``recipe_batch`` views a step."""

    processes: int
    views: int  # per process and step
    recipe_batch: int  # the total batch the step counts were written for
    device: str  # "GPU" or "process", for the run's one line
    changes: list[tuple[str, Any, Any]] = field(default_factory=list)  # (key, recipe's value, the run's)
    kept: dict[str, Any] = field(default_factory=dict)  # step keys the user gave, left as given: their values
    lr_factor: float = 1.0  # Adam's rates x this (1: unchanged)

    @property
    def factor(self) -> float:
        return self.processes * self.views / self.recipe_batch

    def change(self, key: str) -> tuple[Any, Any] | None:
        return next(((old, new) for k, old, new in self.changes if k == key), None)

    def line(self) -> str:
        """The one line a run says about it: how many steps, what else moved, what was kept."""
        device = self.device if self.processes == 1 else "processes" if self.device == "process" else f"{self.device}s"
        what = f"{self.processes} {device} x {_views(self.views)}"
        steps = self.change("trainer.max_steps")
        if steps:
            head = f"{what}: {steps[1]} steps (the recipe's {steps[0]} for {_views(self.recipe_batch)})"
        elif "trainer.max_steps" in self.kept:
            head = f"{what}: {self.kept['trainer.max_steps']} steps (trainer.max_steps as given)"
        else:
            head = f"{what}: the recipe's steps for {_views(self.recipe_batch)} / {self.factor:g}"
        details = [text for text in (self._densify(), self._every("system.gaussians.sh_degree_interval", "SH degree up"),
                                     self._every("trainer.val_check_interval", "validate")) if text]
        others = len(self.changes) - sum(1 for k, _, _ in self.changes if k.endswith(_SHOWN))
        if others > 0:
            details.append(f"{others} more step value{'s' if others > 1 else ''} / {self.factor:g}")
        if self.lr_factor != 1.0:
            details.append(f"Adam's rates x{self.lr_factor:.2f} (square-root rule)")
        kept = f"; as given: {', '.join(k for k in self.kept if k != 'trainer.max_steps')}" if len(self.kept) > (
            "trainer.max_steps" in self.kept) else ""
        rest = ", ".join(details) or "nothing else counts steps"
        return f"{head}, {rest}{kept} (trainer.rescale_steps=never: every recipe step)"

    def _densify(self) -> str:
        every = self.change("system.densify.refine_every")
        start, stop = self.change("system.densify.refine_start"), self.change("system.densify.refine_stop")
        if not every:
            return ""
        span = f" from {start[1]} to {stop[1]}" if start and stop else ""
        return f"densify every {every[1]}{span}"

    def _every(self, key: str, what: str) -> str:
        moved = self.change(key)
        return f"{what} every {moved[1]}" if moved and moved[1] else ""


_SHOWN = ("trainer.max_steps", "densify.refine_every", "densify.refine_start", "densify.refine_stop",
          "gaussians.sh_degree_interval", "trainer.val_check_interval")


def _views(n: int) -> str:
    return f"{n} view{'s' if n != 1 else ''}"


# ----------------------------------------------------------------------------------- values
def scaled_count(value: Any, factor: float) -> Any:
    """A step number or interval divided by ``factor`` (at least 1; 0 and negative values mean off or unlimited)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return value
    return max(1, round(value / factor))


def _step(value: Any, factor: float) -> Any:
    """A step position (0 stays 0)."""
    return round(value / factor) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def scaled_schedule(value: Any, factor: float, values: Callable[[Any], Any] = lambda v: v) -> Any:
    """A number or schedule (``lift3d.schedule``'s forms) with its steps divided by ``factor`` and ``values`` applied
    to its values; a plain number gets ``values`` only."""
    if not isinstance(value, (list, tuple)):
        return values(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    items = list(value)
    mode = [items.pop()] if items and isinstance(items[-1], str) else []
    if items and all(isinstance(p, (list, tuple)) for p in items):
        return [[_step(p[0], factor), values(p[1])] for p in items] + mode
    if len(items) == 4:
        start, v0, v1, end = items
        return [_step(start, factor), values(v0), values(v1), _step(end, factor)] + mode
    return value


def scaled_by_kind(kind: str, value: Any, factor: float, node: Any = None) -> Any:
    """``value`` of a field marked ``kind`` (``lift3d.config.declarations.STEP_KINDS``) at a ``factor`` x batch."""
    if kind == "count":
        return scaled_count(value, factor)
    if kind == "pairs":
        return [[_step(p[0], factor), *p[1:]] for p in value] if isinstance(value, list) else value
    if kind == "milestones":
        return [_step(s, factor) for s in value] if isinstance(value, list) else value
    if kind == "scheduler-args":
        if not isinstance(value, dict) or (node or {}).get("interval", "step") != "step":
            return value
        return {k: (scaled_schedule(v, factor) if k == "milestones" and isinstance(v, list) else scaled_count(v, factor))
                if k in SCHEDULER_STEP_ARGS else v for k, v in value.items()}
    return value  # kept, optimizer-groups (their own walk)


# ----------------------------------------------------------------------------------- the walk
@dataclass
class _Walk:
    factor: float
    explicit: list[Path_]
    links: dict[Path_, Path_]
    report: Rescaling
    linked: list[tuple[Any, str, Path_, Path_]] = field(default_factory=list)  # (node, name, path, target)
    finals: dict[Path_, Any] = field(default_factory=dict)  # every step field's value after the walk

    def given(self, path: Path_) -> bool:
        return any(path[: len(k)] == k or k[: len(path)] == path for k in self.explicit)

    def update(self, node: Any, name: str, path: Path_, value: Any, new: Any) -> None:
        self.finals[path] = new
        if new != value:
            _set(node, name, new)
            self.report.changes.append((".".join(path), value, new))


def _get(node: Any, name: str, default: Any) -> Any:
    return node.get(name, default) if isinstance(node, dict) else getattr(node, name)


def _set(node: Any, name: str, value: Any) -> None:
    if isinstance(node, dict):
        node[name] = value
    else:
        setattr(node, name, value)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _is_dataclass_type(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _part_schema(type_name: Any) -> type | None:
    try:
        schema = getattr(find(str(type_name)), "Config", None)
    except Exception:  # noqa: BLE001  (an unknown part is the config check's to report)
        return None
    return schema if _is_dataclass_type(schema) else None


def _walk(schema: type, node: Any, path: Path_, walk: _Walk) -> None:
    """Rescale every marked field of ``node`` (a ``schema`` instance, or the dict a part's config is held in)."""
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for name, f in fields.items():
        key = (*path, name)
        value = _get(node, name, _default(f))
        absent = isinstance(node, dict) and name not in node
        if _is_dataclass_type(hints.get(name)):
            child = {} if absent or value is None else value  # an absent one: its defaults, written only if changed
            _walk(hints[name], child, key, walk)
            if absent and child:
                node[name] = child
            continue
        if name.endswith("_type") is False and f"{name}_type" in fields and isinstance(value, dict):
            part = _part_schema(_get(node, f"{name}_type", _default(fields[f"{name}_type"])))
            if part is not None:
                before = dict(value)
                _walk(part, value, key, walk)
                if absent and value != before:
                    node[name] = value
            continue
        kind = "schedule" if f.metadata.get("scheduled") else step_kind(schema, name)
        if kind is None or kind == "kept":
            continue
        if kind == "optimizer-groups":
            _walk_groups(node, name, key, value, walk)
            continue
        if key in walk.links:
            walk.linked.append((node, name, key, walk.links[key]))
            continue
        if walk.given(key):
            walk.report.kept[".".join(key)] = value
            walk.finals[key] = value
            continue
        new = scaled_schedule(value, walk.factor) if kind == "schedule" else scaled_by_kind(kind, value, walk.factor, node)
        walk.update(node, name, key, value, new)


def _walk_groups(node: Any, name: str, path: Path_, groups: Any, walk: _Walk) -> None:
    """An optimizer's parameter groups: each scheduled lr's steps divided (its values are the rate rule's)."""
    if not isinstance(groups, dict):
        return
    for group, options in groups.items():
        key = (*path, str(group), "lr")
        if isinstance(options, dict) and isinstance(options.get("lr"), list) and not walk.given(key):
            walk.update(options, "lr", key, options["lr"], scaled_schedule(options["lr"], walk.factor))


def scale_adam(optimizer: dict, path: Path_, factor: float, explicit: Sequence[Path_]) -> float:
    """Adam's square-root rule on an optimizer config (a dict of ``OptimizerConfig``) for a ``factor`` x batch, in
    place: every lr (numbers and schedule values) x sqrt(factor), eps / sqrt(factor), betas 1 - factor (1 - beta),
    keys the user gave left as they are. Returns the rates' factor (1.0: not an Adam optimizer, nothing changed)."""
    if str(optimizer.get("name", "Adam")) not in ADAM_FAMILY or factor == 1.0:
        return 1.0
    root = math.sqrt(factor)

    def given(*parts: str) -> bool:
        key = (*path, *parts)
        return any(key[: len(k)] == k or k[: len(key)] == key for k in explicit)

    def scale(options: dict, *where: str) -> None:
        if "lr" in options and not given(*where, "lr"):
            options["lr"] = scaled_schedule(options["lr"], 1.0, lambda v: v * root)
        if "eps" in options and not given(*where, "eps"):
            options["eps"] = options["eps"] / root
        if "betas" in options and not given(*where, "betas"):
            options["betas"] = [max(0.0, 1.0 - factor * (1.0 - float(b))) for b in options["betas"]]

    args = optimizer.setdefault("args", {"lr": 1e-3})
    args.setdefault("eps", 1e-8)  # torch's defaults, written so that they scale too
    args.setdefault("betas", [0.9, 0.999])
    scale(args, "args")
    for group, options in (optimizer.get("params") or {}).items():
        if isinstance(options, dict):
            scale(options, "params", str(group))
    return root


# ----------------------------------------------------------------------------------- the run's numbers
def recipe_layers(config_paths: Sequence[str | Path], overrides: Sequence[str] = ()) -> Any:
    """The config files (and ``overrides``) merged as written, interpolations unresolved (None if they cannot be)."""
    from lift3d.config.layers import dotlist_layer, load_yaml_layers, merge_layers

    try:
        layers = [node for path in config_paths for _, node in load_yaml_layers(Path(path))]
        return merge_layers([*layers, dotlist_layer(list(overrides))])
    except Exception:  # noqa: BLE001  (the config loaded already: without its layers, no links and the run's batch)
        return None


def interpolation_links(tree: Any) -> dict[Path_, Path_]:
    """Every key whose value is exactly ``${other.key}`` -> the key it follows."""
    import re

    from omegaconf import DictConfig, OmegaConf

    found: dict[Path_, Path_] = {}

    def visit(node: Any, path: Path_) -> None:
        if isinstance(node, DictConfig):
            for key in node:
                if OmegaConf.is_interpolation(node, key):
                    match = re.fullmatch(r"\$\{([\w.]+)\}", str(node._get_node(key)._value()))
                    if match:
                        found[(*path, str(key))] = tuple(match.group(1).split("."))
                else:
                    visit(node[key], (*path, str(key)))

    if tree is not None:
        visit(tree, ())
    return found


def recipe_batch(cfg: ExperimentConfig, config_paths: Sequence[str | Path]) -> int:
    """The total batch the step counts are written for: ``trainer.schedule_batch``, else the config files' own
    views a step on one process (the user's overrides left out), else this run's."""
    if cfg.trainer.schedule_batch > 0:
        return cfg.trainer.schedule_batch
    tree = recipe_layers(config_paths) if config_paths else None
    if tree is not None:
        from omegaconf import OmegaConf

        try:
            plain = OmegaConf.to_container(tree, resolve=True)
            return views_per_step(plain.get("data") or {}, str(plain.get("data_type") or cfg.data_type))
        except Exception:  # noqa: BLE001
            pass
    return views_per_step(cfg.data, cfg.data_type)


def explicit_keys(overrides: Iterable[str]) -> list[Path_]:
    from lift3d.config.layers import split_key

    return [tuple(split_key(item.split("=", 1)[0].strip().lstrip("+~"))) for item in overrides if "=" in item]


def rescale_config(cfg: ExperimentConfig, factor: float, explicit: Sequence[Path_] = (),
                   links: dict[Path_, Path_] | None = None, report: Rescaling | None = None) -> Rescaling:
    """Divide every step count of ``cfg`` by ``factor`` and apply Adam's rule to its rates, in place; keys in
    ``explicit`` keep their values, keys in ``links`` take their target's final value. Returns what changed."""
    report = report or Rescaling(1, 1, 1, "process")
    walk = _Walk(factor, list(explicit), dict(links or {}), report)
    _walk(ExperimentConfig, cfg, (), walk)
    for node, name, path, target in walk.linked:
        value = _get(node, name, None)
        walk.update(node, name, path, value, walk.finals.get(target, value))
    optimizer = cfg.system.get("optimizer") if isinstance(cfg.system, dict) else None
    if isinstance(optimizer, dict):
        report.lr_factor = scale_adam(optimizer, ("system", "optimizer"), factor, walk.explicit)
    return report


def apply_rescale(cfg: ExperimentConfig, config_paths: Sequence[str | Path] = (), overrides: Sequence[str] = (),
                  processes: int | None = None) -> Rescaling | None:
    """Rescale a new training run's ``cfg`` in place for its processes and batch (``trainer.rescale_steps``) and
    record its total batch in ``trainer.schedule_batch``; None when nothing is to be done."""
    mode = cfg.trainer.rescale_steps
    processes = processes or training_processes(cfg.trainer)
    if mode == "never" or (mode == "auto" and processes <= 1):
        return None
    views, batch = views_per_step(cfg.data, cfg.data_type), recipe_batch(cfg, config_paths)
    total = processes * views
    if total == batch:
        return None
    if cfg.resume:
        log.warning("resuming on %d x %s a step where the run's step counts are for %s: they stay as they are",
                     processes, _views(views), _views(batch))
        return None
    accelerator = str(cfg.trainer.accelerator).lower()
    device = "process" if accelerator == "cpu" else "GPU"
    report = Rescaling(processes, views, batch, device)
    links = interpolation_links(recipe_layers(config_paths, overrides)) if config_paths else {}
    rescale_config(cfg, total / batch, explicit_keys(overrides), links, report)
    cfg.trainer.schedule_batch = total
    return report
