"""Optimizers with per-parameter-group options (learning rates may be scheduled) and LR schedulers."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.config import choice, step_count
from lift3d.schedule import is_schedule, scheduled_value, validate_schedule


def optimizer_names() -> tuple[str, ...]:
    """The optimizers of torch.optim (``optimizer.name``'s choices)."""
    return tuple(name for name, cls in vars(torch.optim).items()
                 if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer)


def scheduler_names() -> tuple[str, ...]:
    """"" (none) and the LR schedulers of torch.optim.lr_scheduler (``scheduler.name``'s choices)."""
    base = torch.optim.lr_scheduler.LRScheduler
    return ("", *(name for name, cls in vars(torch.optim.lr_scheduler).items()
                  if isinstance(cls, type) and issubclass(cls, base) and cls is not base and not name.startswith("_")))


@dataclass
class OptimizerConfig:
    """Which torch optimizer, its defaults, and per-group options keyed by attribute path."""

    name: str = choice("Adam", among=optimizer_names)  # any class in torch.optim (Adam, AdamW, SGD, ...)
    args: dict = field(default_factory=lambda: {"lr": 1e-3})  # defaults for every group (lr, betas, eps, ...)
    # {"geometry.encoding": {"lr": 0.01}}: group options; lr may be a schedule
    params: dict = step_count({}, kind="optimizer-groups")
    # auto: the optimizer's fused kernel when every parameter is on CUDA (one launch per group, and no host sync under
    # 16-mixed's grad scaler); always; never (torch's default)
    fused: str = choice("auto", "always", "never")
    # Gaussian recipes whose step is a CUDA graph: Adam moves only the Gaussians the step's views drew (gsplat's visible_adam)
    visible_adam: bool = False


@dataclass
class SchedulerConfig:
    """An optional torch LR scheduler stepped every step (or epoch)."""

    # class in torch.optim.lr_scheduler ("" for none; scheduled group lrs need none)
    name: str = choice("", among=scheduler_names)
    args: dict = step_count({}, kind="scheduler-args")  # passed to the scheduler
    interval: str = choice("step", "epoch")  # step or epoch


def resolve_attribute(root: nn.Module, path: str) -> Any:
    """``root.a.b.c`` for ``path`` "a.b.c", with an error naming the first missing part and the options."""
    target: Any = root
    walked = []
    for part in path.split("."):
        if not hasattr(target, part):
            children = [name for name, _ in target.named_children()] if isinstance(target, nn.Module) else []
            params = [name for name, _ in target.named_parameters(recurse=False)] if isinstance(target, nn.Module) else []
            where = ".".join(walked) or "the system"
            raise ValueError(
                f"optimizer.params names '{path}', but {where} has no '{part}'. "
                f"Available there: {', '.join(children + params) or '(nothing)'}"
            )
        target = getattr(target, part)
        walked.append(part)
    return target


def _trainable(target: Any, path: str) -> list[nn.Parameter]:
    if isinstance(target, nn.Parameter):
        return [target] if target.requires_grad else []
    if isinstance(target, nn.Module):
        return [p for p in target.parameters() if p.requires_grad]
    raise ValueError(f"optimizer.params entry '{path}' is a {type(target).__name__}, not a module or parameter")


def build_param_groups(root: nn.Module, cfg: OptimizerConfig, step: int = 0) -> list[dict[str, Any]]:
    """Parameter groups in config order; trainable parameters not named go in a final "default" group."""
    groups: list[dict[str, Any]] = []
    seen: dict[int, str] = {}
    for path, options in cfg.params.items():
        options = dict(options or {})
        params = _trainable(resolve_attribute(root, path), path)
        for p in params:
            if id(p) in seen:
                raise ValueError(f"a parameter of '{path}' is already in optimizer group '{seen[id(p)]}'")
            seen[id(p)] = path
        group: dict[str, Any] = {"params": params, "name": path, **options}
        if is_schedule(group.get("lr")):
            validate_schedule(group["lr"])
            group["lr_schedule"] = group["lr"]
            group["lr"] = scheduled_value(group["lr"], step)
        groups.append(group)
    rest = [p for p in root.parameters() if p.requires_grad and id(p) not in seen]
    if rest:
        groups.append({"params": rest, "name": "default"})
    return [g for g in groups if g["params"]]


def build_optimizer(root: nn.Module, cfg: OptimizerConfig, step: int = 0, clips_gradients: bool = False) -> torch.optim.Optimizer:
    """The configured optimizer over ``root``'s trainable parameters (``clips_gradients``: the trainer clips
    them, which Lightning's grad scaler cannot do for a fused optimizer, so auto stays unfused)."""
    optimizer_cls = getattr(torch.optim, cfg.name, None)
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        raise ValueError(f"optimizer.name '{cfg.name}' is not a torch.optim optimizer (e.g. Adam, AdamW, SGD)")
    args = dict(cfg.args)
    if is_schedule(args.get("lr")):
        raise ValueError("optimizer.args.lr must be a number; schedule a group's lr under optimizer.params")
    groups = build_param_groups(root, cfg, step)
    if not groups:
        raise ValueError("the system has no trainable parameters to optimize")
    if "fused" not in args and "foreach" not in args and use_fused(optimizer_cls, groups, cfg.fused, clips_gradients):
        args["fused"] = True
    return optimizer_cls(groups, **args)


def use_fused(optimizer_cls: type, groups: list[dict[str, Any]], mode: str, clips_gradients: bool = False) -> bool:
    """Whether to build ``optimizer_cls`` with ``fused=True`` under ``optimizer.fused`` = ``mode``."""
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"optimizer.fused must be auto, always or never, got '{mode}'")
    if mode == "never" or (mode == "auto" and clips_gradients):
        return False
    if clips_gradients:
        raise ValueError("optimizer.fused=always cannot go with trainer.gradient_clip_val: a fused optimizer unscales "
                         "16-mixed gradients inside its step, after clipping would need them; use optimizer.fused=auto")
    has_fused = "fused" in inspect.signature(optimizer_cls.__init__).parameters
    if mode == "always":
        if not has_fused:
            raise ValueError(f"optimizer.fused=always, but torch.optim.{optimizer_cls.__name__} has no fused kernel: "
                             "use auto or never")
        return True
    return has_fused and all_on_cuda([p for group in groups for p in group["params"]])


def all_on_cuda(params: list[Tensor]) -> bool:
    """Every parameter is a floating-point CUDA tensor (what auto needs before it fuses)."""
    return bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)


def apply_lr_schedules(optimizer: torch.optim.Optimizer, step: int) -> None:
    """Set each group's lr from its schedule (groups built with a scheduled lr); an lr held in a tensor (a step
    captured as a CUDA graph reads it there) is filled in place, without waiting for the device."""
    for group in optimizer.param_groups:
        if "lr_schedule" in group:
            value = scheduled_value(group["lr_schedule"], step)
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(value)
            else:
                group["lr"] = value


def plain_param_groups(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer ``state_dict`` with the options of a captured step undone (tensor learning rates as numbers,
    ``capturable`` off), so a checkpoint resumes anywhere, the CPU included, as one written without capture."""
    groups = []
    for group in state.get("param_groups", []):
        group = dict(group)
        if torch.is_tensor(group.get("lr")):
            group["lr"] = float(group["lr"])
        if group.get("capturable"):
            group["capturable"] = False
        groups.append(group)
    return {**state, "param_groups": groups}


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig) -> dict[str, Any] | None:
    """A Lightning scheduler config for ``cfg`` (None when no scheduler is set)."""
    if not cfg.name:
        return None
    scheduler_cls = getattr(torch.optim.lr_scheduler, cfg.name, None)
    if scheduler_cls is None:
        raise ValueError(f"scheduler.name '{cfg.name}' is not in torch.optim.lr_scheduler")
    return {"scheduler": scheduler_cls(optimizer, **cfg.args), "interval": cfg.interval}
